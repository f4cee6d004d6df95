"""A results folder as a person reads it: plots and a report.md written into the folder, for every
kind of results document (run, collective, experiment, scenario, calibration).

    fabriclab report results/20250101-120000-flap/          # re-render the plots and report.md

Everything is read back from results.json and the links CSVs, so a folder renders again long after
its fabric is gone, and optional parts (faults, telemetry, queues, CSVs) that a run lacks are
skipped and said so rather than failing the report.
"""

from __future__ import annotations

import csv
import pathlib
import re
import statistics

from fabriclab.errors import LabError
from fabriclab.results import compare, document, plots
from fabriclab import jobs as job_kinds
from fabriclab.table import fixed, markdown_table
from fabriclab.units import human_size

HOST_PORT = re.compile(r"^h\d+-")          # a host's NIC port, e.g. h1-n0
LEAF = re.compile(r"^(p\d+)?l")            # a leaf, e.g. l1 or p2l1 (plane 2)
KINDS = ("up", "down", "nic_tx", "nic_rx")  # heatmap row order: fabric up, down, NICs sending, receiving
UTIL_BINS = 10                             # NIC histograms: tenths of line rate
MAX_NIC_LINES = 12                         # above this, healthy NICs are drawn as one mean line
TIME_AXIS = "time from the timeline's start (s)"


# -- reading ---------------------------------------------------------------------------------------
def column_kind(name):
    """up | down (fabric) | nic_tx | nic_rx (host links) of a links CSV column such as `l1>s1#2`,
    `h1-n0>l1` (what NIC h1-n0 sent) or `l1>h1-n0` (what it received)."""
    left, _, right = name.partition(">")
    if HOST_PORT.match(left):
        return "nic_tx"
    if HOST_PORT.match(right):
        return "nic_rx"
    return "up" if LEAF.match(left) else "down"


def read_links(path):
    """(bin times, column names, Mbit/s bins x columns) of a links CSV; None when it is missing or has
    no rows, a LabError when it cannot be parsed."""
    import numpy as np

    path = pathlib.Path(path)
    if not path.is_file():
        return None
    try:
        with open(path, newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            data = np.asarray([[float(v) for v in row] for row in reader if row], dtype=float)
    except (OSError, ValueError) as exc:
        raise LabError(f"{path.name}: unreadable links CSV ({exc})") from None
    if not header or len(header) < 2 or not len(data):
        return None
    if data.ndim != 2 or data.shape[1] != len(header):
        raise LabError(f"{path.name}: rows do not match the header's {len(header)} columns")
    return data[:, 0], header[1:], data[:, 1:]


def link_rates(names, scale):
    """Line rate in Mbit/s per column: fabric directions at the fabric rate, host links at the host
    rate (either falls back to the other); None when the scale states neither."""
    host = scale.get("host_rate_mbps") or scale.get("fabric_rate_mbps")
    fabric = scale.get("fabric_rate_mbps") or host
    if not host:
        return None
    return [host if column_kind(n).startswith("nic") else fabric for n in names]


# -- small helpers ---------------------------------------------------------------------------------
def _natural(text):
    """Sort key that puts h2 before h10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _slug(run, index):
    return run.get("slug") or f"run{index + 1}"


def _run_label(run, index):
    """How runs are named everywhere: 'ecmp r1' in a scenario, the case in an experiment."""
    return run.get("label") or f"run {index + 1}"


def _target(fault):
    """A fault's target as text: a link label, switch, or a list of them; nothing for a flag."""
    target = fault.get("target")
    if isinstance(target, (list, tuple)):
        return "-".join(str(t) for t in target)
    return None if target is None or isinstance(target, bool) else str(target)


def _fault_label(fault):
    return fault.get("label") or " ".join(v for v in (fault.get("kind"), _target(fault)) if v) or "fault"


def _measured(jobs):
    """The measured jobs (all jobs when none is marked measured): what the cross-run plots compare."""
    chosen = {name: job for name, job in jobs.items() if job.get("role") == "measured"}
    return chosen or jobs


# -- report.md -------------------------------------------------------------------------------------
def experiment_preface(experiment, doc):
    """The lines report.md shows after its header for a packaged experiment's document: what it
    shows and its own table. `experiment` is the experiment's module (SUMMARY, table(doc))."""
    return ["## Experiment", "", experiment.SUMMARY, "", "```", experiment.table(doc), "```", ""]


def render(folder, doc=None, preface=(), run_plots=True, plan_plots=True):
    """Write the plots and report.md of a results folder from its results.json (or `doc`, the same
    document already in memory) and links CSVs; returns the path of report.md. `preface`: lines
    set after the header (an experiment's own table). `run_plots` False leaves out each run's
    heatmap, delivered rate and NIC plots (about a second a run; `reproduce` runs dozens), and
    report.md says how to draw them; `plan_plots` False the plots across runs too (a lab machine
    of a sweep: its CPU is for its fabric, and the report is drawn again where the sweep runs)."""
    folder = pathlib.Path(folder)
    doc = document.load(folder) if doc is None else doc
    runs = doc.get("runs") or []
    out = _header(doc, runs) + list(preface) + _summary(doc)
    for index, run in enumerate(runs):
        out += _run_section(folder, doc.get("scale") or {}, run, index, run_plots)
    out += _across_runs(folder, doc, runs) if plan_plots else _undrawn_across()
    path = folder / "report.md"
    path.write_text("\n".join(out).rstrip() + "\n")
    return path


def _header(doc, runs):
    out = [f"# {doc.get('name', 'results')} ({doc.get('kind', '?')})", ""]
    if doc.get("description"):
        out += [doc["description"], ""]
    if doc.get("valid") is False:
        out += ["> **Warning: not valid.** Some job ran with a saturated CPU or failed a check: the software "
                "switches, not the modelled fabric, may have set these numbers (see the `valid` column).", ""]
    out.append(f"- Scale: {_scale_line(doc.get('scale') or {})}")
    if doc.get("fabric"):
        out.append(f"- Fabric: {_fabric_line(doc['fabric'])}")
    out += [f"- Runs: {', '.join(_run_label(r, i) for i, r in enumerate(runs)) or 'none'}", ""]
    return out


def _scale_line(scale):
    host = scale.get("host_rate_mbps")
    rates = f"host links {host:g} Mbit/s" if host else "host link rate not stated"
    if scale.get("fabric_rate_mbps"):
        rates += f", fabric links {scale['fabric_rate_mbps']:g} Mbit/s"
    ts = scale.get("time_scale")
    timing = (f"time scale x{ts:g} (lab times are {ts:g}x the real hardware's)" if ts
              else "time scale not stated (times are the lab's)")
    buffers = scale.get("buffers_bytes") or {}
    shown = ", ".join(f"{role} {human_size(v) if isinstance(v, int) and v > 0 else v}"
                      for role, v in buffers.items()) if isinstance(buffers, dict) else str(buffers)
    return f"{rates}; {timing}; buffers {shown or 'not stated'}"


def _fabric_line(fabric):
    over = fabric.get("oversubscription")
    parts = [str(fabric.get("name", "?")), f"{fabric.get('switches', '?')} switches",
             f"{fabric.get('hosts', '?')} hosts"]
    if over is not None:
        parts.append(f"oversubscription {over:g}:1" if isinstance(over, (int, float))
                     else f"oversubscription {over}")
    return ", ".join(parts)


def _summary(doc):
    """The measured jobs of every run in one table: what a reader compares first."""
    rows = [r for r in compare.rows(doc, "") if r["role"] != "noise"]
    if not rows:
        return []
    header = ("run", "job", "size", "busbw Mbit/s", "CCT p50 ms", "p99", "delivered Mbit/s", "uplink max/mean",
              "recovery s", "outliers")
    return ["## Summary", ""] + markdown_table(header, [
        (r["run"], r["job"] + ("" if r["valid"] is not False else " (invalid)"),
         compare.size_label(r["size"], r["in_place"]),
         fixed(r["busbw_mbps"]), fixed(r["cct_p50_ms"], 1), fixed(r["cct_p99_ms"], 1), fixed(r["delivered_mbps"]),
         fixed(r["uplink_max_mean"]), fixed(r["recovery_s"]), r["outliers"]) for r in rows])


def _run_section(folder, scale, run, index, run_plots=True):
    label = _run_label(run, index)
    out = [f"## Run {label}", ""]
    if run.get("end_s") is not None:
        bins = f"; rates in {run['bin_s'] * 1e3:g} ms bins" if run.get("bin_s") else ""
        out += [f"Measured jobs ended {run['end_s'] - (run.get('origin_s') or 0.0):.2f} s after the "
                f"timeline's start{bins}.", ""]
    return (out + _jobs_table(run.get("jobs") or {}) + _faults_table(run.get("faults") or [])
            + _telemetry(run.get("telemetry") or {}) + _queues(run.get("queues"))
            + (_run_plots(folder, scale, run, index) if run_plots else _undrawn(folder, run, index)))


def _undrawn(folder, run, index):
    out = ["### Plots", ""]
    queues_png = (run.get("files") or {}).get("queues_plot")
    if queues_png and (folder / queues_png).exists():      # drawn at run time from the queue samples
        out += [f"![lossless queues, marks and pauses by hop, {_run_label(run, index)}]({queues_png})", ""]
    return out + ["- heatmap, delivered rate and NIC plots not drawn here: `fabriclab report FOLDER` draws "
                  "them from this folder", ""]


def _jobs_table(jobs):
    """A table per job kind (jobs/<kind>.py report_lines), in the registry's order; a record of a
    kind this install does not know (a plugin's) is named, not shown."""
    out = ["### Jobs", ""]
    by_kind = {}
    for name, job in jobs.items():
        by_kind.setdefault(job.get("kind"), []).append((name, job))
    for kind_name, named in sorted(by_kind.items(), key=lambda item: _kind_order(item[0])):
        kind = job_kinds.recorded(kind_name)
        out += kind.report_lines(named) if kind else [
            f"Job{'s' * (len(named) > 1)} {', '.join(n for n, _ in named)}: kind {str(kind_name)[:40]} is not "
            f"installed here.", ""]
    if len(out) == 2:
        out += ["No jobs recorded.", ""]
    return out


def _kind_order(name):
    return (job_kinds.KINDS.index(name), "") if name in job_kinds.KINDS else (len(job_kinds.KINDS), str(name))


def _faults_table(faults):
    if not faults:
        return ["### Faults", "", "No faults injected.", ""]
    rows = []
    for f in faults:
        impact = f.get("impact") or {}
        retained = impact.get("retained")
        until = fixed(f.get("until_s")) or ("end" if f.get("at_s") is not None else None)
        rows.append((f.get("kind", "?"), _target(f), fixed(f.get("at_s")), until, len(f.get("events") or []),
                     fixed(impact.get("baseline_mbps")), fixed(impact.get("min_mbps")), _recovery(impact),
                     None if retained is None else f"{100 * retained:.0f}%"))
    header = ("kind", "target", "at s", "until s", "events", "baseline Mbit/s", "min Mbit/s", "recovery s",
              "retained")
    notes = [f"- {_fault_label(f)}: {note}" for f in faults
             for note in (f.get("note"), (f.get("impact") or {}).get("note")) if note]
    return (["### Faults", "", "Times are seconds from the timeline's start; recovery is from the fault to the "
             "first bin back above half the baseline delivered rate.", ""] + markdown_table(header, rows)
            + (notes + [""] if notes else []))


def _recovery(impact):
    """Recovery as a reader wants it: seconds, 'held' when traffic never fell, 'not back' when it fell
    and never came back."""
    if not impact or impact.get("baseline_mbps") is None:
        return None
    if impact.get("fell") is False:
        return "held"
    return "not back" if impact.get("recovery_s") is None else fixed(impact["recovery_s"])


def _telemetry(tel):
    out = ["### Telemetry", ""]
    if not tel:
        return out + ["No telemetry recorded.", ""]
    out.append(f"- Sampling: {_sampling_line(tel.get('sampling') or {})}")
    if tel.get("uplink_max_mean") is not None:
        out.append(f"- Uplink max/mean: {tel['uplink_max_mean']:.2f} (1.00 is a perfect spread)")
    out += _symmetry_lines(tel.get("symmetry"))
    if "stragglers" not in tel:
        out.append("- Stragglers: not checked")
    else:
        out.append(f"- Stragglers: {', '.join(tel['stragglers']) or 'none'}")
    return out + [""] + _latency(tel.get("latency"))


def _latency(latency):
    """The latency monitor's per-switch RTT p50s, over the pairs that must cross each switch."""
    if not latency:
        return []
    rows = []
    for switch, classes in latency["switches"].items():
        for cls, kinds in classes.items():
            must = kinds.get("must")
            if must:
                rows.append((switch, cls, must["unloaded"]["n"], fixed(must["unloaded"]["p50_ms"], 2),
                             must["loaded"]["n"], fixed(must["loaded"]["p50_ms"], 2),
                             fixed(must["loaded"]["p99_ms"], 2), must["unloaded"]["lost"] + must["loaded"]["lost"]))
    return (["### Latency monitor", "",
             f"{len({(p['src'], p['dst']) for p in latency['pairs']})} pairs probed every {latency['interval_ms']:g} ms in each class; "
             f"RTT of the pairs that must cross each switch:", ""]
            + markdown_table(("switch", "class", "unloaded n", "p50 ms", "loaded n", "p50 ms", "p99 ms", "lost"),
                             rows))


def _queues(queues):
    """The queue model's totals and the PFC agent's reaction: lossless is lossless only while the
    reaction stays inside the headroom (reaction_ms)."""
    report = (queues or {}).get("report")
    if not report:
        return []
    totals = report.get("totals") or {}
    out = ["### Queues and PFC", "",
           "- Totals: " + ", ".join(f"{name} {fixed(totals.get(key), 0 if key != 'pause_ms' else 1)}"
                                    for name, key in (("ECN marks", "marks"), ("drops", "drops"),
                                                      ("lossless drops", "lossless_drops"),
                                                      ("watchdog drops", "wd_drops"), ("pauses sent", "pause_tx"),
                                                      ("paused ms", "pause_ms")) if key in totals)]
    reaction = report.get("pfc_reaction") or {}
    if reaction.get("pauses"):
        sched = f"; the agent ran {reaction['scheduling']}" if reaction.get("scheduling") else ""
        out.append(f"- PFC reaction (XOFF to gate closed, wall time) over {reaction['pauses']} pauses: "
                   f"p50 {reaction['p50_ms']:.3f} ms, p99 {reaction['p99_ms']:.3f} ms, "
                   f"max {reaction['max_ms']:.3f} ms{sched}"
                   + (f" (longest wait for the agent {reaction['max_wait_ms']:.3f} ms, longest gate change "
                      f"{reaction['max_gate_change_ms']:.3f} ms)" if "max_wait_ms" in reaction else ""))
    else:
        out.append("- PFC reaction: no pauses")
    for name, key in (("Watchdog alarms", "alarms"), ("Leaked accounts repaired", "leak_repairs")):
        if report.get(key):
            out.append(f"- {name}: {len(report[key])}")
    if queues.get("cut_drops"):
        out.append(f"- Dropped at a buffer cut: {'; '.join(queues['cut_drops'])}")
    if queues.get("errors"):
        out.append(f"- Errors: {len(queues['errors'])}, the first: {str(queues['errors'][0])[:200]}")
    return out + [""]


def _sampling_line(s):
    if not s:
        return "not recorded"
    asked = f"asked every {s['interval_s'] * 1e3:g} ms" if s.get("interval_s") else "interval not stated"
    if s.get("reached_median_s") is None:
        return f"{asked}, reached interval not recorded"
    line = f"{asked}, reached {s['reached_median_s'] * 1e3:.2f} ms median"
    extra = [f"{name} {s[key] * 1e3:.1f} ms" for name, key in (("p99", "reached_p99_s"),
                                                              ("largest gap", "largest_gap_s"))
             if s.get(key) is not None]
    if extra:
        line += f" ({', '.join(extra)})"
    return line + (f" over {s['samples']} samples" if s.get("samples") else "")


MAX_OUTLIER_LINES = 16


def _symmetry_lines(groups):
    if groups is None:
        return ["- Symmetry outliers: not checked"]
    flagged = [(g, o) for g in groups for o in g.get("outliers") or []]
    if not flagged:
        return [f"- Symmetry outliers: none ({len(groups)} group{'s' if len(groups) != 1 else ''} checked)"]
    out = [f"- Symmetry outliers ({len(flagged)} in {len(groups)} group{'s' if len(groups) > 1 else ''} "
           f"checked):"]
    for g, o in flagged[:MAX_OUTLIER_LINES]:
        median = g.get("median_mbps")
        against = f" vs the median {median:.2f}" if median is not None else ""
        metric = f" ({g['metric']} rate)" if g.get("metric") else ""
        out.append(f"  - {g.get('group', '?')}{metric}: {o.get('member', '?')} at {o.get('mbps', 0):.2f} Mbit/s, "
                   f"{100 * o.get('deviation', 0):+.0f}%{against}")
    if len(flagged) > MAX_OUTLIER_LINES:
        out.append(f"  - ... and {len(flagged) - MAX_OUTLIER_LINES} more in results.json (telemetry.symmetry)")
    return out


# -- per-run plots ---------------------------------------------------------------------------------
def _run_plots(folder, scale, run, index):
    """Heatmap, delivered rate and NIC histograms of one run, each skipped (and said so) without data."""
    slug, label = _slug(run, index), _run_label(run, index)
    out, notes = ["### Plots", ""], []
    links, csv_name = None, (run.get("files") or {}).get("links_csv")
    if not csv_name:
        notes.append("no links CSV recorded: heatmap and delivered rate skipped")
    else:
        try:
            links = read_links(folder / csv_name)
        except LabError as exc:
            notes.append(f"{exc}: heatmap and delivered rate skipped")
        else:
            if links is None:
                notes.append(f"{csv_name} missing or empty: heatmap and delivered rate skipped")
    if links is not None:
        if _heatmap(folder / f"heatmap-{slug}.png", links, scale, run, label):
            out += [f"![link utilization, {label}](heatmap-{slug}.png)", ""]
        else:
            notes.append("the scale states no link rates: heatmap skipped")
        if _throughput(folder / f"throughput-{slug}.png", links, run, label):
            out += [f"![delivered rate, {label}](throughput-{slug}.png)", ""]
        else:
            notes.append("no NIC receive columns in the links CSV: delivered rate skipped")
    if _nics(folder / f"nics-{slug}.png", run.get("telemetry") or {}, label):
        out += [f"![NIC histograms, {label}](nics-{slug}.png)", ""]
    else:
        notes.append("no NIC histograms recorded: NIC plot skipped")
    queues_png = (run.get("files") or {}).get("queues_plot")
    if queues_png and (folder / queues_png).exists():      # drawn at run time from the queue samples
        out += [f"![lossless queues, marks and pauses by hop, {label}]({queues_png})", ""]
    return out + [f"- {n}" for n in notes] + ([""] if notes else [])


def _fault_marks(run):
    """(t, label) of every fault's start and of the measured jobs' end, on the timeline's axis."""
    marks = [(f["at_s"], _fault_label(f)) for f in run.get("faults") or [] if f.get("at_s") is not None]
    if run.get("end_s") is not None:
        marks.append((run["end_s"] - (run.get("origin_s") or 0.0), "jobs end"))
    return marks


def _heatmap(path, links, scale, run, label):
    """Every direction's utilization over time, fabric up, down, then NICs sending and receiving."""
    import numpy as np

    times, names, mbps = links
    rates = link_rates(names, scale)
    if rates is None:
        return None
    order = sorted(range(len(names)), key=lambda i: KINDS.index(column_kind(names[i])))
    util = (mbps / np.asarray(rates, dtype=float))[:, order].T
    return plots.heatmap(path, f"{label}: link utilization (rows: fabric up, down, NIC send, NIC receive)",
                         [names[i] for i in order], times - (run.get("origin_s") or 0.0), util, TIME_AXIS,
                         "utilization (share of line rate)", vmax=1.0, marks=_fault_marks(run))


def _throughput(path, links, run, label):
    """What the fabric delivered to the hosts (and what they sent) over time, faults shaded."""
    times, names, mbps = links
    kinds = [column_kind(n) for n in names]
    rx = [i for i, k in enumerate(kinds) if k == "nic_rx"]
    if not rx:
        return None
    tx = [i for i, k in enumerate(kinds) if k == "nic_tx"]
    ts = list(times - (run.get("origin_s") or 0.0))
    series = {"delivered (NICs received)": (ts, list(mbps[:, rx].sum(axis=1)))}
    if tx:
        series["sent (NICs sent)"] = (ts, list(mbps[:, tx].sum(axis=1)))
    faults = [f for f in run.get("faults") or [] if f.get("at_s") is not None]
    spans = [(f["at_s"], f["until_s"], _fault_label(f)) for f in faults if f.get("until_s") is not None]
    marks = [(f["at_s"], _fault_label(f)) for f in faults if f.get("until_s") is None]
    return plots.timeline(path, f"{label}: rate the fabric delivered to the hosts", series, TIME_AXIS,
                          "Mbit/s", spans=spans, marks=marks)


def _nics(path, tel, label):
    """Per-NIC share of time at each tenth of line rate: a healthy collective NIC is bimodal (idle or
    near line rate), a straggler sits in between. Many healthy NICs are drawn as one mean line."""
    hists = {port: n["histogram"] for port, n in (tel.get("nics") or {}).items()
             if len(n.get("histogram") or []) == UTIL_BINS}
    if not hists:
        return None
    slow = set(tel.get("stragglers") or [])
    ports = sorted(hists, key=_natural)
    series = {f"{p} (STRAGGLER)": hists[p] for p in ports if p in slow}
    healthy = [p for p in ports if p not in slow]
    if len(healthy) > MAX_NIC_LINES:
        series[f"other {len(healthy)} NICs (mean)"] = [statistics.fmean(hists[p][i] for p in healthy)
                                                       for i in range(UTIL_BINS)]
    else:
        series.update({p: hists[p] for p in healthy})
    xs = [100 * (i + 0.5) / UTIL_BINS for i in range(UTIL_BINS)]
    return plots.lines(path, f"{label}: time share per NIC at each tenth of line rate", xs, series,
                       "utilization (% of line rate, bin centre)", "share of time bins", log_x=False)


# -- across runs -----------------------------------------------------------------------------------
def _across_runs(folder, doc, runs):
    out, notes = ["## Across runs", ""], []
    if _cct_plot(folder / "cct.png", runs):
        out += ["![completion time CDF](cct.png)", ""]
    else:
        notes.append("no per-iteration completion times recorded: CCT plot skipped")
    if _busbw_plot(folder / "busbw.png", doc, runs):
        out += ["![busbw per size](busbw.png)", ""]
    return out + [f"- {n}" for n in notes] + ([""] if notes else [])


def _undrawn_across():
    return ["## Across runs", "", "- plots not drawn here: `fabriclab report FOLDER` draws them from this folder", ""]


def _cct_plot(path, runs):
    series = {}
    for index, run in enumerate(runs):
        for name, job in _measured(run.get("jobs") or {}).items():
            for s in job.get("sizes") or []:
                values = (s.get("cct_ms") or {}).get("all") or []
                if values:
                    size = compare.size_label(s.get("size"), s.get("in_place", False))
                    series[f"{_run_label(run, index)} {name} {size}"] = values
    if not series:
        return None
    return plots.cdfs(path, "collective completion time per run, job and size", series, "CCT (ms)")


def _busbw_plot(path, doc, runs):
    """busbw over message size, a line per routing scheme (and job), repetitions averaged; only drawn
    when some job ran more than one size."""
    per = {}
    for run in runs:
        for name, job in _measured(run.get("jobs") or {}).items():
            for s in job.get("sizes") or []:
                if s.get("busbw_mbps") is not None and s.get("size"):
                    key = (run.get("routing", "run"), name + (" in-place" if s.get("in_place", False) else ""))
                    per.setdefault(key, {}).setdefault(s["size"], []).append(s["busbw_mbps"])
    if not any(len(sizes) > 1 for sizes in per.values()):
        return None
    xs = sorted({size for sizes in per.values() for size in sizes})
    jobs = {job for _, job in per}
    series = {(routing if len(jobs) == 1 else f"{routing} {job}"):
              [statistics.fmean(sizes[x]) if x in sizes else float("nan") for x in xs]
              for (routing, job), sizes in per.items()}
    host_rate = (doc.get("scale") or {}).get("host_rate_mbps")
    return plots.lines(path, "bus bandwidth per message size (repetitions averaged)", xs, series,
                       "message size (bytes)", "busbw (Mbit/s)", reference=(host_rate, "NIC line rate")
                       if host_rate else None)
