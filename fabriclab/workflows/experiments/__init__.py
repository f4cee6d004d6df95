"""Packaged experiments: one command reproduces a measurement from the papers on a real fabric.

    fabriclab experiment list
    fabriclab experiment pfc-incast [--quick] [--out DIR]

or from Python (pytest):

    doc = run_experiment("pfc-incast", quick=True, out=tmp_path)

An experiment is a plan plus its own table and plot: one module that implements the Experiment
protocol below, plus its line in EXPERIMENTS. Everything is checked before the fabric is built.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from fabriclab.apps import DEFAULT_ROUTING
from fabriclab.errors import LabError

EXPERIMENTS = {
    "pfc-incast": "fabriclab.workflows.experiments.incast",
    "ecn-dcqcn": "fabriclab.workflows.experiments.ecn_dcqcn",
    "dcqcn-tuning": "fabriclab.workflows.experiments.dcqcn_tuning",
    "victim-noise": "fabriclab.workflows.experiments.victim",
    "routing-schemes": "fabriclab.workflows.experiments.routing",
    "path-pinning": "fabriclab.workflows.experiments.path_pinning",
    "ecmp-balance": "fabriclab.workflows.experiments.ecmp_balance",
    "ecmp-tiers": "fabriclab.workflows.experiments.ecmp_tiers",
    "flowlet-interval": "fabriclab.workflows.experiments.flowlet_interval",
    "ar-fabric": "fabriclab.workflows.experiments.ar_fabric",
    "multiplane-asymmetry": "fabriclab.workflows.experiments.multiplane_asymmetry",
    "plane-convergence": "fabriclab.workflows.experiments.plane_convergence",
    "plane-failover": "fabriclab.workflows.experiments.plane_failover",
    "plane-flaps": "fabriclab.workflows.experiments.plane_flaps",
    "esr": "fabriclab.workflows.experiments.esr",
    "switchml": "fabriclab.workflows.experiments.switchml",
}


@dataclasses.dataclass
class Options:
    quick: bool = False              # smaller transfers and fewer iterations (tests, CI)
    sample_s: float = 0.005          # port and queue sampling interval
    routing: object = None           # a choice (text or Routing); None: the experiment's DEFAULT_ROUTING (else ecmp)
    seed: int = 1                    # seeds the workloads' queue pairs (source ports) and the
                                     # switches' hash bases: a draw of the hash
    lossy: bool = False              # drop the lossless class (experiments with LOSSY_OPTION only)
    shuffle: bool = False            # run the cases in an order drawn from the seed (reproduce's draws)
    derate: int = 0                  # the spec's links 2**derate times slower (a saturated run's rerun)
    cc: str = "dcqcn"                # the NICs' congestion control (experiments with CC_OPTION only)


class Experiment(Protocol):
    """What an experiment's module defines (module-level names; incast.py is a short example).
    Optional: DEFAULT_ROUTING, the app its runs use unless --routing says otherwise (None: it
    compares routing schemes itself and takes no --routing; absent: ecmp), LOSSY_OPTION (True:
    it runs lossless by default and `--lossy` runs it without PFC) and CC_OPTION (True: `--cc`
    chooses its NICs' congestion control, traffic/cc.py)."""

    NAME: str               # what `fabriclab experiment NAME` calls it, and its key in EXPERIMENTS
    SUMMARY: str            # one line for `experiment list`
    DEFAULT_SPEC: str       # the spec it runs on unless --spec names another
    REFERENCE: dict         # what the paper reports, for its table

    def prepare(self, spec, options):
        """The FabricSpec the runs need, from `spec` (a lossless class, rates, ...)."""

    def runs(self, fabric, options):
        """[RunPlan]: one per case, each with its routing app, jobs, faults, conditions, ECN."""

    def table(self, doc):
        """Its text table from the one results document."""

    def plot(self, doc, folder):
        """Its plots, drawn into `folder` from the document."""


def check_protocol(mod, name):
    """`mod` if it implements Experiment under `name`; LabError naming what it lacks otherwise."""
    from fabriclab import plugins

    return plugins.check_protocol(mod, name, Experiment, ("NAME", "SUMMARY", "DEFAULT_SPEC", "REFERENCE"),
                                  "experiment", "workflows/experiments/__init__.py")


def names():
    """Every experiment's name: the built-in ones, then those installed packages add."""
    from fabriclab import plugins

    return plugins.names(EXPERIMENTS, plugins.EXPERIMENTS)


def module(name):
    """The experiment's module, built in or added by an installed package (fabriclab/plugins.py),
    checked against the protocol."""
    from fabriclab import plugins

    return check_protocol(plugins.module(name, EXPERIMENTS, plugins.EXPERIMENTS, "experiment"), name)


def build_plan(name, spec=None, options=None):
    """The experiment's Plan on `spec` (a spec name, a file, or None for its default)."""
    from fabriclab.lab.controller import check_app
    from fabriclab.topologies.fabric import Fabric
    from fabriclab.topologies.spec import load_spec
    from fabriclab.workflows.plan import Metrics, Plan

    mod = module(name)
    options = options or Options()
    if isinstance(options.seed, bool) or not isinstance(options.seed, int) or options.seed < 0:
        raise LabError(f"--seed must be a whole number >= 0, got {str(options.seed)[:20]}")
    if not options.sample_s >= 0.001:
        raise LabError(f"--sample-ms must be >= 1 ms, got {options.sample_s * 1e3:g}")
    default = getattr(mod, "DEFAULT_ROUTING", DEFAULT_ROUTING)
    if options.routing is None:
        options = dataclasses.replace(options, routing=default or DEFAULT_ROUTING)
    elif default is None:
        raise LabError(f"experiment {name} compares routing schemes itself: it takes no --routing")
    routing = check_app(options.routing)        # parsed once: every run of the experiment gets it
    given = dataclasses.asdict(dataclasses.replace(options, routing=str(routing)))   # for the record
    options = dataclasses.replace(options, routing=routing)
    if options.lossy and not getattr(mod, "LOSSY_OPTION", False):
        raise LabError(f"experiment {name} takes no --lossy: it runs under its spec's own queue settings")
    from fabriclab.traffic.cc import DEFAULT as CC_DEFAULT, KINDS as CC_KINDS
    if options.cc not in CC_KINDS:
        raise LabError(f"--cc must be one of {', '.join(CC_KINDS)}, got {str(options.cc)[:20]}")
    if options.cc != CC_DEFAULT and not getattr(mod, "CC_OPTION", False):
        raise LabError(f"experiment {name} takes no --cc: its NICs run {CC_DEFAULT}")
    if isinstance(options.derate, bool) or not isinstance(options.derate, int) or not 0 <= options.derate <= MAX_DERATE:
        raise LabError(f"derate must be 0-{MAX_DERATE} halvings of the link rates, got {str(options.derate)[:20]}")
    fabric_spec = mod.prepare(load_spec(spec or mod.DEFAULT_SPEC), options)
    if options.derate:
        fabric_spec = fabric_spec.derated(2 ** options.derate)
    # the seed draws the switches' hash bases too (a routing that names its own seed keeps it)
    runs = [dataclasses.replace(r, routing=r.routing.with_seed(options.seed))
            for r in mod.runs(Fabric(fabric_spec), options)]
    sample_ms = options.sample_s * 1e3
    plan = Plan(name=name, kind="experiment", spec=fabric_spec, runs=runs,
                metrics=Metrics(sample_ms=sample_ms, bin_ms=max(50.0, sample_ms)),
                description=mod.SUMMARY, source={"experiment": name, **given},
                experiment=mod, order_seed=options.seed if options.shuffle else None)
    plan.check()
    return plan


def run_experiment(name, spec=None, out=None, options=None, progress=None, verbose=False, run_plots=True,
                   derate=True, plots=True):
    """Run experiment `name`; returns the results document, written to `out` (default
    results/<time>-<name>/) with the experiment's table inputs and plots (each run's own too,
    unless `run_plots` is False; none at all if `plots` is False). A run that saturated the CPU measured the software switches,
    not the fabric: with `derate`, the whole experiment runs again at half its link rates (twice
    its time scale), at most MAX_DERATE times, and the document judged is the last one's; every
    attempt stays beside it (`<out>.attempt-<k>`) and the document lists them (`attempts`)."""
    import pathlib

    from fabriclab.results import document
    from fabriclab.workflows import pipeline

    options = options or Options()
    folder = pathlib.Path(out) if out else document.default_folder(name)
    attempts = []
    while True:
        plan = build_plan(name, spec, options)
        doc = pipeline.run_plan(plan, folder, progress=progress, verbose=verbose, run_plots=run_plots,
                                plots=plots).doc
        saturated = saturated_runs(doc)
        attempts.append({"derate": options.derate, "host_rate_mbps": doc["scale"]["host_rate_mbps"],
                         "time_scale": doc["scale"]["time_scale"], "saturated": saturated,
                         "elapsed_s": doc["elapsed_s"]})
        if not runs_again(saturated, options.derate, derate):
            break
        aside = folder.with_name(f"{folder.name}.attempt-{len(attempts)}")
        if aside.exists():
            import shutil

            shutil.rmtree(aside)
        folder.rename(aside)
        attempts[-1]["folder"] = aside.name
        if progress:
            progress({"event": "derate", "saturated": saturated, "derate": options.derate + 1})
        options = dataclasses.replace(options, derate=options.derate + 1)
    if len(attempts) > 1 or attempts[0]["derate"]:      # the rates it ran at are not the spec's
        doc["attempts"] = attempts
        document.write(doc, folder)
    return doc


MAX_DERATE = 2                 # halvings of the link rates a saturated experiment is run again at


def runs_again(saturated, halvings, derate=True):
    """Whether an attempt run at `halvings` whose `saturated` runs (saturated_runs) are not empty
    is followed by one at half its rates (with `derate`, at most MAX_DERATE halvings)."""
    return bool(derate and saturated and halvings < MAX_DERATE)


def saturated_runs(doc):
    """Labels of the runs that are not valid only because the CPU saturated (a lossless drop or a
    failed check is the fabric's, and no slower rate would mend it)."""
    out = []
    for run in doc["runs"]:
        reasons = run["invalid"]
        if reasons and all("CPU saturated" in reason for reason in reasons):
            out.append(run["label"])
    return out


# -- reading an experiment's document (its tables and plots) ---------------------------------------
def label(run):
    """A run's name for a table, flagged when it is not valid: a saturated CPU (the software
    switches, not the modelled fabric, may have set its numbers), or a drop in a lossless class."""
    if run["valid"]:
        return run["label"]
    flags = [flag for flag, prefix in (("CPU SATURATED", "CPU"), ("LOSSLESS DROPS", "lossless drop"))
             if any(prefix in reason for reason in run["invalid"])]
    return f"{run['label']} ({', '.join(flags) or 'INVALID'})"


def num(value):
    """A figure for a table: 3 significant digits, '-' where there is none."""
    return "-" if value is None else f"{value:.3g}"


def first_size(run, job):
    """The first message size of a collective job of a run (experiments run one size)."""
    return run["jobs"][job]["sizes"][0]


def hops(run):
    return (run.get("queues") or {}).get("hops") or {}


def queue_totals(run):
    return ((run.get("queues") or {}).get("report") or {}).get("totals") or {}


def report_preface(doc):
    """The lines report.md shows after its header for a document read back: its experiment's
    summary and table (none for other documents)."""
    from fabriclab.results.report import experiment_preface

    if not doc.get("experiment"):
        return []
    return experiment_preface(module(doc["experiment"]["name"]), doc)
