"""The one runner: a Plan in, a results folder out.

    result = run_plan(plan)                    # build the fabric, run every run, tear down
    result = run_plan(plan, lab=running_lab)   # on a fabric that is already up (prompt, pytest)
    result.doc                                 # the results document (also results.json)
    result.runs[0].mean_mbps("l1>s1", 2, 4)    # a link direction's rate, seconds from the origin

Everything the plan names (routing apps, hosts, ranks, links, switches, fault times) is checked
against the fabric before anything is built. Then, per run: the routing app is switched if the run
names another, lossless queues drain, ECN settings and conditions are applied, the port sampler
(and the queue sampler when the spec models queues) start, and the jobs go: noise jobs first, each
until its first iteration is done, then the measured ones. The fault timeline's origin is the
moment every measured job's traffic is about to begin; with `duration_s` the measured jobs stop
after their current iteration once that much time has passed. Afterwards the lab is put back as
the run found it (faults and conditions undone, ECN back to the spec) and the run is recorded:
each job's record, each fault's impact on the delivered traffic, the fault log, per-link rates,
symmetry outliers, stragglers, the queue model's report, the routing app's state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import pathlib
import threading
import time

from fabriclab.apps import DEFAULT_ROUTING
from fabriclab.errors import LabError
from fabriclab.loading import excerpt
from fabriclab.workflows import faults as faults_mod
from fabriclab import jobs as jobs_mod

DRAIN_TIMEOUT_S = 10.0
PLOT_MARGIN_S = 0.1
TE_POLL_S = 0.1


@dataclasses.dataclass
class RunOutcome:
    """One run as recorded, with what stays in memory for Python callers: the port series (and
    queue series), and each job's launcher result."""

    record: dict
    series: object                       # measure.portsampler.PortSeries
    queue_series: object | None
    raw: dict                            # job name -> CollectiveRun | TrafficRun | SwitchML report

    def mean_mbps(self, column, start_s, end_s):
        """Mean Mbit/s of one direction (`l1>s1`, `h1-n0>l1`) between two times counted from the
        run's origin (the moment the measured jobs' traffic began)."""
        if column not in self.series.index:
            raise LabError(f"no column {excerpt(column)} (columns look like l1>s1, s1>l1, h1-n0>l1)")
        origin = self.record["origin_s"]
        return self.series.mean_mbps(origin + start_s, origin + end_s)[column]


@dataclasses.dataclass
class PlanResult:
    doc: dict
    folder: pathlib.Path
    runs: list

    @property
    def valid(self):
        return self.doc["valid"]


# -- checking ------------------------------------------------------------------------------------
def check(plan, lab):
    """Every run of `plan` against `lab`'s fabric (the lab need not be running); LabError first."""
    plan.check()
    if plan.spec.name != lab.fabric.spec.name:
        raise LabError(f"plan {excerpt(plan.name)} is for spec {excerpt(plan.spec.name)}, the lab runs {excerpt(lab.fabric.spec.name)}")
    checked = set()
    for run in plan.runs:                   # each run's routing was checked when its RunPlan was made
        key = run.check_key()
        if key in checked:                  # a repetition, or another scheme: checked once
            continue
        checked.add(key)
        where = f"run {excerpt(run.label)}"
        owner = {}
        for job in run.jobs:
            try:
                runner = jobs_mod.runner(job, lab, run)
            except LabError as exc:
                raise LabError(f"{where}, job {job.name}: {exc}") from None
            runner.cancel()
            for host in sorted(runner.hosts, key=lambda h: (len(h), h)):
                if host in owner:
                    raise LabError(f"{where}: jobs {owner[host]} and {job.name} both use {host}; "
                                   f"jobs of one run need disjoint hosts")
                owner[host] = job.name
            if job.kind == "all-pairs" and not job.noise:
                late = [f.at for f in run.faults if f.at >= job.workload.duration_s]
                if late:
                    raise LabError(f"{where}: a fault at {late[0]:g} s comes after the traffic ends "
                                   f"({job.workload.duration_s:g} s)")
        faults_mod.check(run.faults, lab)
        faults_mod.check(run.conditions, lab)
        if run.ecn and lab.fabric.spec.queues is None:
            raise LabError(f"{where}: ECN settings need a spec with a queues: section")
    if plan.metrics.pingmesh_ms:
        _mesh_probes(lab, plan.metrics)


def prepare(plan, verbose=False):
    """A Lab (not started) for the plan, with the plan checked against its fabric."""
    from fabriclab.lab.lab import Lab

    lab = Lab(plan.spec, routing=plan.runs[0].routing if plan.runs else DEFAULT_ROUTING, verbose=verbose)
    check(plan, lab)
    return lab


# -- running -------------------------------------------------------------------------------------
def run_plan(plan, out=None, lab=None, progress=None, verbose=False, shared=False, run_plots=True,
             plots=True):
    """Run every run of `plan`; returns a PlanResult whose document is written, with its CSVs and
    plots, into `out` (default results/<time>-<name>/). `lab`: a running Lab to use instead of
    building one (it is left running, put back as the plan found it). `shared`: others use that
    lab meanwhile (the prompt): queues are not drained first, and only what the plan itself
    changed is undone. `progress(event)` gets dicts: {"event": "up", "spec", "seconds",
    "datapath"} once a fabric it built is up, {"event": "run", "index", "total", "label"},
    {"event": "tick", ...} about twice a second, {"event": "job", "job", "fraction", "label"}
    as jobs advance. `run_plots` False: report.md without each run's own plots (report.render);
    `plots` False: without any plot (the experiment's and the plan's too)."""
    from fabriclab.results import document, report
    from fabriclab.traffic import roce

    if lab is None:
        lab, context = prepare(plan, verbose), None
    else:
        if lab.net is None:
            raise LabError("the lab passed in is not running")
        check(plan, lab)
        context = contextlib.nullcontext(lab)
    folder = pathlib.Path(out) if out else document.default_folder(plan.name)
    t0 = time.monotonic()
    with context or lab:
        if progress and context is None:
            progress({"event": "up", "spec": lab.fabric.spec.name, "seconds": lab.timings["up_s"],
                      "datapath": lab.datapath})
        folder.mkdir(parents=True, exist_ok=True)
        head = document.header(lab, roce.path_mtu_for(lab.fabric.spec.mtu))
        outcomes = [None] * len(plan.runs)
        for step, index in enumerate(plan.execution_order()):
            run = plan.runs[index]
            if progress:
                progress({"event": "run", "index": step, "total": len(plan.runs), "label": run.label})
            with collector_frozen():
                outcomes[index] = run_one(lab, plan, run, folder, progress, shared)
    doc = document.assemble(plan, head, [o.record for o in outcomes], time.monotonic() - t0, folder,
                            lab.timings)
    document.write(doc, folder)
    run_plots = run_plots and plots
    if plan.experiment is not None:
        if plots:
            plan.experiment.plot(doc, folder)
        report.render(folder, doc, report.experiment_preface(plan.experiment, doc), run_plots=run_plots,
                      plan_plots=plots)
    else:
        report.render(folder, doc, run_plots=run_plots, plan_plots=plots)
    return PlanResult(doc, folder, outcomes)


@contextlib.contextmanager
def collector_frozen():
    """Python's full garbage collection holds the GIL for as long as it walks every object, tens
    of ms once earlier runs' series are in memory, and the PFC agent (a thread of this process)
    cannot close a gate meanwhile: a pause arriving then overruns its headroom. Collect before
    the run and freeze what is there, so a collection during the run walks only the run's own
    objects; unfreeze after, so nothing stays uncollectable."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def run_one(lab, plan, run, folder, progress=None, shared=False):
    """One run on a running lab; returns its RunOutcome (the record and the series behind it)."""
    from fabriclab.measure.portsampler import PortSampler
    from fabriclab.queues.sampler import QueueSampler

    # Where a run's wall time goes besides its traffic (the lab's own overhead, what CI waits for)
    phases = _Phases()
    if lab.routing != run.routing:            # by their labels: "ecmp:seed=0" is "ecmp"
        lab.set_routing(run.routing)
        phases.mark("routing_s")
    if lab.queues is not None and not shared:
        wait_drained(lab)
        phases.mark("drain_s")
    runners = {job.name: jobs_mod.runner(job, lab, run) for job in run.jobs}
    raw = None
    state = lab.fault_state()
    changes_faults = bool(run.faults or run.conditions) or not shared
    first_event = len(lab.events)
    sample_s = plan.metrics.sample_ms / 1e3
    clock = _Clock(lab, [j.name for j in run.measured()], run.duration_s)
    ports = queues = qseries = mesh = latency = None
    queue_before = loss = None
    routing = _RoutingWatch(lab, [f"job-{j.name}" for j in run.measured()])
    ticker = _Ticker(progress, clock) if progress else None
    try:
        _apply_ecn(lab, run.ecn)
        conditions = [_apply_condition(lab, fault) for fault in run.conditions]
        timed = faults_mod.steps(run.faults, lab)
        faults_mod.prepare(lab, timed)
        clock.timeline = faults_mod.Timeline(lab, timed)
        ports = PortSampler(lab.fabric, sample_s, cluster=getattr(lab, "cluster", None)).start()
        if lab.queues is not None:
            queue_before = (lab.queues.counters(), time.monotonic_ns())
            queues = QueueSampler(lab.queues, sample_s).start()
        loss = [_loss_counters(lab)]
        if plan.metrics.pingmesh_ms:
            mesh = _start_mesh(lab, plan.metrics)
        clock.timeline.start()
        routing.start()
        if ticker:
            ticker.start()
        phases.mark("setup_s")
        raw, windows = run_jobs(lab, run, runners, clock, progress)
        phases.split_at("start_s", "traffic_s", clock.wall)
        clock.timeline.join_checked()
    finally:
        if ticker:
            ticker.stop()
        clock.stop()
        routing.stop()
        if raw is None:                           # the jobs never ran: their launchers hold sockets
            for runner in runners.values():
                runner.cancel()
        try:
            if mesh is not None:
                latency = (mesh, mesh.stop())
            series = ports.stop() if ports is not None else None
            if queues is not None:
                qseries = queues.stop()
        finally:
            # Whatever failed, the fabric is put back as the run found it.
            if loss is not None:
                loss.append(_loss_counters(lab))     # before restore lifts the loss and its counters
            if changes_faults:
                lab.restore(to=state)
            _reset_ecn(lab, run.ecn)
    phases.mark("teardown_s")
    record = _record(lab, plan, run, folder, runners, raw, windows, series, qseries, clock,
                     lab.events[first_event:], conditions, routing, queue_before, loss, latency)
    phases.mark("record_s")
    record["timings_s"] = phases.seconds()
    return RunOutcome(record, series, qseries, raw)


class _Phases:
    """Wall seconds of a run's phases, each from the previous mark: switching the controller app,
    draining the queues, setting up (ECN, conditions, samplers), starting the jobs (agents up,
    until the traffic's origin), the traffic, putting the fabric back, and writing the record."""

    def __init__(self):
        self.t0 = self.last = time.monotonic()
        self.times = {}

    def mark(self, name):
        now = time.monotonic()
        self.times[name] = self.times.get(name, 0.0) + now - self.last
        self.last = now

    def split_at(self, before, after, wall):
        """Mark `before` up to the wall-clock time `wall` (None: not reached) and `after` from it."""
        now = time.monotonic()
        if wall is None:
            self.mark(before)
            return
        first = min(now - self.last, max(0.0, now - self.last - (time.time() - wall)))
        self.times[before] = self.times.get(before, 0.0) + first
        self.times[after] = self.times.get(after, 0.0) + (now - self.last - first)
        self.last = now

    def seconds(self):
        return {**{k: round(v, 3) for k, v in self.times.items()}, "run_s": round(time.monotonic() - self.t0, 3)}


def run_jobs(lab, run, runners, clock, progress=None):
    """Run the jobs of a run at once: noise first (each until its first iteration is done), then
    the measured ones; noise stops after its current iteration once the measured jobs end. A job
    that fails stops the others and fails the run. Returns ({name: raw}, {name: (start, end) wall})."""
    noise_stop = threading.Event()
    raw, windows, failures, threads = {}, {}, [], []

    def launch(job, stop, started=None):
        runner = runners[job.name]

        def on_start(wall):
            windows[job.name] = (wall, None)
            if not job.noise:
                clock.started(job.name, wall)

        def on_progress(fraction, label=""):
            if started is not None:
                started.set()
            if progress:
                progress({"event": "job", "job": job.name, "fraction": fraction, "label": label})

        def body():
            try:
                raw[job.name] = runner.run(stop, on_start, on_progress)
                begun = windows.get(job.name, (None, None))[0]
                windows[job.name] = _traffic_window(raw[job.name], begun)
            except BaseException as exc:          # noqa: BLE001 - re-raised in the caller's thread
                failures.append((job, exc))
                # The run has failed: every other job ends after its current iteration rather
                # than run out its iterations (measured jobs with duration_s run until stopped).
                noise_stop.set()
                clock.measured_stop.set()
            finally:
                if started is not None:
                    started.set()
        thread = threading.Thread(target=body, name=f"job-{job.name}", daemon=True)
        thread.start()
        threads.append((job, thread))

    try:
        for job in run.jobs:
            if job.noise:
                started = threading.Event()
                launch(job, noise_stop, started)
                started.wait()
        if not failures:
            for job in run.measured():
                launch(job, clock.measured_stop)
            for job, thread in threads:
                if not job.noise:
                    thread.join()
    except BaseException:
        # Ctrl-C: end every job's agents now rather than wait out their iterations.
        noise_stop.set()
        clock.measured_stop.set()
        for runner in runners.values():
            runner.cancel()
        for _job, thread in threads:
            thread.join(2)
        raise
    noise_stop.set()
    for _job, thread in threads:
        thread.join()
    if failures:
        job, exc = failures[0]
        if isinstance(exc, KeyboardInterrupt):
            raise exc
        raise LabError(f"{run.label}: {'noise job' if job.noise else 'job'} {excerpt(job.name)} failed: {exc}") from None
    return raw, windows


def _traffic_window(raw, begun):
    """(first, last) wall time of a job's measured traffic."""
    window = getattr(raw, "traffic_window", None)
    if window:
        return tuple(window)
    if hasattr(raw, "start_wall"):                       # all-pairs: it sent for duration_s
        return raw.start_wall, raw.start_wall + raw.duration_s
    return begun or time.time(), time.time()


def wait_drained(lab, timeout_s=DRAIN_TIMEOUT_S):
    """Wait until no lossless queue holds bytes and no port is paused: each run starts from an
    empty fabric, not from the previous run's backlog."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = [r for r in lab.queues.counters() if r["class"] == "lossless"]
        # A port's flag says it asked its upstream to pause; the upstream's gate says whether
        # that is still in force (the agent opens it when nothing is left to send the XON).
        gate_closed = {r["port"]: r.get("gate_closed", False) for r in rows}
        busy = [r for r in rows if r.get("occ") or (r.get("paused") and gate_closed.get(r["peer"], True))]
        if not busy:
            return
        if time.monotonic() > deadline:
            what = ", ".join(f"{r['port']} ({r.get('occ', 0)} B{', paused' if r.get('paused') else ''})"
                             for r in busy[:4])
            raise LabError(f"queues did not drain within {timeout_s:.0f} s before the next run: {what}")
        time.sleep(0.05)


def _apply_ecn(lab, ecn):
    for target, settings in (ecn or {}).items():
        lab.queues.set_ecn(target, **settings)


def _reset_ecn(lab, ecn):
    for target in ecn or {}:
        lab.queues.set_ecn(target, reset=True)


def _apply_condition(lab, fault):
    """Apply a condition at once (its steps at time 0, no undo: restore ends it)."""
    for step in faults_mod.steps([fault], lab):
        if not step.undo:
            faults_mod.apply(lab, step)
    return {"kind": fault.kind, "target": fault.target if isinstance(fault.target, (str, bool)) else list(fault.target),
            "params": fault.params, "label": fault.label}


def _loss_counters(lab):
    from fabriclab.lab import linkloss

    return {key: dropped for key, (dropped, _passed) in linkloss.counters(lab).items()}


class _Clock:
    """The run's origin and duration: when every measured job has said its traffic begins, the
    fault timeline starts there, and `duration_s` later the measured jobs are asked to stop."""

    def __init__(self, lab, measured, duration_s):
        self.lab, self.waiting, self.duration_s = lab, set(measured), duration_s
        self.starts = {}
        self.wall = None
        self.timeline = None
        self.measured_stop = threading.Event()
        self._lock = threading.Lock()
        self._timer = None

    def started(self, name, wall):
        with self._lock:
            self.starts[name] = wall
            self.waiting.discard(name)
            if self.waiting or self.wall is not None:
                return
            self.wall = max(self.starts.values())
            self.timeline.start_at(self.wall)
            if self.duration_s is not None:
                self._timer = threading.Timer(max(0.0, self.wall + self.duration_s - time.time()),
                                              self.measured_stop.set)
                self._timer.daemon = True
                self._timer.start()

    def stop(self):
        if self._timer is not None:
            self._timer.cancel()
        if self.timeline is not None:
            self.timeline.stop()
        self.measured_stop.set()

    def status(self):
        wall = self.wall
        timeline = self.timeline
        return {"started": wall is not None, "elapsed_s": time.time() - wall if wall else 0.0,
                "duration_s": self.duration_s,
                "fault_steps": len(timeline.applied) if timeline else 0,
                "fault_steps_total": len(timeline.steps) if timeline else 0}


class _Ticker(threading.Thread):
    """Reports a run's progress about twice a second: since the origin, fault steps applied."""

    def __init__(self, progress, clock, every_s=0.5):
        super().__init__(daemon=True, name="run-ticker")
        self.progress, self.clock, self.every_s = progress, clock, every_s
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(self.every_s):
            self.progress({"event": "tick", **self.clock.status()})

    def stop(self):
        self.done.set()
        if self.is_alive():
            self.join(2)
        self.progress({"event": "tick", **self.clock.status(), "finished": True})


class _RoutingWatch(threading.Thread):
    """While a run's jobs go, keep the TE app's last placement that includes a measured job: when
    the launcher retracts the job at its end TE recomputes without it, so reading it afterwards
    races that. Other apps have no placement; their selection stage's counters are read after."""

    def __init__(self, lab, job_names):
        super().__init__(daemon=True, name="routing-watch")
        self.lab, self.job_names = lab, set(job_names)
        self.placement = None
        self.done = threading.Event()

    def start(self):
        if self.lab.controller is not None and self.lab.controller.app == "te":
            super().start()

    def run(self):
        while not self.done.wait(TE_POLL_S):
            current = self.lab.te_placement()
            if current and self.job_names & set(current.get("jobs") or []):
                self.placement = current

    def stop(self):
        self.done.set()
        if self.is_alive():
            self.join(2)

    def state(self):
        return {"app": str(self.lab.routing), "stage": self.lab.stage_stats(), "te": _te_summary(self.placement),
                "hash": _hash_bases(self.lab)}


def _hash_bases(lab):
    """The seed, and each switch's hash basis, the routing app hashed from (apps/hashing.py)."""
    from fabriclab.apps.hashing import switch_bases

    if lab.routing.foreign:
        return None                   # an os-ken app of one's own or an external controller hashes its own way
    options = lab.routing.settings
    return {"seed": options.get("seed", 0), "shared": bool(options.get("shared_basis", False)),
            "bases": switch_bases(lab.fabric, options)}


def _te_summary(placement):
    if not placement:
        return None
    return {"recomputes": placement.get("recomputes"), "placed": len(placement.get("placed", [])),
            "unplaced": len(placement.get("unplaced", [])),
            "uplinks": sorted({p["uplink_intf"] for p in placement.get("placed", [])})}


# -- recording -------------------------------------------------------------------------------------
def _mesh_probes(lab, metrics):
    """The latency monitor's probes on this lab (lab/probepairs.py); LabError in one line for
    pairs the fabric lacks, too many of them, or a fabric over several machines."""
    from fabriclab.lab import probepairs
    from fabriclab.measure.pingmesh import MAX_PROBES

    if getattr(lab, "machines", None):
        raise LabError("the latency monitor runs on one machine's fabric (no split)")
    probes = probepairs.probes(lab.fabric, metrics.pingmesh_pairs)
    if not 0 < len(probes) <= MAX_PROBES:
        raise LabError(f"the latency monitor would run {len(probes)} probes (2 classes per pair); "
                       f"at most {MAX_PROBES}: choose metrics.pingmesh_pairs")
    return probes


# Probes the latency monitor takes before the traffic starts, at the least: its unloaded samples.
UNLOADED_PROBES = 8


def _start_mesh(lab, metrics):
    from fabriclab.measure.pingmesh import Pingmesh

    probes = [{**p, "src_ns": lab.net.get(p["src_host"]).pid} for p in _mesh_probes(lab, metrics)]
    return Pingmesh(probes, metrics.pingmesh_ms,
                    record=lambda pid: lab.run.add_process(pid, "pingmesh", "ping")).start(UNLOADED_PROBES)


def _latency(lab, latency, origin_wall, end_wall):
    """telemetry.latency: the monitor's settings and its summary (measure/pingmesh.summarize)."""
    from fabriclab.lab.probepairs import dscps
    from fabriclab.measure.pingmesh import summarize

    mesh, samples = latency
    return {"interval_ms": mesh.interval_ms, "dscp": dscps(lab.fabric.spec),
            **summarize(mesh.probes, samples, origin_wall, end_wall, mesh.quiet_end)}


def _record(lab, plan, run, folder, runners, raw, windows, series, qseries, clock, events, conditions,
            routing, queue_before, loss, latency=None):
    from fabriclab.measure import symmetry
    from fabriclab.measure.telemetry import max_mean_ratio

    metrics = plan.metrics
    bin_s, tolerance = metrics.bin_ms / 1e3, metrics.tolerance
    measured = [j.name for j in run.measured()]
    start_wall = min(windows[name][0] for name in measured)
    end_wall = max(windows[name][1] for name in measured)
    origin_wall = clock.wall or start_wall
    origin, end = series.to_series_time(origin_wall), series.to_series_time(end_wall)
    jobs = {name: runners[name].record(raw[name]) for name in raw}
    measured_hosts = {h for name in measured for h in jobs[name]["hosts"]}
    times, delivered = series.delivered(bin_s)
    applied = clock.timeline.applied if clock.timeline else []
    strikes = sorted(series.to_series_time(wall) for step, wall in applied if not step.undo)
    faults = [_fault_row(series, fault, [(step, series.to_series_time(wall)) for step, wall in applied
                                         if step.fault == fault.index], origin, end, times, delivered, strikes)
              for fault in run.faults]
    window = (origin, end)
    groups = [g for metric in symmetry.METRICS
              for g in symmetry.check(series, *window, hosts=measured_hosts, tolerance=tolerance,
                                      metric=metric, bin_s=bin_s)]
    nics = symmetry.nic_histograms(series, bin_s, *window, hosts=measured_hosts)
    means = series.mean_mbps(*window)
    files = {"links_csv": f"links-{run.slug}.csv"}
    series.write_csv(folder / files["links_csv"], bin_s)
    queues = None
    if qseries is not None:
        from fabriclab.results import figures

        files["queues_csv"] = f"queues-{run.slug}.csv"
        qseries.write_csv(folder / files["queues_csv"])
        files["queues_plot"] = f"queues-{run.slug}.png"
        figures.queue_timeline(qseries.window(start_wall - PLOT_MARGIN_S, end_wall + PLOT_MARGIN_S),
                               folder / files["queues_plot"],
                               f"{run.label}: lossless queues, marks and pauses by hop",
                               origin=origin_wall - qseries.wall0)
        queues = {"report": lab.queues.report(*queue_before), "hops": qseries.window(start_wall, end_wall).hops(),
                  "summary": qseries.summary(), "sampling": qseries.timing(), "errors": lab.queues.errors()}
    invalid = sorted({f"{name}: {reason}" for name, job in jobs.items() for reason in job["invalid"]})
    invalid += lossless_drops(queues)
    if queues:
        queues["cut_drops"] = cut_drops(queues)
    return {
        "label": run.label, "slug": run.slug, "routing": str(run.routing), "repetition": run.repetition,
        "note": run.note, "tags": run.tags, "duration_s": run.duration_s,
        "conditions": conditions, "ecn": run.ecn,
        "origin_s": round(origin, 4), "end_s": round(end, 4), "bin_s": bin_s,
        "origin_unix": round(origin_wall, 4),
        "jobs": jobs,
        "faults": faults,
        "events": [{**{k: v for k, v in e.items() if k != "time"}, "t_s": round(e["time"] - origin_wall, 4)}
                   for e in events],
        "telemetry": {"sampling": series.timing(), "symmetry": groups,
                      "outliers": [list(row) for row in symmetry.flagged(groups)],
                      "nics": nics, "stragglers": symmetry.stragglers(nics, tolerance),
                      "uplink_max_mean": max_mean_ratio(means[c.name] for c in series.columns if c.kind == "up"),
                      "mean_mbps": {name: round(v, 4) for name, v in means.items()},
                      **({"latency": _latency(lab, latency, origin_wall, end_wall)} if latency else {})},
        "queues": queues,
        "routing_state": routing.state(),
        "link_loss": _dropped(loss),
        "valid": not invalid, "invalid": invalid,
        "files": files,
    }


def lossless_drops(queues):
    """A reason per port that dropped a packet of a PFC-protected class: a lossless class must
    lose nothing (headroom overruns, and the watchdog's drops of a stuck port alike)."""
    if not queues:
        return []
    rows = [r for r in queues["report"]["ports"] if r["class"] == "lossless"
            and (r.get("lossless_drops") or r.get("wd_drops"))]
    return [f"lossless drop: {r['port']} ({r['node']}) dropped {r.get('lossless_drops', 0)} "
            f"over its headroom" + (f" and {r['wd_drops']} by the PFC watchdog" if r.get("wd_drops") else "")
            for r in sorted(rows, key=lambda r: r["port"])]


def cut_drops(queues):
    """A line per switch port whose lossless class was tail-dropped at a buffer fault's cut: the
    fault's effect, there to be found (seed 000, 6.4.2), not a mis-sized headroom. A PFC class
    adds to `drops` only there (queues/fabricq.bpf.c, cut_drop)."""
    rows = [r for r in queues["report"]["ports"] if r["class"] == "lossless" and r.get("drops")]
    return [f"lossless drop: {r['port']} ({r['node']}) dropped {r['drops']} at a buffer cut"
            for r in sorted(rows, key=lambda r: r["port"])]


def _dropped(loss):
    """Packets the link-loss stage dropped during the run ({(node, intf): dropped} before, after);
    None when no link lost packets on purpose."""
    before, after = (loss + [{}, {}])[:2] if loss else ({}, {})
    if not before and not after:
        return None
    return {"dropped_packets": sum(after.get(k, 0) - before.get(k, 0) for k in after)}


def _balance_by_switch(up, loads):
    """{switch: max/mean of its uplinks still up} where it has two or more that carried traffic:
    how evenly a switch that lost an uplink spread what it carried over the rest."""
    from fabriclab.measure.telemetry import max_mean_ratio

    by = {}
    for c in up:
        by.setdefault(c.src, []).append(loads[c.name])
    return {switch: max_mean_ratio(v) for switch, v in sorted(by.items()) if len(v) > 1 and sum(v) > 0}


def _fault_row(series, fault, applied, origin, end, times, delivered, strikes):
    """One fault as it happened: when it began and ended (seconds after the origin), each change
    it made, the delivered traffic's dip and recovery after each time it struck, and for a link
    fault the balance of the uplinks still up once traffic recovered."""
    from fabriclab.measure import recovery
    from fabriclab.measure.telemetry import max_mean_ratio

    row = {"index": fault.index, "kind": fault.kind, "label": fault.label,
           "target": fault.target if isinstance(fault.target, (str, bool)) else list(fault.target),
           "planned_at_s": fault.at, "params": fault.params, "at_s": None, "until_s": None,
           "events": [{"t_s": round(t - origin, 4), "event": faults_mod.describe(step), "undo": step.undo}
                      for step, t in applied],
           "impact": None}
    hits = [t for step, t in applied if not step.undo]
    if not hits:
        row["note"] = "not reached: the measured jobs ended first"
        return row
    row["at_s"] = round(hits[0] - origin, 4)
    undos = [t for step, t in applied if step.undo]
    row["until_s"] = round(undos[-1] - origin, 4) if undos else None
    impacts = []
    for t in hits:
        later = [s for s in strikes if s > t]
        impacts.append(recovery.impact(times, delivered, t, min(later + [end])))
    row["impact"] = impacts[0]
    if len(impacts) > 1:
        row["impacts"] = impacts
        took = [i["recovery_s"] for i in impacts if i.get("recovery_s") is not None]
        row["recovery_s_mean"] = round(sum(took) / len(took), 3) if took else None
    dead = {link.label for step, _t in applied if step.action == "link" and not step.undo
            for link in step.args[0]}
    if dead and row["until_s"] is None:
        since = hits[0] + (impacts[0].get("recovery_s") or 0.0)
        if since < end:
            loads = series.mean_mbps(since, end)
            up = [c for c in series.columns if c.kind == "up" and c.link not in dead]
            alive = [loads[c.name] for c in up]
            if alive:
                row["uplinks_after"] = {"max_mean_ratio": max_mean_ratio(alive),
                                        "max_mbps": round(max(alive), 3), "min_mbps": round(min(alive), 3),
                                        "by_switch": _balance_by_switch(up, loads)}
    return row
