"""`fabriclab reproduce`: run every claim of the seeds the lab can test and write the catalogue."""

from __future__ import annotations

import pathlib
import shutil
import sys

from fabriclab.cli import running


def register(subparsers):
    p = subparsers.add_parser("reproduce", help="run the papers' claims under their conditions and write "
                                                "a catalogue of how far the lab agrees")
    p.add_argument("--quick", action="store_true", help="the experiments' quick forms, fewer draws (CI)")
    p.add_argument("--draws", type=int, metavar="N",
                   help="independent draws of every experiment (default: as many as each claim asks for, "
                        "fewer with --quick); each claim is judged on its figures' 90%% interval over them")
    p.add_argument("--only", metavar="SEED|CLAIM", help="comma-separated seeds (000) or claim ids "
                                                        "(000-eecmp-gain); `--only list` lists them")
    p.add_argument("--no-derate", dest="derate", action="store_false",
                   help="judge a draw whose run saturated the CPU as it is (not judged) instead of running it "
                        "again at half its link rates")
    p.add_argument("--out", help="results folder (default results/<time>-reproduce/)")
    p.add_argument("--resume", action="store_true",
                   help="go on with a run that stopped part-way in --out: the draws it finished there are "
                        "read back, the rest run")
    p.add_argument("--from", dest="source", metavar="DIR",
                   help="judge the claims again from a catalogue folder's experiments (no fabric, no root)")
    p.add_argument("--markdown", metavar="FILE", help="also write the catalogue to FILE (its plots in a "
                                                      "folder named after it), e.g. docs/reproductions.md")
    p.set_defaults(func=cmd_reproduce)


def cmd_reproduce(args):
    from fabriclab.table import format_table
    from fabriclab.errors import LabError
    from fabriclab.workflows.reproduce import CLAIMS, catalogue, select

    if args.only == "list":
        print(format_table(("claim", "seed", "section", "experiments", "draws (quick)", "paper"),
                           [(c.id, c.seed, c.section, ", ".join(c.experiments) or "(model)",
                             f"{c.draws_for(False)} ({c.draws_for(True)})", c.paper) for c in CLAIMS]))
        return running.EXIT_VALID
    claims = select(args.only)
    if args.resume and (args.source or not args.out):
        raise LabError("--resume goes on with the run in --out DIR; --from judges one again without running")
    runner, out, quick, origin, draws = None, args.out, args.quick, None, args.draws
    if args.source:
        if draws is not None:
            raise LabError("--draws runs experiments; with --from the catalogue's own draws are judged again")
        runner, quick, origin, draws = catalogue.reader(args.source)
        out = args.out or args.source
    counts = catalogue.draw_counts(claims, quick, draws)
    print(f"reproduce: {len(claims)} claims from {len(counts)} experiments, {sum(counts.values())} runs of "
          f"them{' (quick forms)' if quick else ''}{' read from ' + args.source if args.source else ''}", flush=True)
    outcome = catalogue.run(claims, quick=quick, out=out, progress=lambda line: print(line, flush=True),
                            runner=runner, events=running.Progress(), origin=origin, draws=draws,
                            derate=args.derate, resume=args.resume)
    print("\n" + catalogue.summary_table(outcome.rows))
    if args.markdown:
        write_markdown(outcome, pathlib.Path(args.markdown), quick)
    print(f"\ncatalogue: {outcome.folder}/catalogue.md")
    if not outcome.ok:
        flipped = [r["id"] for r in outcome.rows if r["status"] == catalogue.FLIPPED]
        drops = [d for e in outcome.experiments.values() for d in e["lossless_drops"]]
        failed = [n for n, e in outcome.experiments.items() if e["error"]]
        parts = [f"direction flipped: {', '.join(flipped)}" if flipped else "",
                 f"lossless drops: {drops[0]}" + (f" (and {len(drops) - 1} more)" if len(drops) > 1 else "")
                 if drops else "",
                 f"experiments failed: {', '.join(failed)}" if failed else ""]
        print("fabriclab: reproduce failed: " + "; ".join(p for p in parts if p), file=sys.stderr)
        return running.EXIT_INVALID
    return running.EXIT_VALID


def write_markdown(outcome, path, quick):
    """The catalogue as a document of its own: FILE, with its plots copied into FILE's stem folder."""
    import json

    from fabriclab.workflows.reproduce import catalogue

    data = json.loads((outcome.folder / "catalogue.json").read_text())
    plots = path.with_suffix("")
    if plots.exists():
        shutil.rmtree(plots)
    plots.mkdir(parents=True)
    for row in data["claims"]:
        if row["plot"]:
            shutil.copy(outcome.folder / row["plot"], plots / pathlib.Path(row["plot"]).name)
            row["plot"] = pathlib.Path(row["plot"]).name
    command = f"sudo .venv/bin/fabriclab reproduce{' --quick' if quick else ''} --markdown {path}"
    head = ["# Reproductions: the papers' claims, measured", "",
            f"Generated by `{command}`; every figure below is measured, none typed in. "
            "How it works and how to add a claim: [reproduce.md](reproduce.md).", ""]
    path.write_text("\n".join(head) + "\n" + catalogue.markdown(data, plots_prefix=f"{plots.name}/"))
