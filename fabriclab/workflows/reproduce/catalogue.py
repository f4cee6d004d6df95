"""Run the experiments a set of claims reads, measure every claim, and write the catalogue.

The folder: `experiments/<name>/` (each experiment's own results folder), `plots/<claim>.png`,
`catalogue.json` (every claim with its finding and agreement, and each experiment's validity and
lossless drops) and `catalogue.md` (the same for people). A claim whose direction flips, an
experiment that fails, or a drop in a lossless class anywhere makes the run fail (exit 1).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import platform
import time

from fabriclab.errors import EnvironmentProblem, LabError, Terminated
from fabriclab.table import format_table
from fabriclab.workflows.reproduce import experiments_for
from fabriclab.workflows.reproduce.claim import AGREES, FLIPPED, KNOWN, NOT_JUDGED, Finding, agreement

# What write() puts in catalogue.json: a reader refuses anything else.
CATALOGUE_KEYS = {"created", "quick", "machine", "judged", "ok", "claims", "experiments"}
MACHINE_KEYS = {"kernel", "cpus", "arch"}

# A claim's bars by source: the paper's grey, the lab's blue, a model's or bound's orange.
SOURCE_COLORS = {"paper": "#8C8C8C", "lab": "#4C72B0", "flow": "#55A868"}


@dataclasses.dataclass
class Outcome:
    folder: pathlib.Path
    rows: list              # one dict per claim
    experiments: dict       # name -> {"seconds", "valid", "lossless_drops", "error", "folder"}

    @property
    def ok(self):
        return (all(r["status"] != FLIPPED for r in self.rows)
                and not any(e["error"] or e["lossless_drops"] for e in self.experiments.values()))


def run(claims, quick=False, out=None, progress=print, runner=None, events=None, origin=None):
    """Run the claims' experiments (quick forms with `quick`) into `out` and write the catalogue.
    `runner(name, folder, quick)` runs one experiment and returns its results document (default:
    the packaged experiment through the pipeline, its progress events to `events`). `origin`: the
    date and machine the experiments ran on, when they were read rather than run."""
    from fabriclab.results import document

    folder = pathlib.Path(out) if out else document.default_folder("reproduce")
    folder.mkdir(parents=True, exist_ok=True)
    docs, experiments = {}, {}
    names = experiments_for(claims)
    if runner is None:
        check(names, quick)
        runner = lambda name, where, quick_: _run_experiment(name, where, quick_, events)   # noqa: E731
    for i, name in enumerate(names, 1):
        progress(f"[{i}/{len(names)}] experiment {name}{' (quick)' if quick else ''}")
        t0 = time.monotonic()
        where = folder / "experiments" / name
        try:
            docs[name] = runner(name, where, quick)
            error = None
        except (Terminated, EnvironmentProblem):
            raise                         # stopped, or the machine cannot run any experiment
        except Exception as exc:          # noqa: BLE001 - one experiment's failure is its claims' verdict
            error = f"{type(exc).__name__}: {str(exc)[:300]}"
            progress(f"  {name} failed: {error}")
        # the plan's own wall time where the document has it (also when read back), else ours
        elapsed = (docs.get(name) or {}).get("elapsed_s")
        seconds = elapsed if isinstance(elapsed, (int, float)) else time.monotonic() - t0
        experiments[name] = {"seconds": round(seconds, 1), "folder": f"experiments/{name}",
                             "error": error, **_validity(docs.get(name))}
    rows = [_row(claim, docs, experiments, folder) for claim in claims]
    outcome = Outcome(folder, rows, experiments)
    write(outcome, quick, origin)
    return outcome


def check(names, quick):
    """Build every experiment's plan first: a spec or case the lab would refuse stops the run
    before any fabric is up."""
    from fabriclab.workflows.experiments import Options, build_plan

    for name in names:
        build_plan(name, options=Options(quick=quick))


def _run_experiment(name, folder, quick, events=None):
    from fabriclab.workflows.experiments import Options, run_experiment

    return run_experiment(name, out=folder, options=Options(quick=quick), progress=events)


def reader(source):
    """(runner, quick, origin) that read a catalogue folder's experiments instead of running them:
    the claims judged again (after a claim changed) without a fabric; origin is when and where
    the experiments ran."""
    from fabriclab.loading import excerpt, parse_json, read_text
    from fabriclab.results import document

    source = pathlib.Path(source)
    path = source / "catalogue.json"
    if not path.is_file():
        raise LabError(f"{source}: no catalogue.json here (not a reproduce folder?)")
    data = parse_json(read_text(path, "catalogue"), str(path))
    quick = data.get("quick") if isinstance(data, dict) else None
    if not isinstance(quick, bool):
        raise LabError(f"{path}: not a catalogue (no quick: true/false)")
    machine = data.get("machine")
    unknown = sorted(set(data) - CATALOGUE_KEYS) + (sorted(set(machine) - MACHINE_KEYS)
                                                    if isinstance(machine, dict) else [])
    if unknown:
        raise LabError(f"{path}: not a catalogue: unknown key {excerpt(unknown[0])}")
    if not (isinstance(data.get("created"), str) and isinstance(machine, dict)
            and all(isinstance(machine.get(k), t) for k, t in (("kernel", str), ("cpus", int), ("arch", str)))):
        raise LabError(f"{path}: not a catalogue (no created date or machine)")
    origin = {"created": data["created"][:40],
              "machine": {"kernel": machine["kernel"][:80], "cpus": machine["cpus"], "arch": machine["arch"][:20]}}
    return (lambda name, folder, _quick: document.load(source / "experiments" / name)), quick, origin


def _validity(doc):
    """An experiment's invalid runs and its lossless drops (the reasons that name them)."""
    if doc is None:
        return {"valid": False, "invalid_runs": [], "lossless_drops": []}
    invalid = [r["label"] for r in doc["runs"] if not r["valid"]]
    drops = [f"{r['label']}: {reason}" for r in doc["runs"] for reason in r["invalid"] if "lossless drop" in reason]
    return {"valid": not invalid, "invalid_runs": invalid, "lossless_drops": drops}


def _row(claim, docs, experiments, folder):
    failed = [f"{e}: {experiments[e]['error']}" for e in claim.experiments if experiments[e]["error"]]
    if failed:
        finding = Finding(lab="-", lab_value=None, holds=False, direction="", invalid=failed)
        status, text = FLIPPED, "experiment failed: " + failed[0]
    else:
        try:
            finding = claim.measure({e: docs[e] for e in claim.experiments})
            status, text = agreement(claim, finding)
        except (KeyError, IndexError, TypeError, ZeroDivisionError) as exc:
            # a document without the runs the claim reads: the experiment changed, not the fabric
            finding = Finding(lab="-", lab_value=None, holds=False, direction="")
            status, text = FLIPPED, f"could not measure: {type(exc).__name__}: {str(exc)[:200]}"
    plot = _plot(claim, finding, folder)
    return {"id": claim.id, "seed": claim.seed, "section": claim.section, "statement": claim.statement,
            "paper": claim.paper, "paper_value": claim.paper_value, "lab": finding.lab,
            "lab_value": _round(finding.lab_value), "against": _round(finding.against),
            "model": finding.model, "direction": finding.direction, "holds": finding.holds,
            "status": status, "agreement": text, "conditions": claim.conditions, "differs": claim.differs,
            "experiments": list(claim.experiments), "invalid": finding.invalid, "plot": plot}


def _round(value):
    return None if value is None else round(float(value), 4)


def _plot(claim, finding, folder):
    """plots/<claim>.png from the finding's bars or lines; None when it has neither."""
    from fabriclab.results import plots

    path = folder / "plots" / f"{claim.id}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    title = f"seed {claim.seed} {claim.section}: {claim.id}"
    if finding.lines:
        lines = finding.lines
        plots.lines(path, title, lines["x"], lines["series"], lines["xlabel"], lines["ylabel"],
                    reference=(claim.paper_value, f"paper: {claim.paper}") if claim.paper_value else None)
    elif finding.bars:
        bars = [(label, value) for label, value in finding.bars if value is not None]
        plots.hbars(path, title, [b[0] for b in bars], [b[1] for b in bars], finding.unit or "value",
                    colors=[SOURCE_COLORS.get(label.split()[0].rstrip(":,"), "#DD8452") for label, _v in bars])
    else:
        return None
    return f"plots/{claim.id}.png"


# -- writing --------------------------------------------------------------------------------------
def write(outcome, quick, origin=None):
    meta = {"created": time.strftime("%Y-%m-%d %H:%M %Z"), "quick": quick,
            "machine": {"kernel": platform.release(), "cpus": os.cpu_count(), "arch": platform.machine()},
            **(origin or {}), "judged": time.strftime("%Y-%m-%d %H:%M %Z"), "ok": outcome.ok}
    data = {**meta, "claims": outcome.rows, "experiments": outcome.experiments}
    (outcome.folder / "catalogue.json").write_text(json.dumps(data, indent=1) + "\n")
    (outcome.folder / "catalogue.md").write_text(markdown(data))


def summary_table(rows):
    return format_table(("claim", "paper", "lab", "agreement"),
                        [(r["id"], r["paper"], _clip(r["lab"], 70), _clip(r["agreement"], 60)) for r in rows])


def _clip(text, n):
    return text if len(text) <= n else text[:n - 3] + "..."


def markdown(data, plots_prefix=""):
    """The catalogue for people: a summary table, each experiment's validity, then per claim what
    the paper says, what the lab measured, the agreement, the plot, and why it differs."""
    m = data["machine"]
    counts = {s: sum(r["status"] == s for r in data["claims"]) for s in (AGREES, FLIPPED, NOT_JUDGED, KNOWN)}
    out = [f"Run {data['created']} on Linux {m['kernel']} ({m['arch']}, {m['cpus']} CPUs)"
           f"{', quick forms' if data['quick'] else ''}: {counts[AGREES]} claims agree in direction, "
           f"{counts[FLIPPED]} flipped, {counts[KNOWN]} differ as expected, {counts[NOT_JUDGED]} not judged.", "",
           "| claim | paper | lab | agreement |", "| --- | --- | --- | --- |"]
    out += [f"| [{r['id']}](#{r['id']}) | {r['paper']} | {_cell(r['lab'])} | {_cell(r['agreement'])} |"
            for r in data["claims"]]
    out += ["", "| experiment | minutes | valid | lossless drops |", "| --- | --- | --- | --- |"]
    for name, e in data["experiments"].items():
        valid = "failed: " + _cell(e["error"]) if e["error"] else (
            "yes" if e["valid"] else "no: " + ", ".join(e["invalid_runs"]))
        out.append(f"| {name} | {e['seconds'] / 60:.1f} | {valid} | {len(e['lossless_drops'])} |")
    for r in data["claims"]:
        out += ["", f"### {r['id']}", "", f"**Seed {r['seed']}, {r['section']}.** {r['statement']}.", "",
                f"- Paper: {r['paper']}.", f"- Lab: {r['lab']}."]
        if r["model"]:
            out.append(f"- Model: {r['model']}.")
        out += [f"- Agreement: {r['agreement']}.", f"- Conditions: {r['conditions']}."]
        if r["differs"]:
            out.append(f"- Why it differs: {r['differs']}.")
        if r["experiments"]:
            out.append(f"- From: {', '.join('`fabriclab experiment ' + e + '`' for e in r['experiments'])}.")
        if r["plot"]:
            out += ["", f"![{r['id']}]({plots_prefix}{r['plot']})"]
    return "\n".join(out) + "\n"


def _cell(text):
    return str(text).replace("|", "/").replace("\n", " ")
