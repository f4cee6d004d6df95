"""Port counters of another machine of a cluster, read on request by a reader that lives there.

Snapshots (a job's steady-state window, the prompt's `uplinks` and `ports`) and each refresh of
`top` and the live view read every switch port once. A port of a switch on another machine is a
file of that machine's /sys, so the lab keeps one reader there for the run, started on first use
over its SSH connection (recorded with the run's member, so it ends with the run or a dropped
connection):

    python -m fabriclab.cluster.remotecounters

One JSON object per line each way:

    out  {"ready": PID}
    in   "clock"                                          out {"wall": time.time()}
    in   {"read": [[intf, counter], ...],                  out {"wall", "values": [int | null],
          "drops": bool, "states": bool}                        "drops": {intf: n}, "states": {intf: s}}

A reading is dated by the other machine's clock when its files were read, and set onto this
machine's clock by the offset measured when the reader started (remotechannel.py), so a reading
that a busy machine answers late is still dated when it was taken. Its error is that offset's:
half the round trip of the best clock exchange.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys
import threading
import time

from fabriclab.errors import LabError
from fabriclab.measure.counters import SYS_NET, PortCounters, operstates, qdisc_drops
from fabriclab.system.remotechannel import Channel, pairs_of, say

MODULE = "fabriclab.cluster.remotecounters"
MAX_PAIRS = 1 << 16
MAX_REPLY = 1 << 24
# Clocks drift apart (an emulated guest's by tenths of a second a minute): an offset older than
# this is measured again before it is used.
OFFSET_MAX_AGE_S = 10.0


# -- on the other machine ------------------------------------------------------------------------
def main(argv=None, sys_net=SYS_NET):
    if argv:
        print(f"usage: python -m {MODULE} (requests on its input)", file=sys.stderr)
        return 2
    say({"ready": os.getpid()})
    for line in iter(lambda: sys.stdin.readline(MAX_REPLY), ""):
        if line.strip() == "clock":
            say({"wall": time.time()})
            continue
        request = _request(line)
        if request is None:
            say({"error": "expected \"clock\" or {\"read\": [[interface, counter], ...], \"drops\": bool, "
                          "\"states\": bool}"})
            continue
        pairs, drops, states = request
        with PortCounters(pairs, sys_net) as counters:
            wall = time.time()
            reply = {"wall": wall, "values": counters.read()}
        intfs = sorted({intf for intf, _c in pairs})
        if drops:
            reply["drops"] = qdisc_drops(intfs)
        if states:
            reply["states"] = operstates(intfs, sys_net)
        say(reply)
    return 0


def _request(line):
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    if not isinstance(msg, dict) or set(msg) - {"read", "drops", "states"}:
        return None
    pairs = pairs_of(msg.get("read"), MAX_PAIRS)
    drops, states = msg.get("drops", False), msg.get("states", False)
    if pairs is None or not isinstance(drops, bool) or not isinstance(states, bool):
        return None
    return pairs, drops, states


# -- here ----------------------------------------------------------------------------------------
class Reading:
    """Values of (interface, counter) pairs on one machine, read at `time` (this machine's
    monotonic clock) within +- `error_s`; `drops` and `states` {interface: ...} when asked for."""

    def __init__(self, pairs, values, time_, error_s, drops=None, states=None):
        self.pairs, self.values, self.time, self.error_s = pairs, values, time_, error_s
        self.drops, self.states = drops, states

    def by_interface(self):
        """{interface: {counter: value}}, leaving out interfaces with a counter unread (as
        counters.PortCounters.by_interface does here)."""
        out, gone = {}, set()
        for (intf, counter), value in zip(self.pairs, self.values):
            if value is None:
                gone.add(intf)
            else:
                out.setdefault(intf, {})[counter] = value
        return {intf: values for intf, values in out.items() if intf not in gone}


class CounterReader:
    """The reader on `machine`: start() returns once it answers, with the other clock's offset
    measured; read() may be called from several threads (one request at a time)."""

    def __init__(self, machine, record=None, clock=time.monotonic):
        self.machine, self.record, self.clock = machine, record, clock
        self.channel = None
        self.offset_s = self.rtt_s = None
        self.measured_at = None
        self._lock = threading.Lock()

    def start(self):
        self.channel = Channel.opened(self.machine, MODULE, [], f"counter reader on {self.machine.name}",
                                      self.record, then=self._measure)
        return self

    def _measure(self, channel=None):
        self.offset_s, self.rtt_s = (channel or self.channel).clock_offset()
        self.measured_at = self.clock()

    def offset(self):
        """(the other clock minus this one, half the round trip it was measured in), measured
        again when older than OFFSET_MAX_AGE_S."""
        with self._lock:
            if self.measured_at is None or self.clock() - self.measured_at > OFFSET_MAX_AGE_S:
                self._measure()
            return self.offset_s, self.rtt_s / 2

    def read(self, pairs, drops=False, states=False):
        pairs = [tuple(p) for p in pairs]
        if pairs_of([list(p) for p in pairs], MAX_PAIRS) is None:
            raise LabError(f"reading counters on {self.machine.name}: not a list of at most {MAX_PAIRS} "
                           f"(interface, counter) pairs")
        offset, error = self.offset()
        with self._lock:
            reply = self.channel.ask({"read": [list(p) for p in pairs], "drops": drops, "states": states},
                                     limit=MAX_REPLY)
        return self._reading(pairs, reply, drops, states, offset, error)

    def _reading(self, pairs, reply, drops, states, offset, error):
        where = f"reading counters on {self.machine.name}"
        if "error" in reply:
            raise LabError(f"{where}: {str(reply['error'])[:200]}")
        wall, values = reply.get("wall"), reply.get("values")
        if (not isinstance(wall, (int, float)) or not isinstance(values, list) or len(values) != len(pairs)
                or not all(v is None or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64)
                           for v in values)):
            raise LabError(f"{where}: a malformed reply")
        wanted = {intf for intf, _c in pairs}
        extra = {}
        for key, asked, ok in (("drops", drops, lambda v: isinstance(v, int) and v >= 0),
                               ("states", states, lambda v: isinstance(v, str) and len(v) <= 32)):
            got = reply.get(key, {}) if asked else {}
            if not isinstance(got, dict):
                raise LabError(f"{where}: a malformed reply")
            extra[key] = {k: v for k, v in got.items() if k in wanted and ok(v)} if asked else None
        # its wall clock, less the offset, is this machine's wall clock at the read
        here = time.monotonic() - (time.time() - (float(wall) - offset))
        return Reading(pairs, values, here, error, extra["drops"], extra["states"])

    def close(self):
        if self.channel is not None:
            self.channel.close()


def reader_on(cluster, machine):
    """The run's counter reader on `machine`, started on first use and closed with the cluster."""
    def start():
        return CounterReader(machine, lambda pid: cluster.record(
            machine, process={"pid": pid, "role": "counter-reader", "match": MODULE})).start()
    return cluster.helper(machine, MODULE, start)


def clock_offset_s(cluster, machine):
    """`machine`'s wall clock minus this one's, s (as its counter reader measured it, at most
    OFFSET_MAX_AGE_S ago): what a launcher adds to a start time it gives an agent there."""
    return reader_on(cluster, machine).offset()[0]


def read(cluster, machine, pairs, drops=False, states=False):
    """One Reading of `pairs` on `machine`, by its reader (which checks them)."""
    return reader_on(cluster, machine).read(pairs, drops, states)


def read_all(cluster, by_machine, drops=False):
    """{machine name: Reading} for {machine name: (Machine, pairs)}, the machines read at once."""
    if not by_machine:
        return {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(by_machine)) as pool:
        futures = {name: pool.submit(read, cluster, machine, pairs, drops)
                   for name, (machine, pairs) in by_machine.items()}
        return {name: future.result() for name, future in futures.items()}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
