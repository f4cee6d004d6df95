"""What `clean` accepts as the lab's own: link groups in the lab's range, bridges by their OVS
tags (with the owner's pid), processes by a whole argument of their command line."""

import os
import subprocess
import sys
import time

import pytest

from fabriclab.lab import teardown
from fabriclab.lab.runstate import LINK_GROUP_BASE, LINK_GROUP_SPAN, RunState, is_lab_link_group
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
