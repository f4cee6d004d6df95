"""Is a run's result about the fabric or about this machine's CPU?

Two readings, both from /proc: how busy all cores were, and how busy Open vSwitch's forwarding
thread was. The userspace datapath forwards every non-DPDK port from ovs-vswitchd's main thread,
so one saturated core caps the whole fabric while the machine as a whole looks half idle; packets
then vanish in socket buffers no counter reports. Either reading at or above SATURATED makes a
run invalid.
"""

from __future__ import annotations

import os
import pathlib
import time

SATURATED = 0.90
OVS_PIDFILE = pathlib.Path("/var/run/openvswitch/ovs-vswitchd.pid")


def _machine():
    fields = [int(v) for v in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields), fields[3] + fields[4]


def _ovs_main_thread_ticks():
    try:
        pid = int(OVS_PIDFILE.read_text().strip())
        stat = pathlib.Path(f"/proc/{pid}/task/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])      # utime + stime, in clock ticks


def sample():
    """The CPU counters now; two samples give the load between them (see `between`)."""
    total, idle = _machine()
    return {"time": time.monotonic(), "total": total, "idle": idle, "ovs": _ovs_main_thread_ticks()}


def between(a, b):
    """{'machine': share of all cores busy, 'ovs_forwarding': share of one core} from a to b."""
    seconds = b["time"] - a["time"]
    dt, di = b["total"] - a["total"], b["idle"] - a["idle"]
    machine = round(1 - di / dt, 3) if dt > 0 else None
    ovs = None
    if a["ovs"] is not None and b["ovs"] is not None and seconds > 0:
        ovs = round((b["ovs"] - a["ovs"]) / os.sysconf("SC_CLK_TCK") / seconds, 3)
    return {"machine": machine, "ovs_forwarding": ovs}


class CpuMeter:
    """Start it before something, read it after: the load in between."""

    def __init__(self):
        self.start = sample()

    def read(self):
        return between(self.start, sample())


def valid(load):
    """True when neither the machine nor OVS's forwarding thread was saturated."""
    return all(v is None or v < SATURATED for v in load.values())
