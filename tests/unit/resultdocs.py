"""Results documents for tests that need no network: every part built by fabriclab.results.document
from launcher-shaped inputs (a CollectiveRun, a TrafficRun, a SwitchML report), the run records
shaped as the pipeline writes them. Each document follows schema.json (test_results_schema checks).
"""

from __future__ import annotations

import json
import types

from fabriclab.apps.choice import Routing
from fabriclab.jobs import allpairs as allpairs_kind
from fabriclab.jobs import collective as collective_kind
from fabriclab.jobs import switchml as switchml_kind
from fabriclab.results import document
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec
from fabriclab.traffic import schedules
from fabriclab.traffic.allpairs import AllPairsSpec, all_pairs_plan
from fabriclab.traffic.collective import CollectiveRun, CollectiveSpec, place_ranks
from fabriclab.traffic.launcher import TrafficRun
from fabriclab.workflows.plan import Job, Metrics, Plan, RunPlan
from fabriclab.workflows.plan import slug as plan_slug

COLUMNS = ["l1>s1", "s1>l1", "l1>s2", "s2>l1", "l2>s1", "s1>l2", "l2>s2#2", "s2>l2#2",
           "h1-n0>l1", "l1>h1-n0", "h2-n0>l2", "l2>h2-n0"]


def fake_lab(spec="tiny"):
    fabric = Fabric(load_spec(spec))
    return types.SimpleNamespace(fabric=fabric, datapath="user", queues=None, warnings=[],
                                 ecn_mechanism="none", delay_mechanism="none",
                                 routing=Routing.parse("ecmp"))


def snapshot(t, fabric, tx=0, drops=0):
    intfs = [i for s in fabric.switches for i in fabric.switch_ports(s).values()]
    return {"time": t, "counters": {i: {"tx_bytes": tx, "rx_bytes": tx, "tx_packets": 0, "rx_packets": 0,
                                        "tx_dropped": 0, "rx_dropped": 0} for i in intfs},
            "drops": {i: drops for i in intfs},
            "cpu": {"time": t, "total": 100 * t, "idle": 60 * t, "ovs": None}}


def launcher_size(size, ccts_s, busbw, fabric, verify=None, valid=True, in_place=False, collective="allreduce",
                  ranks=2):
    """One size in one mode as traffic.collective.Launcher._summarise returns it."""
    from fabriclab.measure import telemetry

    before, after = snapshot(0.0, fabric), snapshot(1.0, fabric, tx=125_000)
    links = telemetry.link_utilization(fabric, before, after)
    mean = sum(ccts_s) / len(ccts_s)
    factor = schedules.bus_factor(collective, ranks)
    return {"collective": collective, "algorithm": "ring", "size": size, "in_place": in_place, "ranks": ranks,
            "iterations": len(ccts_s),
            "time_s": {"mean": mean, "p50": sorted(ccts_s)[len(ccts_s) // 2], "p99": max(ccts_s),
                       "min": min(ccts_s), "max": max(ccts_s), "all": list(ccts_s)},
            "rank_time_s_mean": mean, "ideal_time_s": mean / 2, "algbw_mbps": busbw / factor, "busbw_mbps": busbw,
            "bus_factor": factor, "nic_rate_mbps": 100.0, "busbw_fraction_of_nic": busbw / 100,
            "bytes_sent_per_rank": [size] * ranks,
            "counters": {"out_of_sequence": 7, "retransmitted_packets": 3, "local_ack_timeout_err": 1,
                         "ce_marked": 0, "cnp_sent": 0, "cnp_handled": 0},
            "agent_cpu_s": [0.01, 0.02], "flows": None, "verify": verify, "window_s": 1.0, "window_error_ms": 0.0, "links": links,
            "buffer_drops": telemetry.buffer_drops(fabric, before, after),
            "balance": {"up": telemetry.balance(links, "up"), "down": telemetry.balance(links, "down")},
            "cpu": {"machine": 0.4, "ovs_forwarding": None}, "valid": valid}


def verify_record(ranks, iterations, wrong=0):
    """A size's check as the launcher summarises it: `wrong` elements in the worst iteration."""
    record = {"ok": not wrong, "checked_outputs": ranks * iterations, "mismatched_outputs": 1 if wrong else 0,
              "wrong_elements": wrong, "max_abs_err": 3.0 if wrong else 0.0}
    if wrong:
        record["first_mismatch"] = {"index": 5, "got": 0.0, "want": 3.0}
    return record


def collective_job(busbw=71.5, sizes=((1 << 20, (0.010, 0.012, 0.030)), (4 << 20, (0.040, 0.044, 0.090))),
                   role="measured", hosts=("h1", "h2"), valid=True, collective="allreduce", in_place=False,
                   verify=False, wrong=None, root=0, spec="tiny", plb=None):
    """A collective job's record; with `in_place` every size has an in-place row after its out-of-place
    one (10% slower). `wrong`: {(size, in_place): wrong elements} of a verified job. `plb`: a plane
    load balancer mode, whose records (settings, per-plane shares, each rank's report) the job gets."""
    lab = fake_lab(spec)
    cspec = CollectiveSpec(collective, sizes=tuple(s for s, _ in sizes), hosts=hosts, verify=verify,
                           in_place=in_place, root=root, warmup=2, iterations=len(sizes[0][1]),
                           plb=plb or "static")
    ranks = place_ranks(lab.fabric, cspec)
    settings = None
    if plb is not None:
        settings = {"mode": plb, "probe_interval_s": 0.037, "probe_timeouts": 3, "sw_timeout_s": 1.7,
                    "egress_room_bytes": 12510}
    run = CollectiveRun(cspec, ranks, 4096, 0.2, 100.0, plb=settings)
    modes = (False, True) if in_place else (False,)
    run.sizes = []
    for i, (size, ccts) in enumerate(sizes):
        for mode in modes:
            slower = 1.1 if mode else 1.0
            checked = verify and not (mode and collective in schedules.IN_PLACE_UNDEFINED)
            check = verify_record(len(ranks), len(ccts), (wrong or {}).get((size, mode), 0)) if checked else None
            run.sizes.append(launcher_size(size, [t * slower for t in ccts], (busbw + 5 * i) / slower, lab.fabric,
                                           verify=check, valid=valid, in_place=mode, collective=collective,
                                           ranks=len(ranks)))
    run.finals = {r.rank: {"totals": {"tx_packets": 10}, "qps": [{"qpn": 256 + r.rank, "tx_packets": 10}]}
                  for r in ranks}
    if plb is not None:
        planes = len(ranks[0].ports)
        for row in run.sizes:
            row["planes"] = {"tx_bytes": [1000] * planes, "share": [round(1 / planes, 4)] * planes}
        for r in ranks:
            run.finals[r.rank]["plb"] = plb_report(plb, planes, peer=1 - r.rank)
    run.pids = {r.rank: 4242 + r.rank for r in ranks}
    run.elapsed_s = 1.5
    return collective_kind.record(run, role)


def plb_report(mode, planes, peer):
    """One rank's plane load balancer record, shaped as traffic/agent.py's plb_report makes it:
    one plane removed by its port and back after a successful send."""
    return {"mode": mode,
            "planes": [{"plane": p + 1, "intf": f"h1-n0p{p + 1}", "up": True, "data_tx_packets": 25,
                        "data_tx_bytes": 104250, "deep_queue_skips": 0} for p in range(planes)],
            "destinations": [{"peer": peer, "planes": [
                {"plane": p + 1, "liveness": {"probes_sent": 4, "probe_timeouts": 0, "echoes": 4, "removed": False,
                                              "rtt_ms": {"min": 3.1, "max": 9.0, "mean": 5.2}},
                 "cc": {"rate_mbps": 10.0, "min_rate_mbps": 5.0, "cnps": 1}} for p in range(planes)]}],
            "events": [{"t": 1700000000.5, "plane": planes, "peer": None, "event": "removed", "by": "send"},
                       {"t": 1700000001.5, "plane": planes, "peer": None, "event": "returned", "by": "send"}],
            "reorder": {"out_of_sequence": 12, "depth_max": 6, "depth_mean": 2.5},
            "timeline": {"start": 1700000000.0, "t_s": [0.0, 0.01], "acked_bytes": [4096, 8192],
                         "received_bytes": [0, 4096], "sent_bytes": [[4170, 8340]] * planes, "truncated": False}}


def allpairs_job(delivered_mbps=30.0):
    lab = fake_lab()
    spec = AllPairsSpec(duration_s=2.0)
    flows = all_pairs_plan(lab.fabric, load=spec.load)
    run = TrafficRun(flows, 2.0, 0.0, payload_bytes=4096, message_bytes=65536, start_wall=100.0)
    run.window = (snapshot(0.5, lab.fabric), snapshot(2.0, lab.fabric, tx=250_000))
    per_host = delivered_mbps / len(flows)
    for host, fl in flows.items():
        sent = {f["id"]: {"packets": 100} for f in fl}
        received = [{"src": f["src"], "dst": f["dst"], "dst_qpn": f["dst_qpn"], "packets": 99, "oos": 1, "late": 0,
                     "wire_bytes": int(per_host * 1e6 / 8 * 2.0)} for f in fl]
        run.results[host] = {"sent": sent, "received": received}
    return allpairs_kind.record(run, spec, lab.fabric)


def switchml_job():
    from fabriclab.switchml.launcher import AggregationSpec

    report = {"mechanism": "switchml", "dtype": "int32", "elements": 65536, "tensor_bytes": 262144, "workers": 2,
              "k": 256, "slots": 64, "hierarchy": False, "aggregators": {"l1": "h3"},
              "worker_hosts": {"l1": ["h1", "h2"]},
              "tat_s": {"per_iteration": [0.2, 0.25], "mean": 0.225, "p50": 0.225, "max": 0.25},
              "elements_per_s": 291271.0, "bytes_sent_per_worker": 300000.0, "retransmissions": 2,
              "packets_sent": 600, "verify": {"ok": True, "exact": True, "max_error": 0.0, "bound": 0.0,
                                               "result_sha256": "00"}}
    return switchml_kind.record(report, AggregationSpec(elements=65536, workers=("h1", "h2")))


def impact(recovery, fell=True):
    return {"baseline_mbps": 160.0, "min_mbps": 0.0, "min_at_s": 0.1, "fell": fell,
            "recovery_s": recovery, "after_mbps": 150.0, "retained": 0.94}


def fault(kind, at, until, recovery, index=0, target="l1-s1"):
    return {"index": index, "kind": kind, "label": f"{kind.replace('_', ' ')} {target}", "target": target,
            "planned_at_s": at, "params": {}, "at_s": at, "until_s": until,
            "events": [{"t_s": at, "event": f"{target} down", "undo": False}], "impact": impact(recovery)}


def unreached(index=3):
    return {"index": index, "kind": "link_down", "label": "link down l2-s2", "target": "l2-s2",
            "planned_at_s": 9.0, "params": {}, "at_s": None, "until_s": None, "events": [], "impact": None,
            "note": "not reached: the measured jobs ended first"}


def telemetry():
    return {"sampling": {"interval_s": 0.005, "samples": 800, "reached_median_s": 0.0052,
                         "reached_p99_s": 0.009, "largest_gap_s": 0.02},
            "symmetry": [{"group": "l1 uplinks", "members": {"l1>s1": 80.0, "l1>s2": 30.0},
                          "median_mbps": 55.0, "max_mean_ratio": 1.45,
                          "outliers": [{"member": "l1>s2", "mbps": 30.0, "deviation": -0.455}]}],
            "outliers": [["l1 uplinks", "l1>s2", -0.455, "tx"]],
            "stragglers": ["h2-n0"],
            "nics": {"h1-n0": {"histogram": [0.4] + [0.0] * 8 + [0.6], "idle_share": 0.4,
                               "mean_utilization": 0.55, "busy_mean_utilization": 0.95},
                     "h2-n0": {"histogram": [0.2, 0, 0, 0, 0.8, 0, 0, 0, 0, 0], "idle_share": 0.2,
                               "mean_utilization": 0.36, "busy_mean_utilization": 0.45}},
            "uplink_max_mean": 1.45, "mean_mbps": {c: 80.0 for c in COLUMNS}}


def run(label, jobs, faults=(), routing="ecmp", repetition=1, tags=None):
    slug = plan_slug(label)
    invalid = [f"{name}: {r}" for name, job in jobs.items() for r in job["invalid"]]
    return {"label": label, "slug": slug, "routing": routing, "repetition": repetition, "note": "",
            "tags": tags or {}, "duration_s": None, "conditions": [], "ecn": None,
            "origin_s": 0.5, "end_s": 3.5, "bin_s": 0.1, "jobs": jobs, "faults": list(faults), "events": [],
            "telemetry": telemetry(), "queues": None,
            "routing_state": {"app": routing, "stage": None, "te": None}, "link_loss": None,
            "valid": not invalid, "invalid": invalid, "files": {"links_csv": f"links-{slug}.csv"}}


def doc(kind, runs, name="t", description="", experiment=None):
    lab = fake_lab()
    spec = lab.fabric.spec
    plan = Plan(name=name, kind=kind, spec=spec, runs=[RunPlan(r["label"]) for r in runs], metrics=Metrics(),
                description=description, source={"command": kind})
    out = document.assemble(plan, document.header(lab, 4096), runs, 12.0, "/tmp/x", {"up_s": 1.0})
    if experiment is not None:
        out["experiment"] = experiment
    return out


def scenario_doc():
    """Two runs; the first has four faults (one never recovered, one never reached)."""
    jobs = {"ring": collective_job(71.5), "bg": collective_job(20.0, sizes=((1 << 20, (0.05,)),), role="noise",
                                                               hosts=("h1", "h2"))}
    return doc("scenario", [
        run("ecmp r1", jobs, [fault("link_down", 1.0, 1.5, 0.6), fault("flap", 2.0, 2.2, 0.2, 1),
                              fault("degrade", 2.5, None, None, 2), unreached()]),
        run("flowlet r1", {"ring": collective_job(88.25)}, routing="flowlet")],
        name="flap under load", description="an uplink flaps during a ring AllReduce")


def write(folder, document_, csvs=True, dip=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(document_))
    if csvs:
        for r in document_["runs"]:
            links_csv(folder / r["files"]["links_csv"], dip if r is document_["runs"][0] else None)
    return document_


def links_csv(path, dip=None):
    """40 bins of 0.1 s: every direction at 80 Mbit/s, nothing while `dip` (series seconds) lasts."""
    lines = ["t_s," + ",".join(COLUMNS)]
    for i in range(40):
        t = 0.1 * i
        rate = 0.0 if dip and dip[0] <= t < dip[1] else 80.0
        lines.append(f"{t:.4f}," + ",".join(f"{rate:.3f}" for _ in COLUMNS))
    path.write_text("\n".join(lines) + "\n")


def job(kind, **kw):
    return {"collective": collective_job, "all-pairs": allpairs_job, "switchml": switchml_job}[kind](**kw)


def plan_job(name="ring"):
    return Job(name, CollectiveSpec())


def saturating_run_plan(seen, below_mbps=2.5):
    """A stand-in for pipeline.run_plan: its first run saturates the CPU while the plan's host rate
    is above `below_mbps` (the `incast` spec's 10 Mbit/s until a quarter); appends each plan's host
    rate to `seen` and writes the document where the pipeline would."""
    def run_plan(plan, out, progress=None, verbose=False, run_plots=True, plots=True):
        seen.append(plan.spec.host_rate_mbps)
        runs = [run(r.label, {"ring": collective_job()}) for r in plan.runs]
        if plan.spec.host_rate_mbps > below_mbps:
            runs[0]["valid"], runs[0]["invalid"] = False, ["ring: CPU saturated: the software switches ..."]
        got = doc("experiment", runs)
        got["scale"]["host_rate_mbps"], got["scale"]["time_scale"] = plan.spec.host_rate_mbps, plan.spec.time_scale
        got["plan"]["source"] = plan.source
        document.write(got, out)
        return types.SimpleNamespace(doc=got)
    return run_plan
