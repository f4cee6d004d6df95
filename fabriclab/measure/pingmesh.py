"""The latency monitor: a ping mesh between chosen host ports, Pingmesh style (Guo et al.,
SIGCOMM 2015), in the lossless and the lossy class, through a whole run.

Seed 000 section 6.4.1: a switch image raised port-to-port latency while every congestion metric
stayed in its baseline; only constant latency monitoring, loaded and unloaded, finds that. Each
pair (lab/probepairs.py chooses them and says which switches each one crosses) runs one `ping`
per class in its source host's namespace for the whole run, its DSCP in the IP header's TOS byte
(the queue model queues ICMP by DSCP like any IPv4 packet), a timestamp on every line. What it
printed is parsed here into samples; a sample taken before the traffic's origin is unloaded, one
between the origin and the end of the measured jobs loaded. The summary has percentiles per pair
and per switch; `regressions` is the rule `compare` applies against a baseline.
"""

from __future__ import annotations

import math
import re
import signal
import subprocess
import threading
import time

from fabriclab.errors import LabError
from fabriclab.system.netns import in_namespace
from fabriclab.system.procs import end_children

CLASSES = ("lossless", "lossy")
PHASES = ("unloaded", "loaded")
# `ping -D -O`: "[1764637200.123456] 64 bytes from 10.1.2.1: icmp_seq=3 ttl=62 time=12.3 ms" and
# "[1764637200.223456] no answer yet for icmp_seq=4"
_REPLY = re.compile(r"^\[(\d+(?:\.\d+)?)\] \d+ bytes from [^:]+: icmp_seq=(\d+) .*time=([\d.]+) ms")
_LOST = re.compile(r"^\[(\d+(?:\.\d+)?)\] no answer yet for icmp_seq=(\d+)")
MIN_INTERVAL_MS = 10.0           # ping's floor for root is 2 ms; 10 keeps 2 cores' share small
MAX_PROBES = 64                  # pairs x classes: one ping process each for the whole run
PERCENTILES = (50, 90, 99)


def parse_ping(text):
    """[(unix time, icmp_seq, RTT ms or None when no answer came)] from `ping -D -O` output,
    sorted by sequence; a sequence first reported lost and answered later counts as answered."""
    out = {}
    for line in text.splitlines():
        reply = _REPLY.match(line.strip())
        if reply:
            out[int(reply.group(2))] = (float(reply.group(1)), int(reply.group(2)), float(reply.group(3)))
            continue
        lost = _LOST.match(line.strip())
        if lost and int(lost.group(2)) not in out:
            out[int(lost.group(2))] = (float(lost.group(1)), int(lost.group(2)), None)
    return [out[seq] for seq in sorted(out)]


def percentile(values, q):
    """The q-th percentile of `values` by linear interpolation between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        return None
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def stats(rtts, lost=0):
    """{"n", "lost", "p50_ms", "p90_ms", "p99_ms", "max_ms"} of RTT samples (None where there are none)."""
    out = {"n": len(rtts), "lost": lost}
    for q in PERCENTILES:
        value = percentile(rtts, q)
        out[f"p{q}_ms"] = None if value is None else round(value, 4)
    out["max_ms"] = round(max(rtts), 4) if rtts else None
    return out


def phase_of(t, origin, end, quiet_end=None):
    """"unloaded" before `quiet_end` (the jobs' launch; the origin when None), "loaded" from the
    traffic's origin to its end, None otherwise (the agents starting, which loads the CPU
    without traffic; after the end)."""
    if t < (origin if quiet_end is None else min(quiet_end, origin)):
        return "unloaded"
    return "loaded" if origin <= t <= end else None


def summarize(probes, samples, origin, end, quiet_end=None):
    """The results' `telemetry.latency` (less its settings): per pair and class the RTT
    percentiles unloaded and loaded, and per switch those of the pairs that must cross it (every
    path does) and of those that may (some paths do).

    `probes`: [{"src", "dst", "class", "must", "may"}]; `samples`: one list of parse_ping
    tuples per probe; `origin`, `end`: the traffic's unix times; `quiet_end`: when the jobs were
    launched (Pingmesh.quiet_end)."""
    pairs, by_switch = [], {}
    for probe, taken in zip(probes, samples):
        row = {"src": probe["src"], "dst": probe["dst"], "class": probe["class"],
               "must": sorted(probe["must"]), "may": sorted(probe["may"])}
        for phase in PHASES:
            mine = [(t, rtt) for t, _seq, rtt in taken if phase_of(t, origin, end, quiet_end) == phase]
            rtts = [rtt for _t, rtt in mine if rtt is not None]
            row[phase] = stats(rtts, sum(1 for _t, rtt in mine if rtt is None))
            for how in ("must", "may"):
                for switch in probe[how]:
                    cell = by_switch.setdefault(switch, {}).setdefault(probe["class"], {}).setdefault(
                        how, {p: ([], 0) for p in PHASES})
                    old, lost = cell[phase]
                    cell[phase] = (old + rtts, lost + row[phase]["lost"])
        pairs.append(row)
    switches = {switch: {cls: {how: {phase: stats(*cell[phase]) for phase in PHASES}
                               for how, cell in sorted(kinds.items())}
                         for cls, kinds in sorted(classes.items())}
                for switch, classes in sorted(by_switch.items())}
    return {"pairs": pairs, "switches": switches}


def check_threshold(threshold):
    """A regression threshold: a finite fraction > 0; LabError in one line otherwise."""
    if isinstance(threshold, bool) or not (isinstance(threshold, (int, float)) and math.isfinite(threshold)
                                           and threshold > 0):
        raise LabError(f"a latency threshold is a fraction > 0 (0.2: 20 % slower), got {threshold!r}")
    return float(threshold)


def regressions(base, new, threshold, measure="p50_ms"):
    """The regression rule of `compare --baseline`: a pair (src, dst, class) slowed when, in one
    phase, its `measure` grew by more than `threshold` (0.2: 20 %) over the baseline's. Returns
    {"slowed": [{src, dst, class, phase, base_ms, new_ms, change}], "must_cross": the switches
    every slowed pair must cross, "culprits": those of them no pair that kept its latency must
    cross}. Pairs in only one of the two are left out."""
    check_threshold(threshold)
    old = {(p["src"], p["dst"], p["class"]): p for p in base.get("pairs", [])}
    slowed, kept = [], []
    for pair in new.get("pairs", []):
        before = old.get((pair["src"], pair["dst"], pair["class"]))
        if before is None:
            continue
        worst = None
        for phase in PHASES:
            a, b = before[phase].get(measure), pair[phase].get(measure)
            if a is None or b is None or a <= 0:
                continue
            change = b / a - 1
            if change > threshold and (worst is None or change > worst["change"]):
                worst = {"src": pair["src"], "dst": pair["dst"], "class": pair["class"], "phase": phase,
                         "base_ms": a, "new_ms": b, "change": round(change, 4)}
        (slowed if worst else kept).append((pair, worst))
    must = set.intersection(*(set(pair["must"]) for pair, _ in slowed)) if slowed else set()
    spared = set().union(*(set(pair["must"]) for pair, _ in kept)) if kept else set()
    return {"slowed": [w for _pair, w in slowed], "must_cross": sorted(must), "culprits": sorted(must - spared)}


class Pingmesh:
    """One `ping` per probe for a whole run, each in its source host's namespace. `probes`:
    [{"src_ns": a PID in the source's namespace, "src_ip", "dst_ip", "tos", ...}]; `record(pid)`
    registers a process with the run (its teardown ends it if the lab is killed)."""

    def __init__(self, probes, interval_ms, record=None):
        if not (isinstance(interval_ms, (int, float)) and math.isfinite(interval_ms)
                and interval_ms >= MIN_INTERVAL_MS):
            raise LabError(f"the latency monitor's interval is at least {MIN_INTERVAL_MS:g} ms, got {interval_ms!r}")
        if not 0 < len(probes) <= MAX_PROBES:
            raise LabError(f"the latency monitor runs 1 to {MAX_PROBES} probes (pairs x 2 classes), "
                           f"got {len(probes)}; choose fewer pairs")
        self.probes, self.interval_ms, self.record = probes, float(interval_ms), record
        self.procs = []
        self.outputs = []
        self.quiet_end = None
        self._readers = []

    def argv(self, probe):
        wait_s = max(1, math.ceil(4 * self.interval_ms / 1000))
        return in_namespace(probe["src_ns"], [
            "ping", "-n", "-D", "-O", "-i", f"{self.interval_ms / 1000:.3f}", "-W", str(wait_s),
            "-Q", str(probe["tos"]), "-I", probe["src_ip"], probe["dst_ip"]])

    def start(self, warm_probes=0):
        """Start every ping; with `warm_probes`, wait that many intervals (the unloaded samples
        taken before any traffic)."""
        try:
            for probe in self.probes:
                proc = subprocess.Popen(self.argv(probe), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)
                self.procs.append(proc)
                if self.record is not None:
                    self.record(proc.pid)
                chunks = []
                self.outputs.append(chunks)
                reader = threading.Thread(target=_drain, args=(proc.stdout, chunks), daemon=True,
                                          name="pingmesh-read")
                reader.start()
                self._readers.append(reader)
        except BaseException:
            self.stop()
            raise
        time.sleep(warm_probes * self.interval_ms / 1000)
        self.quiet_end = time.time()       # the jobs start now: their agents' start-up is not "unloaded"
        return self

    def stop(self):
        """End every ping and return one parse_ping list per probe."""
        end_children(self.procs, signal.SIGINT)   # ping prints its summary on SIGINT
        for reader in self._readers:
            reader.join(timeout=5)
        return [parse_ping("".join(chunks)) for chunks in self.outputs]


def _drain(stream, chunks):
    for line in stream:
        chunks.append(line)
