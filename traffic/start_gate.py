"""An agent's side of a common start set once every agent of a run is ready.

A launcher whose agents all run on this machine starts each with `--start-on-stdin`: the agent sets
itself up (config, sockets, tensors), says {"ready": NAME} as one line on stdout, and reads its
start time (unix seconds) as one line on stdin. The launcher sets that time a few tens of
milliseconds after the last agent said ready, where a fixed margin had to cover the slowest
start on a loaded machine. An agent on another machine of a cluster is started over SSH, whose
input is closed: it is given `--start-at` on its command line instead (traffic/agent_process.py).
"""

from __future__ import annotations

import json
import math
import os
import select
import sys
import time

FLAG = "--start-on-stdin"
FILE_FLAG = "--start-file"
CALL_OFF = "cancel"        # a start file's word for "no start": the launcher gave up (the agent exits)
MAX_WAIT_S = 600.0         # a launcher that says nothing for this long is gone or broken
POLL_S = 0.1               # how often a waiting agent asks `stopped`
FILE_POLL_S = 0.005        # how often it looks for its start file (the start is ~1 s away)
MAX_LINE = 64


class GateError(Exception):
    """The start time never came, or came malformed: the agent's one-line error."""


def announce(name, out=None):
    """Say `name` is ready: the line the launcher waits for."""
    out = out or sys.stdout
    out.write(json.dumps({"ready": name}) + "\n")
    out.flush()


def read_start(fd=None, stopped=None, limit_s=MAX_WAIT_S):
    """Wait for the start time on `fd` (stdin); None if `stopped()` comes true first."""
    fd = sys.stdin.fileno() if fd is None else fd
    deadline = time.monotonic() + limit_s
    line = b""
    while b"\n" not in line:
        if stopped is not None and stopped():
            return None
        left = deadline - time.monotonic()
        if left <= 0:
            raise GateError(f"no start time on stdin within {limit_s:.0f} s")
        if select.select([fd], [], [], min(left, POLL_S))[0]:
            chunk = os.read(fd, MAX_LINE)
            if not chunk:
                if stopped is not None and stopped():
                    return None         # told to stop, then its input closed: not an error
                raise GateError("stdin ended before a start time came (the launcher is gone)")
            line += chunk
            if len(line) > MAX_LINE:
                raise GateError("the start time on stdin is not one short line")
    return _start_time(line.split(b"\n", 1)[0], "on stdin")


def read_start_file(path, stopped=None, limit_s=MAX_WAIT_S):
    """Wait for the start time in the file `path` (the launcher writes it whole, by a rename);
    None if `stopped()` comes true first."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            with open(path, "rb") as handle:
                return _start_time(handle.read(MAX_LINE + 1).split(b"\n", 1)[0], "in the start file")
        except FileNotFoundError:
            pass
        if time.monotonic() > deadline:
            raise GateError(f"no start file within {limit_s:.0f} s")
        if stopped is not None and stopped():
            return None
        time.sleep(FILE_POLL_S)


def _start_time(raw, where):
    if len(raw) > MAX_LINE:
        raise GateError(f"the start time {where} is not one short line")
    text = raw.decode(errors="replace").strip()
    if text == CALL_OFF:
        raise GateError("the launcher called the start off")
    try:
        start = float(text)
    except ValueError:
        raise GateError(f"the start time {where} is not a number: {text[:20]!r}") from None
    if not math.isfinite(start) or abs(start - time.time()) > MAX_WAIT_S:
        raise GateError(f"the start time {where} is not within {MAX_WAIT_S:.0f} s of now: {text[:20]!r}")
    return start


def ready_then_start(name, stopped=None, fd=None, out=None, limit_s=MAX_WAIT_S, path=None):
    """announce(name), then the start time from stdin, or from the file `path` when given: the
    agent's whole side of the gate."""
    announce(name, out)
    if path is not None:
        return read_start_file(path, stopped, limit_s)
    return read_start(fd, stopped, limit_s)
