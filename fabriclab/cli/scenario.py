"""`fabriclab scenario check|run FILE`: validate a scenario file, or run it into a results folder.

    fabriclab scenario check examples/scenarios/flap_recovery.yaml
    fabriclab scenario run examples/scenarios/flap_recovery.yaml --out results/flap

`check` checks everything against the fabric without building it. `run` shows which run (routing x
repetition) is going and how far its timeline is, prints a table per run (the jobs, each fault's
dip and recovery, symmetry outliers) and writes the folder (results.json, CSVs, PNGs, report.md).
"""

from __future__ import annotations

import json

from fabriclab.cli import running


def register(subparsers):
    p = subparsers.add_parser("scenario", help="check or run a scenario file (fabric, routing, jobs, "
                                               "faults on a timeline, metrics, repetitions)")
    p.add_argument("action", choices=("check", "run"))
    p.add_argument("file", metavar="FILE", help="scenario YAML (see examples/scenarios/)")
    running.add_output_args(p)
    p.set_defaults(func=cmd_scenario)


def cmd_scenario(args):
    from fabriclab.results import tables
    from fabriclab.workflows import pipeline, scenario

    sc = scenario.load(args.file)
    if args.action == "check":
        scenario.prepare(sc)
        print(f"{args.file}: ok: {sc.name}: {len(sc.jobs)} job(s), {len(sc.faults)} fault(s), "
              f"{len(sc.routings)} routing scheme(s) x {sc.repetitions} repetition(s)")
        return 0
    plan = scenario.to_plan(sc)
    table = args.format == "table"
    if table:
        print(f"scenario {sc.name}: {sc.description}".rstrip(": "), flush=True)
    result = pipeline.run_plan(plan, args.out, progress=running.Progress() if table else None,
                               verbose=args.verbose)
    doc = result.doc
    if table:
        print(tables.runs_table(doc))
        print(f"\nresults and report: {result.folder}/report.md")
    else:
        print(json.dumps(doc, indent=1))
    return running.exit_code(doc)
