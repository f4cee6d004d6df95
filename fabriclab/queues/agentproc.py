"""The PFC agent in a process of its own, so nothing the lab's Python does can delay a pause.

As a thread of the lab process the agent (queues/pfc.py) waited for the GIL behind the launcher,
the samplers and garbage collection: in CI's quick catalogues of 2026-11-27/28 the XOFF-to-gate
delay had medians of 0.1-0.3 ms but maxima up to 12.6 ms, past the 5 ms the default headroom
covers, and one run dropped lossless packets. Here it runs in an interpreter that does nothing
else, with real-time scheduling (SCHED_FIFO) where the kernel allows it; it owns the ring buffer,
the gates' netlink sockets (opened before the first pause), the watchdog and the leak repair.
The queue model talks to it over a pipe, one JSON object per line each way:

    python -m fabriclab.queues.agentproc --run-id ID

    out {"ready": PID}
    in  {"start": {pins, ports, pfc, accounts, rows, relay}}   out {"started": SCHEDULING}
    in  {"storm": [port, seconds]}          out {"done": 1}
    in  {"dead": [[row, ...], down]}        out {"done": 1}     (cables down: queues/leaks.py)
    in  {"reaction": since_ns} | {"repairs": since_ns}          (time.monotonic_ns(): one clock a machine)
    in  snapshot | alarms | errors          out {"snapshot": [[port, row], ...]} | {"alarms": [...]} | ...
    in  {"pfc": [kind, port, waited_ns]}    a pause relayed from another machine (not answered)
    out {"pfc": [kind, port, age_ns]}       a pause for a port on another machine, at any time

A request it cannot carry out gets {"error": "..."}. It stops when its input ends: with the run,
or with a lab that was killed. Its command line carries the run's id, and the lab records its PID
with the run, so `fabriclab clean` knows it by both.
"""

from __future__ import annotations

import ctypes
import gc
import json
import math
import os
import pathlib
import sys
import types

from fabriclab.errors import LabError
from fabriclab.loading import excerpt
from fabriclab.queues.config import WATCHDOG_ACTIONS
from fabriclab.queues.datapath import EV_XOFF, EV_XON, Ctl, Map, QStat, pinned_events
from fabriclab.queues.gate import Gates
from fabriclab.queues.leaks import Account, LeakRepair
from fabriclab.queues.pfc import PfcAgent
from fabriclab.system.procs import helper_run_id
from fabriclab.system.remotechannel import Channel, Conversation, say

MODULE = "fabriclab.queues.agentproc"
MAX_LINE = 1 << 24               # a start request of a large fabric's ports and accounts
MAX_PORTS = 1 << 16
MAX_STORM_S = 3600.0
MAX_AGE_NS = 10 ** 12
ANSWER_TIMEOUT_S = 30.0
PRIORITY = 10                    # SCHED_FIFO: above every normal process, below the kernel's own threads
PORT_FIELDS = ("idx", "name", "ns_pid", "ifindex", "open_rate_bytes", "open_burst", "closed_burst", "gate_limit")
PFC_FIELDS = ("watchdog_ms", "watchdog_action", "restore_ms")
ACCOUNT_FIELDS = ("row", "port", "cls", "egress_rows", "xon", "upstream")
_NAMED = ("snapshot", "alarms", "errors")


# -- in the agent's process ----------------------------------------------------------------------
def realtime(priority=PRIORITY):
    """Ask for SCHED_FIFO for this thread and those it starts; what the process got, as text."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except (OSError, AttributeError) as exc:
        return f"SCHED_OTHER (SCHED_FIFO refused: {getattr(exc, 'strerror', None) or exc})"
    return f"SCHED_FIFO {priority}"


def main(argv=None):
    if helper_run_id(MODULE, argv) is None:
        return 2
    say({"ready": os.getpid()})
    agent = None
    try:
        for line in iter(lambda: sys.stdin.readline(MAX_LINE), ""):
            if agent is None:
                agent, answer = _start(line)
            else:
                answer = _answer(agent, line)
            if answer is not None:
                say(answer)
    finally:
        if agent is not None:
            agent.stop()
            agent.gates.close()
    return 0


def _start(line):
    try:
        config = start_config(json.loads(line))
        pins = config["pins"]
        maps = types.SimpleNamespace(stats=Map.pinned(pins / "stats", ctypes.c_uint32, QStat),
                                     bias=Map.pinned(pins / "bias", ctypes.c_uint32, ctypes.c_int64),
                                     ctl=Map.pinned(pins / "ctl", ctypes.c_uint32, Ctl))
        events = pinned_events(pins)
        if None in (maps.stats, maps.bias, maps.ctl) or events is None:
            raise ValueError(f"start: the queue model's maps are not pinned under {excerpt(str(pins))}")
        maps.events_fd = lambda: events
        gates = Gates()
        gates.open({p.ns_pid for p in config["ports"].values()})
        scheduling = realtime()
        relay = (lambda kind, port, age_ns: say({"pfc": [kind, port, age_ns]})) if config["relay"] else None
        agent = PfcAgent(maps, config["ports"], gates, config["pfc"], relay=relay, rows=config["rows"],
                         leaks=LeakRepair(config["accounts"]) if config["accounts"] else None)
        agent.start()
        gc.freeze()                    # what start built is never collected: later passes are short
    except (ValueError, LabError, OSError) as exc:
        return None, {"error": str(exc)[:300]}
    return agent, {"started": scheduling}


def _int(value, low, high):
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < high


def _number(value, low, high):
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and low <= value <= high)


def start_config(msg):
    """The start request, checked as hostile: ValueError naming what is wrong."""
    keys = {"pins", "ports", "pfc", "accounts", "rows", "relay"}
    config = msg.get("start") if isinstance(msg, dict) and set(msg) == {"start"} else None
    if not isinstance(config, dict) or set(config) != keys:
        raise ValueError(f"expected {{\"start\": {{{', '.join(sorted(keys))}}}}}")
    pins = config["pins"]
    if not (isinstance(pins, str) and pins.startswith("/sys/fs/bpf/fabriclab/") and ".." not in pins
            and len(pins) < 256):
        raise ValueError("start: pins must be a folder of the lab's under /sys/fs/bpf/fabriclab")
    rows = config["rows"]
    if not _int(rows, 1, MAX_PORTS * 4):
        raise ValueError("start: rows must be the data path's row count")
    ports = {}
    if not isinstance(config["ports"], list) or not 0 < len(config["ports"]) <= MAX_PORTS:
        raise ValueError("start: ports must list this machine's ports")
    for row in config["ports"]:
        if not (isinstance(row, list) and len(row) == len(PORT_FIELDS)):
            raise ValueError(f"start: a port must be [{', '.join(PORT_FIELDS)}]")
        port = types.SimpleNamespace(**dict(zip(PORT_FIELDS, row)))
        if not (_int(port.idx, 0, rows) and isinstance(port.name, str) and 0 < len(port.name) <= 15
                and (port.ns_pid is None or _int(port.ns_pid, 1, 1 << 22)) and _int(port.ifindex, 1, 1 << 31)
                and all(_int(getattr(port, f), 0, 1 << 40) for f in PORT_FIELDS[4:])):
            raise ValueError(f"start: a malformed port {excerpt(json.dumps(row))}")
        ports[port.idx] = port
    pfc = config["pfc"]
    if not (isinstance(pfc, dict) and set(pfc) == set(PFC_FIELDS) and _number(pfc["watchdog_ms"], 0, 1e9)
            and pfc["watchdog_action"] in WATCHDOG_ACTIONS and _number(pfc["restore_ms"], 0, 1e9)):
        raise ValueError(f"start: pfc must be {{{', '.join(PFC_FIELDS)}}} in range")
    accounts = []
    if not isinstance(config["accounts"], list) or len(config["accounts"]) > rows:
        raise ValueError("start: accounts must list the leak repair's accounts")
    for row in config["accounts"]:
        if not (isinstance(row, list) and len(row) == len(ACCOUNT_FIELDS)):
            raise ValueError(f"start: an account must be [{', '.join(ACCOUNT_FIELDS)}]")
        fields = dict(zip(ACCOUNT_FIELDS, row))
        if not (_int(fields["row"], 0, rows) and isinstance(fields["port"], str) and isinstance(fields["cls"], str)
                and isinstance(fields["egress_rows"], list) and all(_int(r, 0, rows) for r in fields["egress_rows"])
                and (fields["xon"] is None or _int(fields["xon"], 0, 1 << 40))
                and (fields["upstream"] is None or _int(fields["upstream"], 0, rows))):
            raise ValueError(f"start: a malformed account {excerpt(json.dumps(row))}")
        accounts.append(Account(**{**fields, "egress_rows": tuple(fields["egress_rows"])}))
    if not isinstance(config["relay"], bool):
        raise ValueError("start: relay must be true or false")
    return {**config, "pins": pathlib.Path(pins), "ports": ports, "accounts": accounts,
            "pfc": types.SimpleNamespace(**pfc)}


def _answer(agent, line):
    text = line.strip()
    try:
        msg = text if text in _NAMED else json.loads(text)
    except ValueError:
        return {"error": "not JSON"}
    try:
        if msg == "snapshot":
            return {"snapshot": [[idx, row] for idx, row in agent.snapshot().items()]}
        if msg == "alarms":
            return {"alarms": list(agent.alarms)}
        if msg == "errors":
            return {"errors": list(agent.errors)}
        if isinstance(msg, dict) and len(msg) == 1:
            (key, value), = msg.items()
            return _keyed(agent, key, value)
    except (LabError, OSError, ValueError, KeyError, TypeError) as exc:
        return {"error": str(exc)[:200]}
    return {"error": f"unknown request {excerpt(text)}"}


def _keyed(agent, key, value):
    if key == "pfc":
        if (isinstance(value, list) and len(value) == 3 and value[0] in (EV_XOFF, EV_XON)
                and _int(value[1], 0, MAX_PORTS * 4) and _int(value[2], 0, MAX_AGE_NS)):
            try:
                agent.relayed(*value)
            except ValueError as exc:
                agent.note(f"a relayed pause {excerpt(json.dumps(value))}: {exc}")
        else:
            agent.note(f"a malformed relayed pause {excerpt(json.dumps(value))}")
        return None                      # pauses are not answered
    if key == "storm" and isinstance(value, list) and len(value) == 2 and value[0] in agent.state \
            and _number(value[1], 0, MAX_STORM_S):
        agent.storm(*value)
        return {"done": 1}
    if key == "dead" and isinstance(value, list) and len(value) == 2 and isinstance(value[1], bool) \
            and isinstance(value[0], list) and all(_int(r, 0, agent.rows) for r in value[0]):
        if agent.leaks is not None:
            agent.leaks.set_dead(value[0], value[1])
        return {"done": 1}
    # since_ns: a time of this machine's monotonic clock, before its boot when a long-running lab
    # on another machine asks about its whole run (negative, then)
    if key in ("reaction", "repairs") and _int(value, -(1 << 63), 1 << 63):
        if key == "reaction":
            return {"reaction": agent.reaction_stats(value)}
        return {"repairs": agent.repairs_since(value)}
    return {"error": f"a malformed {excerpt(key)} request"}


# -- in the lab ------------------------------------------------------------------------------------
class AgentProcess:
    """The lab's handle on its agent process: the PfcAgent calls the queue model makes, over the
    pipe. `relay(kind, port, age_ns)` carries pauses for other machines' ports; `record(pid)`
    tells the run of the process."""

    def __init__(self, run_id, pins, ports, pfc, accounts, rows, relay=None, record=None):
        self.run_id, self.relay, self.record = run_id, relay, record
        self.config = {"pins": str(pins), "rows": rows, "relay": relay is not None,
                       "ports": [[getattr(p, f) for f in PORT_FIELDS] for p in ports],
                       "pfc": {f: getattr(pfc, f) for f in PFC_FIELDS},
                       "accounts": [[list(getattr(a, f)) if f == "egress_rows" else getattr(a, f)
                                     for f in ACCOUNT_FIELDS] for a in accounts]}
        self.talk = Conversation("the PFC agent", self._unasked, ANSWER_TIMEOUT_S)
        self.scheduling = None
        self.errors_here = []            # what went wrong on this side: a relay, the process's end

    @property
    def proc(self):
        return self.talk.channel.proc if self.talk.channel is not None else None

    def start(self):
        channel = Channel.opened(None, MODULE, ["--run-id", self.run_id], "the PFC agent", self.record)
        try:
            self.talk.attach(channel, "pfc-agent")
            self.scheduling = self._ask({"start": self.config}, "started")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        self.talk.close()

    def _unasked(self, msg):
        """A pause for another machine's port, the only thing the agent says unasked."""
        pause = msg.get("pfc") if len(msg) == 1 else None
        if pause is None:
            return False
        try:
            self.relay(*pause)
        except Exception as exc:             # a pause lost on the way must show in the results
            self.errors_here.append(f"relaying a pause {excerpt(json.dumps(pause))}: {type(exc).__name__}: {exc}")
        return True

    def _send(self, obj):
        self.talk.send(obj)

    def _ask(self, request, key):
        return self.talk.ask(request, key)

    # -- what the queue model calls -------------------------------------------------------------
    def storm(self, idx, seconds):
        self._ask({"storm": [idx, seconds]}, "done")

    def relayed(self, kind, idx, waited_ns=0):
        self._send({"pfc": [kind, idx, int(waited_ns)]})

    def set_dead(self, rows, down):
        self._ask({"dead": [list(rows), bool(down)]}, "done")

    def reaction_stats(self, since_ns=0):
        stats = self._ask({"reaction": int(since_ns)}, "reaction")
        return {**stats, "scheduling": self.scheduling} if isinstance(stats, dict) else stats

    def repairs_since(self, since_ns=0):
        return self._ask({"repairs": int(since_ns)}, "repairs")

    def snapshot(self):
        return {idx: row for idx, row in self._ask("snapshot", "snapshot")}

    @property
    def alarms(self):
        return self._ask("alarms", "alarms")

    @property
    def errors(self):
        """Its errors and this side's; a process that ended says why, rather than raising."""
        try:
            theirs = self._ask("errors", "errors")
        except LabError as exc:
            theirs = [str(exc)]
        return theirs + list(self.errors_here)

    def note(self, text):
        self.errors_here.append(text)


if __name__ == "__main__":
    sys.exit(main())
