"""`fabriclab report` and `fabriclab compare`: read results folders back, whatever wrote them."""

from __future__ import annotations

import json
import sys

from fabriclab.results import compare, document, report


def register(subparsers):
    p = subparsers.add_parser("report", help="re-render a results folder's plots and report.md")
    p.add_argument("folder", metavar="FOLDER")
    p.add_argument("--html", nargs="?", const="", metavar="FILE",
                   help="also write the fabric view: one self-contained page with a time slider "
                        "(default FOLDER/view.html)")
    p.set_defaults(func=cmd_report)
    p = subparsers.add_parser("compare", help="one table of several results folders (run, collective, "
                                              "experiment, scenario)")
    p.add_argument("folders", metavar="FOLDER", nargs="+")
    p.add_argument("--plot", metavar="PNG", help="also draw busbw and CCT p99 bars into this PNG")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--baseline", metavar="DIR",
                   help="a results folder to check the latency monitor's pairs against: exit 1 when one is "
                        "slower by more than --latency-threshold, naming the switches the slowed pairs cross")
    p.add_argument("--latency-threshold", type=float, default=0.2, metavar="FRACTION",
                   help="how much slower (p50, loaded or unloaded) a pair may get (default 0.2: 20%%)")
    p.set_defaults(func=cmd_compare)


def cmd_report(args):
    from fabriclab.workflows.experiments import report_preface

    doc = document.load(args.folder)
    print(report.render(args.folder, doc, report_preface(doc)))
    if args.html is not None:
        from fabriclab.view import page

        print(f"view: {page.write(args.folder, args.html or None, doc)}")
    return 0


def cmd_compare(args):
    found = None
    if args.baseline is not None:
        from fabriclab.measure.pingmesh import check_threshold

        check_threshold(args.latency_threshold)
        found = compare.latency_regressions(args.baseline, args.folders, args.latency_threshold)
    if args.format == "json":
        rows = compare.collect(args.folders)
        print(json.dumps(rows if found is None else {"rows": rows, "latency_regressions": found}, indent=1))
    else:
        print(compare.table(args.folders))
        if found is not None:
            print("\n".join(compare.latency_lines(found, args.latency_threshold)))
    if args.plot:
        path = compare.plot(args.folders, args.plot)
        print(f"plot: {path}", file=sys.stdout if args.format == "table" else sys.stderr)
    return 1 if found else 0
