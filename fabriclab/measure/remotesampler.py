"""Port counters of another machine of a cluster, sampled there on its own grid and brought back
onto this machine's sample times.

The ports of a switch on another machine are files of that machine's /sys, too many and too often
read (every few ms) to fetch one by one over SSH. So the lab starts this module there, on its SSH
connection, and it samples them with the same counters and clock as the port sampler here:

    python -m fabriclab.measure.remotesampler --interval S

One JSON object per line each way:

    in   {"pairs": [[intf, counter], ...]}      out {"ready": PID} or {"error": "..."}
    in   "clock"                                 out {"wall": time.time()}   (as often as asked)
    in   "stop" (or the input ends)              out {"wall0", "times", "rows", "error"}, then exit

The input ending is also how a killed run ends it: its SSH session goes, and so does this. The
lab sets its series onto its own times by wall clock, after measuring the other clock's offset
with "clock" exchanges (the one with the shortest round trip counts): `RemoteSampler` below.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

from fabriclab.errors import LabError

MODULE = "fabriclab.measure.remotesampler"
MAX_PAIRS = 1 << 14
MAX_LINE = 1 << 20
MAX_RESULT = 1 << 30              # bytes of the series coming back: MAX_SAMPLES rows at most
CLOCK_EXCHANGES = 5


# -- on the other machine ------------------------------------------------------------------------
def main(argv=None):
    from fabriclab.measure.counters import PortCounters
    from fabriclab.measure.grid import SamplingThread
    from fabriclab.measure.portsampler import MAX_SAMPLES, MIN_INTERVAL_S

    parser = argparse.ArgumentParser(prog=MODULE)
    parser.add_argument("--interval", type=float, required=True)
    args = parser.parse_args(argv)
    pairs = _pairs(sys.stdin.readline(MAX_LINE))
    if pairs is None or not args.interval >= MIN_INTERVAL_S:
        _say({"error": "expected a list of [interface, counter] pairs and an interval >= 1 ms"})
        return 2
    counters = PortCounters(pairs)
    if counters.missing:
        counters.close()
        _say({"error": f"no port(s) {', '.join(counters.missing[:3])} on this machine"})
        return 1
    times, rows = [], []
    t0, wall0 = time.monotonic(), time.time()

    def sample():
        rows.append(counters.read())
        times.append(time.monotonic() - t0)

    sample()
    thread = SamplingThread(sample, args.interval, "remote-port-sampler", lambda: len(times) < MAX_SAMPLES)
    thread.start(t0)
    _say({"ready": os.getpid()})
    for line in iter(lambda: sys.stdin.readline(MAX_LINE), ""):
        if line.strip() == "clock":
            _say({"wall": time.time()})
        elif line.strip() == "stop":
            break
    error = thread.stop()
    if error is None:
        sample()
    counters.close()
    gone = next((pairs[row.index(None)][0] for row in rows if None in row), None)
    _say({"wall0": wall0, "times": times, "rows": rows if gone is None else [],
          "error": str(error) if error else (f"port {gone} disappeared during sampling" if gone else None)})
    return 0


def _pairs(line):
    try:
        pairs = json.loads(line).get("pairs")
    except (ValueError, AttributeError):
        return None
    ok = (isinstance(pairs, list) and 0 < len(pairs) <= MAX_PAIRS
          and all(isinstance(p, list) and len(p) == 2 and all(isinstance(v, str) for v in p) for p in pairs)
          and all(_safe_name(intf) and counter.isidentifier() for intf, counter in pairs))
    return [tuple(p) for p in pairs] if ok else None


def _safe_name(intf):
    """An interface name as the kernel allows it: no path separators, at most 15 bytes."""
    return 0 < len(intf) <= 15 and "/" not in intf and intf not in (".", "..")


def _say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


# -- here ----------------------------------------------------------------------------------------
class RemoteSampler:
    """The sampler of `pairs` (interface, counter) on `machine` (a cluster Machine with its SSH
    connection up). start() returns once it samples, with the other clock's offset measured;
    stop() returns (wall times on this machine's clock, rows) or raises LabError."""

    def __init__(self, machine, pairs, interval_s, record=None):
        self.machine, self.pairs, self.interval_s = machine, [list(p) for p in pairs], interval_s
        self.record = record            # record(pid): tell the machine's run member of the process
        self.proc = None
        self.offset_s = self.rtt_s = None

    def start(self):
        command = shlex.join([self.machine.python, "-m", MODULE, "--interval", repr(self.interval_s)])
        self.proc = subprocess.Popen([*self.machine.ssh_argv(), command], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        try:
            self._send(json.dumps({"pairs": self.pairs}))
            first = self._read()
            if "ready" not in first:
                raise LabError(f"port sampler on {self.machine.name}: "
                               f"{str(first.get('error') or 'did not start')[:200]}")
            if self.record is not None and isinstance(first["ready"], int):
                self.record(first["ready"])
            self.offset_s, self.rtt_s = self._clock_offset()
        except BaseException:
            self.close()
            raise
        return self

    def _clock_offset(self):
        """(the other clock minus this one, s; the round trip it was read in): the exchange with
        the shortest round trip, its reading set at that trip's middle."""
        best = None
        for _ in range(CLOCK_EXCHANGES):
            sent = time.time()
            self._send("clock")
            wall = self._read().get("wall")
            back = time.time()
            if not isinstance(wall, (int, float)):
                raise LabError(f"port sampler on {self.machine.name}: no clock reading")
            if best is None or back - sent < best[1]:
                best = (wall - (sent + back) / 2, back - sent)
        return best

    def stop(self):
        """(wall times here, rows): the series it took, its clock set onto this one's."""
        try:
            self._send("stop")
            result = self._read(limit=MAX_RESULT)
        finally:
            self.close()
        if result.get("error"):
            raise LabError(f"port sampler on {self.machine.name}: {str(result['error'])[:200]}")
        times, rows = result.get("times"), result.get("rows")
        if not isinstance(times, list) or not isinstance(rows, list) or len(times) != len(rows) or not times:
            raise LabError(f"port sampler on {self.machine.name}: a malformed series came back")
        wall0 = float(result["wall0"]) - self.offset_s
        return [wall0 + t for t in times], rows

    def _send(self, line):
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise LabError(f"port sampler on {self.machine.name}: {self._why()}") from None

    def _read(self, limit=MAX_LINE):
        line = self.proc.stdout.readline(limit)
        try:
            obj = json.loads(line)
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            raise LabError(f"port sampler on {self.machine.name}: {self._why() if not line else 'a malformed reply'}")
        return obj

    def _why(self):
        if self.proc.poll() is None:
            return "no answer"
        err = self.proc.stderr.read().strip().splitlines()
        return (err or [f"exit code {self.proc.returncode}"])[-1][:200]

    def close(self):
        """End its input (so it exits) and wait for it; safe to call more than once."""
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def onto(times_here, wall0_here, remote_walls, remote_rows):
    """A remote series' cumulative counters at this machine's sample times (series seconds from
    `wall0_here`), interpolated by wall clock; held at its first and last values outside it."""
    import numpy as np

    walls = np.asarray(remote_walls, dtype=float)
    data = np.asarray(remote_rows, dtype=float).reshape(len(walls), -1)
    at = wall0_here + np.asarray(times_here, dtype=float)
    return np.stack([np.interp(at, walls, data[:, i]) for i in range(data.shape[1])], axis=1).round().astype(np.int64)


if __name__ == "__main__":
    sys.exit(main())
