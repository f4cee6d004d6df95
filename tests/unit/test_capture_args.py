"""What `capture` refuses before it starts anything: limits out of range, a filter that could be
read as options, ports the run does not have here, no run or several to choose from."""

import os
import types

import pytest

from fabriclab.errors import LabError
from fabriclab.lab import capture


@pytest.mark.parametrize("kwargs, said", [
    ({"count": 0}, "--count"), ({"count": 10**10}, "--count"),
    ({"seconds": 0}, "--seconds"), ({"seconds": float("nan")}, "--seconds"), ({"seconds": float("inf")}, "--seconds"),
    ({"snaplen": 10}, "--snaplen"), ({"snaplen": 10**6}, "--snaplen"),
    ({"bpf": "-w /etc/passwd"}, "does not start with '-'"), ({"bpf": "udp\nport 1"}, "printable"),
    ({"bpf": "x" * 3000}, "at most"),
])
def test_limits_out_of_range_are_refused(kwargs, said):
    with pytest.raises(LabError, match=said):
        capture.check_limits(**kwargs)


def test_limits_in_range_pass():
    capture.check_limits(count=1, seconds=0.5, snaplen=128, bpf="udp port 4791")


def fake_run(interfaces=(), shells=()):
    processes = [{"pid": pid, "role": "host-shell", "match": f"mininet:{node}"} for node, pid in shells]
    return types.SimpleNamespace(id="20261128-200000-abcdef", data={"interfaces": list(interfaces),
                                                                      "processes": processes})


def test_a_recorded_interface_of_this_namespace_resolves():
    assert capture.resolve_ports(fake_run(["lo"]), ["lo"]) == [("lo", None)]


@pytest.mark.parametrize("names, said", [
    ([], "at least one"), (["lo", "lo"], "twice"), (["l9-eth9"], "has no port"),
    ([f"p{i}" for i in range(capture.MAX_PORTS + 1)], "at most"),
])
def test_ports_the_run_does_not_have_are_refused(names, said):
    with pytest.raises(LabError, match=said):
        capture.resolve_ports(fake_run(["lo"]), names)


def test_a_host_port_needs_the_hosts_own_shell():
    """This process's namespace has `lo`, but this process is not `mininet:h1`: refused."""
    with pytest.raises(LabError, match="has no port"):
        capture.resolve_ports(fake_run(shells=[("lo", os.getpid())]), ["lo"])


def test_the_run_is_the_only_live_one_or_named(monkeypatch):
    runs = [types.SimpleNamespace(id=f"20261128-20000{i}-abcdef", data={}, live=live) for i, live in enumerate(
        (True, False, True))]
    monkeypatch.setattr(capture.RunState, "all", classmethod(lambda cls: runs))
    with pytest.raises(LabError, match="2 runs are running"):
        capture.live_run()
    assert capture.live_run(runs[2].id) is runs[2]
    with pytest.raises(LabError, match="is not running"):
        capture.live_run(runs[1].id)
    with pytest.raises(LabError, match="not a run id"):
        capture.live_run("../etc")
    monkeypatch.setattr(capture.RunState, "all", classmethod(lambda cls: runs[1:2]))
    with pytest.raises(LabError, match="no run is running"):
        capture.live_run()
