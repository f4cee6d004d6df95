"""`fabriclab scenario check|run FILE`: validate a scenario file, or run it into a results folder.

    fabriclab scenario check examples/scenarios/flap.yaml
    fabriclab scenario run examples/scenarios/flap.yaml --out results/flap

`run` shows which run (routing x repetition) is going and how far its timeline is, prints a
table per run (the jobs, each fault's dip and recovery, symmetry outliers) and writes the folder
(results.json, CSVs, PNGs, report.md).
"""

from __future__ import annotations

import json
import sys

from fabriclab.table import format_table
from fabriclab.units import human_size


def register(subparsers):
    p = subparsers.add_parser("scenario", help="check or run a scenario file (fabric, routing, jobs, "
                                               "faults on a timeline, metrics, repetitions)")
    p.add_argument("action", choices=("check", "run"))
    p.add_argument("file", metavar="FILE", help="scenario YAML (see examples/scenarios/)")
    p.add_argument("--out", help="results folder (default results/<time>-<name>/)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--verbose", action="store_true")
    p.set_defaults(func=cmd_scenario)


def cmd_scenario(args):
    from fabriclab.workflows import scenario

    sc = scenario.load(args.file)
    if args.action == "check":
        scenario.prepare(sc)
        print(f"{args.file}: ok: {sc.name}: {len(sc.jobs)} job(s), {len(sc.faults)} fault(s), "
              f"{len(sc.routings)} routing scheme(s) x {sc.repetitions} repetition(s)")
        return 0
    table = args.format == "table"
    progress = _progress if table else None
    if table:
        print(f"scenario {sc.name}: {sc.description}".rstrip(": "), flush=True)
    doc = scenario.run(sc, args.out, progress, args.verbose)
    if table:
        print(scenario_table(doc))
        print(f"\nresults and report: {doc['folder']}/report.md")
    else:
        print(json.dumps(doc, indent=1))
    if not doc["valid"]:
        print("warning: the CPU was saturated in some run: the software switches, not the fabric, "
              "may have set those numbers", file=sys.stderr)
    return 0


def _progress(number, total, routing, repetition, status):
    label = f"[{number + 1}/{total}] {routing} run {repetition}"
    if not status["started"]:
        text = f"{label}: starting agents"
    else:
        left = f" of {status['duration_s']:g}" if status["duration_s"] else ""
        text = (f"{label}: {status['elapsed_s']:5.1f}{left} s, fault steps "
                f"{status['fault_steps']}/{status['fault_steps_total']}")
    tty = sys.stdout.isatty()
    if tty:                            # one line, redrawn in place
        sys.stdout.write("\r" + text.ljust(70) + ("\n" if status.get("finished") else ""))
    elif status.get("finished"):       # a log: one line per run
        sys.stdout.write(text + "\n")
    sys.stdout.flush()


def scenario_table(doc):
    """Per run: a row per job and size, then its faults and what the symmetry check flagged."""
    scale = doc["scale"]
    out = [f"fabric {doc['fabric']['name']}, links {scale['host_rate_mbps']:g} Mbit/s"
           + (f" (time scale x{scale['time_scale']:.0f})" if scale.get("time_scale") else "")]
    rows = []
    for run in doc["runs"]:
        for name, job in run["jobs"].items():
            for size in job["sizes"]:
                c = size["counters"]
                rows.append((f"{run['routing']} r{run['repetition']}", name + (" (noise)" if job["role"] == "noise" else ""),
                             f"{size['collective']} {human_size(size['size'])}", f"{size['busbw_mbps']:.2f}",
                             f"{size['cct_ms']['p50']:.0f}", f"{size['cct_ms']['p99']:.0f}",
                             c["out_of_sequence"], c["retransmitted_packets"], c["local_ack_timeout_err"]))
    out.append(format_table(("run", "job", "collective", "busbw Mbit/s", "CCT p50 ms", "p99", "OOS",
                             "retrans", "LAT"), rows, title="Jobs"))
    rows = []
    for run in doc["runs"]:
        for f in run["faults"]:
            hit = f.get("impact") or {}
            rows.append((f"{run['routing']} r{run['repetition']}", f["label"], _num(f["at_s"]), _num(f["until_s"]),
                         _num(hit.get("baseline_mbps")), _num(hit.get("min_mbps")),
                         _num(f.get("recovery_s_mean", hit.get("recovery_s"))), _num(hit.get("retained")),
                         f.get("note", "")))
    if rows:
        out.append(format_table(("run", "fault", "at s", "until s", "before Mbit/s", "lowest", "recovery s",
                                 "retained", "note"), rows, title="Faults (delivered traffic around each)"))
    for run in doc["runs"]:
        t = run["telemetry"]
        flagged = ", ".join(f"{member} in {group} ({metric} {100 * dev:+.0f} %)"
                            for group, member, dev, metric in t["outliers"][:6])
        if len(t["outliers"]) > 6:
            flagged += f" and {len(t['outliers']) - 6} more (report.md)"
        sampling = t["sampling"].get("reached_median_s")
        out.append(f"{run['routing']} r{run['repetition']}: uplink max/mean {_num(t['uplink_max_mean'])}; "
                   f"outliers: {flagged or 'none'}; stragglers: {', '.join(t['stragglers']) or 'none'}"
                   + (f"; sampled every {sampling * 1e3:.1f} ms" if sampling else ""))
    return "\n\n".join(out)


def _num(value):
    return "-" if value is None else f"{value:.3g}"
