"""The one plan every entry point builds: a fabric, and the runs to make on it.

    plan = Plan(name="qp-scaling", kind="collective", spec=load_spec("default"), runs=[
        RunPlan("4 QPs", routing="ecmp", jobs=[Job("ring", CollectiveSpec(qps=4))]),
    ])
    result = pipeline.run_plan(plan)           # builds the fabric, runs, writes results.json

`run` and `demo` make one run with an all-pairs job (and their --link-down/--link-up faults),
`collective` one run with one collective job, a scenario file one run per routing scheme and
repetition, an experiment one run per case. A run holds the jobs that go at once (noise jobs first,
then the measured ones), the faults on its timeline (seconds from the moment the measured jobs'
traffic begins), conditions held for the whole run (a degraded link, loss on every link), and ECN
thresholds for the queue model. Everything here is data: checking it against a fabric and running
it is fabriclab.workflows.pipeline's job.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field

from fabriclab.apps import DEFAULT_ROUTING
from fabriclab.errors import LabError
from fabriclab.workflows import faults as faults_mod
from fabriclab.loading import excerpt

KINDS = ("run", "demo", "collective", "experiment", "scenario", "calibration", "prompt", "python", "replay")
ROLES = ("measured", "noise")
CONDITION_KINDS = ("link_down", "degrade", "loss", "slow_receiver", "switch_down")
# Runs in one plan (a scenario's are routing schemes x repetitions). Each is seconds of traffic at
# the least, plus its drain and its records (its link series stay in memory and in the results
# document): 1000 runs is hours on one fabric. More is a sweep's work, over several machines.
MAX_RUNS = 1000


@dataclass(frozen=True)
class Metrics:
    """How runs are observed: port sampling interval, the bins rates are reported in, and the
    tolerance of the symmetry check (a member this far from its group's median is an outlier)."""

    sample_ms: float = 5.0
    bin_ms: float = 50.0
    tolerance: float = 0.25
    # The latency monitor (measure/pingmesh.py): ms between probes, 0 off; the host pairs it
    # probes ([] : lab/probepairs.default_pairs)
    pingmesh_ms: float = 0.0
    pingmesh_pairs: tuple = ()

    def check(self):
        if isinstance(self.pingmesh_ms, bool) or not isinstance(self.pingmesh_ms, (int, float)) \
                or not (self.pingmesh_ms == 0 or 10 <= self.pingmesh_ms <= 10_000):
            raise LabError(f"metrics.pingmesh_ms is 0 (off) or the ms between probes in [10, 10000], "
                           f"got {excerpt(str(self.pingmesh_ms)[:20])}")
        if not isinstance(self.pingmesh_pairs, (list, tuple)) or not all(
                isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(n, str) for n in p)
                for p in self.pingmesh_pairs):
            raise LabError("metrics.pingmesh_pairs is a list of [A, B] host (or host port) pairs")
        if self.pingmesh_pairs and not self.pingmesh_ms:
            raise LabError("metrics.pingmesh_pairs needs metrics.pingmesh_ms (the latency monitor is off)")
        for name in ("sample_ms", "bin_ms", "tolerance"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not value > 0:
                raise LabError(f"metrics.{name} must be a number > 0, got {excerpt(str(value)[:20])}")
        if self.sample_ms < 1:
            raise LabError(f"metrics.sample_ms must be >= 1 ms, got {self.sample_ms:g}")
        if self.sample_ms > 10_000:
            raise LabError(f"metrics.sample_ms must be <= 10000 ms, got {self.sample_ms:g}")
        if self.bin_ms < self.sample_ms:
            raise LabError("metrics.bin_ms must be >= sample_ms")
        if self.bin_ms > 60_000:
            raise LabError(f"metrics.bin_ms must be <= 60000 ms, got {self.bin_ms:g}")
        if self.tolerance >= 1:
            raise LabError(f"metrics.tolerance is a fraction below 1, got {self.tolerance:g}")


@dataclass
class Job:
    """One job of a run. `workload` is a job kind's spec (fabriclab/jobs: a CollectiveSpec, an
    AllPairsSpec, a SwitchML AggregationSpec, a ReplaySpec, or a plugin's); its type is the kind."""

    name: str
    workload: object
    role: str = "measured"

    @property
    def kind(self):
        from fabriclab import jobs

        return jobs.kind_of(self.workload)

    @property
    def noise(self):
        return self.role == "noise"


@dataclass
class RunPlan:
    label: str                              # how tables name the run: "ecmp r1", a case name
    routing: object = DEFAULT_ROUTING       # a Routing; a string is parsed into one here
    jobs: list = field(default_factory=list)
    faults: list = field(default_factory=list)       # faults.Fault on the run's timeline (or a tuple)
    conditions: list = field(default_factory=list)   # faults.Fault held for the whole run
    ecn: dict | None = None                 # {role or switch or port: set_ecn arguments}
    repetition: int = 1
    duration_s: float | None = None         # measured collectives repeat iterations until then
    note: str = ""
    tags: dict = field(default_factory=dict)         # what an experiment varies, recorded as given

    def __post_init__(self):
        from fabriclab.lab.controller import check_app

        self.routing = check_app(self.routing)      # a Routing passes through as it is

    @property
    def slug(self):
        return slug(self.label)

    def measured(self):
        return [job for job in self.jobs if not job.noise]

    def check_key(self):
        """What checking this run's jobs, faults and conditions depends on (not its routing, checked
        on its own). A scenario's runs share their jobs' workloads and one tuple of faults (the
        same objects): runs with one key are checked once."""
        def same(faults):            # a tuple cannot change: its identity says what it holds
            return id(faults) if isinstance(faults, tuple) else tuple(map(id, faults))

        return (self.duration_s, repr(self.ecn), same(self.faults), same(self.conditions),
                tuple((j.name, j.role, id(j.workload)) for j in self.jobs))


@dataclass
class Plan:
    name: str
    kind: str                               # which entry point made it (recorded in the results)
    spec: object                            # the FabricSpec
    runs: list
    metrics: Metrics = field(default_factory=Metrics)
    description: str = ""
    source: dict = field(default_factory=dict)       # the input as the user gave it, for the record
    experiment: object = None               # the experiment module, for `experiment` plans
    order_seed: int | None = None           # the runs execute in an order shuffled by this seed
                                            # (None: as listed); results list them as listed

    def execution_order(self):
        """The indices of the runs in the order they execute."""
        order = list(range(len(self.runs)))
        if self.order_seed is not None:
            random.Random(self.order_seed).shuffle(order)
        return order

    def check(self):
        """What can be checked without a fabric; LabError naming the run and job."""
        if self.kind not in KINDS:
            raise LabError(f"plan: kind must be one of {', '.join(KINDS)}, got {excerpt(self.kind)}")
        if not isinstance(self.name, str) or not self.name.strip():
            raise LabError("plan: a name is needed (it names the results folder)")
        self.metrics.check()
        if not self.runs:
            raise LabError(f"plan {excerpt(self.name)}: no runs")
        if len(self.runs) > MAX_RUNS:
            raise LabError(f"plan {excerpt(self.name)}: {len(self.runs)} runs, more than {MAX_RUNS}")
        slugs, checked = set(), set()
        for run in self.runs:
            slug, key = run.slug, run.check_key()
            if slug in slugs:
                raise LabError(f"plan {excerpt(self.name)}, run {excerpt(run.label)}: another run has the same name")
            slugs.add(slug)
            if key not in checked:             # a repetition: checked as its first run was
                checked.add(key)
                check_run(run, f"plan {excerpt(self.name)}, run {excerpt(run.label)}")


def check_run(run, where):
    from fabriclab import jobs as jobs_mod

    if not run.jobs:
        raise LabError(f"{where}: no jobs")
    if not run.measured():
        raise LabError(f"{where}: every job is noise; one must be measured")
    names = set()
    for job in run.jobs:
        if not isinstance(job.name, str) or not job.name.replace("-", "").replace("_", "").isalnum():
            raise LabError(f"{where}: job name must be letters, digits, - or _, got {excerpt(job.name)}")
        if job.name in names:
            raise LabError(f"{where}: job name {excerpt(job.name)} is used twice")
        names.add(job.name)
        if job.role not in ROLES:
            raise LabError(f"{where}, job {job.name}: role must be measured or noise, got {excerpt(job.role)}")
        try:
            jobs_mod.check_workload(job.workload)
        except LabError as exc:
            raise LabError(f"{where}, job {job.name}: {exc}") from None
    if run.duration_s is not None and (isinstance(run.duration_s, bool) or not isinstance(run.duration_s, (int, float))
                                       or not math.isfinite(run.duration_s) or not run.duration_s > 0):
        raise LabError(f"{where}: duration_s must be > 0 seconds, got {excerpt(run.duration_s)}")
    last = max((f.at for f in run.faults), default=0.0)
    if run.duration_s is not None and last >= run.duration_s:
        raise LabError(f"{where}: a fault at {last:g} s comes after duration_s ({run.duration_s:g} s) ends the jobs")
    for fault in run.conditions:
        if fault.kind not in CONDITION_KINDS:
            raise LabError(f"{where}: a condition held for the run is one of {', '.join(CONDITION_KINDS)}, "
                           f"not {fault.kind}")
        if "for" in fault.params:
            raise LabError(f"{where}: a condition lasts the whole run; it takes no `for`")


def single_run(name, kind, spec, job, routing=DEFAULT_ROUTING, faults=(), metrics=None, source=None,
               label=None):
    """The plan of `run`, `demo`, `collective` and the prompt's traffic: one run, one job."""
    plan = Plan(name=name, kind=kind, spec=spec,
                runs=[RunPlan(label or str(routing), routing=routing, jobs=[job], faults=list(faults))],
                metrics=metrics or Metrics(), source=dict(source or {}))
    plan.check()
    return plan


def link_events(down=(), up=()):
    """`run --link-down A-B@T --link-up A-B@T` as faults on the run's timeline."""
    events = [faults_mod.parse_link_event(text, False) for text in down]
    events += [faults_mod.parse_link_event(text, True) for text in up]
    return [dataclasses.replace(f, index=i) for i, f in enumerate(sorted(events, key=lambda f: f.at))]


def slug(text):
    return "".join(c if c.isalnum() else "-" for c in str(text).lower()).strip("-") or "run"
