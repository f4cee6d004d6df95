"""A top-like live view of a running fabric, for the engineer watching a run at the prompt.

    fabriclab> collective -c allreduce --sizes 4M -n 50 &
    fabriclab> top 30

Every refresh reads the switch ports' counters once and shows what moved since the last one:
delivered traffic, each leaf's uplinks (with their max/mean, seed 002's symmetry check), each
spine's downlinks, the NICs, links down, the queue model's pauses and marks when it runs, and
the latest faults from the lab's event log.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from fabriclab.measure import portsampler, symmetry
from fabriclab.measure.counters import SYS_NET
from fabriclab.table import format_table

REFRESH_S = 1.0


def frame(lab_name, routing, cols, before, after, seconds, down=(), events=(), queues=None, width=100):
    """The text of one refresh from two readings `seconds` apart."""
    mbps = {c.name: max(0, after[c.name] - before[c.name]) * 8 / seconds / 1e6 for c in cols}
    sent = sum(mbps[c.name] for c in cols if c.kind == "nic_tx")
    got = sum(mbps[c.name] for c in cols if c.kind == "nic_rx")
    lines = [f"fabriclab top: {lab_name}, routing {routing}, {time.strftime('%H:%M:%S')}, "
             f"every {seconds:.1f} s (Ctrl-C stops)",
             f"NICs sent {sent:.1f} Mbit/s, received {got:.1f} Mbit/s; links down: {', '.join(sorted(down)) or 'none'}"]
    rows = []
    for name, members in symmetry.groups(cols).items():
        if not name.endswith(("uplinks", "downlinks")):
            continue
        loads = [sum(mbps[c] for c in cs) for cs in members.values()]
        mean = statistics.fmean(loads)
        rows.append((name, " ".join(f"{v:5.1f}" for v in loads), f"{max(loads) / mean:.2f}" if mean > 0.05 else "-"))
    if rows:
        lines.append(format_table(("group", "Mbit/s per member", "max/mean"), rows))
    nics = sorted({c.src if c.kind == "nic_tx" else c.dst for c in cols if c.kind in ("nic_tx", "nic_rx")},
                  key=_natural)
    if nics:
        tx = {c.src: mbps[c.name] for c in cols if c.kind == "nic_tx"}
        rx = {c.dst: mbps[c.name] for c in cols if c.kind == "nic_rx"}
        cells = [f"{n} {tx.get(n, 0):4.1f}/{rx.get(n, 0):4.1f}" for n in nics]
        per_line = max(1, width // 22)
        lines.append("NIC send/receive Mbit/s:")
        lines += ["  " + "  ".join(cells[i:i + per_line]) for i in range(0, len(cells), per_line)]
    if queues:
        lines.append(f"queues: {queues['paused']} port(s) holding a pause, {queues['occupied']} with bytes queued, "
                     f"{queues['marks']} CE marks and {queues['drops']} drops so far")
    for event in list(events)[-5:]:
        lines.append(f"  {time.strftime('%H:%M:%S', time.localtime(event['time']))} {event['event']} "
                     f"{event['target']}")
    return "\n".join(lines)


def _natural(name):
    digits = "".join(ch if ch.isdigit() else " " for ch in name).split()
    return [int(d) for d in digits] + [name]


def queue_summary(model):
    if model is None:
        return None
    rows = model.counters(nonzero=False)
    return {"paused": sum(1 for r in rows if r.get("gate_closed")),
            "occupied": sum(1 for r in rows if r.get("occ")),
            "marks": sum(r.get("marks", 0) for r in rows),
            "drops": sum(r.get("drops", 0) + r.get("lossless_drops", 0) + r.get("wd_drops", 0) for r in rows)}


def watch(lab, seconds=None, refresh_s=REFRESH_S, stream=None, sys_net=SYS_NET):
    """Redraw the view every `refresh_s` until `seconds` pass (None: until Ctrl-C)."""
    stream = stream or sys.stdout
    cols = portsampler.columns(lab.fabric)
    clear = "\033[H\033[2J" if stream.isatty() else ""
    width = os.get_terminal_size().columns if stream.isatty() else 100
    end = None if seconds is None else time.monotonic() + seconds
    with portsampler.ColumnReader(lab.fabric, cols, getattr(lab, "cluster", None), sys_net) as reader:
        before, t0 = reader.read(), time.monotonic()
        try:
            while end is None or time.monotonic() < end:
                time.sleep(refresh_s if end is None else max(0.0, min(refresh_s, end - time.monotonic())))
                after, t1 = reader.read(), time.monotonic()
                if t1 - t0 <= 0:
                    continue
                down = lab.injected()["links_down"]
                stream.write(clear + frame(lab.fabric.spec.name, lab.routing, cols, before, after, t1 - t0, down,
                                           lab.events, queue_summary(lab.queues), width) + "\n\n")
                stream.flush()
                before, t0 = after, t1
        except KeyboardInterrupt:
            stream.write("\n")
