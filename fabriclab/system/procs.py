"""Processes by PID, checked without signalling them: alive, and the command line they run."""

from __future__ import annotations

import os
import pathlib


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


def pid_runs(pid, token):
    """Whether `pid`'s command line has `token` as one of its arguments, whole: `mininet:h1` is
    not `mininet:h12`, and a PID recycled for another command is not the one recorded."""
    try:
        args = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return token.encode() in args
