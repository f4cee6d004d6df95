"""A routing swap's retarget (fabriclab/lab/controller.py): the lab's own bridges, by name, pointed
at the new app's port in one ovs-vsctl transaction; a refusal is one line. The switches then
connecting at once is tests/lab/test_routing.py's."""

import subprocess

import pytest

from fabriclab.errors import LabError
from fabriclab.lab import controller


def test_one_transaction_names_each_bridge_and_the_new_target(monkeypatch):
    calls = []
    monkeypatch.setattr(controller.subprocess, "run",
                        lambda argv, **kw: calls.append(argv) or subprocess.CompletedProcess(argv, 0, "", ""))
    controller.retarget(["l1", "s1"], "127.0.0.1", 41000)
    assert len(calls) == 1 and calls[0][0] == "ovs-vsctl"
    target = 'target="tcp:127.0.0.1:41000"'
    assert calls[0][2:] == ["--", "set", "Controller", "l1", target, "--", "set", "Controller", "s1", target]


def test_a_refusal_is_one_line(monkeypatch):
    monkeypatch.setattr(controller.subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(
        argv, 1, "", "ovs-vsctl: no row \"l9\" in table Controller\n" + "x" * 500))
    with pytest.raises(LabError) as err:
        controller.retarget(["l9"], "127.0.0.1", 41000)
    assert "\n" not in str(err.value) and len(str(err.value)) < 200 and "l9" in str(err.value)
