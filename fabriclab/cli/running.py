"""What the verbs that run a plan share: their common options, the progress they print while the
pipeline runs, and the exit code a results document earns.

Exit codes, the same for every verb: 0 the run completed and is valid; 1 it completed but is not
valid (a saturated CPU, a failed verification: the numbers are not the fabric's); 2 bad input or a
failure the lab names in one line; 130 interrupted (Ctrl-C or SIGTERM, with the fabric torn down).
"""

from __future__ import annotations

import json
import sys

from fabriclab.table import progress_bar

EXIT_VALID, EXIT_INVALID, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130


def add_output_args(p, formats=("table", "json")):
    p.add_argument("--out", help="results folder (default results/<time>-<name>/)")
    p.add_argument("--format", choices=formats, default="table")
    p.add_argument("--verbose", action="store_true", help="show Mininet's and the lab's progress")
    p.add_argument("--no-run-plots", dest="run_plots", action="store_false",
                   help="leave out each run's heatmap, delivered-rate and NIC plots (about a second a run); "
                        "`fabriclab report FOLDER` draws them later")
    p.add_argument("--no-plots", dest="plots", action="store_false",
                   help="draw no plot at all (results, CSVs and report.md only; `fabriclab report FOLDER` "
                        "draws them later): a sweep's lab machines run their cases so")


def execute(plan, args, heading, renderers, bar=False, runner=None):
    """What every verb that runs a plan does: say what it starts, run it through the pipeline with
    progress lines, print the document in the chosen format (`renderers`: {format: doc -> text};
    `json` prints the document itself) and return the exit code the document earns. Only `table`
    is for people (heading, progress, where the results went); any other format prints its text
    alone, for scripts to parse (a text format says on stderr where the results went).
    `runner(progress)`, where given, runs the plan instead (an experiment's own loop) and returns
    an object with the document and folder, as pipeline.run_plan does."""
    from fabriclab.workflows import pipeline

    table = args.format == "table"
    if table:
        print(heading, flush=True)
    progress = Progress(bar=bar) if table else None
    if runner is not None:
        result = runner(progress)
    else:
        result = pipeline.run_plan(plan, args.out, progress=progress, verbose=args.verbose,
                                   run_plots=getattr(args, "run_plots", True), plots=getattr(args, "plots", True))
    if args.format not in renderers:
        print(json.dumps(result.doc, indent=1))
    elif table:
        print(renderers[args.format](result.doc))
        print(f"\nresults: {result.folder}/results.json (report: {result.folder}/report.md)")
    else:
        print(renderers[args.format](result.doc))
        print(f"results: {result.folder}/results.json", file=sys.stderr)
    return exit_code(result.doc)


def exit_code(doc, stream=None):
    """0 for a valid document, 1 (with the reasons on stderr) for one that is not."""
    if doc["valid"]:
        return EXIT_VALID
    stream = stream or sys.stderr
    reasons = sorted({reason for run in doc["runs"] for reason in run["invalid"]})
    print("fabriclab: results not valid: " + "; ".join(reasons[:3])
          + (f" (and {len(reasons) - 3} more)" if len(reasons) > 3 else ""), file=stream)
    return EXIT_INVALID


class Progress:
    """Prints the pipeline's progress events: a line per run, the run's clock and fault steps, a
    bar for a lone job's iterations (redrawn in place on a terminal, one line per run in a log)."""

    def __init__(self, stream=None, bar=False):
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.bar = bar and self.tty
        self.label = ""
        self.runs = 1

    def __call__(self, event):
        kind = event["event"]
        if kind == "up":
            self._line(f"fabric {event['spec']} up in {event['seconds']:.1f} s (datapath {event['datapath']})",
                       final=True)
        elif kind == "run":
            self.runs = event["total"]
            self.label = f"[{event['index'] + 1}/{event['total']}] {event['label']}" if event["total"] > 1 \
                else event["label"]
            self._line(f"{self.label}: starting", final=not self.tty)
        elif kind == "derate":
            self._line(f"CPU saturated in {', '.join(event['saturated'][:3])}: running again at 1/{2 ** event['derate']} "
                       f"of the link rates", final=True)
        elif kind == "job" and self.bar:
            progress_bar(event["fraction"], event.get("label", ""))
        elif kind == "tick":
            self._tick(event)

    def _tick(self, status):
        if status.get("finished") and self.bar:
            self.stream.write("\n")
        if not status["started"]:
            text = f"{self.label}: starting agents"
        else:
            left = f" of {status['duration_s']:g}" if status["duration_s"] else ""
            faults = (f", fault steps {status['fault_steps']}/{status['fault_steps_total']}"
                      if status["fault_steps_total"] else "")
            text = f"{self.label}: {status['elapsed_s']:5.1f}{left} s{faults}"
        if status.get("finished"):
            self._line(text + " done", final=True)
        elif self.tty and not self.bar:
            self._line(text, final=False)

    def _line(self, text, final):
        if self.tty:
            self.stream.write("\r" + text.ljust(70) + ("\n" if final else ""))
        elif final:
            self.stream.write(text + "\n")
        self.stream.flush()
