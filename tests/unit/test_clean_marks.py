"""What `clean` accepts as the lab's own: link groups in the lab's range, bridges by their OVS
tags (with the owner's pid), processes by a whole argument of their command line."""

import os
import subprocess
import sys
import time

import pytest

from fabriclab.lab import teardown
from fabriclab.lab.runstate import LINK_GROUP_BASE, LINK_GROUP_SPAN, RunState, is_lab_link_group
from fabriclab.system import procs
from fabriclab.system.procs import pid_runs


@pytest.mark.parametrize("group, ours", [
    (LINK_GROUP_BASE, True), (LINK_GROUP_BASE + LINK_GROUP_SPAN - 1, True),
    (LINK_GROUP_BASE + LINK_GROUP_SPAN, False), (LINK_GROUP_BASE - 1, False), (0, False),
    (None, False), (True, False), ("1275068416", False), (-1, False)])
def test_only_the_labs_link_groups_are_deleted(group, ours):
    assert is_lab_link_group(group) is ours


def test_a_new_run_allocates_a_group_in_the_range():
    assert all(is_lab_link_group(RunState("r").data["link_group"]) for _ in range(50))


def test_a_process_is_matched_by_a_whole_argument():
    me = os.getpid()
    assert pid_runs(me, sys.executable) or pid_runs(me, os.path.basename(sys.executable)) or \
        any(pid_runs(me, arg) for arg in sys.argv)
    assert not pid_runs(me, sys.argv[0][:-1] or "x")           # a prefix is not the argument
    assert not pid_runs(2 ** 22 + 12345, "anything")            # no such process


def test_bridges_are_read_with_their_run_and_owner(monkeypatch):
    class Out:
        stdout = ('s1,"fabriclab-pid=4242 fabriclab-run=20261125-1-abc"\n'
                  'l1,"fabriclab-run=20261125-1-abc"\n'
                  'mine,"owner=someone"\n')

    monkeypatch.setattr(teardown, "_ovs", lambda *args: Out)
    assert teardown.tagged_bridges() == {"s1": ("20261125-1-abc", 4242), "l1": ("20261125-1-abc", None)}


def test_a_listener_is_known_by_its_process():
    import socket
    import subprocess

    from fabriclab.system.procs import listens

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert listens(os.getpid(), port)
        other = subprocess.Popen(["sleep", "5"])
        try:
            assert not listens(other.pid, port)           # it answers, but not from that process
        finally:
            other.kill()
            other.wait()
    assert not listens(os.getpid(), port)                 # closed


def test_a_process_started_with_a_file_of_a_run_folder_is_found_by_it(tmp_path):
    from fabriclab.system.procs import with_argument_under

    folder = f"{tmp_path}/runs/"
    arg = f"{folder}r1/traffic/h1.json"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", arg])
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not with_argument_under(folder):
            time.sleep(0.02)
        assert with_argument_under(folder) == [(proc.pid, arg)]
        assert with_argument_under(f"{tmp_path}/other/") == []
    finally:
        proc.kill()
        proc.wait()


def test_recorded_processes_are_stopped_and_a_term_ignorer_is_killed():
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "fl-test-polite"])
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, sys, time; "
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); "
                                 "time.sleep(60)", "fl-test-stubborn"], stdout=subprocess.PIPE)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "fl-test-other"])
    try:
        stubborn.stdout.readline()                      # its SIGTERM handler is in place
        records = [{"pid": polite.pid, "match": "fl-test-polite"},
                   {"pid": stubborn.pid, "match": "fl-test-stubborn"},
                   {"pid": other.pid, "match": "fl-test-polite"},     # the PID runs something else
                   {"pid": 2 ** 22 + 12345, "match": "fl-test-polite"}]
        assert procs.stop_recorded(records, grace_s=0.5) == [polite.pid, stubborn.pid]
        assert polite.wait(5) == -15 and stubborn.wait(5) == -9
        assert other.poll() is None
    finally:
        for proc in (polite, stubborn, other):
            proc.kill()
            proc.wait()


def test_a_process_mid_exec_is_read_again_and_a_zombie_is_not(monkeypatch):
    reads = iter([[b""], [b""], [b"python", b"-m", b"fabriclab.traffic.agent"]])
    monkeypatch.setattr(procs, "_arguments", lambda pid: next(reads))
    monkeypatch.setattr(procs, "_state", lambda pid: "R")
    assert procs.pid_runs(4242, "fabriclab.traffic.agent")          # the exec finished
    monkeypatch.setattr(procs, "_arguments", lambda pid: [b""])
    monkeypatch.setattr(procs, "_state", lambda pid: "Z")
    assert not procs.pid_runs(4242, "fabriclab.traffic.agent")      # exited, not yet reaped
