"""Job kind `all-pairs`: every host port streams to its peers for a while (traffic.launcher's
agents); its record what was delivered, link by link and flow by flow."""

from __future__ import annotations

import dataclasses
import threading

from fabriclab.jobs.common import dataclass_workload, hosts_record, invalid_reasons, yes_no
from fabriclab.table import fixed, markdown_table

NAME = "all-pairs"
SUMMARY = "every host port streams to its peers at a share of its link rate for duration_s"


def spec_class():
    from fabriclab.traffic.allpairs import AllPairsSpec

    return AllPairsSpec


def check(spec):
    spec.check()


def parse(entry, base):
    return dataclass_workload(spec_class(), NAME, entry, ("sport_mode",), check)


class Runner:
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
        return record(raw, self.job.workload, self.lab.fabric, self.job.role)


def record(run, spec, fabric, role="measured"):
    """The record of an all-pairs job from its TrafficRun."""
    from fabriclab.measure import cpuload, telemetry

    cpu = run.cpu()
    links = telemetry.link_utilization(fabric, *run.window)
    invalid = invalid_reasons(cpuload.valid(cpu))
    hosts = {h for h, flows in run.plan.items() if flows}
    return {
        "kind": NAME, "role": role, "hosts": hosts_record(hosts),
        "workload": dataclasses.asdict(spec),
        "traffic": run.totals(),
        "links": links,
        "balance": {"up": telemetry.balance(links, "up"), "down": telemetry.balance(links, "down")},
        "buffer_drops": telemetry.buffer_drops(fabric, *run.window),
        "flows": run.flow_rows(),
        "window_s": round(run.window[1]["time"] - run.window[0]["time"], 4),
        "window_error_ms": telemetry.window_error_ms(*run.window),
        "late_start_s": run.late_starts(),
        # each flow sends RDMA WRITEs of message_bytes, in packets of payload_bytes
        "payload_bytes": run.payload_bytes, "message_bytes": run.message_bytes,
        "cpu": cpu, "valid": not invalid, "invalid": invalid,
    }


def report_lines(jobs):
    rows = []
    for name, job in jobs:
        t, up = job.get("traffic") or {}, ((job.get("balance") or {}).get("up") or {})
        loss = t.get("loss")
        rows.append((name, job.get("role", "-"), t.get("flows"), fixed(t.get("delivered_mbps")),
                     None if loss is None else f"{100 * loss:.2f}%", t.get("oos"), up.get("max_mean_ratio"),
                     (job.get("buffer_drops") or {}).get("total"), yes_no(job.get("valid", True))))
    return markdown_table(("job", "role", "flows", "delivered Mbit/s", "loss", "OOS", "uplink max/mean",
                           "buffer drops", "valid"), rows) if rows else []


def compare_rows(job):
    t = job.get("traffic") or {}
    return [{"delivered_mbps": t.get("delivered_mbps"), "out_of_sequence": t.get("oos")}]


def runs_rows(job):
    t = job["traffic"]
    return [(f"all-pairs {t['flows']} flows", f"({t['delivered_mbps']:.2f})", "-", "-", t["oos"], "-", "-")]
