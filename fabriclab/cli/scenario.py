"""`fabriclab scenario check|run FILE`: validate a scenario file, or run it into a results folder.

    fabriclab scenario check examples/scenarios/flap_recovery.yaml
    fabriclab scenario run examples/scenarios/flap_recovery.yaml --out results/flap

`check` checks everything against the fabric without building it. `run` shows which run (routing x
repetition) is going and how far its timeline is, prints a table per run (the jobs, each fault's
dip and recovery, symmetry outliers) and writes the folder (results.json, CSVs, PNGs, report.md).
"""

from __future__ import annotations

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
    from fabriclab.workflows import scenario

    sc = scenario.load(args.file)
    if args.action == "check":
        scenario.prepare(sc)
        print(f"{args.file}: ok: {sc.name}: {len(sc.jobs)} job(s), {len(sc.faults)} fault(s), "
              f"{len(sc.routings)} routing scheme(s) x {sc.repetitions} repetition(s)")
        return 0
    plan = scenario.to_plan(sc)
    heading = f"scenario {sc.name}: {sc.description}".rstrip(": ")
    return running.execute(plan, args, heading, {"table": tables.runs_table})
