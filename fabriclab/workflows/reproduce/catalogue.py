"""Run the experiments a set of claims reads, measure every claim, and write the catalogue.

The folder: `experiments/<name>/` (each experiment's own results folder), `plots/<claim>.png`,
`catalogue.json` (every claim with its finding and agreement, and each experiment's validity and
lossless drops) and `catalogue.md` (the same for people). A claim whose direction flips, an
experiment that fails, or a drop in a lossless class anywhere makes the run fail (exit 1).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import platform
import time

from fabriclab.errors import EnvironmentProblem, LabError, Terminated
from fabriclab.table import format_table
from fabriclab.workflows.reproduce import experiments_for
from fabriclab.workflows.reproduce.claim import (AGREES, FLIPPED, INCONCLUSIVE, KNOWN, NOT_JUDGED, STATUSES,
                                                 Finding, agreement, effect_text)

# What write() puts in catalogue.json: a reader refuses anything else.
CATALOGUE_KEYS = {"created", "quick", "machine", "judged", "ok", "claims", "experiments"}
MACHINE_KEYS = {"kernel", "cpus", "arch"}

MAX_DRAWS = 50              # a draw is a whole experiment: 50 of the longest take a day

# A claim's bars by source: the paper's grey, the lab's blue, a model's or bound's orange.
SOURCE_COLORS = {"paper": "#8C8C8C", "lab": "#4C72B0", "flow": "#55A868"}


@dataclasses.dataclass
class Outcome:
    folder: pathlib.Path
    rows: list              # one dict per claim
    experiments: dict       # name -> {"seconds", "valid", "lossless_drops", "error", "folder", "draws"}

    @property
    def ok(self):
        return (all(r["status"] != FLIPPED for r in self.rows)
                and not any(e["error"] or e["lossless_drops"] for e in self.experiments.values()))


def draw_counts(claims, quick, draws=None):
    """How many draws each experiment the claims read runs: `draws` where given (a number, or
    {experiment: number} as a catalogue read back ran them), else the most any of its claims asks
    for."""
    counts = {}
    for name in experiments_for(claims):
        wanted = max(c.draws_for(quick) for c in claims if name in c.experiments)
        given = draws.get(name) if isinstance(draws, dict) else draws
        if isinstance(draws, dict) and given is None:
            raise LabError(f"the catalogue read back has no draws of experiment {name}")
        if given is not None and not (isinstance(given, int) and not isinstance(given, bool)
                                      and 1 <= given <= MAX_DRAWS):
            raise LabError(f"--draws must be 1-{MAX_DRAWS}, got {str(given)[:20]}")
        counts[name] = given or wanted
    return counts


def draw_folder(name, k):
    return f"experiments/{name}/draw-{k}"


def run(claims, quick=False, out=None, progress=print, runner=None, events=None, origin=None, draws=None,
        derate=True, resume=False):
    """Run the claims' experiments (quick forms with `quick`), each over its draws, into `out`, and
    write the catalogue. Draw k runs the experiment with seed k (its queue pairs, so its source
    ports: a new draw of the hash) and its cases in an order drawn from k. `runner(name, folder,
    quick, k)` runs draw k of one experiment and returns its results document (default: the
    packaged experiment through the pipeline, its progress events to `events`, run again at lower
    link rates when a run saturates the CPU unless `derate` is False). `origin`: the date and
    machine the experiments ran on, when they were read rather than run. With `resume`, a draw an
    earlier run of the same claims finished in `out` is read back instead of run again (a run of
    hours stopped part-way loses only the draw it was in)."""
    from fabriclab.results import document

    counts = draw_counts(claims, quick, draws)
    folder = pathlib.Path(out) if out else document.default_folder("reproduce")
    folder.mkdir(parents=True, exist_ok=True)
    drawer = None
    if runner is None:
        check(counts, quick)
        runner = drawer = _DrawRunner(events, derate, resume)
    elif resume:
        raise LabError("resume reads the draws an earlier run left in its folder; it runs them itself")
    docs, experiments = {}, {}
    total, step = sum(counts.values()), 0
    for name, n in counts.items():
        docs[name], errors, seconds, derated, failed = [], [], 0.0, {}, {}
        for k in range(1, n + 1):
            step += 1
            progress(f"[{step}/{total}] experiment {name}{' (quick)' if quick else ''}, draw {k} of {n}")
            t0 = time.monotonic()
            try:
                doc = runner(name, folder / draw_folder(name, k), quick, k)
                error = None
            except (Terminated, EnvironmentProblem):
                raise                     # stopped, or the machine cannot run any experiment
            except Exception as exc:      # noqa: BLE001 - one experiment's failure is its claims' verdict
                # long enough for a stall's chain of waits (traffic/stall.py)
                failed[str(k)] = f"{type(exc).__name__}: {str(exc)[:800]}"
                doc, error = None, f"draw {k}: {failed[str(k)]}"
                progress(f"  {name} failed: {error}")
                errors.append(error)
            docs[name].append(doc)
            attempts = (doc or {}).get("attempts") or []
            if attempts:                  # run slower: the scale the verdict came from
                derated[str(k)] = {"rate_divisor": 2 ** attempts[-1]["derate"], "attempts": len(attempts),
                                   "started": 2 ** attempts[0]["derate"]}
            # the plan's own wall time where the document has it (also when read back), else ours;
            # every attempt's where it was run again slower (a doomed attempt costs as much)
            elapsed = (doc or {}).get("elapsed_s")
            if attempts and all(isinstance(a.get("elapsed_s"), (int, float)) for a in attempts):
                elapsed = sum(a["elapsed_s"] for a in attempts)
            seconds += elapsed if isinstance(elapsed, (int, float)) else time.monotonic() - t0
        experiments[name] = {"seconds": round(seconds, 1), "folder": f"experiments/{name}", "draws": n,
                             "resumed": drawer.resumed.get(name, []) if drawer else [], "derated": derated,
                             "error": "; ".join(errors) or None, "failed_draws": failed,
                             **_validity(docs[name])}
    rows = [_row(claim, docs, experiments, folder, quick) for claim in claims]
    outcome = Outcome(folder, rows, experiments)
    write(outcome, quick, origin)
    return outcome


def check(names, quick):
    """Build every experiment's plan first: a spec or case the lab would refuse stops the run
    before any fabric is up."""
    from fabriclab.workflows.experiments import build_plan

    for name in names:
        build_plan(name, options=draw_options(quick, 1))


def draw_options(quick, k):
    """The options of draw k: seed k, the cases in an order drawn from it."""
    from fabriclab.workflows.experiments import Options

    return Options(quick=quick, seed=k, shuffle=True)


class _DrawRunner:
    """Runs draw k of an experiment through the pipeline. A draw starts at the link rates the
    experiment's previous draw settled on: where draw 1 saturated the CPU at full rate, draw 2
    would too, and its doomed attempt costs as much as a measured one (multiplane-asymmetry's
    quick form, on 2 cores: about 60 s of its 190 s)."""

    def __init__(self, events=None, derate=True, resume=False):
        self.events, self.derate, self.resume = events, derate, resume
        self.settled = {}                 # experiment -> halvings of the link rates its last draw ran at
        self.resumed = {}                 # experiment -> the draws read back from an earlier run

    def __call__(self, name, folder, quick, k):
        import dataclasses

        from fabriclab.workflows.experiments import run_experiment

        doc = finished_draw(name, folder, quick, k, self.derate) if self.resume else None
        if doc is not None:
            self.resumed.setdefault(name, []).append(k)
            self.settled[name] = doc["plan"]["source"]["derate"]
            return doc
        options = dataclasses.replace(draw_options(quick, k), derate=self.settled.get(name, 0) if self.derate else 0)
        # each run's own plots are left to `fabriclab report`: a second a run, dozens of runs a draw
        doc = run_experiment(name, out=folder, options=options, progress=self.events, run_plots=False,
                             derate=self.derate)
        attempts = doc.get("attempts") or []
        if attempts:
            self.settled[name] = attempts[-1]["derate"]
        return doc


def finished_draw(name, folder, quick, k, derate=True):
    """Draw k's document where an earlier run finished it in `folder`, else None: it must be this
    experiment's draw k in this form with the cases the experiment has now, and not stopped
    part-way through being run again slower (its attempts recorded, none left to run)."""
    from fabriclab.results import document
    from fabriclab.workflows.experiments import build_plan, runs_again, saturated_runs

    try:
        doc = document.load(folder)
    except LabError:
        return None                       # none there, or cut off mid-write: run it
    source = doc["plan"]["source"]
    ran_at = source.get("derate")
    if (source.get("experiment"), source.get("quick"), source.get("seed"), source.get("shuffle")) != (
            name, quick, k, True) or not isinstance(ran_at, int) or isinstance(ran_at, bool):
        return None
    attempts = doc.get("attempts") or []
    if (attempts[-1]["derate"] if attempts else 0) != ran_at or (ran_at and not derate):
        return None
    if runs_again(saturated_runs(doc), ran_at, derate):
        return None                       # it was to run again slower when it stopped
    wanted = build_plan(name, options=dataclasses.replace(draw_options(quick, k), derate=ran_at))
    if sorted(r.label for r in wanted.runs) != sorted(r["label"] for r in doc["runs"]):
        return None                       # the experiment's cases changed since
    return doc


def _why_derated(d):
    started = d.get("started", 1)
    if started == 1:
        return "CPU saturated at full"
    return (f"started at 1/{started}, where the previous draw settled"
            + (", CPU saturated there" if d["attempts"] > 1 else ""))


def reader(source):
    """(runner, quick, origin, draws) that read a catalogue folder's experiments instead of running
    them: the claims judged again (after a claim changed) without a fabric; origin is when and
    where the experiments ran, draws how many draws of each it holds."""
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
    experiments = data.get("experiments")
    if not isinstance(experiments, dict) or len(experiments) > 100 or not all(
            isinstance(e, dict) and isinstance(e.get("draws"), int) and not isinstance(e["draws"], bool)
            and 1 <= e["draws"] <= MAX_DRAWS for e in experiments.values()):
        raise LabError(f"{path}: not a catalogue of draws (each experiment needs draws: 1-{MAX_DRAWS})")
    draws = {str(name)[:60]: e["draws"] for name, e in experiments.items()}
    return (lambda name, folder, _quick, k: document.load(source / draw_folder(name, k))), quick, origin, draws


def _validity(docs):
    """An experiment's invalid runs and its lossless drops over its draws (the reasons that name
    them); a draw that failed counts as not valid."""
    invalid = [f"draw {k}: {r['label']}" if len(docs) > 1 else r["label"]
               for k, doc in enumerate(docs, 1) if doc for r in doc["runs"] if not r["valid"]]
    drops = [f"{'draw %d: ' % k if len(docs) > 1 else ''}{r['label']}: {reason}"
             for k, doc in enumerate(docs, 1) if doc for r in doc["runs"] for reason in r["invalid"]
             if "lossless drop" in reason]
    return {"valid": all(docs) and not invalid, "invalid_runs": invalid, "lossless_drops": drops}


def _row(claim, docs, experiments, folder, quick):
    """A claim's row: judged over the draws of its experiments. A draw in which one of them failed
    is left out, as a saturated one is (the failure is listed, and `reproduce` still exits 1 for
    it): one stalled run does not decide the claim, but it is not hidden either."""
    n = claim.draws_for(quick) if not claim.experiments else min(experiments[e]["draws"] for e in claim.experiments)
    try:
        findings = [_finding(claim, docs, experiments, k) for k in range(n)]
        judgement = agreement(claim, findings)
        status, text = judgement.status, judgement.text
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as exc:
        # a document without the runs the claim reads: the experiment changed, not the fabric
        findings, judgement = [], None
        status, text = FLIPPED, f"could not measure: {type(exc).__name__}: {str(exc)[:200]}"
    findings = [f for f in findings if f.effects]         # the draws that measured something
    first = findings[0] if findings else Finding(lab="-", lab_value=None, effects=(), direction="")
    lab = judgement.lab if judgement else None
    plot = _plot(claim, findings, folder)
    return {"id": claim.id, "seed": claim.seed, "section": claim.section, "statement": claim.statement,
            "paper": claim.paper, "paper_value": claim.paper_value, "lab": first.lab,
            "lab_value": _round(lab.mean) if lab else None, "lab_interval": lab.as_dict() if lab else None,
            "against": _round(first.against), "model": first.model, "direction": first.direction,
            "draws": n, "judged_draws": judgement.draws if judgement else 0,
            "effects": judgement.effects if judgement else [],
            "status": status, "agreement": text, "conditions": claim.conditions, "differs": claim.differs,
            "experiments": list(claim.experiments),
            "invalid": judgement.invalid if judgement else [], "plot": plot}


def _finding(claim, docs, experiments, k):
    """Draw k's Finding (0-based); an invalid one naming the failure where an experiment failed."""
    failed = [f"{e} failed: {experiments[e]['failed_draws'][str(k + 1)]}" for e in claim.experiments
              if docs[e][k] is None]
    if failed:
        return Finding(lab="-", lab_value=None, effects=(), direction="", invalid=failed)
    return claim.measure({e: docs[e][k] for e in claim.experiments})


def _round(value):
    return None if value is None else round(float(value), 4)


def _plot(claim, findings, folder):
    """plots/<claim>.png from the findings' bars or lines, each the mean over the draws with its
    interval; None when they have neither."""
    from fabriclab.results import plots

    if not findings:
        return None
    first = findings[0]
    path = folder / "plots" / f"{claim.id}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    title = f"seed {claim.seed} {claim.section}: {claim.id}" + (f" ({len(findings)} draws)" if len(findings) > 1 else "")
    if first.lines:
        lines = first.lines
        drawn = [f.lines for f in findings if f.lines and len(f.lines["x"]) == len(lines["x"])]
        means, bands = {}, {}
        for name in lines["series"]:
            points = [_over([d["series"][name][i] for d in drawn]) for i in range(len(lines["x"]))]
            means[name] = [iv.mean if iv else float("nan") for iv in points]
            if all(iv and iv.lo is not None for iv in points):
                bands[name] = ([iv.lo for iv in points], [iv.hi for iv in points])
        plots.lines(path, title, lines["x"], means, lines["xlabel"], lines["ylabel"],
                    reference=(claim.paper_value, f"paper: {claim.paper}") if claim.paper_value else None, bands=bands)
    elif first.bars:
        drawn = [f.bars for f in findings if len(f.bars) == len(first.bars)]
        bars = [(label, _over([d[i][1] for d in drawn])) for i, (label, _v) in enumerate(first.bars)]
        bars = [(label, iv) for label, iv in bars if iv is not None]
        plots.hbars(path, title, [b[0] for b in bars], [b[1].mean for b in bars], first.unit or "value",
                    colors=[SOURCE_COLORS.get(label.split()[0].rstrip(":,"), "#DD8452") for label, _v in bars],
                    errors=[(iv.lo, iv.hi) if iv.lo is not None and iv.lo != iv.hi else None for _l, iv in bars])
    else:
        return None
    return f"plots/{claim.id}.png"


def _over(values):
    """The interval of the finite values among `values` (None where there is none)."""
    from fabriclab.workflows.reproduce.judge import interval

    finite = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return interval(finite) if finite else None


# -- writing --------------------------------------------------------------------------------------
def write(outcome, quick, origin=None):
    meta = {"created": time.strftime("%Y-%m-%d %H:%M %Z"), "quick": quick,
            "machine": {"kernel": platform.release(), "cpus": os.cpu_count(), "arch": platform.machine()},
            **(origin or {}), "judged": time.strftime("%Y-%m-%d %H:%M %Z"), "ok": outcome.ok}
    data = {**meta, "claims": outcome.rows, "experiments": outcome.experiments}
    (outcome.folder / "catalogue.json").write_text(json.dumps(data, indent=1) + "\n")
    (outcome.folder / "catalogue.md").write_text(markdown(data))


def lab_figure(row):
    """A claim's lab figure over its draws: the compared number's mean and interval where it has
    one, else its effects'."""
    from fabriclab.workflows.reproduce.judge import Interval

    iv = row.get("lab_interval")
    if iv:
        return Interval(iv["mean"], iv["lo"], iv["hi"], iv["n"]).text()
    return "; ".join(effect_text(e) for e in row["effects"]) or row["lab"]


def summary_table(rows):
    return format_table(("claim", "verdict", "paper", "lab: mean [90% interval]"),
                        [(r["id"], r["status"], _clip(r["paper"], 40), _clip(lab_figure(r), 70)) for r in rows])


def _clip(text, n):
    return text if len(text) <= n else text[:n - 3] + "..."


def markdown(data, plots_prefix=""):
    """The catalogue for people: a summary table, each experiment's validity, then per claim what
    the paper says, what the lab measured (one draw, then every effect over the draws), the
    verdict, the plot, and why it differs."""
    m = data["machine"]
    counts = {s: sum(r["status"] == s for r in data["claims"]) for s in STATUSES}
    out = [f"Run {data['created']} on Linux {m['kernel']} ({m['arch']}, {m['cpus']} CPUs)"
           f"{', quick forms' if data['quick'] else ''}: {counts[AGREES]} claims agree, "
           f"{counts[INCONCLUSIVE]} inconclusive, {counts[FLIPPED]} flipped, {counts[KNOWN]} differ as expected, "
           f"{counts[NOT_JUDGED]} not judged. Each claim is judged on the 90% interval of its figures over "
           f"independent draws ([reproduce.md](reproduce.md#how-a-claim-is-judged)).", "",
           "| claim | paper | lab: mean [90% interval] | draws | verdict |", "| --- | --- | --- | --- | --- |"]
    out += [f"| [{r['id']}](#{r['id']}) | {r['paper']} | {_cell(lab_figure(r))} | {r['judged_draws']} of {r['draws']} "
            f"| {r['status']} |" for r in data["claims"]]
    out += ["", "| experiment | draws | minutes | link rates | valid | lossless drops |",
            "| --- | --- | --- | --- | --- | --- |"]
    for name, e in data["experiments"].items():
        valid = "failed: " + _cell(e["error"]) if e["error"] else (
            "yes" if e["valid"] else "no: " + ", ".join(e["invalid_runs"]))
        rates = "; ".join(f"draw {k}: 1/{d['rate_divisor']} ({_why_derated(d)})" for k, d in
                          sorted(e.get("derated", {}).items())) or "as specified"
        resumed = e.get("resumed") or []
        out.append(f"| {name} | {e['draws']}{' (%d from an earlier run)' % len(resumed) if resumed else ''} "
                   f"| {e['seconds'] / 60:.1f} | {rates} | {valid} | "
                   f"{len(e['lossless_drops'])} |")
    for r in data["claims"]:
        out += ["", f"### {r['id']}", "", f"**Seed {r['seed']}, {r['section']}.** {r['statement']}.", "",
                f"- Paper: {r['paper']}.", f"- Lab{' (draw 1 of %d)' % r['draws'] if r['draws'] > 1 else ''}: {r['lab']}."]
        if r["model"]:
            out.append(f"- Model: {r['model']}.")
        out += [f"- Verdict: {r['status']}: {r['agreement']}.", f"- Conditions: {r['conditions']}."]
        if r["invalid"]:
            out.append(f"- Left out: {_cell('; '.join(r['invalid'][:3]))}.")
        if r["differs"]:
            out.append(f"- Why it differs: {r['differs']}.")
        if r["experiments"]:
            out.append(f"- From: {', '.join('`fabriclab experiment ' + e + '`' for e in r['experiments'])}.")
        if r["plot"]:
            out += ["", f"![{r['id']}]({plots_prefix}{r['plot']})"]
    return "\n".join(out) + "\n"


def _cell(text):
    return str(text).replace("|", "/").replace("\n", " ")
