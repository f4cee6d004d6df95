"""Scenario files: a fabric, routing, jobs, faults on a timeline, metrics and repetitions in one
declarative YAML file, checked before anything is built and run into a results folder.

    name: flap-during-allreduce
    spec: tiny                      # a shipped spec name or a path (relative to this file)
    routing: ecmp                   # or a list: every scheme runs the whole workload
    repetitions: 2
    duration_s: 4                   # optional: measured jobs repeat iterations until then
    jobs:
      - {name: train, collective: allreduce, sizes: [1M], hosts: [h1, h2, h3, h4]}
      - {name: noise, role: noise, collective: alltoall, sizes: [256K], hosts: [h5, h6]}
    faults:
      - {at: 1.0, flap: l1-s1, count: 2, down: 0.5, up: 0.5}
    metrics: {sample_ms: 5, bin_ms: 50, tolerance: 0.25}

A job takes every field of the collective engine's CollectiveSpec (sizes as 64K/1M or bytes).
`role: noise` jobs run from before the measured jobs start until they end. Jobs must use disjoint
hosts. Faults: see fabriclab.workflows.faults. Each run (routing x repetition) writes links-<run>.csv
(Mbit/s per link direction per bin), queues-<run>.csv when the spec models queues, and the
results.json that `fabriclab report` turns into plots and report.md.
"""

from __future__ import annotations

import dataclasses
import pathlib


from fabriclab import jobs as job_kinds
from fabriclab.apps import DEFAULT_ROUTING
from fabriclab.errors import LabError
from fabriclab.workflows import faults as faults_mod
from fabriclab.workflows import plan as plan_mod
from fabriclab.loading import clip, excerpt, is_file, load_yaml

TOP_FIELDS = ("name", "description", "spec", "routing", "repetitions", "duration_s", "jobs", "faults", "metrics")
METRIC_DEFAULTS = dataclasses.asdict(plan_mod.Metrics())
ROLES = plan_mod.ROLES


@dataclasses.dataclass
class ScenarioJob:
    name: str
    role: str
    spec: object                   # CollectiveSpec | AllPairsSpec | AggregationSpec | ReplaySpec

    @property
    def noise(self):
        return self.role == "noise"


@dataclasses.dataclass
class Scenario:
    name: str
    description: str
    spec: str
    routings: list
    repetitions: int
    duration_s: float | None
    jobs: list
    faults: list
    metrics: dict
    source: dict
    base: pathlib.Path

    def spec_path(self):
        """The spec as load_spec takes it: a path relative to the scenario file, or a name."""
        candidate = self.base / self.spec
        return str(candidate) if candidate.suffix in (".yaml", ".yml") or is_file(candidate) else self.spec


def load(path):
    """Read and validate a scenario file (no fabric needed); LabError naming file and field."""
    path = pathlib.Path(path)
    data = load_yaml(path, "scenario")
    try:
        return parse(data, path.parent)
    except LabError as exc:
        raise LabError(f"{clip(path)}: {exc}") from None


def parse(data, base=pathlib.Path(".")):
    if not isinstance(data, dict):
        raise LabError("scenario: the file must be a mapping with name, spec and jobs")
    unknown = [k for k in data if k not in TOP_FIELDS]
    if unknown:
        raise LabError(f"scenario: unknown field {excerpt(unknown[0])} (fields: {', '.join(TOP_FIELDS)})")
    for field in ("name", "spec", "jobs"):
        if field not in data:
            raise LabError(f"scenario: missing {field}")
    name, spec = data["name"], data["spec"]
    if not isinstance(name, str) or not name.strip():
        raise LabError(f"scenario: name must be a non-empty string, got {excerpt(name)}")
    if not isinstance(spec, str) or not spec:
        raise LabError(f"scenario: spec must be a spec name or a path, got {excerpt(spec)}")
    routing = data.get("routing", DEFAULT_ROUTING)
    routings = routing if isinstance(routing, list) else [routing]
    if not routings or not all(isinstance(r, str) and r for r in routings):
        raise LabError(f"scenario: routing must be an app name or a list of them, got {excerpt(routing)}")
    if len(set(routings)) != len(routings):
        raise LabError(f"scenario: routing lists a scheme twice: {excerpt(routing)} (use repetitions)")
    repetitions = data.get("repetitions", 1)
    if isinstance(repetitions, bool) or not isinstance(repetitions, int) or repetitions < 1:
        raise LabError(f"scenario: repetitions must be a whole number >= 1, got {excerpt(repetitions)}")
    # Every routing scheme runs every repetition: the plan's runs are their product, bounded before
    # any run is made (a billion repetitions would be a billion runs in memory first).
    if repetitions * len(routings) > plan_mod.MAX_RUNS:
        raise LabError(f"scenario: repetitions x routing schemes is {excerpt(repetitions)} x {len(routings)}, "
                       f"more than {plan_mod.MAX_RUNS} runs (each is seconds of traffic at the least; "
                       f"a longer series is a sweep's)")
    duration = data.get("duration_s")
    if duration is not None and (isinstance(duration, bool) or not isinstance(duration, (int, float))
                                 or not duration > 0):
        raise LabError(f"scenario: duration_s must be > 0 seconds, got {excerpt(duration)}")
    jobs = _jobs(data["jobs"], duration, pathlib.Path(base))
    faults = faults_mod.parse(data.get("faults"))
    metrics = _metrics(data.get("metrics"))
    last = max((f.at for f in faults), default=0.0)
    if duration is not None and last >= duration:
        raise LabError(f"scenario: a fault at {last:g} s comes after duration_s ({duration:g} s) ends the jobs")
    description = data.get("description") or ""
    if not isinstance(description, str):
        raise LabError(f"scenario: description must be text, got {excerpt(description)}")
    return Scenario(name.strip(), description, spec, routings, repetitions,
                    float(duration) if duration is not None else None, jobs, faults, metrics, data,
                    pathlib.Path(base))


def _jobs(entries, duration, base=pathlib.Path(".")):
    if not isinstance(entries, list) or not entries:
        raise LabError("scenario: jobs must be a non-empty list of collectives")
    jobs, names = [], set()
    for i, entry in enumerate(entries):
        where = f"scenario: jobs[{i}]"
        if not isinstance(entry, dict):
            raise LabError(f"{where} must be a mapping like {{name: train, collective: allreduce}}")
        entry = dict(entry)
        name = entry.pop("name", f"job{i + 1}")
        role = entry.pop("role", "measured")
        kind = entry.pop("kind", job_kinds.DEFAULT_KIND)
        if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
            raise LabError(f"{where}.name must be letters, digits, - or _, got {excerpt(name)}")
        if name in names:
            raise LabError(f"{where}: job name {excerpt(name)} is used twice")
        names.add(name)
        if role not in ROLES:
            raise LabError(f"{where}.role must be measured or noise, got {excerpt(role)}")
        if not isinstance(kind, str) or kind not in job_kinds.names():
            raise LabError(f"{where}.kind must be one of {', '.join(job_kinds.names())}, got {excerpt(kind)}")
        try:
            spec = job_kinds.module(kind).parse(entry, base)
        except LabError as exc:
            raise LabError(f"{where} ({name}): {exc}") from None
        jobs.append(ScenarioJob(name, role, spec))
    if not any(not job.noise for job in jobs):
        raise LabError("scenario: every job is noise; one must be measured")
    return jobs


def _metrics(entry):
    if entry is None:
        return dict(METRIC_DEFAULTS)
    if not isinstance(entry, dict):
        raise LabError("scenario: metrics must be a mapping (sample_ms, bin_ms, tolerance)")
    unknown = [key for key in entry if key not in METRIC_DEFAULTS]
    if unknown:
        raise LabError(f"scenario: metrics.{str(unknown[0])[:30]} is unknown (fields: {', '.join(METRIC_DEFAULTS)})")
    metrics = plan_mod.Metrics(**{**METRIC_DEFAULTS, **entry})
    try:
        metrics.check()
    except LabError as exc:
        raise _in_scenario(exc) from None
    return {k: (tuple(tuple(p) for p in v) if k == "pingmesh_pairs" else float(v))
            for k, v in dataclasses.asdict(metrics).items()}


# -- the plan -------------------------------------------------------------------------------------
def to_plan(scenario):
    """The pipeline's Plan: one run per routing scheme and repetition, each with every job and
    the fault timeline. Loads the spec (a SpecError if it is bad)."""
    from fabriclab.lab.controller import check_app
    from fabriclab.topologies.spec import load_spec

    spec = load_spec(scenario.spec_path())
    faults = tuple(scenario.faults)          # one timeline, shared: checked once for every run
    parsed = {routing: check_app(routing) for routing in scenario.routings}     # once each
    runs = [plan_mod.RunPlan(f"{routing} r{rep}", routing=parsed[routing], repetition=rep,
                             jobs=[plan_mod.Job(j.name, j.spec, j.role) for j in scenario.jobs],
                             faults=faults, duration_s=scenario.duration_s)
            for routing in scenario.routings for rep in range(1, scenario.repetitions + 1)]
    source = {**scenario.source, "name": scenario.name, "description": scenario.description}
    plan = plan_mod.Plan(name=scenario.name, kind="scenario", spec=spec, runs=runs,
                         metrics=plan_mod.Metrics(**scenario.metrics), description=scenario.description,
                         source=_plain(source))
    try:
        plan.check()
    except LabError as exc:
        raise _in_scenario(exc) from None
    return plan


def prepare(scenario, verbose=False):
    """A Lab (not started) for the scenario, with every run, job, host and fault checked against
    its fabric; LabError before anything is built."""
    from fabriclab.workflows import pipeline

    plan = to_plan(scenario)
    try:
        return pipeline.prepare(plan, verbose)
    except LabError as exc:
        raise _in_scenario(exc) from None


def _in_scenario(exc):
    """A LabError from below, said as the scenario's: prefixed once (faults.py's already are)."""
    text = str(exc)
    return LabError(text if text.startswith("scenario: ") else f"scenario: {text}")


def _plain(value):
    """The scenario as given, in JSON's types (YAML may hold dates, tuples, sets)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
