"""`fabriclab experiment NAME`: run a packaged experiment, print its table, write its folder."""

from __future__ import annotations

from fabriclab.cli import running
from fabriclab.table import format_table


def register(subparsers):
    from fabriclab.workflows.experiments import EXPERIMENTS

    p = subparsers.add_parser("experiment", help="run a packaged experiment (table, results.json, "
                                                 "plots); `experiment list` names them")
    # not argparse choices: an installed package may add experiments (fabriclab/plugins.py), and
    # looking for them costs every verb's start; an unknown name is refused by the lookup
    p.add_argument("name", metavar="NAME",
                   help="list, or one of: " + ", ".join(EXPERIMENTS) + " (and those installed packages add)")
    p.add_argument("--spec", help="fabric spec (default: the experiment's own)")
    p.add_argument("--routing", help="controller app for the experiment's runs (default: the "
                                     "experiment's own; refused by those that compare schemes)")
    p.add_argument("--quick", action="store_true",
                   help="smaller transfers and fewer iterations (a minute instead of several)")
    p.add_argument("--sample-ms", type=float, default=5.0, help="port and queue sampling interval (default 5 ms)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-derate", dest="derate", action="store_false",
                   help="keep a run that saturated the CPU as it is (not valid) instead of running the experiment "
                        "again at half its link rates, at most twice")
    p.add_argument("--lossy", action="store_true",
                   help="run without the lossless class (PFC) where the experiment allows it "
                        "(routing-schemes); results say so")
    from fabriclab.traffic.cc import DEFAULT as CC_DEFAULT, KINDS as CC_KINDS
    p.add_argument("--cc", choices=tuple(CC_KINDS), default=CC_DEFAULT,
                   help=f"the NICs' congestion control where the experiment allows it (multiplane-asymmetry, "
                        f"plane-convergence): {', '.join(CC_KINDS)} (default {CC_DEFAULT}; spx also marks "
                        f"ECN in the switches' ar mode); results say so")
    running.add_output_args(p)
    p.set_defaults(func=cmd_experiment)


def cmd_experiment(args):
    from fabriclab.workflows.experiments import Options, build_plan, module, names, run_experiment

    if args.name == "list":
        rows = [(name, module(name).DEFAULT_SPEC, module(name).SUMMARY) for name in names()]
        print(format_table(("experiment", "default spec", "what it shows"), rows))
        return 0
    options = Options(quick=args.quick, sample_s=args.sample_ms / 1e3, routing=args.routing, seed=args.seed,
                      lossy=args.lossy, cc=args.cc)
    plan = build_plan(args.name, args.spec, options)          # every case checked before anything runs

    def runner(progress):
        import pathlib
        import types

        doc = run_experiment(args.name, args.spec, args.out, options, progress=progress, verbose=args.verbose,
                             run_plots=args.run_plots, derate=args.derate, plots=args.plots)
        return types.SimpleNamespace(doc=doc, folder=pathlib.Path(doc["folder"]))

    return running.execute(plan, args, f"{args.name}: {plan.experiment.SUMMARY}",
                           {"table": lambda doc: "\n" + plan.experiment.table(doc)}, runner=runner)
