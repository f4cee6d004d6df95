"""The one results document: what every run of the lab writes as results.json, and reads back.

Whatever wrote it (`run`, `demo`, `collective`, `experiment`, `scenario`, `model calibrate`, the
prompt, pytest, the Python API), a results document has one shape, versioned by `schema_version`
and described by schema.json beside this module:

    header     versions, machine, scale (link rates, buffers, time scale, link delay), mechanisms
               the kernel allowed, the spec and fabric summary
    plan       what was asked: the entry point (`kind`), its input, the metrics
    runs       one record per run: its routing, jobs (collective, all-pairs or switchml records),
               faults with their impact, the fault log, port telemetry, the queue model's report
    valid      false when any job ran with a saturated CPU or failed its verification

This module owns that shape: it builds the records from what the launchers return, writes the
file, and loads it back (refusing, in one line, a file it cannot read: another version, an older
format, a broken document).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import platform
import time

from fabriclab import __version__
from fabriclab.errors import LabError
from fabriclab.loading import clip, parse_json, read_text
from fabriclab.measure import cpuload

SCHEMA_VERSION = 1
SCHEMA_PATH = pathlib.Path(__file__).with_name("schema.json")
MAX_DOCUMENT_BYTES = 256 << 20          # results of long sweeps stay far below; anything above is not ours


# -- the header ------------------------------------------------------------------------------------
def header(lab, payload_bytes):
    """What every results document starts with: versions, scale, mechanisms, spec."""
    fabric = lab.fabric
    spec = fabric.spec
    queues = getattr(lab, "queues", None)
    return {
        "schema_version": SCHEMA_VERSION,
        "fabriclab": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"kernel": platform.release(), "cpus": os.cpu_count()},
        "scale": {
            "host_rate_mbps": spec.host_rate_mbps,
            "fabric_rate_mbps": spec.fabric_rate_mbps,
            "mtu": spec.mtu,
            "roce_payload_bytes": payload_bytes,
            "buffers_bytes": fabric.summary()["buffers_bytes"],
            "real_host_rate_mbps": spec.real_host_rate_mbps,
            "time_scale": spec.time_scale,
            "link_delay": link_delay(lab),
            "note": "emulated rates; time_scale = real_host_rate / host_rate when the spec states it",
        },
        "mechanisms": {"ovs_datapath": lab.datapath,
                       "shaping": "htb+bfifo" if queues is None else "htb classes+tbf gate",
                       "ecn": getattr(lab, "ecn_mechanism", "none"),
                       "delay": getattr(lab, "delay_mechanism", "none"),
                       "queue_model": queues.describe() if queues is not None else None},
        "warnings": list(getattr(lab, "warnings", ())),
        "spec": spec.to_dict(),
        "fabric": fabric.summary(),
        "cluster": cluster(lab),
    }


def cluster(lab):
    """The machines a split fabric ran on and its boundary links; None on one machine."""
    machines, split = getattr(lab, "machines", None), getattr(lab, "split", None)
    if not machines or split is None:
        return None
    return {"machines": [{"name": m.name, "private_ip": m.private_ip,
                          "datapath": lab.datapath if m.local else getattr(m, "datapath", None)} for m in machines],
            "split": split.summary()}


def link_delay(lab):
    """The spec's one-way delay per cable kind, real and in the lab, and whether the lab ran it."""
    spec = lab.fabric.spec
    kinds = ("host", "fabric")
    return {"real_us": {kind: getattr(spec.delay, f"{kind}_us") for kind in kinds},
            "lab_ms": {kind: spec.lab_delay_ms(kind) for kind in kinds},
            "applied": getattr(lab, "delay_mechanism", "none") == "netem"}


# -- job records -----------------------------------------------------------------------------------
def _invalid(cpu_valid, verify=None):
    reasons = [] if cpu_valid else ["CPU saturated: the software switches, not the fabric, may have set the numbers"]
    if verify is not None and not verify.get("ok", True):
        reasons.append("verification failed: an output differs from the expected values")
    return reasons


def size_row(row):
    """One message size of a collective job in one mode (out of place, or in place), from the
    launcher's summary (times in ms)."""
    t = row["time_s"]
    ms = {k: round(t[k] * 1e3, 4) for k in ("mean", "p50", "p99", "min", "max")}
    invalid = _invalid(row["valid"], row["verify"])
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


def collective_job(run, role="measured"):
    """The record of a collective job from its CollectiveRun."""
    spec = run.spec
    sizes = [size_row(row) for row in run.sizes]
    invalid = sorted({reason for row in sizes for reason in row["invalid"]})
    # as results.json holds it (a program's steps are tuples in the spec): the schema types it
    workload = json.loads(json.dumps(dataclasses.asdict(spec)))
    return {
        "kind": "collective", "role": role, "hosts": hosts_record({r.host for r in run.ranks}),
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
    }


def plb_record(run):
    """The plane load balancer of a collective job: its settings, and per rank what each plane
    sent, the removals and returns of planes (unix times), the CC contexts and probes per
    destination, out-of-order arrivals and the rank's timeline (traffic/agent.py plb_report)."""
    return {**run.plb,
            "ranks": {str(rank): final.get("plb") for rank, final in sorted(run.finals.items())}}


def allpairs_job(run, spec, fabric, role="measured"):
    """The record of an all-pairs job from its TrafficRun."""
    from fabriclab.measure import telemetry

    cpu = run.cpu()
    links = telemetry.link_utilization(fabric, *run.window)
    invalid = _invalid(cpuload.valid(cpu))
    hosts = {h for h, flows in run.plan.items() if flows}
    return {
        "kind": "all-pairs", "role": role, "hosts": hosts_record(hosts),
        "workload": dataclasses.asdict(spec),
        "traffic": run.totals(),
        "links": links,
        "balance": {"up": telemetry.balance(links, "up"), "down": telemetry.balance(links, "down")},
        "buffer_drops": telemetry.buffer_drops(fabric, *run.window),
        "flows": run.flow_rows(),
        "window_s": round(run.window[1]["time"] - run.window[0]["time"], 4),
        "window_error_ms": telemetry.window_error_ms(*run.window),
        "late_start_s": run.late_starts(),
        "cpu": cpu, "valid": not invalid, "invalid": invalid,
    }


def switchml_job(report, spec, role="measured"):
    """The record of a SwitchML aggregation job from run_aggregation's report."""
    hosts = set(report["aggregators"].values()) | {h for w in report["worker_hosts"].values() for h in w}
    invalid = _invalid(True, report.get("verify"))
    return {"kind": "switchml", "role": role, "hosts": hosts_record(hosts),
            "workload": dataclasses.asdict(spec), "aggregation": report,
            "valid": not invalid, "invalid": invalid}


def hosts_record(names):
    """A job's hosts in the order people count them: h2 before h10."""
    return sorted(names, key=lambda h: (len(h), h))


# -- the document ----------------------------------------------------------------------------------
def assemble(plan, head, runs, elapsed_s, folder, timings=None):
    """The whole document of a plan's runs."""
    doc = {
        **head,
        "kind": plan.kind,
        "name": plan.name,
        "description": plan.description,
        "plan": {"source": plan.source, "metrics": dataclasses.asdict(plan.metrics),
                 "runs": len(plan.runs)},
        "experiment": None,
        "routing": sorted({run["routing"] for run in runs}),
        "runs": runs,
        "valid": all(run["valid"] for run in runs),
        "elapsed_s": round(elapsed_s, 1),
        "timings_s": {k: round(v, 3) for k, v in (timings or {}).items()},
        "folder": str(folder),
    }
    if plan.experiment is not None:
        mod = plan.experiment
        doc["experiment"] = {"name": mod.NAME, "summary": mod.SUMMARY, "reference": mod.REFERENCE}
    return doc


def default_folder(name):
    return pathlib.Path("results") / f"{time.strftime('%Y%m%d-%H%M%S')}-{_slug(name)}"


def write(doc, folder):
    """Write results.json into `folder`; returns its path."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "results.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=False))
    os.replace(tmp, path)
    return path


def load(folder):
    """The results document of a folder, checked against the schema; a one-line LabError naming
    the folder when there is none, it is of another format, or it is broken."""
    path = pathlib.Path(folder) / "results.json"
    if not path.is_file():
        raise LabError(f"{folder}: no results.json here (not a results folder?)")
    doc = parse_json(read_text(path, "results document", MAX_DOCUMENT_BYTES), clip(path))
    if not isinstance(doc, dict):
        raise LabError(f"{path}: not a results document (a JSON {type(doc).__name__}, not an object)")
    version = doc.get("schema_version")
    if version is None:
        made = doc.get("fabriclab", "an unknown version")
        raise LabError(f"{path}: written by fabriclab {str(made)[:20]} before results documents had a "
                       f"schema_version; rerun it to read it here")
    if version != SCHEMA_VERSION:
        raise LabError(f"{path}: schema_version {str(version)[:10]}; this fabriclab reads {SCHEMA_VERSION}")
    problem = first_problem(doc)
    if problem:
        raise LabError(f"{path}: {problem}")
    return doc


@functools.lru_cache(maxsize=1)
def _validator():
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def first_problem(doc):
    """None when `doc` follows the schema, else one line naming where it does not."""
    error = next(iter(sorted(_validator().iter_errors(doc), key=lambda e: list(e.absolute_path))), None)
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "the top level"
    message = error.message if len(error.message) <= 120 else error.message[:117] + "..."
    return f"not a valid results document at {where}: {message}"


def _slug(text):
    return "".join(c if c.isalnum() else "-" for c in str(text).lower()).strip("-") or "run"
