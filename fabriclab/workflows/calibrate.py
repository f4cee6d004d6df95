"""`fabriclab model calibrate`: the same spec and collective in the emulation and in the flow model.

    sudo .venv/bin/fabriclab model calibrate default --collective allreduce --sizes 256K,1M

Builds the fabric, runs the collective with the lab's agents (ECMP, one rank per host, ranks in
host order, as the model's linear ring), evaluates the flow model for the same spec, workload and
QPs under ECMP and the ideal split, and prints both with the model's error. The model's flows carry
the UDP source ports the agents' queue pairs use, and its ECMP hashes them as Open vSwitch's select
groups do, bit for bit and from the same basis per switch, so it places every flow where the
emulation's switches do. What the model leaves out shows up as that error: RoCE headers and ACKs (about
2% of the bytes at a 4 KiB path MTU), pacing and scheduling jitter, queues and losses.
"""

from __future__ import annotations


from fabriclab.errors import LabError
from fabriclab.model import evaluate, flows
from fabriclab.model.graph import ClosGraph
from fabriclab.model.routes import Routes

MODEL_SCHEMES = ("ecmp", "ideal")


def check_calibratable(spec):
    """The model's ring runs over hosts; the emulation's over NICs: they match for one NIC, one
    plane (the model splits multiplane traffic evenly, the agents round-robin QPs over planes)."""
    if spec.nics_per_host != 1 or spec.planes != 1:
        raise LabError(f"calibration needs one NIC per host on one plane; {spec.name!r} has "
                       f"{spec.nics_per_host} NIC(s) on {spec.planes} plane(s)")


def agents_sports(launcher):
    """{(source address, destination address, QP index): UDP source port} of the queue pairs the
    launcher's agents open (traffic.collective.plan_qps, from the collective's seed)."""
    import random

    from fabriclab.traffic.collective import plan_qps

    spec = launcher.spec
    plan = plan_qps(launcher.ranks, launcher.schedules, spec, random.Random(spec.seed))
    return {(launcher.ranks[rank].ports[0].ip, qp["peer_address"], qp["index"]): qp["sport"]
            for rank, qps in enumerate(plan) for qp in qps}


def model_rows(spec, collective, sizes, qps=1, sport_mode="qp", sports=None):
    """Per size and scheme: the flow model's CCT and busbw for the spec; `sports`
    (agents_sports) gives each flow the source port the emulation's queue pair uses."""
    graph = ClosGraph.from_spec(spec)
    routes = Routes(graph)
    out = {}
    for size in sizes:
        work = flows.build(graph, collective, size, qps, sport_mode, "linear")
        for step in work.steps if sports else ():
            for f in step.flows:
                key = (graph.ip_text(f.src), graph.ip_text(f.dst), (f.src_qpn - flows.FIRST_QPN) % qps)
                f.sport = sports.get(key, f.sport)
        for scheme in MODEL_SCHEMES:
            outcome = evaluate.run(graph, routes, work, scheme)
            up = evaluate.balance(graph, routes, outcome.loads)["up"]["max_mean"]
            out[(size, scheme)] = {"cct_s": outcome.cct_s, "busbw_mbps": outcome.busbw_Bps * 8 / 1e6,
                                   "uplink_max_mean": round(up, 3) if up else None}
    return out


def compare(emulated, modelled):
    """Rows of the side-by-side table: the model's error is (model - emulation) / emulation."""
    rows = []
    for row in emulated:
        size = row["size"]
        entry = {"size": size, "emulated_cct_s": row["cct_ms"]["mean"] / 1e3,
                 "emulated_busbw_mbps": row["busbw_mbps"],
                 "emulated_uplink_max_mean": row["balance"]["up"].get("max_mean_ratio"),
                 "valid": row["valid"]}
        for scheme in MODEL_SCHEMES:
            m = modelled[(size, scheme)]
            entry[f"{scheme}_cct_s"] = m["cct_s"]
            entry[f"{scheme}_error"] = (m["cct_s"] - entry["emulated_cct_s"]) / entry["emulated_cct_s"]
            entry[f"{scheme}_uplink_max_mean"] = m["uplink_max_mean"]
        rows.append(entry)
    return rows


def run_calibration(spec, collective="allreduce", sizes=(1 << 20,), qps=1, sport_mode="qp",
                    iterations=3, out=None):
    """Emulate, model, compare: returns (the emulation's results document, comparison rows); the
    document, with the comparison in `calibration`, is written to `out` (default results/...)."""
    from fabriclab.lab.lab import Lab
    from fabriclab.results import document
    from fabriclab.traffic.collective import CollectiveSpec, Launcher
    from fabriclab.workflows import pipeline
    from fabriclab.workflows.plan import Job, single_run

    check_calibratable(spec)
    cspec = CollectiveSpec(collective, sizes=tuple(sizes), qps=qps, sport_mode=sport_mode,
                           iterations=iterations)
    # The emulation rounds sizes to whole elements per rank; model the sizes it actually runs.
    launcher = Launcher(Lab(spec), cspec)
    run_sizes = [s.size for s in launcher.schedules]
    sports = agents_sports(launcher)
    launcher.cleanup()
    modelled = model_rows(spec, collective, run_sizes, qps, sport_mode, sports)
    plan = single_run(f"{spec.name}-calibration", "calibration", spec, Job(collective, cspec),
                      source={"collective": collective, "sizes": list(sizes), "qps": qps,
                              "sport_mode": sport_mode, "iterations": iterations})
    result = pipeline.run_plan(plan, out)
    doc = result.doc
    (run,) = doc["runs"]
    rows = compare(run["jobs"][collective]["sizes"], modelled)
    doc["calibration"] = {"model_schemes": list(MODEL_SCHEMES), "rows": rows}
    document.write(doc, result.folder)
    return doc, rows
