"""Processes by PID, checked without signalling them: alive, and the command line they run; and
ending a process group the caller itself started (`end_group`)."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pid_cmdline(pid):
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None


def _arguments(pid):
    """`pid`'s command line as a list of byte strings; [] once it is gone."""
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def pid_runs(pid, token):
    """Whether `pid`'s command line has `token` as one of its arguments, whole: `mininet:h1` is
    not `mininet:h12`, and a PID recycled for another command is not the one recorded."""
    return token.encode() in _arguments(pid)


def with_argument_under(prefix):
    """[(pid, argument)] for every process with an argument that starts with `prefix` (a folder
    of the lab's, e.g. a run's: what its agents were started with)."""
    found, mark = [], prefix.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        arg = next((a for a in _arguments(entry) if a.startswith(mark)), None)
        if arg is not None:
            found.append((int(entry), arg.decode(errors="replace")))
    return found


def listening_inodes(port):
    """The socket inodes of every TCP listener on `port` in this network namespace."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = pathlib.Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                out.add(fields[9])
    return out


def listens(pid, port):
    """Whether process `pid` holds a socket listening on TCP `port` (so what answers there is it)."""
    inodes = listening_inodes(port)
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return True
    return False


def end_group(proc):
    """End the process group `proc` (a Popen started with start_new_session) leads: SIGTERM, then
    SIGKILL if it has not exited within 5 s. The group is the caller's own, never found by name."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue
