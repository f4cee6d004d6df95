"""Job kind `collective`: a collective (or a program of them) over RoCEv2 agents, one per rank,
or soft-RoCE verbs (traffic.collective.Launcher); its record a row per message size and mode."""

from __future__ import annotations

import dataclasses
import json

from fabriclab.jobs import DURATION_ITERATIONS
from fabriclab.jobs.common import dataclass_workload, hosts_record, invalid_reasons, size_cell, yes_no
from fabriclab.table import fixed, markdown_table
from fabriclab.units import human_size

NAME = "collective"
SUMMARY = "a collective or a program of them (AllReduce, AlltoAll, ...) over RoCEv2 agents, one per rank"
# fields that are text by nature: a type error is blamed on another one
TEXT_FIELDS = ("collective", "algorithm", "placement", "qp_method", "sport_mode", "backend", "plb", "reorder",
               "cc")


def spec_class():
    from fabriclab.traffic.collective import CollectiveSpec

    return CollectiveSpec


def check(spec):
    spec.check()


def parse(entry, base):
    return dataclass_workload(spec_class(), NAME, entry, TEXT_FIELDS, check)


class Runner:
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
        return record(raw, self.job.role)


# -- the record ------------------------------------------------------------------------------------
def size_row(row):
    """One message size of a collective job in one mode (out of place, or in place), from the
    launcher's summary (times in ms)."""
    t = row["time_s"]
    ms = {k: round(t[k] * 1e3, 4) for k in ("mean", "p50", "p99", "min", "max")}
    invalid = invalid_reasons(row["valid"], row["verify"])
    return {
        "collective": row["collective"], "algorithm": row["algorithm"], "size": row["size"],
        "in_place": row["in_place"], "ranks": row["ranks"], "iterations": row["iterations"],
        "cct_ms": {**ms, "all": [round(v * 1e3, 4) for v in t["all"]]},
        "rank_cct_ms_mean": round(row["rank_time_s_mean"] * 1e3, 4),
        "ideal_ms": round(row["ideal_time_s"] * 1e3, 4),
        "algbw_mbps": round(row["algbw_mbps"], 4), "busbw_mbps": round(row["busbw_mbps"], 4),
        "bus_factor": row["bus_factor"], "nic_rate_mbps": row["nic_rate_mbps"],
        "busbw_fraction_of_nic": round(row["busbw_fraction_of_nic"], 5),
        "bytes_sent_per_rank": row["bytes_sent_per_rank"],
        "counters": row["counters"], "agent_cpu_s": [round(v, 5) for v in row["agent_cpu_s"]],
        "flows": row["flows"], "verify": row["verify"], "window_s": row["window_s"],
        "window_error_ms": row["window_error_ms"],
        "links": row["links"], "buffer_drops": row["buffer_drops"], "balance": row["balance"],
        "cpu": row["cpu"], "valid": not invalid, "invalid": invalid,
        # data bytes each plane carried over the measured iterations, and their shares
        **({"planes": row["planes"]} if "planes" in row else {}),
        # one iteration's bytes by rails and leaves (scale-up, PXN, rail-local, cross-group, cross-rail)
        **({"rails": row["rails"]} if "rails" in row else {}),
        # threetier: bytes that crossed the super-spine tier (measure/zones.py)
        **({"cross_zone": row["cross_zone"]} if row.get("cross_zone") is not None else {}),
        # a program's step (a replayed trace): the idle time before it, as it ran
        **({"gap_s": row["gap_s"]} if "gap_s" in row else {}),
    }


def record(run, role="measured"):
    """The record of a collective job from its CollectiveRun."""
    spec = run.spec
    sizes = [size_row(row) for row in run.sizes]
    invalid = sorted({reason for row in sizes for reason in row["invalid"]})
    # as results.json holds it (a program's steps are tuples in the spec): the schema types it
    workload = json.loads(json.dumps(dataclasses.asdict(spec)))
    return {
        "kind": NAME, "role": role, "hosts": hosts_record({r.host for r in run.ranks}),
        "workload": workload,
        # udp: the lab's RNIC in Python, RoCEv2 through raw sockets; rdma_rxe: soft-RoCE verbs.
        "backend": run.backend,
        # reorder: go-back-n (RoCEv2 RC) or place (out-of-order packets placed by PSN, a hole
        # NAKed after reorder_timeout_s)
        "transport": {"payload_bytes": run.payload_bytes, "ack_timeout_s": run.ack_timeout_s,
                      "link_rate_mbps": run.link_rate_mbps, "reorder": run.reorder,
                      # pxn: cross-rail transfers relayed through the sender's host
                      "pxn": getattr(run, "pxn", False),
                      # the pace of hops between ranks of one host (None: the NIC's rate)
                      "scale_up_rate_mbps": getattr(run, "scale_up_rate_mbps", None),
                      "reorder_timeout_s": run.reorder_timeout_s if run.reorder == "place" else None},
        # pid: the rank agent's process (None where it never started); intfs: its NIC's ports
        "ranks": [{"rank": r.rank, "host": r.host, "nic": r.nic, "addresses": [p.ip for p in r.ports],
                   "intfs": [p.intf for p in r.ports], "pid": run.pids.get(r.rank)} for r in run.ranks],
        "sizes": sizes,
        "rank_counters": {str(rank): final["totals"] for rank, final in sorted(run.finals.items())},
        "qps": [{**q, "rank": rank} for rank, final in sorted(run.finals.items()) for q in final["qps"]],
        "elapsed_s": round(run.elapsed_s, 3),
        # noise told to stop gave up the iteration it was in: its counters stand as they were then
        "abandoned_last_iteration": getattr(run, "abandoned", False),
        "valid": not invalid, "invalid": invalid,
        **({"plb": plb_record(run)} if run.plb is not None else {}),
        # the senders' congestion control (traffic/cc.py): kind, overrides in real units, and
        # every parameter as run (lab units, after the time scale)
        **({"cc": run.cc} if getattr(run, "cc", None) is not None else {}),
    }


def plb_record(run):
    """The plane load balancer of a collective job: its settings, and per rank what each plane
    sent, the removals and returns of planes (unix times), the CC contexts and probes per
    destination, out-of-order arrivals and the rank's timeline (traffic/agent.py plb_report)."""
    return {**run.plb,
            "ranks": {str(rank): final.get("plb") for rank, final in sorted(run.finals.items())}}


# -- how the tables show a record ------------------------------------------------------------------
def mode(row):
    """A size row's mode as the tables show it."""
    return "in-place" if row.get("in_place", False) else "out-of-place"


def both_modes(rows):
    """Whether a job's size rows hold in-place results (then the tables show every row's mode)."""
    return any(row.get("in_place", False) for row in rows)


def rail_split(rails):
    """One iteration's bytes between hosts on one leaf of a rail, through the spines on the rail,
    onto another rail, and PXN's first hops inside hosts: `96K/32K/0/32K`."""
    keys = ("rail_local_bytes", "cross_group_bytes", "cross_rail_bytes", "pxn_bytes")
    return "/".join(human_size(rails[k]) if rails[k] else "0" for k in keys)


def cross_zone_text(row):
    """threetier: the job's bytes between zones, from its schedule and from the super-spine
    links' counters, in MiB: `3.0/3.2`."""
    zone = row.get("cross_zone")
    if not zone:
        return "-"
    counted = zone["counted_bytes"]
    wire = "?" if counted is None else f"{counted / 2**20:.1f}"
    return f"{zone['schedule_bytes'] / 2**20:.1f}/{wire}"


REPORT_HEADER = ("job", "role", "collective", "size", "mode", "ranks", "busbw Mbit/s", "of NIC", "CCT p50 ms",
                 "p99 ms", "OOS", "retrans", "LAT", "rail-local/cross-group/cross-rail/PXN", "valid")


def report_lines(jobs):
    rows = []
    for name, job in jobs:
        for s in job.get("sizes") or []:
            cct, c = s.get("cct_ms") or {}, s.get("counters") or {}
            fraction = s.get("busbw_fraction_of_nic")
            rows.append((name, job.get("role", "-"), f"{s.get('collective', '?')}/{s.get('algorithm', '?')}",
                         size_cell(s.get("size")), mode(s), s.get("ranks"), fixed(s.get("busbw_mbps")),
                         None if fraction is None else f"{100 * fraction:.0f}%", fixed(cct.get("p50"), 1),
                         fixed(cct.get("p99"), 1), c.get("out_of_sequence"), c.get("retransmitted_packets"),
                         c.get("local_ack_timeout_err"),
                         # rail-cabled fabrics (the only ones that pace a scale-up hop)
                         rail_split(s["rails"]) if "rails" in s and (job.get("transport") or {})
                         .get("scale_up_rate_mbps") else None,
                         yes_no(s.get("valid", True))))
    if not rows:
        return []
    header = REPORT_HEADER
    if not any(both_modes(job.get("sizes") or []) for _, job in jobs):
        header, rows = _without(header, rows, "mode")
    if all(row[-2] is None for row in rows):
        header, rows = _without(header, rows, "rail-local/cross-group/cross-rail/PXN")
    return markdown_table(header, rows)


def _without(header, rows, column):
    """The table without `column`."""
    i = header.index(column)
    return header[:i] + header[i + 1:], [row[:i] + row[i + 1:] for row in rows]


def size_measures(size, job_valid):
    """`compare`'s measures of one size row (a collective's, or a replayed trace's)."""
    cct, counters = size.get("cct_ms") or {}, size.get("counters") or {}
    return {"valid": size.get("valid", job_valid), "size": size.get("size"),
            "in_place": size.get("in_place", False),
            "busbw_mbps": size.get("busbw_mbps"), "cct_p50_ms": cct.get("p50"), "cct_p99_ms": cct.get("p99"),
            "out_of_sequence": counters.get("out_of_sequence"),
            "retransmitted_packets": counters.get("retransmitted_packets"),
            "local_ack_timeout_err": counters.get("local_ack_timeout_err")}


def compare_rows(job):
    return [size_measures(size, job.get("valid")) for size in job.get("sizes") or []] or [{}]


def runs_rows(job):
    sizes = job.get("sizes") or []
    modes = both_modes(sizes)
    rows = []
    for size in sizes:
        c = size["counters"]
        workload = f"{size['collective']} {human_size(size['size'])}" + f" {mode(size)}" * modes
        if "cross_zone" in size:
            workload += f", cross-zone {cross_zone_text(size)} MiB"
        rows.append((workload, f"{size['busbw_mbps']:.2f}", f"{size['cct_ms']['p50']:.0f}",
                     f"{size['cct_ms']['p99']:.0f}", c.get("out_of_sequence", 0), c.get("retransmitted_packets", 0),
                     c.get("local_ack_timeout_err", 0)))
    return rows
