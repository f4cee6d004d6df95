"""The live view's data: a thread that reads the same counters the results' samplers read (the
switch ports' veth counters, measure/portsampler.py; the queue model's eBPF stats map, as
queues/sampler.py does) every `refresh_s`, and turns each reading into one frame for the page:

    {"seq", "t", "clock", "rates": {link id: {"up": Mbit/s, "down": Mbit/s}},
     "queues": {link id: {"up": {occ, high, marks, drops, pause_tx, paused}}},
     "down": [link id], "degraded": {link id: text}, "events": [[t, text]], "jobs": [...],
     "timeline": {...} | None, "error": text | None}

`t` counts seconds since the feed started, as the events' times do. Queue counters are totals
since the queue model started; occupancy is the level at the reading, `high` its high-water mark.
"""

from __future__ import annotations

import threading
import time

from fabriclab.loading import clip
from fabriclab.measure import portsampler
from fabriclab.measure.counters import SYS_NET
from fabriclab.measure.grid import SamplingThread
from fabriclab.view.frames import directions
from fabriclab.view.layout import link_id

REFRESH_S = 0.5
MAX_EVENTS = 60            # the fault log's latest lines sent with each frame


def link_rates(dirs, before, after, seconds):
    """{link id: {"up"|"down": Mbit/s}} from two readings ({column: bytes}) `seconds` apart; a
    counter that went backwards (an interface recreated) reads as 0."""
    out = {}
    for name, (ident, way, _egress) in dirs.items():
        moved = max(0, (after.get(name) or 0) - (before.get(name) or 0))
        out.setdefault(ident, {})[way] = round(moved * 8 / seconds / 1e6, 3) if seconds > 0 else 0.0
    return out


def port_queues(dirs, ports):
    """{link id: {way: fields}} from {egress port: fields}, only where the queue model has seen
    something (a port with every field 0 is left out, as in the report)."""
    out = {}
    for _name, (ident, way, egress) in dirs.items():
        fields = ports.get(egress)
        if fields and any(fields.values()):
            out.setdefault(ident, {})[way] = fields
    return out


def read_queue_ports(model):
    """{port name: {occ, high, marks, drops, pause_tx, paused}}, classes summed, from the queue
    model's stats map in one read (None without a queue model)."""
    if model is None or getattr(model, "datapath", None) is None:
        return None
    from fabriclab.queues.datapath import NCLASS

    stats = model.read_rows()[0]
    out = {}
    for p in model.ports:
        rows = [stats[p.idx * NCLASS + cls] for cls in range(NCLASS)]
        out[p.name] = {"occ": sum(max(0, r.occ) for r in rows), "high": sum(r.occ_hwm for r in rows),
                       "marks": sum(r.marks for r in rows),
                       "drops": sum(r.drops + r.lossless_drops + r.wd_drops for r in rows),
                       "pause_tx": sum(r.pause_tx for r in rows), "paused": int(any(r.paused for r in rows))}
    return out


def fault_marks(state):
    """(down link ids, {link id: what degrades it}) from a Lab.fault_state()."""
    down = sorted(link_id(link) for link in state["down"].values())
    degraded = {}
    for link, nodes, rate in state["reshaped"].values():
        where = f" at the {', '.join(nodes)} end" if nodes else ""
        degraded[link_id(link)] = f"shaped to {rate:g} Mbit/s{where}"
    for link, fraction in state["lossy"].values():
        text = f"loses {fraction:.2%} of packets"
        degraded[link_id(link)] = f"{degraded[link_id(link)]}; {text}" if link_id(link) in degraded else text
    return down, degraded


def event_rows(events, t0_wall, limit=MAX_EVENTS):
    """[[t since the feed started (negative: before it), "HH:MM:SS event target detail"]]."""
    rows = []
    for e in list(events)[-limit:]:
        detail = " ".join(f"{k}={v}" for k, v in e.items() if k not in ("time", "event", "target"))
        stamp = time.strftime("%H:%M:%S", time.localtime(e["time"]))
        rows.append([round(e["time"] - t0_wall, 3),
                     f"{stamp} {e['event'].replace('_', ' ')} {e['target']}{' ' + detail if detail else ''}"])
    return rows


class LiveFeed:
    """Reads the lab every `refresh_s` in a thread; wait(seq) hands each new frame to the page's
    push channel. `session` (workflows/session.py) supplies the jobs and the timeline."""

    def __init__(self, lab, session=None, refresh_s=REFRESH_S, sys_net=SYS_NET):
        self.lab, self.session, self.refresh_s, self.sys_net = lab, session, refresh_s, sys_net
        self.dirs = directions(lab.fabric)
        self.cols = portsampler.columns(lab.fabric)
        self.counters = None
        self.thread = None
        self.latest = None
        self.seq = 0
        self.error = None
        self.stopped = False
        self._cond = threading.Condition()
        self._before = self._t_before = self.t0 = self.wall0 = None

    def start(self):
        self.counters = portsampler.ColumnReader(self.lab.fabric, self.cols, getattr(self.lab, "cluster", None),
                                                 self.sys_net)
        self.t0, self.wall0 = time.monotonic(), time.time()
        self._before, self._t_before = self._read(), self.t0
        self.thread = SamplingThread(self._sample, self.refresh_s, "web-feed").start(self.t0)
        return self

    def _read(self):
        return self.counters.read()

    def _sample(self):
        try:
            frame = self.frame()
            self.error = None
        except Exception as exc:           # noqa: BLE001 - shown on the page; the next reading may work
            # (a fault made while the lab's state is read, an interface being recreated)
            self.error = f"{type(exc).__name__}: {clip(str(exc), 120)}"
            frame = dict(self.latest or {}, error=self.error)
        with self._cond:
            self.seq += 1
            frame["seq"] = self.seq
            self.latest = frame
            self._cond.notify_all()

    def frame(self):
        """One frame from a reading now and the one before."""
        after, now = self._read(), time.monotonic()
        rates = link_rates(self.dirs, self._before, after, now - self._t_before)
        self._before, self._t_before = after, now
        ports = read_queue_ports(self.lab.queues)
        down, degraded = fault_marks(self.lab.fault_state())
        return {"t": round(now - self.t0, 3), "clock": time.strftime("%H:%M:%S"), "rates": rates,
                "queues": port_queues(self.dirs, ports) if ports else {}, "down": down, "degraded": degraded,
                "events": event_rows(self.lab.events, self.wall0),
                "jobs": self.session.jobs() if self.session else [],
                "timeline": self.session.timeline_state() if self.session else None, "error": None}

    def wait(self, after_seq, timeout):
        """The latest frame once its seq is past `after_seq`; None when `timeout` passes first
        or the feed stops."""
        with self._cond:
            self._cond.wait_for(lambda: self.seq > after_seq or self.stopped, timeout)
            return self.latest if self.seq > after_seq and not self.stopped else None

    def stop(self):
        if self.thread is not None:
            self.thread.stop()
            self.thread = None
        if self.counters is not None:
            self.counters.close()
            self.counters = None
        with self._cond:
            self.stopped = True
            self._cond.notify_all()
