"""Job kind `switchml`: in-network aggregation beside the ToRs (switchml.launcher); its record
the tensor aggregation time and whether the result was exact."""

from __future__ import annotations

import dataclasses
import threading

from fabriclab.jobs.common import dataclass_workload, hosts_record, invalid_reasons, size_cell, yes_no
from fabriclab.table import fixed, markdown_table
from fabriclab.units import human_size

NAME = "switchml"
SUMMARY = "SwitchML: workers stream a tensor to aggregators beside their ToRs and get the sum back"


def spec_class():
    from fabriclab.switchml.launcher import AggregationSpec

    return AggregationSpec


def check(spec):
    """Nothing before a fabric: a SwitchML spec is checked against its fabric (Runner)."""


def parse(entry, base):
    return dataclass_workload(spec_class(), NAME, entry, ("dtype",), check)


class Runner:
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
        return record(raw, self.job.workload, self.job.role)


def record(report, spec, role="measured"):
    """The record of a SwitchML aggregation job from run_aggregation's report."""
    hosts = set(report["aggregators"].values()) | {h for w in report["worker_hosts"].values() for h in w}
    invalid = invalid_reasons(True, report.get("verify"))
    return {"kind": NAME, "role": role, "hosts": hosts_record(hosts),
            "workload": dataclasses.asdict(spec), "aggregation": report,
            "valid": not invalid, "invalid": invalid}


def report_lines(jobs):
    rows = []
    for name, job in jobs:
        a = job.get("aggregation") or {}
        tat = a.get("tat_s") or {}
        rows.append((name, job.get("role", "-"), a.get("workers"), size_cell(a.get("tensor_bytes")),
                     fixed(1e3 * tat["p50"], 1) if tat.get("p50") is not None else None,
                     fixed(a.get("elements_per_s", 0) / 1e6, 3), a.get("retransmissions"),
                     yes_no((a.get("verify") or {}).get("ok")), yes_no(job.get("valid", True))))
    return markdown_table(("job", "role", "workers", "tensor", "TAT p50 ms", "Melem/s", "retransmissions",
                           "verified", "valid"), rows) if rows else []


def compare_rows(job):
    """The tensor aggregation time in the CCT columns: its p50, and the slowest iteration as p99."""
    a = job.get("aggregation") or {}
    tat = a.get("tat_s") or {}
    p50 = tat.get("p50")
    return [{"size": a.get("tensor_bytes"),
             "cct_p50_ms": None if p50 is None else round(p50 * 1e3, 4),
             "cct_p99_ms": None if tat.get("max") is None else round(tat["max"] * 1e3, 4),
             "retransmitted_packets": a.get("retransmissions")}]


def runs_rows(job):
    a = job["aggregation"]
    return [(f"switchml {human_size(a['tensor_bytes'])}", "-", f"{a['tat_s']['p50'] * 1e3:.0f}",
             f"{a['tat_s']['max'] * 1e3:.0f}", "-", a["retransmissions"], "-")]
