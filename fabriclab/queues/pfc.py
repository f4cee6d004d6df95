"""The PFC agent: turns the data path's XOFF/XON events into closed and open gates, runs the PFC
watchdog, and injects pause storms.

It runs in a process of its own (queues/agentproc.py), never in the lab's: there it waited for the
GIL behind everything else the lab did. It sleeps in the ring buffer's epoll until an event
arrives, so an idle fabric costs nothing; a pause takes effect in well under a millisecond of wall
time (the netlink change), which the default headroom (`reaction_ms`) covers with margin.

Watchdog (seed 000 section 6.3.2): a gate closed for longer than `watchdog_ms` raises an alarm; the
gate opens, pauses aimed at that port are ignored for `restore_ms`, and with action `drop` the data
path drops new packets of that class at that port for the same time (the stuck queue drains onto
the wire first). After the restoration period a port still asked to pause is paused again.

Across machines (a fabric split over a cluster) each machine runs an agent for the gates of its
own ports. An XOFF or XON for a port on another machine goes to `relay(kind, port, age_ns)`, which
the lab carries there, and arrives at that machine's agent as `relayed(kind, port, waited_ns)`.

Leak repair (queues/leaks.py): every LEAK_CHECK_NS the agent corrects ingress accounts that a
packet dropped inside OVS left high, and opens the gate of a port that was left paused by them.
"""

from __future__ import annotations

import collections
import ctypes
import sys
import threading
import time

from fabriclab.queues.config import LOSSLESS
from fabriclab.queues.datapath import EV_XOFF, EV_XON, NCLASS, Ctl, RingBuffer
from fabriclab.queues.gate import CLOSED_RATE


class GateState:
    __slots__ = ("wanted", "storm_until", "closed", "closed_since", "restore_until", "closes", "closed_ns",
                 "watchdog_fires")

    def __init__(self):
        self.wanted = False          # the peer's XOFF is in force
        self.storm_until = 0         # an injected pause storm holds the gate closed until then (ns)
        self.closed = False
        self.closed_since = 0
        self.restore_until = 0
        self.closes = 0
        self.closed_ns = 0
        self.watchdog_fires = 0


REACTIONS_KEPT = 10_000
REPAIRS_KEPT = 10_000
SWITCH_INTERVAL_S = 0.0005
LEAK_CHECK_NS = 25_000_000


class PfcAgent:
    def __init__(self, datapath, ports, gates, pfc, clock=time.monotonic_ns, leaks=None, relay=None, rows=None):
        """`ports` maps a port index to an object with ns_pid, ifindex, name, open_rate_bytes,
        open_burst, gate_limit and closed_burst: the ports whose gates this agent runs; `leaks` is
        a LeakRepair (None: no repair); `relay(kind, port, age_ns)` carries a pause for any other
        port (raised age_ns ago) to the machine it runs on (None: there is no other); `rows` the data path's map rows (by
        default, those of `ports`)."""
        self.datapath, self.ports, self.gates, self.pfc = datapath, ports, gates, pfc
        self.leaks = leaks
        self.relay = relay
        self.rows = rows if rows is not None else len(ports) * NCLASS
        self.relayed_out = 0         # pauses and resumes sent to another machine's agent
        self.relayed_in = 0
        # XOFF-to-gate-closed of pauses relayed from another machine (estimated: see relayed())
        self.relayed_reactions = collections.deque(maxlen=REACTIONS_KEPT)
        self.repairs = collections.deque(maxlen=REPAIRS_KEPT)
        self._next_leak_check = 0
        self.clock = clock
        self.state = {idx: GateState() for idx in ports}
        self.alarms = []
        self.errors = []
        self.events = 0
        # ns from the eBPF program's XOFF to the gate closed: the lab's PFC reaction time, which
        # the headroom (reaction_ms) must cover. Bounded: the most recent ones.
        self.reactions = collections.deque(maxlen=REACTIONS_KEPT)
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self._ring = None

    # -- thread ---------------------------------------------------------------------------------
    def start(self):
        # The agent's process (queues/agentproc.py) has a second thread, the pipe's reader; with
        # Python's default 5 ms switch interval an XOFF could wait that long for the GIL, the whole
        # headroom of a port at lab rates. 0.5 ms keeps the reaction well inside it.
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        self._ring = RingBuffer(self.datapath.events_fd(), self._on_event)
        self._thread = threading.Thread(target=self._run, name="fabriclab-pfc", daemon=True)
        self._thread.start()

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._ring is not None:
            self._ring.close()
            self._ring = None

    def _run(self):
        tick_ms = 20
        if self.pfc.watchdog_ms:
            tick_ms = max(1, min(tick_ms, int(self.pfc.watchdog_ms / 4)))
        while not self._stop.is_set():
            try:
                self._ring.poll(tick_ms)
                self.tick()
            except Exception as exc:           # a broken gate must not kill the agent silently
                self.errors.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.05)

    def _on_event(self, event):
        if event.cls != LOSSLESS:
            return
        if event.target not in self.state:
            self._send(event.kind, event.target, event.ts)
            return
        self.events += 1
        try:
            with self.lock:
                # What came before `picked` is waiting (the wake-up, the lock); after it, the gate's
                # netlink change (the kernel's rtnl lock): a slow reaction says which it was.
                picked = self.clock()
                st = self.state[event.target]
                if event.kind == EV_XOFF:
                    st.wanted = True
                elif event.kind == EV_XON:
                    st.wanted = False
                self._apply(event.target, st, picked)
                if event.kind == EV_XOFF and event.ts:
                    self.reactions.append((event.ts, self.clock() - event.ts, picked - event.ts))
        except Exception as exc:               # raised inside libbpf's callback: keep it, don't lose it
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def _send(self, kind, target, ts=0):
        if self.relay is None:
            return
        try:
            self.relay(kind, target, max(0, self.clock() - ts) if ts else 0)
            self.relayed_out += 1
        except Exception as exc:               # a pause lost on the way must show in the results
            self.errors.append(f"relaying a pause to port {target}: {type(exc).__name__}: {exc}")

    def relayed(self, kind, target, waited_ns=0):
        """An XOFF (EV_XOFF) or XON (EV_XON) another machine's data path sent to local port `target`,
        `waited_ns` ago (its age when sent there plus the relay's one-way estimate: an estimate)."""
        if kind not in (EV_XOFF, EV_XON) or target not in self.state:
            raise ValueError(f"no pause {kind!r} for port {target!r} here")
        with self.lock:
            self.relayed_in += 1
            st = self.state[target]
            st.wanted = kind == EV_XOFF
            start = self.clock()
            self._apply(target, st, start)
            if kind == EV_XOFF and waited_ns:
                self.relayed_reactions.append((start - waited_ns, waited_ns + self.clock() - start))

    # -- decisions ----------------------------------------------------------------------------
    def _apply(self, idx, st, now):
        restoring = st.restore_until > now
        close = (st.wanted or st.storm_until > now) and not restoring
        if close == st.closed:
            return
        port = self.ports[idx]
        if close:
            self.gates.set(port.ns_pid, port.ifindex, CLOSED_RATE, port.closed_burst, port.gate_limit, port.name)
            st.closed, st.closed_since = True, now
            st.closes += 1
        else:
            self.gates.set(port.ns_pid, port.ifindex, port.open_rate_bytes, port.open_burst, port.gate_limit,
                           port.name)
            st.closed = False
            st.closed_ns += now - st.closed_since

    def tick(self):
        """Watchdog, restoration and storm expiry; runs at least every tick of the poll loop."""
        now = self.clock()
        with self.lock:
            for idx, st in self.state.items():
                if (st.closed and self.pfc.watchdog_ms
                        and now - st.closed_since > self.pfc.watchdog_ms * 1e6):
                    self._fire_watchdog(idx, st, now)
                elif st.restore_until and st.restore_until <= now:
                    st.restore_until = 0
                self._apply(idx, st, now)
        if self.leaks is not None and now >= self._next_leak_check:
            self._next_leak_check = now + LEAK_CHECK_NS
            self.repair_leaks(now)

    def repair_leaks(self, now):
        """Correct leaked ingress accounts (see queues/leaks.py); returns the repairs made."""
        stats = self.datapath.stats.lookup_all(self.rows)
        repairs = self.leaks.check(now, stats)
        for fix in repairs:
            self.datapath.bias.update(fix.row, ctypes.c_int64(fix.bias))
            if fix.resume is not None and fix.resume in self.state:
                # Nothing is left in the switch to send the XON: open the upstream's gate here;
                # the port's next arrival clears its paused flag in the data path.
                with self.lock:
                    st = self.state[fix.resume]
                    st.wanted = False
                    self._apply(fix.resume, st, now)
            elif fix.resume is not None:
                self._send(EV_XON, fix.resume)
        self.repairs.extend(repairs)
        return repairs

    def _fire_watchdog(self, idx, st, now):
        st.watchdog_fires += 1
        st.restore_until = now + int(self.pfc.restore_ms * 1e6)
        self.alarms.append({"port": self.ports[idx].name, "class": "lossless", "t_ns": now,
                            "paused_ms": round((now - st.closed_since) / 1e6, 1),
                            "action": self.pfc.watchdog_action})
        if self.pfc.watchdog_action == "drop":
            self.datapath.ctl.update(idx * NCLASS + LOSSLESS, Ctl(st.restore_until))

    # -- injection ------------------------------------------------------------------------------
    def storm(self, idx, seconds):
        """Hold port idx's lossless gate closed for `seconds`, as a NIC streaming pause frames
        at it would (0 ends a storm)."""
        now = self.clock()
        with self.lock:
            st = self.state[idx]
            st.storm_until = now + int(seconds * 1e9) if seconds > 0 else 0
            self._apply(idx, st, now)

    def reaction_stats(self, since_ns=0):
        """The XOFF-to-gate-closed delay (ms) over the pauses since `since_ns` (the clock's time):
        median, p99 and worst, and the longest of its two parts (`max_wait_ms`: until the agent
        had the event; `max_gate_change_ms`: the netlink change); with other machines, how many pauses went to and came from them,
        and the delay of those that came (`relayed`, estimated)."""
        with self.lock:
            own = [(delay, waited) for ts, delay, waited in self.reactions if ts >= since_ns]
            stats = _percentiles([delay for delay, _ in own])
            if own:
                stats["max_wait_ms"] = round(max(waited for _, waited in own) / 1e6, 3)
                stats["max_gate_change_ms"] = round(max(delay - waited for delay, waited in own) / 1e6, 3)
            if self.relay is None:
                return stats
            relayed = _percentiles([delay for ts, delay in self.relayed_reactions if ts >= since_ns])
        return {**stats, "relayed_out": self.relayed_out, "relayed_in": self.relayed_in,
                "relayed": {**relayed, "estimated": "its age when relayed + half the relay's round trip"}}

    def repairs_since(self, since_ns=0):
        """The leak repairs made since `since_ns` (the clock's time), described, oldest first."""
        return [r.describe() for r in list(self.repairs) if r.t_ns >= since_ns]

    def note(self, text):
        """An error found outside the agent about its work (a malformed relayed pause)."""
        self.errors.append(text)

    def snapshot(self):
        """Per port: closes, time closed (ms, including a pause in progress), watchdog fires."""
        now = self.clock()
        with self.lock:
            return {idx: {"gate_closes": st.closes,
                          "gate_closed_ms": round((st.closed_ns + (now - st.closed_since if st.closed else 0))
                                                  / 1e6, 3),
                          "gate_closed": st.closed,
                          "watchdog_fires": st.watchdog_fires}
                    for idx, st in self.state.items()}


def _percentiles(delays_ns):
    """{"pauses", "p50_ms", "p99_ms", "max_ms"} of delays in ns ({"pauses": 0} when none)."""
    values = sorted(delays_ns)
    if not values:
        return {"pauses": 0}
    pick = lambda q: round(values[min(len(values) - 1, int(q * len(values)))] / 1e6, 3)   # noqa: E731
    return {"pauses": len(values), "p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": round(values[-1] / 1e6, 3)}
