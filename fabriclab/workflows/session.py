"""What one interactive lab is doing besides its fabric: the fault timeline started by hand and
the jobs run on it. The prompt and the web view share one Session, so a timeline started in
one is stopped from the other and both list the same jobs.

    session = Session(lab)
    session.inject(entries)                 # a scenario's `faults:` list, from now
    session.run(plan, background=True)      # a plan on the shared fabric, in a thread
    session.jobs()                          # [{number, label, state, busbw, cct, results}]
"""

from __future__ import annotations

import dataclasses
import threading
import time

from fabriclab.errors import LabError

MAX_JOBS_KEPT = 50            # finished jobs listed (the oldest are forgotten)


@dataclasses.dataclass
class JobRecord:
    number: int
    label: str
    started: float                       # wall clock
    thread: threading.Thread | None = None
    doc: dict | None = None
    error: str | None = None
    fraction: float | None = None        # the pipeline's progress, while it runs

    @property
    def running(self):
        return self.doc is None and self.error is None


class Session:
    def __init__(self, lab):
        self.lab = lab
        self.timeline = None
        self.records = []
        self._count = 0
        self._lock = threading.Lock()
        self.web = None                  # the web view's server, when one runs (view/server.py)
        self.metrics = None              # the Prometheus endpoint, when one runs (view/metrics.py)

    # -- the fault timeline ------------------------------------------------------------------
    def inject(self, entries):
        """Start a `faults:` list (parsed and checked against this fabric first) from now;
        returns its steps. Refused while another timeline runs."""
        from fabriclab.workflows import faults

        with self._lock:
            if self.timeline_running():
                raise LabError("a fault timeline is already running (`faults stop`, or stop on the web view, ends it)")
            steps = faults.steps(faults.parse(entries), self.lab)
            self.timeline = faults.Timeline(self.lab, steps)
            self.timeline.start()
            self.timeline.start_at(time.time())
            return steps

    def stop_timeline(self):
        """Stop the running timeline (what it did stays in place); False when none runs."""
        if not self.timeline_running():
            return False
        self.timeline.stop()
        self.timeline.join(5.0)
        return True

    def timeline_running(self):
        return self.timeline is not None and self.timeline.is_alive()

    def timeline_state(self):
        """{"running", "steps", "applied", "error"} of the last timeline (None: none started)."""
        if self.timeline is None:
            return None
        error = self.timeline.error
        return {"running": self.timeline.is_alive(), "steps": len(self.timeline.steps),
                "applied": len(self.timeline.applied), "error": None if error is None else str(error)}

    # -- jobs ----------------------------------------------------------------------------------
    def run(self, plan, label, background=False, out=None):
        """Run `plan` on the shared fabric (results into `out`, default results/<time>-<name>/);
        returns its document, or (background) its record."""
        from fabriclab.workflows import pipeline

        with self._lock:
            self._count += 1
            record = JobRecord(self._count, label, time.time())
            self.records = self.records[-(MAX_JOBS_KEPT - 1):] + [record]

        def progress(event):
            if event.get("event") == "job":
                record.fraction = event.get("fraction")

        def body():
            try:
                record.doc = pipeline.run_plan(plan, out, lab=self.lab, shared=True, progress=progress).doc
            except Exception as exc:                   # noqa: BLE001 - shown with the job
                record.error = str(exc) or type(exc).__name__
                if not background:
                    raise
        if not background:
            body()
            return record.doc
        record.thread = threading.Thread(target=body, daemon=True, name=f"session-job-{record.number}")
        record.thread.start()
        return record

    def jobs(self):
        """Every job so far: {number, label, state, busbw, cct, results} (busbw and CCT p50 of
        its last size, once done)."""
        return [job_summary(r) for r in self.records]

    def job_figures(self):
        """[(number, label, progress 0-1 or None, busbw Mbit/s or None)] of every job so far: what
        the metrics endpoint exports (view/metrics.py)."""
        out = []
        for record in self.records:
            done = record.doc is not None
            out.append((record.number, record.label, 1.0 if done else record.fraction,
                        headline(record.doc)[0] if done else None))
        return out

    def close(self):
        """Stop what this session started: the web view, the metrics endpoint and the timeline (faults stay in place;
        the lab's own teardown undoes them)."""
        for server in (self.web, self.metrics):
            if server is not None:
                server.stop()
        self.web = self.metrics = None
        self.stop_timeline()


def job_summary(record):
    out = {"number": record.number, "label": record.label, "state": "running", "busbw": "-",
           "cct": "-", "results": ""}
    if record.error is not None:
        out["state"] = f"failed: {record.error}"
    elif record.doc is None:
        if record.fraction is not None:
            out["state"] = f"running ({100 * record.fraction:.0f} %)"
    else:
        out["state"] = "done"
        out["results"] = record.doc.get("folder", "")
        busbw, cct = headline(record.doc)
        out["busbw"] = "-" if busbw is None else f"{busbw:.2f} Mbit/s"
        out["cct"] = "-" if cct is None else f"{cct:.1f} ms"
    return out


def headline(doc):
    """(busbw Mbit/s, CCT p50 ms) of a document's last collective size; (None, None) for other jobs."""
    for run in reversed(doc.get("runs") or []):
        for job in (run.get("jobs") or {}).values():
            sizes = job.get("sizes") if isinstance(job, dict) else None
            if isinstance(sizes, list) and sizes and isinstance(sizes[-1], dict):
                row = sizes[-1]
                cct = row.get("cct_ms")
                return row.get("busbw_mbps"), cct.get("p50") if isinstance(cct, dict) else None
    return None, None
