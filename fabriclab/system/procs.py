"""Processes by PID, checked without signalling them: alive, and the command line they run;
stopping recorded processes that still run their recorded command (`stop_recorded`); ending a
process group the caller itself started (`end_group`); and the run id a run's helper process is
started with, its mark (`helper_run_id`)."""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import signal
import subprocess
import sys
import time


EXEC_RETRIES = 100     # 2 ms apart: an exec takes well under 0.2 s even on a loaded machine
RUN_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{6}")      # lab/runstate.py makes them: a folder name, never a path


def valid_run_id(run_id):
    """Whether `run_id` has the form a run's id has."""
    return isinstance(run_id, str) and RUN_ID.fullmatch(run_id) is not None


def helper_run_id(module, argv):
    """The run id a run's helper is started with (`python -m MODULE --run-id ID`); None, said on
    stderr, when it is not one."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}")
    parser.add_argument("--run-id", required=True)
    run_id = parser.parse_args(argv).run_id
    if not valid_run_id(run_id):
        print("error: not a lab run id", file=sys.stderr)
        return None
    return run_id


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
    not `mininet:h12`, and a PID recycled for another command is not the one recorded.

    A process in the middle of an exec (mnexec becoming the agent it starts) reads as an empty
    command line for a moment; that is read again rather than taken for another command."""
    mark = token.encode()
    for _ in range(EXEC_RETRIES):
        args = _arguments(pid)
        if args != [b""] or _state(pid) in (None, "Z"):
            return mark in args
        time.sleep(0.002)
    return False


def _state(pid):
    """The one-letter state of `pid` (R, S, Z...), None once it is gone."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:][:1] or None


def stop_recorded(records, grace_s=2.0):
    """Stop every {"pid", "match"} record whose PID still runs a command with `match` among its
    arguments (a recycled PID is left alone): SIGTERM to all at once, SIGKILL to those still there
    after `grace_s`. Returns the PIDs that were running."""
    running = [r["pid"] for r in records if pid_runs(r["pid"], r["match"])]
    left = running
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while True:
            # A zombie has exited; only its parent has not reaped it yet.
            left = [pid for pid in left if _state(pid) not in (None, "Z")]
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if not left:
            break
    return running


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


def runs_qemu(pid):
    """Whether `pid` runs a qemu-system-* program (by its first argument), a guest's emulator
    found among the processes its recorder already knows by their own marks."""
    program = (pid_cmdline(pid) or "").split(" ", 1)[0]
    return os.path.basename(program).startswith("qemu-system")


def in_session_with(sid, tag):
    """[(pid, argument)] for every process of session `sid` (a Popen started with
    start_new_session leads it) with an argument that holds `tag`, the caller's own mark (e.g. a
    temporary folder it made): that whole argument is what `stop_recorded` matches later."""
    found, mark = [], tag.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
            session = int(stat[stat.rfind(")") + 2:].split()[3])
        except (OSError, ValueError, IndexError):
            continue
        if session != sid:
            continue
        arg = next((a for a in _arguments(entry) if mark in a), None)
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


def end_children(procs, sig=signal.SIGTERM, grace_s=5.0):
    """End the Popen children `procs` (the caller's own): `sig` to each still running, then wait
    for each, killing one that has not exited within `grace_s`."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(sig)
    for proc in procs:
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
