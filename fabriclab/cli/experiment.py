"""`fabriclab experiment NAME`: run a packaged experiment, print its table, write its folder."""

from __future__ import annotations

import json
import sys

from fabriclab.table import format_table


def register(subparsers):
    from fabriclab.workflows.experiments import EXPERIMENTS

    p = subparsers.add_parser("experiment", help="run a packaged experiment (table, results.json, "
                                                 "plots); `experiment list` names them")
    p.add_argument("name", metavar="NAME", choices=("list", *EXPERIMENTS),
                   help="list, or one of: " + ", ".join(EXPERIMENTS))
    p.add_argument("--spec", help="fabric spec (default: the experiment's own)")
    p.add_argument("--routing", default="ecmp", help="controller app (default: ecmp)")
    p.add_argument("--quick", action="store_true",
                   help="smaller transfers and fewer iterations (a minute instead of several)")
    p.add_argument("--sample-ms", type=float, default=5.0, help="queue sampling interval (default 5 ms)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", help="results folder (default results/<time>-<name>/)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--verbose", action="store_true")
    p.set_defaults(func=cmd_experiment)


def cmd_experiment(args):
    from fabriclab.workflows.experiments import EXPERIMENTS, Options, module, run_experiment

    if args.name == "list":
        rows = [(name, module(name).DEFAULT_SPEC, module(name).SUMMARY) for name in EXPERIMENTS]
        print(format_table(("experiment", "default spec", "what it shows"), rows))
        return 0
    mod = module(args.name)
    options = Options(quick=args.quick, sample_s=args.sample_ms / 1e3, routing=args.routing, seed=args.seed)
    table = args.format == "table"

    def progress(number, case):
        if table:
            print(f"[{number + 1}] {case.name} ...", flush=True)

    if table:
        print(f"{args.name}: {mod.SUMMARY}", flush=True)
    doc = run_experiment(args.name, args.spec, args.out, options, progress, args.verbose)
    if table:
        print()
        print(mod.table(doc))
        print(f"\nresults: {doc['folder']}")
    else:
        print(json.dumps(doc, indent=1))
    if not doc["valid"]:
        print("warning: the CPU was saturated in some case: the software switches, not the fabric, "
              "may have set those numbers", file=sys.stderr)
    return 0
