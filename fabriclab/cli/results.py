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
    if args.format == "json":
        print(json.dumps(compare.collect(args.folders), indent=1))
    else:
        print(compare.table(args.folders))
    if args.plot:
        path = compare.plot(args.folders, args.plot)
        print(f"plot: {path}", file=sys.stdout if args.format == "table" else sys.stderr)
    return 0
