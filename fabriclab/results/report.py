"""A scenario's results as a person reads them: plots and a report.md written into its folder, and one
table that sets several folders (scenario or experiment) side by side.

    fabriclab report results/20250101-120000-flap/          # re-render the plots and report.md
    fabriclab compare results/a results/b --plot cmp.png    # a row per run or case, job and size

Everything is read back from results.json and the links CSVs, so a folder renders again long after
its fabric is gone, and optional parts (faults, telemetry, CSVs) that a run lacks are skipped and said
so rather than failing the report.
"""

from __future__ import annotations

import csv
import json
import pathlib
import re
import statistics

from fabriclab.results import plots
from fabriclab.errors import LabError
from fabriclab.table import format_table
from fabriclab.units import human_size

HOST_PORT = re.compile(r"^h\d+-")          # a host's NIC port, e.g. h1-n0
LEAF = re.compile(r"^(p\d+)?l")            # a leaf, e.g. l1 or p2l1 (plane 2)
KINDS = ("up", "down", "nic_tx", "nic_rx")  # heatmap row order: fabric up, down, NICs sending, receiving
UTIL_BINS = 10                             # NIC histograms: tenths of line rate
MAX_NIC_LINES = 12                         # above this, healthy NICs are drawn as one mean line
TIME_AXIS = "time from the timeline's start (s)"
COMPARE_HEADER = ("folder", "run", "job", "size", "busbw Mbit/s", "CCT p50 ms", "p99", "uplink max/mean",
                  "OOS", "retrans", "LAT", "recovery s", "outliers")


# -- reading ---------------------------------------------------------------------------------------
def load(folder):
    """The results document of a folder; a LabError naming the folder when it has none."""
    path = pathlib.Path(folder) / "results.json"
    if not path.is_file():
        raise LabError(f"{folder}: no results.json here (not a results folder?)")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise LabError(f"{path}: unreadable ({exc})") from None


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
def _num(value, decimals=2):
    return None if value is None else f"{value:.{decimals}f}"


def _natural(text):
    """Sort key that puts h2 before h10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _slug(run, index):
    return run.get("slug") or f"{run.get('routing', 'run')}-r{run.get('repetition', index + 1)}"


def _run_label(run, index):
    """'ecmp r1': the routing scheme and the repetition, how runs are named everywhere."""
    return f"{run.get('routing', 'run')} r{run.get('repetition', index + 1)}"


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


def _md_table(header, rows):
    def cell(value):
        return "-" if value is None else str(value).replace("|", "\\|")

    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return out + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows] + [""]


# -- report.md -------------------------------------------------------------------------------------
def render(folder):
    """Write the plots and report.md of a scenario folder from its results.json and links CSVs;
    returns the path of report.md."""
    folder = pathlib.Path(folder)
    doc = load(folder)
    if doc.get("kind") != "scenario":
        raise LabError(f"{folder}: a {doc.get('kind', 'unknown')!r} results folder; `report` renders "
                       f"scenario folders (use `compare` for the others)")
    runs = doc.get("runs") or []
    out = _header(doc, runs) + _summary(doc)
    for index, run in enumerate(runs):
        out += _run_section(folder, doc.get("scale") or {}, run, index)
    out += _across_runs(folder, doc, runs)
    path = folder / "report.md"
    path.write_text("\n".join(out).rstrip() + "\n")
    return path


def _header(doc, runs):
    scenario = doc.get("scenario") or {}
    out = [f"# {scenario.get('name', 'scenario')}", ""]
    if scenario.get("description"):
        out += [scenario["description"], ""]
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
    rows = [r for r in compare_rows(doc, "") if r["role"] != "noise"]
    if not rows:
        return []
    header = ("run", "job", "size", "busbw Mbit/s", "CCT p50 ms", "p99", "uplink max/mean", "recovery s",
              "outliers")
    return ["## Summary", ""] + _md_table(header, [
        (r["run"], r["job"] + ("" if r["valid"] is not False else " (invalid)"), _size(r["size"]),
         _num(r["busbw_mbps"]), _num(r["cct_p50_ms"], 1), _num(r["cct_p99_ms"], 1),
         _num(r["uplink_max_mean"]), _num(r["recovery_s"]), r["outliers"]) for r in rows])


def _size(size):
    return human_size(size) if isinstance(size, int) and size > 0 else size


def _run_section(folder, scale, run, index):
    label = _run_label(run, index)
    out = [f"## Run {label}", ""]
    if run.get("end_s") is not None:
        bins = f"; rates in {run['bin_s'] * 1e3:g} ms bins" if run.get("bin_s") else ""
        out += [f"Measured jobs ended {run['end_s'] - (run.get('origin_s') or 0.0):.2f} s after the "
                f"timeline's start{bins}.", ""]
    return (out + _jobs_table(run.get("jobs") or {}) + _faults_table(run.get("faults") or [])
            + _telemetry(run.get("telemetry") or {}) + _run_plots(folder, scale, run, index))


def _jobs_table(jobs):
    rows = []
    for name, job in jobs.items():
        for s in job.get("sizes") or []:
            cct, c = s.get("cct_ms") or {}, s.get("counters") or {}
            fraction = s.get("busbw_fraction_of_nic")
            rows.append((name, job.get("role", "-"), f"{s.get('collective', '?')}/{s.get('algorithm', '?')}",
                         _size(s.get("size")), s.get("ranks"), _num(s.get("busbw_mbps")),
                         None if fraction is None else f"{100 * fraction:.0f}%", _num(cct.get("p50"), 1),
                         _num(cct.get("p99"), 1), c.get("out_of_sequence"), c.get("retransmitted_packets"),
                         c.get("local_ack_timeout_err"), "yes" if job.get("valid", True) else "NO"))
    if not rows:
        return ["### Jobs", "", "No jobs recorded.", ""]
    header = ("job", "role", "collective", "size", "ranks", "busbw Mbit/s", "of NIC", "CCT p50 ms",
              "p99 ms", "OOS", "retrans", "LAT", "valid")
    return ["### Jobs", ""] + _md_table(header, rows)


def _faults_table(faults):
    if not faults:
        return ["### Faults", "", "No faults injected.", ""]
    rows = []
    for f in faults:
        impact = f.get("impact") or {}
        retained = impact.get("retained")
        until = _num(f.get("until_s")) or ("end" if f.get("at_s") is not None else None)
        rows.append((f.get("kind", "?"), _target(f), _num(f.get("at_s")), until, len(f.get("events") or []),
                     _num(impact.get("baseline_mbps")), _num(impact.get("min_mbps")), _recovery(impact),
                     None if retained is None else f"{100 * retained:.0f}%"))
    header = ("kind", "target", "at s", "until s", "events", "baseline Mbit/s", "min Mbit/s", "recovery s",
              "retained")
    notes = [f"- {_fault_label(f)}: {note}" for f in faults
             for note in (f.get("note"), (f.get("impact") or {}).get("note")) if note]
    return (["### Faults", "", "Times are seconds from the timeline's start; recovery is from the fault to the "
             "first bin back above half the baseline delivered rate.", ""] + _md_table(header, rows)
            + (notes + [""] if notes else []))


def _recovery(impact):
    """Recovery as a reader wants it: seconds, 'held' when traffic never fell, 'not back' when it fell
    and never came back."""
    if not impact or impact.get("baseline_mbps") is None:
        return None
    if impact.get("fell") is False:
        return "held"
    return "not back" if impact.get("recovery_s") is None else _num(impact["recovery_s"])


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


def _cct_plot(path, runs):
    series = {}
    for index, run in enumerate(runs):
        for name, job in _measured(run.get("jobs") or {}).items():
            for s in job.get("sizes") or []:
                values = (s.get("cct_ms") or {}).get("all") or []
                if values:
                    series[f"{_run_label(run, index)} {name} {_size(s.get('size'))}"] = values
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
                    key = (run.get("routing", "run"), name)
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


# -- comparing folders -----------------------------------------------------------------------------
def compare_rows(doc, label):
    """A dict per (run or case, job, size) of a scenario or experiment document, labelled `label`."""
    kind = doc.get("kind")
    if kind == "scenario":
        return [row for index, run in enumerate(doc.get("runs") or [])
                for row in _scenario_rows(run, index, label)]
    if kind == "experiment":
        return [row for case in doc.get("cases") or [] for row in _case_rows(case, label)]
    raise LabError(f"{label or 'results'}: a {kind!r} results folder cannot be compared "
                   f"(only scenario and experiment folders)")


def _scenario_rows(run, index, label):
    tel = run.get("telemetry") or {}
    # every strike of a fault (a flap or random flaps strike several times), not only the first
    recoveries = [hit.get("recovery_s") for f in run.get("faults") or []
                  for hit in (f.get("impacts") or [f.get("impact") or {}])]
    recoveries = [r for r in recoveries if r is not None]
    symmetry = tel.get("symmetry")
    outliers = None if symmetry is None else sum(len(g.get("outliers") or []) for g in symmetry)
    return [_row(label, _run_label(run, index), name, job, s, tel.get("uplink_max_mean"),
                 statistics.fmean(recoveries) if recoveries else None, outliers)
            for name, job in (run.get("jobs") or {}).items() for s in job.get("sizes") or []]


def _case_rows(case, label):
    """An experiment case: each job summary is one size (its first), uplinks and fault per case."""
    symmetry = case.get("symmetry")
    outliers = None if symmetry is None else sum(len(g.get("outliers") or []) for g in symmetry)
    uplink = (case.get("uplinks") or {}).get("max_mean_ratio")
    recovery = (case.get("fault") or {}).get("recovery_s")
    return [_row(label, case.get("case", "?"), name, job, job, uplink, recovery, outliers)
            for name, job in (case.get("jobs") or {}).items()]


def _row(label, run, name, job, size, uplink, recovery, outliers):
    cct, counters = size.get("cct_ms") or {}, size.get("counters") or {}
    return {"folder": label, "run": run, "job": name, "role": job.get("role", "measured"),
            "valid": job.get("valid", size.get("valid")), "size": size.get("size"),
            "busbw_mbps": size.get("busbw_mbps"), "cct_p50_ms": cct.get("p50"), "cct_p99_ms": cct.get("p99"),
            "uplink_max_mean": uplink, "out_of_sequence": counters.get("out_of_sequence"),
            "retransmitted_packets": counters.get("retransmitted_packets"),
            "local_ack_timeout_err": counters.get("local_ack_timeout_err"),
            "recovery_s": recovery, "outliers": outliers}


def _labels(folders):
    """Folder names, or the path as given where two folders share a name."""
    names = [f.resolve().name or str(f) for f in folders]
    return [n if names.count(n) == 1 else str(f) for n, f in zip(names, folders)]


def collect(folders):
    """compare_rows of every folder, in the order given (all folders are read before anything else)."""
    folders = [pathlib.Path(f) for f in folders]
    docs = [load(f) for f in folders]
    return [row for label, doc in zip(_labels(folders), docs) for row in compare_rows(doc, label)]


def _job_cell(row):
    flags = [flag for flag, on in (("noise", row["role"] == "noise"), ("invalid", row["valid"] is False)) if on]
    return row["job"] + (f" ({', '.join(flags)})" if flags else "")


def compare(folders):
    """One table of every run or case, job and size of the folders, ready to print."""
    folders = list(folders)
    rows = collect(folders)
    cells = [(r["folder"], r["run"], _job_cell(r), _size(r["size"]), _num(r["busbw_mbps"]),
              _num(r["cct_p50_ms"], 1), _num(r["cct_p99_ms"], 1), _num(r["uplink_max_mean"]),
              r["out_of_sequence"], r["retransmitted_packets"], r["local_ack_timeout_err"],
              _num(r["recovery_s"]), r["outliers"]) for r in rows]
    title = (f"{len(folders)} results folders; recovery is the mean over a run's faults that recovered, "
             f"outliers the symmetry outliers found")
    return format_table(COMPARE_HEADER, cells, title=title)


def compare_plot(folders, path):
    """Bars of busbw and CCT p99 per (folder, run, job) of the measured jobs, each at its first size;
    labels keep only the parts that differ between bars, wrapped so neighbours do not overlap."""
    import textwrap

    rows = collect(folders)
    first = {}
    for row in [r for r in rows if r["role"] != "noise"] or rows:
        first.setdefault((row["folder"], row["run"], row["job"]), row)
    if not first:
        raise LabError("nothing to plot: the folders hold no jobs")
    varying = [i for i in range(3) if len({key[i] for key in first}) > 1] or [1]
    labels = ["\n".join(textwrap.fill(str(key[i]), 12) for i in varying) for key in first]
    rows = list(first.values())
    return plots.bars(path, "busbw and CCT p99 (each job's first size)", labels, [
        ("busbw (Mbit/s)", [r["busbw_mbps"] for r in rows]),
        ("CCT p99 (ms)", [r["cct_p99_ms"] for r in rows]),
    ])


# -- command line ----------------------------------------------------------------------------------
