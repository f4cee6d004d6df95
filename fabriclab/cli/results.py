"""`fabriclab report` and `fabriclab compare`: read results folders back."""

from __future__ import annotations

import json
import sys

from fabriclab.results import report


def register(subparsers):
    p = subparsers.add_parser("report", help="re-render a scenario results folder: plots and report.md")
    p.add_argument("folder", metavar="FOLDER")
    p.set_defaults(func=cmd_report)
    p = subparsers.add_parser("compare", help="one table of several results folders (scenario or experiment)")
    p.add_argument("folders", metavar="FOLDER", nargs="+")
    p.add_argument("--plot", metavar="PNG", help="also draw busbw and CCT p99 bars into this PNG")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_compare)


def cmd_report(args):
    print(report.render(args.folder))
    return 0


def cmd_compare(args):
    if args.format == "json":
        print(json.dumps(report.collect(args.folders), indent=1))
    else:
        print(report.compare(args.folders))
    if args.plot:
        path = report.compare_plot(args.folders, args.plot)
        print(f"plot: {path}", file=sys.stdout if args.format == "table" else sys.stderr)
    return 0
