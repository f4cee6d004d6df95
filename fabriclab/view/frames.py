"""What a finished run's samples say about every cable over time, as the page draws it: per
frame, each direction's rate, and where the queue model ran, its egress port's occupancy,
high-water mark, ECN marks, drops and pauses sent; the cables down at each moment; the faults.

Read from a results folder (results.json, the run's links and queues CSVs), so a report renders
long after its fabric is gone. A long run is cut into at most MAX_FRAMES frames: rates are
averaged over the bins a frame merges, counters taken at its end, occupancy at its peak.
"""

from __future__ import annotations

import bisect
import csv
import math
import pathlib

from fabriclab.errors import LabError
from fabriclab.measure import portsampler
from fabriclab.results import report
from fabriclab.view.layout import link_id

MAX_FRAMES = 240
QUEUE_FIELDS = ("occ", "marks", "drops", "pause_tx")      # summed over a port's classes
MAX_QUEUE_ROWS = 5_000_000                                 # a queues CSV past this is not read


def directions(fabric):
    """{links CSV column name: (link id, "up" | "down", egress interface)}: "up" is leaf to
    spine, or host to leaf; the egress interface is where that direction's queue builds."""
    out = {}
    for col in portsampler.columns(fabric):
        up = col.kind in ("up", "nic_tx")
        if col.kind in ("up", "down"):
            ident = col.link
        else:
            port = col.src if col.kind == "nic_tx" else col.dst
            ident = f"{port}-{col.dst if col.kind == 'nic_tx' else col.src}"
        egress = col.intf if col.counter == "tx_bytes" else col.src
        out[col.name] = (ident, "up" if up else "down", egress)
    return out


def frame_edges(count, max_frames=MAX_FRAMES):
    """[(first bin, end bin)] cutting `count` bins into at most `max_frames` frames of whole bins."""
    if count <= 0:
        return []
    per = -(-count // max_frames)
    return [(i, min(i + per, count)) for i in range(0, count, per)]


def read_queues(path, max_rows=MAX_QUEUE_ROWS):
    """{egress interface: ([t_s], [{occ, marks, drops, pause_tx, paused}])}, classes summed; None
    where the run has no queues CSV."""
    path = pathlib.Path(path)
    if not path.is_file():
        return None
    ports = {}
    try:
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            for n, row in enumerate(reader):
                if n >= max_rows:
                    raise LabError(f"{path.name}: over {max_rows} rows; not drawn")
                t = float(row["t_s"])
                times, values = ports.setdefault(row["port"], ([], []))
                if not times or times[-1] != t:
                    times.append(t)
                    values.append({k: 0 for k in QUEUE_FIELDS} | {"paused": 0})
                last = values[-1]
                for k in QUEUE_FIELDS:
                    last[k] += int(float(row[k]))       # int(): NaN and inf raise
                last["paused"] = max(last["paused"], int(float(row["paused"])))
    except (OSError, KeyError, ValueError, OverflowError) as exc:
        raise LabError(f"{path.name}: unreadable queues CSV ({type(exc).__name__})") from None
    return ports


def down_intervals(run, fabric):
    """[(link id, from t_s, until t_s or None)] from the run's link and switch events."""
    by_label, by_switch = {}, {}
    for link in fabric.links:
        by_label.setdefault(link.label, []).append(link_id(link))
        for end in (link.a, link.b):
            by_switch.setdefault(end, []).append(link_id(link))
    since, out = {}, []
    for event in sorted(run.get("events") or (), key=lambda e: e.get("t_s", 0)):
        kind, target, t = event.get("event"), str(event.get("target", "")), event.get("t_s", 0)
        if kind in ("link_down", "link_up"):
            ids = [i for label in target.split(", ") for i in by_label.get(label, ())]
        elif kind in ("switch_down", "switch_up"):
            ids = by_switch.get(target, [])
        else:
            continue
        for ident in ids:
            if kind.endswith("_down"):
                since.setdefault(ident, t)
            elif ident in since:
                out.append((ident, since.pop(ident), t))
    out += [(ident, t, None) for ident, t in since.items()]
    return sorted(out, key=lambda d: (d[1], d[0]))


def run_frames(folder, run, fabric, max_frames=MAX_FRAMES):
    """The page's data for one run of a results folder: {"label", "t": [frame end, s], "rates":
    {link id: {"up": [Mbit/s], "down": [...]}}, "queues": {link id: {"up": {field: [...]}}},
    "down": [[link id, from, until]], "faults": [[t, text]]}; None where the run has no links CSV."""
    folder = pathlib.Path(folder)
    files = run.get("files") or {}
    links = report.read_links(folder / files["links_csv"]) if files.get("links_csv") else None
    if links is None:
        return None
    times, names, data = links
    if not (math.isfinite(float(times.sum())) and math.isfinite(float(data.sum()))):
        raise LabError(f"{files['links_csv']}: a rate or time that is not a finite number; not drawn")
    bin_s = float(times[1] - times[0]) if len(times) > 1 else float(run.get("bin_s") or 0.05)
    dirs = directions(fabric)
    edges = frame_edges(len(times), max_frames)
    t = [round(float(times[start]), 4) for start, _end in edges]       # a frame starts with its first bin
    rates = {}
    for j, name in enumerate(names):
        if name not in dirs:
            continue                      # a column of another fabric: the spec changed since
        ident, way, _egress = dirs[name]
        rates.setdefault(ident, {})[way] = [round(float(data[a:b, j].mean()), 3) for a, b in edges]
    out = {"label": run.get("label", ""), "t": t, "rates": rates, "queues": {},
           "down": [list(d) for d in down_intervals(run, fabric)],
           "faults": [[f.get("at_s"), f.get("label", f.get("kind", ""))] for f in run.get("faults") or ()]}
    ports = read_queues(folder / files["queues_csv"]) if files.get("queues_csv") else None
    for name, (ident, way, egress) in dirs.items():
        samples = (ports or {}).get(egress)
        if not samples or not any(v["occ"] or v["marks"] or v["drops"] or v["pause_tx"] for v in samples[1]):
            continue
        out["queues"].setdefault(ident, {})[way] = _queue_frames(samples, times, edges, bin_s)
    return out


def _queue_frames(samples, times, edges, bin_s):
    """One egress port's queue fields per frame (bins a..b-1 span [times[a], times[b-1] + bin_s)):
    occupancy at its peak within the frame, the high-water mark so far, the counters at the
    frame's end (the last sample before it where none falls inside)."""
    qt, values = samples
    fields = {"occ": [], "high": [], "marks": [], "drops": [], "pause_tx": [], "paused": []}
    high = 0
    for a, b in edges:
        lo = bisect.bisect_left(qt, float(times[a]))
        hi = bisect.bisect_left(qt, float(times[b - 1]) + bin_s)
        inside = values[lo:hi] or values[max(0, lo - 1):max(1, lo)]
        peak = max(v["occ"] for v in inside)
        high = max(high, peak)
        last = inside[-1]
        fields["occ"].append(peak)
        fields["high"].append(high)
        for k in ("marks", "drops", "pause_tx"):
            fields[k].append(last[k])
        fields["paused"].append(max(v["paused"] for v in inside))
    return fields
