"""Several results folders side by side: one table (and a bar plot) of every run, job and size,
whatever wrote them (run, collective, experiment, scenario, calibration).

    fabriclab compare results/a results/b --plot cmp.png

A row per collective size (and mode: a job that also ran in place has a row per size for each,
its size marked `in-place`); all-pairs jobs report what they delivered (and no size, busbw or
CCT), SwitchML jobs their tensor aggregation time in the CCT columns (p50 and the slowest), a
replayed trace a row per collective in its order, each named (`allreduce 256K`).
"""

from __future__ import annotations

import pathlib
import statistics

from fabriclab import jobs
from fabriclab.results import document, plots
from fabriclab.table import format_table
from fabriclab.units import human_size
from fabriclab.errors import LabError

HEADER = ("folder", "kind", "run", "job", "size", "busbw Mbit/s", "CCT p50 ms", "p99", "delivered Mbit/s",
          "uplink max/mean", "OOS", "retrans", "LAT", "recovery s", "outliers")


def _num(value, decimals=2):
    return None if value is None else f"{value:.{decimals}f}"


def size_label(size, in_place=False):
    """64K, or 64K in-place for a size's in-place row."""
    text = human_size(size) if isinstance(size, int) and size > 0 else size
    return f"{text} in-place" if in_place else text


def rows(doc, label):
    """A dict per (run, job, size) of any results document, labelled `label` (its folder)."""
    out = []
    for index, run in enumerate(doc.get("runs") or []):
        tel = run.get("telemetry") or {}
        # every strike of a fault (a flap or random flaps strike several times), not only the first
        recoveries = [hit.get("recovery_s") for f in run.get("faults") or []
                      for hit in (f.get("impacts") or [f.get("impact") or {}])]
        recoveries = [r for r in recoveries if r is not None]
        symmetry = tel.get("symmetry")
        common = {"folder": label, "kind": doc.get("kind"), "run": run.get("label") or f"run {index + 1}",
                  "uplink_max_mean": tel.get("uplink_max_mean"),
                  "recovery_s": statistics.fmean(recoveries) if recoveries else None,
                  "outliers": None if symmetry is None else sum(len(g.get("outliers") or []) for g in symmetry)}
        for name, job in (run.get("jobs") or {}).items():
            base = {**common, "job": name, "job_kind": job.get("kind"), "role": job.get("role", "measured")}
            out += [{**base, **measures} for measures in _measures(job)]
    return out


# what every row holds; a job kind's compare_rows (jobs/<kind>.py) fills in those that apply to it
MEASURES = ("valid", "size", "in_place", "busbw_mbps", "cct_p50_ms", "cct_p99_ms", "delivered_mbps",
            "out_of_sequence", "retransmitted_packets", "local_ack_timeout_err")


def _measures(job):
    """The comparable numbers of one job, a dict per row: NaN-free, None where they do not apply (a
    kind this install does not know gives one row of Nones)."""
    blank = {**dict.fromkeys(MEASURES), "valid": job.get("valid"), "in_place": False}
    kind = jobs.recorded(job.get("kind"))
    return [{**blank, **row} for row in (kind.compare_rows(job) if kind else [{}])]


def _labels(folders):
    """Folder names, or the path as given where two folders share a name."""
    names = [f.resolve().name or str(f) for f in folders]
    return [n if names.count(n) == 1 else str(f) for n, f in zip(names, folders)]


def collect(folders):
    """rows() of every folder, in the order given (all folders are read before anything else)."""
    folders = [pathlib.Path(f) for f in folders]
    docs = [document.load(f) for f in folders]
    return [row for label, doc in zip(_labels(folders), docs) for row in rows(doc, label)]


def _job_cell(row):
    flags = [flag for flag, on in (("noise", row["role"] == "noise"), ("invalid", row["valid"] is False)) if on]
    return row["job"] + (f" ({', '.join(flags)})" if flags else "")


def table(folders):
    """One table of every run, job and size of the folders, ready to print."""
    folders = list(folders)
    found = collect(folders)
    cells = [(r["folder"], r["kind"], r["run"], _job_cell(r),
              (f"{r['collective']} " if r.get("collective") else "") + size_label(r["size"], r["in_place"])
              if r["size"] is not None else None,
              _num(r["busbw_mbps"]),
              _num(r["cct_p50_ms"], 1), _num(r["cct_p99_ms"], 1), _num(r["delivered_mbps"]),
              _num(r["uplink_max_mean"]), r["out_of_sequence"], r["retransmitted_packets"],
              r["local_ack_timeout_err"], _num(r["recovery_s"]), r["outliers"]) for r in found]
    title = (f"{len(folders)} results folders; recovery is the mean over a run's faults that recovered, "
             f"outliers the symmetry outliers found")
    return format_table(HEADER, cells, title=title)


def plot(folders, path):
    """Bars of busbw and CCT p99 per (folder, run, job) of the measured jobs, each at its first size;
    labels keep only the parts that differ between bars, wrapped so neighbours do not overlap."""
    import textwrap

    found = [r for r in collect(folders) if r["busbw_mbps"] is not None or r["cct_p99_ms"] is not None]
    first = {}
    for row in [r for r in found if r["role"] != "noise"] or found:
        first.setdefault((row["folder"], row["run"], row["job"]), row)
    if not first:
        raise LabError("nothing to plot: the folders hold no collective or aggregation jobs")
    varying = [i for i in range(3) if len({key[i] for key in first}) > 1] or [1]
    labels = ["\n".join(textwrap.fill(str(key[i]), 12) for i in varying) for key in first]
    chosen = list(first.values())
    return plots.bars(path, "busbw and CCT p99 (each job's first size)", labels, [
        ("busbw (Mbit/s)", [r["busbw_mbps"] for r in chosen]),
        ("CCT p99 (ms)", [r["cct_p99_ms"] for r in chosen]),
    ])


# -- command line ----------------------------------------------------------------------------------


def latency_regressions(baseline, folders, threshold):
    """The latency monitor's regressions of each folder's runs against the baseline folder's
    (measure/pingmesh.regressions): a run is matched with the baseline's run of the same label, or
    with its only run. Returns [{"folder", "run", "slowed", "must_cross", "culprits"}] for every
    run that has a regression; LabError when the baseline has no latency monitor to compare with."""
    from fabriclab.measure.pingmesh import regressions

    base_doc = document.load(baseline)
    base_runs = {run["label"]: run["telemetry"]["latency"] for run in base_doc["runs"]
                 if run["telemetry"].get("latency")}
    if not base_runs:
        raise LabError(f"baseline {baseline}: no run measured latency (its metrics had no pingmesh_ms)")
    folders = [pathlib.Path(f) for f in folders]
    out = []
    for label, doc in zip(_labels(folders), [document.load(f) for f in folders]):
        for run in doc["runs"]:
            mine = run["telemetry"].get("latency")
            base = base_runs.get(run["label"]) or (next(iter(base_runs.values())) if len(base_runs) == 1 else None)
            if not mine or base is None:
                continue
            found = regressions(base, mine, threshold)
            if found["slowed"]:
                out.append({"folder": label, "run": run["label"], **found})
    return out


def latency_lines(found, threshold):
    """What `compare --baseline` prints of latency_regressions(): a line per regressed run, the
    switches every slowed pair must cross, and a line per slowed pair."""
    if not found:
        return [f"latency: no pair slower than the baseline by more than {threshold:.0%}"]
    lines = []
    for r in found:
        suspects = ", ".join(r["culprits"]) or "none that spared pairs do not also cross"
        lines.append(f"latency regression in {r['folder']} run {r['run']}: {len(r['slowed'])} pair(s) "
                     f"slower by more than {threshold:.0%}; every one must cross "
                     f"{', '.join(r['must_cross']) or 'no common switch'}; suspects: {suspects}")
        lines += [f"  {s['src']} -> {s['dst']} ({s['class']}, {s['phase']}): p50 {s['base_ms']:.3g} -> "
                  f"{s['new_ms']:.3g} ms (+{s['change']:.0%})" for s in r["slowed"]]
    return lines
