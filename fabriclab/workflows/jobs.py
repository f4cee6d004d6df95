"""A job of a plan on a live lab, whatever its kind: checked against the fabric, run, recorded.

    runner = jobs.runner(job, lab, run_plan)     # LabError now if the fabric cannot run it
    raw = runner.run(stop, on_start)             # blocks; `stop` ends a job that repeats early
    record = runner.record(raw)                  # the results document's job record

Four kinds, one adapter each over the launcher that owns the kind:
- collective: traffic.collective.Launcher (RoCEv2 agents per rank, or soft-RoCE verbs);
- replay:     a trace's collectives (workflows.replay), segment by segment, each a collective
              program over the same Launcher;
- all-pairs:  traffic.launcher.run_traffic (every host port streams to its peers);
- switchml:   switchml.launcher.run_aggregation (in-network aggregation beside the ToRs).
`on_start(wall_time)` is called when the job's measured traffic is about to begin: the pipeline
starts a run's fault timeline when every measured job has called it.
"""

from __future__ import annotations

import dataclasses
import threading

from fabriclab.errors import LabError

KINDS = ("collective", "all-pairs", "switchml", "replay")
# "until duration_s": the stop event ends the job first
DURATION_ITERATIONS = 1_000_000


def kind_of(workload):
    from fabriclab.switchml.launcher import AggregationSpec
    from fabriclab.traffic.allpairs import AllPairsSpec
    from fabriclab.traffic.collective import CollectiveSpec
    from fabriclab.workflows.replay import ReplaySpec

    for kind, cls in (("collective", CollectiveSpec), ("all-pairs", AllPairsSpec), ("switchml", AggregationSpec),
                      ("replay", ReplaySpec)):
        if isinstance(workload, cls):
            return kind
    raise LabError(f"a job's workload is a CollectiveSpec, AllPairsSpec, AggregationSpec or ReplaySpec, "
                   f"not {type(workload).__name__}")


def check_workload(workload):
    """What can be checked without a fabric."""
    if kind_of(workload) != "switchml":       # a SwitchML spec is checked against its fabric
        workload.check()


def runner(job, lab, run_plan=None):
    """The adapter that runs `job` on `lab` (not necessarily started yet: everything that can be
    checked against the fabric is checked here, before anything is built)."""
    cls = {"collective": CollectiveJob, "all-pairs": AllPairsJob, "switchml": SwitchmlJob,
           "replay": ReplayJob}[job.kind]
    return cls(job, lab, run_plan)


class CollectiveJob:
    def __init__(self, job, lab, run_plan):
        from fabriclab.traffic.collective import Launcher

        self.job, self.lab = job, lab
        spec = job.workload
        if run_plan is not None and run_plan.duration_s is not None and not job.noise:
            spec = dataclasses.replace(spec, iterations=DURATION_ITERATIONS)
        self.spec = spec
        # Ranks, hosts and schedules are checked here, before anything is built.
        # noise ends mid-iteration once the measured jobs are done: nobody measures its last one
        self.launcher = Launcher(lab, spec, name=f"job-{job.name}", abandon=job.noise)
        self.hosts = {r.host for r in self.launcher.ranks}

    def run(self, stop, on_start, progress=None):
        self.launcher.stop = stop
        self.launcher.on_ready = on_start
        self.launcher.progress = progress
        return self.launcher.run()

    def cancel(self):
        self.launcher.cleanup()

    def record(self, raw):
        from fabriclab.results import document

        return document.collective_job(raw, self.job.role)


class AllPairsJob:
    def __init__(self, job, lab, run_plan):
        from fabriclab.traffic.allpairs import all_pairs_plan

        self.job, self.lab = job, lab
        self.cancelled = threading.Event()
        spec = job.workload
        spec.check()
        self.flows = all_pairs_plan(lab.fabric, load=spec.load, flows_per_pair=spec.flows_per_pair)
        self.hosts = set(lab.fabric.hosts)     # every host listens, every port sends

    def run(self, stop, on_start, progress=None):
        from fabriclab.traffic.launcher import run_traffic

        spec = self.job.workload
        # The agents stop by themselves at the end of duration_s: an all-pairs job is not ended early.
        return run_traffic(self.lab, self.flows, duration_s=spec.duration_s, sport_mode=spec.sport_mode,
                           on_start=on_start, progress=progress, cancel=self.cancelled)

    def cancel(self):
        self.cancelled.set()

    def record(self, raw):
        from fabriclab.results import document

        return document.allpairs_job(raw, self.job.workload, self.lab.fabric, self.job.role)


class SwitchmlJob:
    def __init__(self, job, lab, run_plan):
        from fabriclab.switchml.launcher import place

        self.job, self.lab = job, lab
        self.cancelled = threading.Event()
        spec = job.workload
        spec.check(lab.fabric)
        placement = place(lab.fabric, spec)
        self.hosts = set(placement.aggregators.values()) | {h for w in placement.workers.values() for h in w}

    def run(self, stop, on_start, progress=None):
        from fabriclab.switchml.launcher import run_aggregation

        return run_aggregation(self.lab, self.job.workload, tag=f"job-{self.job.name}", on_start=on_start,
                               cancel=self.cancelled)

    def cancel(self):
        self.cancelled.set()

    def record(self, raw):
        from fabriclab.results import document

        return document.switchml_job(raw, self.job.workload, self.job.role)


class ReplayJob:
    """A trace replayed: its segments one after another, each a collective program on its own
    agents (a Launcher). The job's traffic begins with the first segment's; it runs to the end of
    the trace (a replay is not repeated or cut short by duration_s, but a failed run stops it
    after the current segment)."""

    def __init__(self, job, lab, run_plan):
        from fabriclab.traffic.collective import Launcher
        from fabriclab.workflows import replay

        self.job, self.lab = job, lab
        spec = job.workload
        self.segments = replay.plan_segments(spec, lab.fabric)
        self.specs = [replay.collective_spec(spec, segment) for segment in self.segments]
        # Every segment's ranks, hosts and schedules are checked here, before anything is built.
        self.launchers = [Launcher(lab, cspec, name=f"job-{job.name}-{k}") for k, cspec in enumerate(self.specs)]
        self.hosts = {r.host for launcher in self.launchers for r in launcher.ranks}
        self.current = None

    def run(self, stop, on_start, progress=None):
        from fabriclab.traffic.collective import queue_report

        runs = []
        total = sum(len(s.steps) for s in self.segments)
        done = 0
        for k, launcher in enumerate(self.launchers):
            if k and stop is not None and stop.is_set():
                raise LabError(f"stopped after {k} of {len(self.launchers)} segments")
            self.current = launcher
            launcher.on_ready = on_start if k == 0 else None
            if progress:
                base, share = done / total, len(self.segments[k].steps) / total
                launcher.progress = lambda fraction, label, b=base, s=share: progress(b + fraction * s, label)
            before = queue_report(self.lab)
            runs.append(queue_report(self.lab, launcher.run(), before))
            done += len(self.segments[k].steps)
        self.current = None
        return runs

    def cancel(self):
        for launcher in self.launchers:
            launcher.cleanup()

    def record(self, raw):
        from fabriclab.workflows import replay

        return replay.job_record(raw, self.job.workload, self.segments, self.lab.fabric, self.job.role)
