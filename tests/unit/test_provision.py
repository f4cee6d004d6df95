"""The provision command's reporting, from fake ansible-runner events: no root, no ansible run."""

import argparse

import pytest

from fabriclab.cli import machine
from fabriclab.system import provision as prov
from fabriclab.errors import EnvironmentProblem, LabError


def event(kind, task, role=None, **data):
    event_data = {"task": task, **data}
    if role:
        event_data["role"] = role
    return {"event": kind, "event_data": event_data}


def test_collector_reports_changed_and_failed_tasks(capsys):
    collect = prov._EventCollector(echo=True, check=False)
    collect(event("runner_on_ok", "Install the lab's packages", role="packages",
                  res={"changed": True}))
    collect(event("runner_on_ok", "Checksum pyproject.toml", role="python_env",
                  res={"changed": False}))
    collect(event("runner_on_failed", "Probe", res={"msg": "ignored"}, ignore_errors=True))
    collect(event("runner_on_failed", "Start Open vSwitch with ovs-ctl (no systemd)",
                  role="openvswitch",
                  res={"msg": "non-zero return code", "stderr": "line 1\novsdb-server: bad db\n"}))
    collect({"event": "playbook_on_stats",
             "event_data": {"changed": {"localhost": 1}, "failures": {"localhost": 1}}})

    assert collect.changed_tasks == ["packages : Install the lab's packages"]
    assert collect.failures == [prov.TaskFailure(
        "openvswitch : Start Open vSwitch with ovs-ctl (no systemd)",
        "non-zero return code: ovsdb-server: bad db")]
    assert prov._count(collect.stats, "changed") == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "  changed: packages : Install the lab's packages",
        "  failed: openvswitch : Start Open vSwitch with ovs-ctl (no systemd): "
        "non-zero return code: ovsdb-server: bad db",
    ]


def test_quiet_collector_prints_nothing(capsys):
    collect = prov._EventCollector(echo=False, check=True)
    collect(event("runner_on_ok", "t", res={"changed": True}))
    assert collect.changed_tasks == ["t"]
    assert capsys.readouterr().out == ""


def make_result(**kw):
    base = dict(ok=True, changed=0, failed=0, status="successful", rc=0, check=False,
                duration=11.2)
    base.update(kw)
    return prov.ProvisionResult(**base)


def test_summary_line():
    assert prov.summary_line(make_result()) == "provision: ok, 0 changed in 11 s"
    assert prov.summary_line(make_result(changed=3, check=True)).startswith(
        "provision: ok, 3 changed (check mode")


def test_failure_names_the_task():
    result = make_result(ok=False, failed=1, status="failed", rc=2,
                         failures=[prov.TaskFailure("packages : Install", "No package matching 'x'")])
    with pytest.raises(LabError, match="failed at task 'packages : Install': No package matching"):
        result.raise_for_failure()
    bare = make_result(ok=False, status="failed", rc=4, output_tail="ERROR! the playbook could not be found")
    with pytest.raises(LabError, match="could not be found"):
        bare.raise_for_failure()
    make_result().raise_for_failure()


def test_needs_root(monkeypatch):
    monkeypatch.setattr(prov.os, "geteuid", lambda: 1000)
    with pytest.raises(EnvironmentProblem, match="run it as root"):
        prov.provision(prov.PROJECT_DIR)


def test_register_adds_provision_command():
    parser = argparse.ArgumentParser()
    machine.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["provision", "--check", "--venv", "/opt/v"])
    assert args.func is machine.run_provision and args.check and args.venv == "/opt/v"
