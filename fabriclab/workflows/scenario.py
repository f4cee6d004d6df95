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
import threading
import time

import yaml

from fabriclab.workflows import faults as faults_mod
from fabriclab.errors import LabError

TOP_FIELDS = ("name", "description", "spec", "routing", "repetitions", "duration_s", "jobs", "faults", "metrics")
METRIC_DEFAULTS = {"sample_ms": 5.0, "bin_ms": 50.0, "tolerance": 0.25}
ROLES = ("measured", "noise")
ORIGIN_TIMEOUT_S = 90.0
DURATION_ITERATIONS = 1_000_000     # "until duration_s": the stop event ends the job first


@dataclasses.dataclass
class ScenarioJob:
    name: str
    role: str
    spec: object                   # CollectiveSpec

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
        return str(candidate) if candidate.suffix in (".yaml", ".yml") or candidate.exists() else self.spec


def load(path):
    """Read and validate a scenario file (no fabric needed); LabError naming file and field."""
    path = pathlib.Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise LabError(f"cannot read scenario {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise LabError(f"{path}:{f' line {mark.line + 1}' if mark else ''} is not valid YAML: "
                       f"{getattr(exc, 'problem', exc)}") from None
    try:
        return parse(data, path.parent)
    except LabError as exc:
        raise LabError(f"{path}: {exc}") from None


def parse(data, base=pathlib.Path(".")):
    if not isinstance(data, dict):
        raise LabError("scenario: the file must be a mapping with name, spec and jobs")
    unknown = [k for k in data if k not in TOP_FIELDS]
    if unknown:
        raise LabError(f"scenario: unknown field {unknown[0]!r} (fields: {', '.join(TOP_FIELDS)})")
    for field in ("name", "spec", "jobs"):
        if field not in data:
            raise LabError(f"scenario: missing {field}")
    name, spec = data["name"], data["spec"]
    if not isinstance(name, str) or not name.strip():
        raise LabError(f"scenario: name must be a non-empty string, got {name!r}")
    if not isinstance(spec, str) or not spec:
        raise LabError(f"scenario: spec must be a spec name or a path, got {spec!r}")
    routing = data.get("routing", "ecmp")
    routings = routing if isinstance(routing, list) else [routing]
    if not routings or not all(isinstance(r, str) and r for r in routings):
        raise LabError(f"scenario: routing must be an app name or a list of them, got {routing!r}")
    if len(set(routings)) != len(routings):
        raise LabError(f"scenario: routing lists a scheme twice: {routing!r} (use repetitions)")
    repetitions = data.get("repetitions", 1)
    if isinstance(repetitions, bool) or not isinstance(repetitions, int) or repetitions < 1:
        raise LabError(f"scenario: repetitions must be a whole number >= 1, got {repetitions!r}")
    duration = data.get("duration_s")
    if duration is not None and (isinstance(duration, bool) or not isinstance(duration, (int, float))
                                 or not duration > 0):
        raise LabError(f"scenario: duration_s must be > 0 seconds, got {duration!r}")
    jobs = _jobs(data["jobs"], duration)
    faults = faults_mod.parse(data.get("faults"))
    metrics = _metrics(data.get("metrics"))
    last = max((f.at for f in faults), default=0.0)
    if duration is not None and last >= duration:
        raise LabError(f"scenario: a fault at {last:g} s comes after duration_s ({duration:g} s) ends the jobs")
    description = data.get("description") or ""
    if not isinstance(description, str):
        raise LabError(f"scenario: description must be text, got {description!r}")
    return Scenario(name.strip(), description, spec, routings, repetitions,
                    float(duration) if duration is not None else None, jobs, faults, metrics, data,
                    pathlib.Path(base))


def _jobs(entries, duration):
    from fabriclab.traffic.collective import CollectiveSpec
    from fabriclab.units import parse_size, parse_sizes

    if not isinstance(entries, list) or not entries:
        raise LabError("scenario: jobs must be a non-empty list of collectives")
    fields = {f.name for f in dataclasses.fields(CollectiveSpec)}
    jobs, names = [], set()
    for i, entry in enumerate(entries):
        where = f"scenario: jobs[{i}]"
        if not isinstance(entry, dict):
            raise LabError(f"{where} must be a mapping like {{name: train, collective: allreduce}}")
        entry = dict(entry)
        name = entry.pop("name", f"job{i + 1}")
        role = entry.pop("role", "measured")
        if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
            raise LabError(f"{where}.name must be letters, digits, - or _, got {name!r}")
        if name in names:
            raise LabError(f"{where}: job name {name!r} is used twice")
        names.add(name)
        if role not in ROLES:
            raise LabError(f"{where}.role must be measured or noise, got {role!r}")
        unknown = sorted(set(entry) - fields)
        if unknown:
            raise LabError(f"{where}: unknown field {unknown[0]!r} (a job takes name, role and the "
                           f"collective's fields: {', '.join(sorted(fields))})")
        try:
            if "sizes" in entry:
                sizes = entry["sizes"]
                sizes = parse_sizes(sizes) if isinstance(sizes, str) else \
                    [parse_size(s) if isinstance(s, str) else s for s in (sizes if isinstance(sizes, list) else [sizes])]
                entry["sizes"] = tuple(sizes)
            for key in ("chunk_bytes", "piece_bytes"):
                if isinstance(entry.get(key), str):
                    entry[key] = parse_size(entry[key])
            if isinstance(entry.get("hosts"), str):
                entry["hosts"] = tuple(h.strip() for h in entry["hosts"].split(",") if h.strip())
            elif isinstance(entry.get("hosts"), list) and all(isinstance(h, str) for h in entry["hosts"]):
                entry["hosts"] = tuple(entry["hosts"])
            elif entry.get("hosts") is not None:
                raise LabError(f"hosts must be a list of host names or \"h1,h2\", got {entry['hosts']!r}")
            if duration is not None and role == "measured":
                entry["iterations"] = DURATION_ITERATIONS
            spec = CollectiveSpec(**entry)
            spec.check()
        except LabError as exc:
            raise LabError(f"{where} ({name}): {exc}") from None
        except (TypeError, ValueError):
            bad = next((k for k, v in entry.items() if isinstance(v, str) and k not in ("collective", "algorithm",
                        "placement", "qp_method", "sport_mode")), "a field")
            raise LabError(f"{where} ({name}): {bad} has the wrong type: {entry.get(bad)!r}") from None
        jobs.append(ScenarioJob(name, role, spec))
    measured = [job.name for job in jobs if not job.noise]
    if not measured:
        raise LabError("scenario: every job is noise; one must be measured")
    return jobs


def _metrics(entry):
    metrics = dict(METRIC_DEFAULTS)
    if entry is None:
        return metrics
    if not isinstance(entry, dict):
        raise LabError("scenario: metrics must be a mapping (sample_ms, bin_ms, tolerance)")
    for key, value in entry.items():
        if key not in METRIC_DEFAULTS:
            raise LabError(f"scenario: metrics.{key} is unknown (fields: {', '.join(METRIC_DEFAULTS)})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise LabError(f"scenario: metrics.{key} must be a number > 0, got {value!r}")
        metrics[key] = float(value)
    if metrics["sample_ms"] < 1:
        raise LabError(f"scenario: metrics.sample_ms must be >= 1 ms, got {metrics['sample_ms']:g}")
    if metrics["bin_ms"] < metrics["sample_ms"]:
        raise LabError("scenario: metrics.bin_ms must be >= sample_ms")
    if metrics["tolerance"] >= 1:
        raise LabError(f"scenario: metrics.tolerance is a fraction below 1, got {metrics['tolerance']:g}")
    return metrics


# -- checking against the fabric and running ------------------------------------------------------
def prepare(scenario, verbose=False):
    """A Lab (not started) for the scenario, with every job, host and fault checked against its
    fabric; LabError before anything is built."""
    from fabriclab.lab.lab import Lab
    from fabriclab.topologies.spec import load_spec

    lab = Lab(load_spec(scenario.spec_path()), routing=scenario.routings[0], verbose=verbose)
    check_against(scenario, lab)
    return lab


def check_against(scenario, lab):
    """Routing apps, jobs (hosts, ranks, disjoint hosts) and faults against a lab's fabric."""
    from fabriclab.lab.controller import check_app
    from fabriclab.traffic.collective import place_ranks

    for routing in scenario.routings:
        check_app(routing)
    owner = {}
    for job in scenario.jobs:
        try:
            ranks = place_ranks(lab.fabric, job.spec)
        except LabError as exc:
            raise LabError(f"scenario: job {job.name}: {exc}") from None
        for host in {r.host for r in ranks}:
            if host in owner:
                raise LabError(f"scenario: jobs {owner[host]} and {job.name} both use {host}; "
                               f"concurrent jobs need disjoint hosts")
            owner[host] = job.name
    faults_mod.steps(scenario.faults, lab)


def run(scenario, out=None, progress=None, verbose=False, lab=None):
    """Run every routing x repetition of `scenario` on one fabric; returns the results document,
    written with its CSVs, plots and report into `out` (default results/<time>-<name>/).

    `lab`: a running Lab to use instead of building the scenario's spec (a test suite's shared
    fabric); it is left running, with its faults repaired, and its spec must be the scenario's."""
    import contextlib

    from fabriclab.results import report

    from fabriclab.results import document
    from fabriclab.traffic import roce

    if lab is None:
        lab, context = prepare(scenario, verbose), None
    else:
        if lab.net is None:
            raise LabError("scenario: the lab passed in is not running")
        check_against(scenario, lab)
        context = contextlib.nullcontext(lab)
    folder = pathlib.Path(out) if out else pathlib.Path("results") / f"{time.strftime('%Y%m%d-%H%M%S')}-{_slug(scenario.name)}"
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    runs = []
    with context or lab:
        header = document.run_header(lab, roce.path_mtu_for(lab.fabric.spec.mtu))
        total = len(scenario.routings) * scenario.repetitions
        for routing in scenario.routings:
            if lab.routing != routing:
                lab.set_routing(routing)
            for rep in range(1, scenario.repetitions + 1):
                tick = (lambda status, n=len(runs): progress(n, total, routing, rep, status)) if progress else None
                runs.append(run_once(lab, scenario, routing, rep, folder, tick))
    doc = {**header, "kind": "scenario", "routing": scenario.routings,
           "scenario": {**scenario.source, "name": scenario.name, "description": scenario.description},
           "metrics": scenario.metrics, "runs": runs,
           "valid": all(job["valid"] for r in runs for job in r["jobs"].values()),
           "elapsed_s": round(time.monotonic() - t0, 1), "folder": str(folder)}
    document.write_result(doc, folder)
    report.render(folder)
    return doc


def run_once(lab, scenario, routing, repetition, folder, tick=None):
    """One run: samplers on, the fault timeline armed, the jobs, then the fabric restored.
    `tick(status)` is called about twice a second with how far the run is."""
    from fabriclab.workflows.experiments.runner import Job, run_jobs, wait_drained
    from fabriclab.measure.portsampler import PortSampler
    from fabriclab.queues.sampler import QueueSampler

    sample_s = scenario.metrics["sample_ms"] / 1e3
    if lab.queues is not None:
        wait_drained(lab)
    first_event = len(lab.events)
    steps = faults_mod.steps(scenario.faults, lab)
    timeline = faults_mod.Timeline(lab, steps)
    measured_stop = threading.Event()
    measured = [f"job-{j.name}" for j in scenario.jobs if not j.noise]
    origin = {}
    watcher = threading.Thread(target=_arm, args=(lab, measured, timeline, scenario.duration_s, measured_stop, origin),
                               daemon=True, name="scenario-origin")
    ports = PortSampler(lab.fabric, sample_s).start()
    queues = QueueSampler(lab.queues, sample_s).start() if lab.queues is not None else None
    qseries = None
    ticker = _Ticker(tick, origin, timeline, scenario.duration_s) if tick else None
    try:
        timeline.start()
        watcher.start()
        if ticker:
            ticker.start()
        runs = run_jobs(lab, [Job(j.name, j.spec, j.noise) for j in scenario.jobs], measured_stop,
                        label=f"{routing} run {repetition}")
        timeline.join_checked()
    finally:
        if ticker:
            ticker.stop()
        timeline.stop()
        measured_stop.set()
        origin.setdefault("cancel", True)
        series = ports.stop()
        if queues is not None:
            qseries = queues.stop()
        lab.restore()
    end_wall = max(run.traffic_window[1] for name, run in runs.items()
                   if not next(j for j in scenario.jobs if j.name == name).noise)
    return _run_result(lab, scenario, routing, repetition, folder, runs, series, qseries,
                       origin.get("wall", series.wall0), end_wall, lab.events[first_event:], timeline.applied)


class _Ticker(threading.Thread):
    """Reports a run's progress: seconds since the origin, fault steps applied, time left."""

    def __init__(self, tick, origin, timeline, duration_s, every_s=0.5):
        super().__init__(daemon=True, name="scenario-ticker")
        self.tick, self.origin, self.timeline, self.duration_s, self.every_s = tick, origin, timeline, duration_s, every_s
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(self.every_s):
            self.tick(self.status())

    def status(self):
        wall = self.origin.get("wall")
        return {"started": wall is not None, "elapsed_s": time.time() - wall if wall else 0.0,
                "duration_s": self.duration_s, "fault_steps": len(self.timeline.applied),
                "fault_steps_total": len(self.timeline.steps)}

    def stop(self):
        self.done.set()
        self.join(2)
        self.tick(dict(self.status(), finished=True))


def _arm(lab, measured, timeline, duration_s, measured_stop, origin):
    """Wait until every measured job has announced its agents (they are up and about to run),
    then start the fault timeline's clock and the duration timer there."""
    deadline = time.monotonic() + ORIGIN_TIMEOUT_S
    while not all(name in lab.jobs for name in measured):
        if origin.get("cancel") or time.monotonic() > deadline:
            timeline.stop()
            measured_stop.set()       # jobs that did start must not run on without a clock
            return
        time.sleep(0.005)
    origin["wall"] = time.time()
    timeline.start_at(origin["wall"])
    if duration_s is not None:
        measured_stop.wait(duration_s)
        measured_stop.set()


def _run_result(lab, scenario, routing, repetition, folder, runs, series, qseries, origin_wall, end_wall,
                events, applied):
    from fabriclab.measure import symmetry
    from fabriclab.workflows.experiments.runner import size_summary
    from fabriclab.measure.telemetry import max_mean_ratio

    slug = f"{_slug(routing)}-r{repetition}"
    bin_s = scenario.metrics["bin_ms"] / 1e3
    tolerance = scenario.metrics["tolerance"]
    origin, end = series.to_series_time(origin_wall), series.to_series_time(end_wall)
    roles = {j.name: j.role for j in scenario.jobs}
    job_hosts = {name: sorted({r.host for r in run.ranks}, key=lambda h: int(h[1:])) for name, run in runs.items()}
    measured_hosts = {h for name, hosts in job_hosts.items() if roles[name] == "measured" for h in hosts}
    times, delivered = series.delivered(bin_s)
    starts = sorted(series.to_series_time(wall) for step, wall in applied if not step.undo)
    faults = [_fault_row(fault, [(step, series.to_series_time(wall)) for step, wall in applied
                                 if step.fault == fault.index], origin, end, times, delivered, starts)
              for fault in scenario.faults]
    window = (origin, end)
    groups = [g for metric in symmetry.METRICS
              for g in symmetry.check(series, *window, hosts=measured_hosts, tolerance=tolerance,
                                      metric=metric, bin_s=bin_s)]
    nics = symmetry.nic_histograms(series, bin_s, *window, hosts=measured_hosts)
    means = series.mean_mbps(*window)
    files = {"links_csv": f"links-{slug}.csv"}
    series.write_csv(folder / files["links_csv"], bin_s)
    if qseries is not None:
        from fabriclab.results import figures

        files["queues_csv"] = f"queues-{slug}.csv"
        qseries.write_csv(folder / files["queues_csv"])
        files["queues_plot"] = f"queues-{slug}.png"
        figures.queue_timeline(qseries, folder / files["queues_plot"], f"{routing} run {repetition}: lossless "
                               f"queues, marks and pauses by hop", origin=origin_wall - qseries.wall0)
    return {
        "routing": routing, "repetition": repetition, "slug": slug,
        "origin_s": round(origin, 4), "end_s": round(end, 4), "bin_s": bin_s,
        "jobs": {name: {"role": roles[name], "hosts": job_hosts[name],
                        "valid": all(row["valid"] for row in run.sizes),
                        "sizes": [size_summary(row) for row in run.sizes], "queues": run.queues}
                 for name, run in runs.items()},
        "faults": faults,
        "events": [{**{k: v for k, v in e.items() if k != "time"}, "t_s": round(e["time"] - origin_wall, 4)}
                   for e in events],
        "telemetry": {"sampling": series.timing(), "symmetry": groups,
                      "outliers": [list(row) for row in symmetry.flagged(groups)],
                      "nics": nics, "stragglers": symmetry.stragglers(nics, tolerance),
                      "uplink_max_mean": max_mean_ratio(means[c.name] for c in series.columns if c.kind == "up")},
        "queues": qseries.summary() if qseries is not None else None,
        "files": files,
    }


def _fault_row(fault, applied, origin, end, times, delivered, starts):
    """One fault as it happened: when it began and ended (seconds after the origin), each change
    it made, and the delivered traffic's dip and recovery after each time it struck."""
    from fabriclab.measure import recovery

    row = {"index": fault.index, "kind": fault.kind, "label": fault.label,
           "target": fault.target if isinstance(fault.target, (str, bool)) else list(fault.target),
           "planned_at_s": fault.at, "params": fault.params, "at_s": None, "until_s": None,
           "events": [{"t_s": round(t - origin, 4), "event": _describe(step), "undo": step.undo}
                      for step, t in applied],
           "impact": None}
    strikes = [t for step, t in applied if not step.undo]
    if not strikes:
        row["note"] = "not reached: the measured jobs ended first"
        return row
    row["at_s"] = round(strikes[0] - origin, 4)
    undos = [t for step, t in applied if step.undo]
    row["until_s"] = round(undos[-1] - origin, 4) if undos else None
    impacts = []
    for t in strikes:
        later = [s for s in starts if s > t]
        impacts.append(recovery.impact(times, delivered, t, min(later + [end])))
    row["impact"] = impacts[0]
    if len(impacts) > 1:
        row["impacts"] = impacts
        took = [i["recovery_s"] for i in impacts if i.get("recovery_s") is not None]
        row["recovery_s_mean"] = round(sum(took) / len(took), 3) if took else None
    return row


def _describe(step):
    if step.action == "link":
        links, up = step.args
        return f"{', '.join(link.label for link in links)} {'up' if up else 'down'}"
    if step.action == "rate":
        links, rate = step.args
        return f"{', '.join(link.label for link in links)} " + (f"at {rate:g} Mbit/s" if rate else "rate restored")
    if step.action == "receiver":
        host, fraction = step.args
        return f"{host} receives at {fraction:g} of line rate" if fraction else f"{host} receives at line rate"
    if step.action == "switch":
        name, up = step.args
        return f"switch {name} {'up' if up else 'down'}"
    return "controller restarted"


def _slug(text):
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")
