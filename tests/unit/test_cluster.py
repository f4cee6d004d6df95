"""A fabric over several machines, without a network: machines read from inventory variables
(hostile input), the plan a Lab checks before building, tunnel ids, and the member's record."""

import json

import pytest

from fabriclab.errors import LabError
from fabriclab.cluster import member
from fabriclab.queues.model import WIRE_PRIO
from fabriclab.cluster.cluster import Cluster
from fabriclab.cluster.machine import Machine
from fabriclab.lab.lab import Lab
from fabriclab.lab.network import MAX_CROSSING, vxlan_id
from fabriclab.lab.runstate import LINK_GROUP_BASE, RunState
from fabriclab.topologies.spec import load_spec
from fabriclab.topologies.split import parse_split

GUEST = {"ansible_host": "172.31.253.2", "ansible_user": "root", "fabriclab_private_ip": "172.31.253.2",
         "ansible_ssh_private_key_file": "/run/fabriclab/runs/x/id", "venv_dir": "/work/main/.venv",
         "ansible_ssh_common_args": "-o BatchMode=yes -o UserKnownHostsFile=/run/fabriclab/runs/x/known_hosts"}
HERE = {"ansible_connection": "local", "fabriclab_private_ip": "172.31.253.1", "project_dir": "/work/main"}


def machines():
    return [Machine.from_hostvars("here", HERE), Machine.from_hostvars("guest", GUEST)]


def test_a_machine_is_read_from_its_inventory_variables():
    here, guest = machines()
    assert here.local and here.private_ip == "172.31.253.1" and here.python == "/work/main/.venv/bin/python"
    assert not guest.local and guest.python == "/work/main/.venv/bin/python"
    argv = guest.ssh_argv()
    assert argv[0] == "ssh" and argv[-1] == "root@172.31.253.2" and "-T" in argv
    assert argv[argv.index("-i") + 1] == "/run/fabriclab/runs/x/id"
    guest.control_path = "/run/fabriclab/runs/x/ssh-guest"
    tty = guest.ssh_argv(tty=True)
    assert "-tt" in tty and "ControlPath=/run/fabriclab/runs/x/ssh-guest" in tty and "ControlMaster=no" in tty


@pytest.mark.parametrize("change, complaint", [
    ({"fabriclab_private_ip": "127.0.0.1"}, "not an address other machines reach"),
    ({"fabriclab_private_ip": "0.0.0.0"}, "not an address other machines reach"),
    ({"fabriclab_private_ip": "10.0.0.300"}, "fabriclab_private_ip must be"),
    ({"fabriclab_private_ip": None}, "fabriclab_private_ip must be"),
    ({"ansible_host": "a b; rm -rf /"}, "ansible_host must be"),
    ({"ansible_user": "root; id"}, "ansible_user must be"),
    ({"ansible_ssh_common_args": "-o ProxyCommand=sh -c id"}, "ssh option"),
    ({"ansible_ssh_common_args": "-o LocalCommand=id"}, "ssh option"),
    ({"ansible_ssh_common_args": "-L 80:x:80"}, "ssh option"),
    ({"ansible_ssh_common_args": "-o 'unterminated"}, "cannot be split"),
    ({"ansible_ssh_private_key_file": "relative/key"}, "absolute path"),
])
def test_a_machine_with_bad_variables_is_refused_in_one_line(change, complaint):
    with pytest.raises(LabError) as err:
        Machine.from_hostvars("guest", {**GUEST, **change})
    assert complaint in str(err.value) and "\n" not in str(err.value)


def test_a_cluster_runs_from_its_one_local_machine():
    here, guest = machines()
    for order in ([guest, here], [guest], [here, here]):
        with pytest.raises(LabError, match="exactly one machine with ansible_connection=local"):
            Cluster(order)
    assert Cluster([here, guest]).machines == [here, guest]


def test_a_lab_over_machines_checks_its_plan_before_building():
    here, guest = machines()
    with pytest.raises(LabError, match="both a split and the machines"):
        Lab(load_spec("tiny"), split=parse_split("leaf:2"))
    with pytest.raises(LabError, match="the split has 3 machines and the inventory 2"):
        Lab(load_spec("default"), split=parse_split("leaf:3"), cluster=Cluster([here, guest]))
    # the queue model runs across machines (a model per machine, cluster/remotequeues.py)
    assert Lab(load_spec("multiplane_pfc"), split=parse_split("plane:2"), cluster=Cluster([here, guest])).split
    lab = Lab(load_spec("tiny"), split=parse_split("leaf:2"), cluster=Cluster([here, guest]))
    assert lab.split.machine_of == {"l1": 1, "s1": 1, "h1": 1, "l2": 2, "s2": 2, "h2": 2}
    assert sorted(link.label for link in lab.split.boundary) == ["l1-s2", "l2-s1"]


def test_tunnel_ids_are_distinct_per_cable_and_bounded():
    group = LINK_GROUP_BASE + 0x123456
    ids = [vxlan_id(group, i) for i in range(MAX_CROSSING)]
    assert len(set(ids)) == len(ids) and all(0 < i < 1 << 24 for i in ids)
    with pytest.raises(LabError, match="cross machines"):
        vxlan_id(group, MAX_CROSSING)


def test_the_member_records_only_well_formed_messages(tmp_path, monkeypatch):
    monkeypatch.setattr(RunState, "save", lambda self: None)
    run = RunState("20261126-120000-abcdef")
    for line in ['{"bridges": ["l2", "s2"], "interfaces": ["l2-eth1"]}',
                 '{"process": {"pid": 42, "role": "host-shell", "match": "mininet:h2"}}',
                 '{"bridges": "l2"}', '{"bridges": [1]}', '[1, 2]', 'not json',
                 '{"process": {"pid": "42", "match": "x"}}', json.dumps({"bridges": ["x"] * (1 << 16)}),
                 '{"wire": ["eth1"]}', '{"wire": ["../eth1"]}', '{"wire": "eth1"}', '{"wire": ["a-name-too-long-x"]}']:
        member._record(run, line)
    assert run.data["bridges"] == ["l2", "s2"] and run.data["interfaces"] == ["l2-eth1"]
    assert run.data["processes"] == [{"pid": 42, "role": "host-shell", "match": "mininet:h2"}]
    assert run.data["wire"] == ["eth1"]


def test_clean_takes_off_the_wire_filter_of_a_gone_run_by_its_link_group(monkeypatch):
    from fabriclab.lab import clean

    ran = []
    monkeypatch.setattr(clean.subprocess, "run", lambda argv, **kw: ran.append(argv))
    for name in ("delete_link_group", "delete_bridges", "remove_pins"):
        monkeypatch.setattr(clean, name, lambda *a, **kw: None)
    monkeypatch.setattr(clean, "interfaces_in_group", lambda *a: [])
    monkeypatch.setattr(clean, "tagged_bridges", lambda: {})
    monkeypatch.setattr(RunState, "remove", lambda self: None)
    run = RunState("20261126-120000-abcdef")
    run.data.update(link_group=LINK_GROUP_BASE + 9, wire=["eth1"])
    clean.remove_run(run)
    assert ran == [["tc", "filter", "del", "dev", "eth1", "egress", "prio", str(WIRE_PRIO), "handle",
                    str(LINK_GROUP_BASE + 9), "bpf"]]
    ran.clear()
    run.data["link_group"] = 12            # not the lab's: nothing of it is touched
    clean.remove_run(run)
    assert ran == []


def test_clean_deletes_a_gone_runs_folders_only_while_they_carry_its_mark(monkeypatch, tmp_path):
    """The full-kernel tier's folder outside the run folder: a SIGKILL leaves it, `clean` deletes it
    by the record and the mark inside it; a folder that lost the mark (reused) stays."""
    from fabriclab.lab import clean

    for name in ("delete_link_group", "delete_bridges", "remove_pins"):
        monkeypatch.setattr(clean, name, lambda *a, **kw: None)
    monkeypatch.setattr(clean, "tagged_bridges", lambda: {})
    monkeypatch.setattr(RunState, "save", lambda self: None)
    monkeypatch.setattr(RunState, "remove", lambda self: None)
    run = RunState("20261126-120000-abcdef")
    kept, gone = tmp_path / "fabriclab-tier-a", tmp_path / "fabriclab-tier-b"
    for folder in (kept, gone):
        folder.mkdir()
        run.add_folder(folder)
        (folder / "guest.sh").write_text("#!/bin/sh\n")
    assert run.data["folders"] == sorted([str(kept), str(gone)])
    (kept / ".fabriclab-run").write_text("20261126-999999-other")        # another run's now
    assert clean.remove_run(run).endswith("and 1 folders")
    assert kept.is_dir() and not gone.exists()


def test_the_member_refuses_what_is_not_a_run_of_the_lab(capsys):
    assert member.main(["--run-id", "../../etc", "--link-group", str(LINK_GROUP_BASE)]) == 2
    assert member.main(["--run-id", "20261126-120000-abcdef", "--link-group", "0"]) == 2


def bare_cluster():
    """A Cluster with no connections: what its helpers and start costs keep."""
    return Cluster([Machine("here", "10.0.0.1", local=True)])


def test_a_helper_is_started_once_per_machine_and_closed_with_the_cluster():
    import types

    cluster = bare_cluster()
    m2 = types.SimpleNamespace(name="m2")
    made, closed = [], []

    def start():
        made.append(1)
        return types.SimpleNamespace(close=lambda: closed.append(1))

    first = cluster.helper(m2, "reader", start)
    assert cluster.helper(m2, "reader", start) is first and made == [1]
    cluster.helper(m2, "other", start)
    cluster.close()
    assert len(made) == 2 and len(closed) == 2 and cluster.helpers == {}


def test_an_agents_start_cost_is_measured_once_and_a_failure_named():
    import subprocess
    import types

    cluster = bare_cluster()
    runs = []

    def run(command, timeout):
        runs.append(command)
        return subprocess.CompletedProcess([], 0, "", "")

    m2 = types.SimpleNamespace(name="m2", python="/usr/bin/python3", run=run)
    first = cluster.agent_start_s(m2, "fabriclab.traffic.generator")
    assert first >= 0 and cluster.agent_start_s(m2, "fabriclab.traffic.generator") == first
    assert runs == ["/usr/bin/python3 -c 'import fabriclab.traffic.generator'"]
    cluster.agent_start_s(m2, "fabriclab.switchml.node")         # another module: measured on its own
    assert runs[1:] == ["/usr/bin/python3 -c 'import fabriclab.switchml.node'"]
    m3 = types.SimpleNamespace(name="m3", python="/usr/bin/python3", run=lambda command, timeout: (
        subprocess.CompletedProcess([], 1, "", "ModuleNotFoundError: No module named 'fabriclab'\n")))
    with pytest.raises(LabError, match="machine m3 cannot start fabriclab.traffic.generator: ModuleNotFound"):
        cluster.agent_start_s(m3, "fabriclab.traffic.generator")
