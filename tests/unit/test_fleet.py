"""Judging what each lab machine's doctor sent back: ready, unreachable, another lab, lacking."""

import json

import pytest

from fabriclab.errors import LabError
from fabriclab.system import fleet, inventory
from fabriclab.system.inventory import Reply

HERE = {"version": "0.1.0", "commit": "a" * 40}


def doctor_reply(machine="lab1", rc=0, missing=(), lab=None, kernel="6.1.0-18-amd64", ovs="3.1.0",
                 addresses=None):
    doc = {"ok": not missing, "missing": list(missing),
           "capabilities": {"kernel": kernel, "ovs_version": ovs},
           "lab": HERE if lab is None else lab}
    if addresses is not None:
        doc["addresses"] = addresses
    return Reply(machine, reached=True, rc=rc, stdout=json.dumps(doc), message="")


def test_a_machine_with_the_same_lab_and_nothing_missing_is_ready():
    check = fleet.judge(doctor_reply(), HERE)
    assert check.ready and check.verdict == "ready"
    assert (check.kernel, check.ovs, check.lab) == ("6.1.0-18-amd64", "3.1.0", "0.1.0 at aaaaaaaaaa")


def test_each_reason_a_machine_is_not_ready_is_named():
    gone = fleet.judge(Reply("lab2", reached=False, message="ssh: connect to host 192.0.2.7 port 22: timed out"),
                       HERE)
    assert gone.verdict == "unreachable: ssh: connect to host 192.0.2.7 port 22: timed out"
    other = fleet.judge(doctor_reply(lab={"version": "0.1.0", "commit": "b" * 40}), HERE)
    assert other.verdict == "runs lab 0.1.0 at bbbbbbbbbb, this machine 0.1.0 at aaaaaaaaaa"
    lacking = fleet.judge(doctor_reply(rc=1, missing=["Open vSwitch", "Mininet"], ovs=None), HERE)
    assert lacking.verdict == "lacks Open vSwitch, Mininet" and lacking.ovs == "not running"
    old = fleet.judge(doctor_reply(lab={"commit": 5}), HERE)
    assert "too old to say its version" in old.verdict
    norun = fleet.judge(Reply("lab3", reached=True, rc=None, message="no fabriclab at /x/bin/fabriclab"), HERE)
    assert norun.verdict == "its doctor did not run: no fabriclab at /x/bin/fabriclab"


def test_an_unknown_commit_on_either_side_compares_versions_only():
    assert fleet.judge(doctor_reply(lab={"version": "0.1.0", "commit": None}), HERE).ready
    assert fleet.judge(doctor_reply(), {"version": "0.1.0", "commit": None}).ready
    assert not fleet.judge(doctor_reply(lab={"version": "0.2.0", "commit": None}), HERE).ready


@pytest.mark.parametrize("stdout", ["", "not json", "[1, 2]", json.dumps({"missing": "x", "capabilities": {}}),
                                    json.dumps({"missing": [], "capabilities": []}), "{" * 5000])
def test_a_reply_that_is_not_a_doctor_report_is_refused_in_one_short_line(stdout):
    check = fleet.judge(Reply("lab1", reached=True, rc=2, stdout=stdout, stderr="", message=""), HERE)
    assert not check.ready and check.verdict.startswith("its doctor exited 2 without a report")
    assert len(check.verdict) < 200 and "\n" not in check.verdict


def test_hostile_fields_are_cut_short():
    check = fleet.judge(doctor_reply(kernel="k" * 10_000, missing=["m" * 10_000] * 500,
                                     lab={"version": "v" * 10_000, "commit": None}), HERE)
    assert len(check.kernel) <= 80 and len(check.verdict) < 2000


def test_only_the_known_verbs_run_on_the_machines(tmp_path):
    with pytest.raises(LabError, match="no verb 'rm -rf'"):
        inventory.run_everywhere(tmp_path / "inv.ini", "rm -rf", found=[("lab1", {})])
    assert set(inventory.VERBS) == {"doctor", "clean", "clean-all"}


def test_the_identity_here_is_this_checkout():
    here = fleet.lab_identity()
    assert here["version"] and (here["commit"] is None or len(here["commit"]) == 40)


def test_a_machines_private_address_must_be_its_own_and_its_mtu_is_shown():
    addresses = {"10.0.0.2": {"interface": "eth1", "mtu": 9216}, "127.0.0.1": {"interface": "lo", "mtu": 65536}}
    ok = fleet.judge(doctor_reply(addresses=addresses), HERE, "10.0.0.2")
    assert ok.ready and ok.private == "10.0.0.2 on eth1, MTU 9216: fabrics up to MTU 9166"
    small = fleet.judge(doctor_reply(addresses={"10.0.0.2": {"interface": "eth1", "mtu": 1500}}), HERE, "10.0.0.2")
    assert small.ready and small.private.endswith("MTU 1500: fabrics up to MTU 1450")
    wrong = fleet.judge(doctor_reply(addresses=addresses), HERE, "10.0.0.9")
    assert wrong.problems == ["fabriclab_private_ip '10.0.0.9' is not one of its addresses"]
    hostile = fleet.judge(doctor_reply(addresses={"10.0.0.2": {"interface": "eth1", "mtu": "big"}}), HERE, "10.0.0.2")
    assert hostile.problems == ["its private interface reports no MTU"]
    # an older lab reports no addresses: nothing is judged
    assert fleet.judge(doctor_reply(), HERE, "10.0.0.2").ready
    assert "private network" in fleet.render_checks([ok])


def test_this_machines_addresses_include_loopback():
    assert fleet.local_addresses()["127.0.0.1"] == {"interface": "lo", "mtu": 65536}
