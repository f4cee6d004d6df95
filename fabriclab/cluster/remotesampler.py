"""Port counters of another machine of a cluster, sampled there on its own grid and brought back
onto this machine's sample times.

The ports of a switch on another machine are files of that machine's /sys, too many and too often
read (every few ms) to fetch one by one over SSH. So the lab starts this module there, on its SSH
connection, and it samples them with the same counters and clock as the port sampler here:

    python -m fabriclab.cluster.remotesampler --interval S

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
import sys
import time

from fabriclab.errors import LabError
from fabriclab.system.remotechannel import MAX_LINE, Channel, pairs_of, say

MODULE = "fabriclab.cluster.remotesampler"
MAX_PAIRS = 1 << 14
MAX_RESULT = 1 << 30              # bytes of the series coming back: MAX_SAMPLES rows at most


# -- on the other machine ------------------------------------------------------------------------
def main(argv=None):
    from fabriclab.measure.counters import PortCounters
    from fabriclab.measure.grid import MAX_SAMPLES, MIN_INTERVAL_S, SamplingThread

    parser = argparse.ArgumentParser(prog=MODULE)
    parser.add_argument("--interval", type=float, required=True)
    args = parser.parse_args(argv)
    pairs = _pairs(sys.stdin.readline(MAX_LINE))
    if pairs is None or not args.interval >= MIN_INTERVAL_S:
        say({"error": "expected a list of [interface, counter] pairs and an interval >= 1 ms"})
        return 2
    counters = PortCounters(pairs)
    if counters.missing:
        counters.close()
        say({"error": f"no port(s) {', '.join(counters.missing[:3])} on this machine"})
        return 1
    times, rows = [], []
    t0, wall0 = time.monotonic(), time.time()

    def sample():
        rows.append(counters.read())
        times.append(time.monotonic() - t0)

    sample()
    thread = SamplingThread(sample, args.interval, "remote-port-sampler", lambda: len(times) < MAX_SAMPLES)
    thread.start(t0)
    say({"ready": os.getpid()})
    for line in iter(lambda: sys.stdin.readline(MAX_LINE), ""):
        if line.strip() == "clock":
            say({"wall": time.time()})
        elif line.strip() == "stop":
            break
    error = thread.stop()
    if error is None:
        sample()
    counters.close()
    gone = next((pairs[row.index(None)][0] for row in rows if None in row), None)
    say({"wall0": wall0, "times": times, "rows": rows if gone is None else [],
          "error": str(error) if error else (f"port {gone} disappeared during sampling" if gone else None)})
    return 0


def _pairs(line):
    try:
        return pairs_of(json.loads(line).get("pairs"), MAX_PAIRS)
    except (ValueError, AttributeError):
        return None


# -- here ----------------------------------------------------------------------------------------
class RemoteSampler:
    """The sampler of `pairs` (interface, counter) on `machine` (a cluster Machine with its SSH
    connection up). start() returns once it samples, with the other clock's offset measured;
    stop() returns (wall times on this machine's clock, rows) or raises LabError."""

    def __init__(self, machine, pairs, interval_s, record=None):
        self.machine, self.pairs, self.interval_s = machine, [list(p) for p in pairs], interval_s
        self.record = record            # record(pid): tell the machine's run member of the process
        self.channel = None
        self.offset_s = self.rtt_s = None
        self.end_offset_s = None         # measured again at stop: the clocks' drift over the run

    @property
    def proc(self):
        return self.channel.proc if self.channel is not None else None

    def start(self):
        self.channel = Channel.opened(self.machine, MODULE, ["--interval", repr(self.interval_s)],
                                      f"port sampler on {self.machine.name}", self.record,
                                      first=[json.dumps({"pairs": self.pairs})], then=self._clock)
        return self

    def _clock(self, channel):
        self.offset_s, self.rtt_s = channel.clock_offset()

    def stop(self):
        """(wall times here, rows): the series it took, its clock set onto this one's."""
        try:
            self.end_offset_s, _rtt = self.channel.clock_offset()
            ended = time.time()
            result = self.channel.ask("stop", limit=MAX_RESULT)
        finally:
            self.close()
        if result.get("error"):
            raise LabError(f"port sampler on {self.machine.name}: {str(result['error'])[:200]}")
        times, rows = result.get("times"), result.get("rows")
        if not isinstance(times, list) or not isinstance(rows, list) or len(times) != len(rows) or not times:
            raise LabError(f"port sampler on {self.machine.name}: a malformed series came back")
        return self._here(float(result["wall0"]), times, ended), rows

    def _here(self, wall0, times, ended):
        """The series' wall times on this clock: its offset drifts linearly from the one measured
        at start to the one measured at stop (`ended`, this clock)."""
        span = ended - (wall0 - self.offset_s)
        drift = (self.end_offset_s - self.offset_s) / span if span > 0 else 0.0
        return [wall0 + t - (self.offset_s + drift * t) for t in times]

    def close(self):
        """End its input (so it exits) and wait for it; safe to call more than once."""
        if self.channel is not None:
            self.channel.close()


if __name__ == "__main__":
    sys.exit(main())
