"""`fabriclab sweep FILE`: every combination of a sweep file's parameters, here or over machines.

    fabriclab sweep examples/sweeps/qps_by_routing.yaml --check
    sudo fabriclab sweep examples/sweeps/qps_by_routing.yaml --out results/qps
    fabriclab sweep examples/sweeps/qps_by_routing.yaml --out results/qps --inventory .vagrant/fabriclab-inventory.ini

Run again with the same --out, it resumes: cases done are kept. Prints a row per case and writes,
beside the cases' folders, a plot per varied parameter (sweep-<parameter>.png).
"""

from __future__ import annotations

import re
import sys
import time

from fabriclab.cli import running
from fabriclab.table import format_table


def register(subparsers):
    p = subparsers.add_parser("sweep", help="run every combination of a sweep file's parameter lists "
                                            "(here, or over an ansible inventory's machines)")
    p.add_argument("file", metavar="FILE", help="a scenario file with a sweep: section (see docs/scenarios.md)")
    p.add_argument("--check", action="store_true", help="expand and check every case against its fabric; run nothing")
    p.add_argument("--out", help="the sweep's folder (default results/<time>-<name>-sweep/); the same folder resumes")
    p.add_argument("--inventory", metavar="FILE",
                   help="spread the cases over this ansible inventory's machines (its `lab` group)")
    p.add_argument("--verbose", action="store_true", help="show Mininet's and the lab's progress")
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(args):
    from fabriclab.workflows import sweep

    sw = sweep.load(args.file)
    varied = ", ".join(f"{k} ({len(v)})" for k, v in sw.parameters.items())
    if args.check:
        sweep.check(sw)
        print(f"{args.file}: ok: {sw.name}: {len(sw.cases)} case(s) over {varied}")
        return running.EXIT_VALID
    folder = args.out or f"results/{time.strftime('%Y%m%d-%H%M%S')}-{_slug(sw.name)}-sweep"
    where = f"over the machines of {args.inventory}" if args.inventory else "here, one after another"
    print(f"sweep {sw.name}: {len(sw.cases)} case(s) over {varied}, {where}; folder {folder}", flush=True)
    record = sweep.run(sw, folder, args.inventory, log=lambda line: print(line, flush=True), verbose=args.verbose)
    rows = sweep.summary(record)
    print()
    print(case_table(sw, rows))
    for parameter in sw.parameters:
        if len(sw.parameters[parameter]) > 1:
            path = plot_parameter(rows, parameter, record.folder / f"sweep-{_slug(parameter)}.png")
            if path:
                print(f"plot: {path}")
    print(f"\nsweep: {record.folder}/sweep.json; each case's results in {record.folder}/cases/")
    states = [row["state"] for row in rows]
    if any(s != "done" for s in states):
        print(f"fabriclab: {sum(s != 'done' for s in states)} case(s) not done (run again to resume)", file=sys.stderr)
        return running.EXIT_ERROR
    if not all(row["valid"] for row in rows):
        print("fabriclab: some cases' results are not valid (see their report.md)", file=sys.stderr)
        return running.EXIT_INVALID
    return running.EXIT_VALID


def _slug(text):
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:60] or "sweep"


def _num(value, decimals=2):
    return "-" if value is None else f"{value:.{decimals}f}"


def case_table(sw, rows):
    from fabriclab.workflows.sweep import _short

    header = ("case", *sw.parameters, "state", "machine", "busbw Mbit/s", "CCT p50 ms", "CCT p99 ms", "valid")
    cells = [(r["id"], *(_short(r["params"][p]) for p in sw.parameters), r["state"], r["machine"] or "-",
              _num(r["busbw_mbps"]), _num(r["cct_p50_ms"], 1), _num(r["cct_p99_ms"], 1),
              "-" if r["valid"] is None else ("yes" if r["valid"] else "no")) for r in rows]
    lines = [format_table(header, cells, title=f"{sw.name}: the first measured job's first size, per case")]
    lines += [f"  {r['id']}: {r['error']}" for r in rows if r["error"] and r["state"] != "done"]
    return "\n".join(lines)


def plot_parameter(rows, parameter, path):
    """Bars of mean busbw and CCT p99 per value of one parameter; None when nothing is done."""
    from fabriclab.results import plots
    from fabriclab.workflows.sweep import _short, by_parameter

    groups = by_parameter(rows, parameter)
    if not any(count for _v, _b, _c, count in groups):
        return None
    return plots.bars(path, f"{parameter}: mean over the other parameters' cases",
                      [_short(v) for v, _b, _c, _n in groups],
                      [("busbw (Mbit/s)", [b for _v, b, _c, _n in groups]),
                       ("CCT p99 (ms)", [c for _v, _b, c, _n in groups])])
