"""Cases on one live fabric: each case runs collective jobs (one measured, others as noise until it
ends) while the queue sampler records every port, then puts the fabric back as it found it.

An experiment module builds a list of Case objects; `run_cases` runs them on one Lab (built once:
the cases differ in traffic and settings, not in the fabric) and returns one dict per case with
the jobs' results, the queue model's counters, the per-hop table and the sampling rate reached.
"""

from __future__ import annotations

import dataclasses
import threading
import time

from fabriclab.errors import LabError
from fabriclab.queues.sampler import QueueSampler

SETTLE_TIMEOUT_S = 10.0
PLOT_MARGIN_S = 0.1


@dataclasses.dataclass
class Job:
    name: str
    spec: object                     # a CollectiveSpec
    noise: bool = False              # runs from before the measured job starts until it ends


@dataclasses.dataclass
class Case:
    name: str
    jobs: list
    note: str = ""
    ecn: dict | None = None          # {role: set_ecn arguments} for the case, e.g. {"leaf": {"kmin": ...}}
    degrade: tuple | None = None     # (node1, node2, rate_mbps): a slow link for the case

    def measured(self):
        return next(j for j in self.jobs if not j.noise)


def run_cases(lab, cases, sample_s=0.005, folder=None, progress=None):
    """Run every case in order on `lab`; returns [case result]. Writes each case's sampled
    queues as CSV and PNG into `folder` when given."""
    from fabriclab.results import figures

    results = []
    for number, case in enumerate(cases):
        if progress:
            progress(number, case)
        _apply(lab, case)
        try:
            wait_drained(lab)
            before, since = lab.queues.counters(), time.monotonic_ns()
            sampler = QueueSampler(lab.queues, sample_s).start()
            try:
                runs = run_jobs(lab, case.jobs, label=case.name)
            finally:
                series = sampler.stop()
            report = lab.queues.report(before, since)
        finally:
            _restore(lab, case)
        # Hops are measured over the measured job's iterations only (not agent start-up).
        start, end = runs[case.measured().name].traffic_window
        focus = series.window(start, end)
        result = {"case": case.name, "note": case.note, "ecn": case.ecn,
                  "degrade": list(case.degrade) if case.degrade else None,
                  "jobs": {name: job_summary(run) for name, run in runs.items()},
                  "window_s": [round(start - series.wall0, 4), round(end - series.wall0, 4)],
                  "hops": focus.hops(), "queues": report, "sampling": series.timing(),
                  "errors": lab.queues.errors()}
        if folder is not None:
            slug = case_slug(case.name)
            series.write_csv(folder / f"queues-{slug}.csv")
            figures.queue_timeline(series.window(start - PLOT_MARGIN_S, end + PLOT_MARGIN_S),
                                   folder / f"queues-{slug}.png",
                                   f"{case.name}: lossless queues, marks and pauses by hop",
                                   origin=start - series.wall0)
            result["files"] = {"csv": f"queues-{slug}.csv", "plot": f"queues-{slug}.png"}
        results.append(result)
    return results


def case_label(case):
    """A case's name for a table, flagged when the CPU was saturated during it (then the software
    switches, not the modelled fabric, may have set its numbers)."""
    ok = all(job["valid"] for job in case["jobs"].values())
    return case["case"] if ok else case["case"] + " (CPU SATURATED)"


def case_slug(name):
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def _apply(lab, case):
    for role, settings in (case.ecn or {}).items():
        lab.queues.set_ecn(role, **settings)
    if case.degrade is not None:
        a, b, rate = case.degrade
        lab.set_rate(a, b, rate)


def _restore(lab, case):
    for role in case.ecn or {}:
        lab.queues.set_ecn(role, reset=True)
    if case.degrade is not None:
        a, b, _rate = case.degrade
        lab.set_rate(a, b, None)


def wait_drained(lab, timeout_s=SETTLE_TIMEOUT_S):
    """Wait until no lossless queue holds bytes and no port is paused: each case starts from an
    empty fabric, not from the previous case's backlog."""
    deadline = time.monotonic() + timeout_s
    while True:
        busy = [r["port"] for r in lab.queues.counters()
                if r["class"] == "lossless" and (r.get("occ") or r.get("paused"))]
        if not busy:
            return
        if time.monotonic() > deadline:
            raise LabError(f"queues did not drain within {timeout_s:.0f} s before the next case: "
                           f"{', '.join(busy[:4])}")
        time.sleep(0.05)


def run_jobs(lab, jobs, measured_stop=None, label="case"):
    """Run `jobs` (runner.Job) at once on disjoint hosts: the noise jobs first (each until its
    warm-up iteration is done), then every measured job; the noise jobs stop after their current
    iteration once the measured ones have ended. `measured_stop` (an Event) ends the measured jobs
    early (after their current iteration). Returns {job name: CollectiveRun}."""
    from fabriclab.traffic.collective import Launcher, queue_report

    noise_stop = threading.Event()
    measured_stop = measured_stop if measured_stop is not None else threading.Event()
    runs, failures, launchers, threads = {}, [], [], []

    def launch(job, stop, started=None):
        launcher = Launcher(lab, job.spec, progress=(lambda *_: started.set()) if started else None,
                            name=f"job-{job.name}", stop=stop)
        launchers.append(launcher)

        def body():
            before = queue_report(lab)
            try:
                runs[job.name] = queue_report(lab, launcher.run(), before)
            except BaseException as exc:          # noqa: BLE001 - re-raised in the main thread
                failures.append((job.name, exc))
                # The case has failed: the other jobs end after their current iteration rather
                # than run out their iterations (a scenario's measured jobs run until stopped).
                noise_stop.set()
                measured_stop.set()
            finally:
                if started is not None:
                    started.set()
        thread = threading.Thread(target=body, name=f"job-{job.name}", daemon=True)
        thread.start()
        threads.append((job, thread))
        return thread

    try:
        for job in jobs:
            if job.noise:
                started = threading.Event()
                launch(job, noise_stop, started)
                started.wait()
        if not failures:
            for job in jobs:
                if not job.noise:
                    launch(job, measured_stop)
            for job, thread in threads:
                if not job.noise:
                    thread.join()
    except BaseException:
        # Ctrl-C: end every job's agents now rather than wait out their iterations.
        noise_stop.set()
        measured_stop.set()
        for launcher in launchers:
            launcher.cleanup()
        for _job, thread in threads:
            thread.join(2)
        raise
    noise_stop.set()
    for _job, thread in threads:
        thread.join()
    if failures:
        name, exc = failures[0]
        role = "noise job" if next(j for j in jobs if j.name == name).noise else "job"
        raise LabError(f"{label}: {role} {name!r} failed: {exc}") from None
    return runs


def job_summary(run):
    """What a table needs from one job: its first size's timing, bandwidth and counters."""
    return {**size_summary(run.sizes[0]), "hosts": sorted({r.host for r in run.ranks}, key=lambda h: int(h[1:])),
            "workload": dataclasses.asdict(run.spec)}


def size_summary(row):
    """One message size of a CollectiveRun: CCT (ms, with every iteration's), bandwidth, counters."""
    c = row["counters"]
    return {"collective": row["collective"], "algorithm": row["algorithm"], "size": row["size"],
            "ranks": row["ranks"], "iterations": row["iterations"],
            "cct_ms": {**{k: round(row["time_s"][k] * 1e3, 2) for k in ("mean", "p50", "p99", "min", "max")},
                       "all": [round(t * 1e3, 3) for t in row["time_s"]["all"]]},
            "busbw_mbps": round(row["busbw_mbps"], 3), "algbw_mbps": round(row["algbw_mbps"], 3),
            "busbw_fraction_of_nic": round(row["busbw_fraction_of_nic"], 4),
            "counters": {k: c.get(k, 0) for k in ("out_of_sequence", "retransmitted_packets",
                                                  "local_ack_timeout_err", "ce_marked", "cnp_sent",
                                                  "cnp_handled")},
            "buffer_drops": row.get("buffer_drops"),
            "cpu": row["cpu"], "valid": row["valid"]}
