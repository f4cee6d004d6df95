"""`fabriclab model calibrate`: the same spec and collective in the emulation and in the flow model.

    sudo .venv/bin/fabriclab model calibrate default --collective allreduce --sizes 256K,1M

Builds the fabric, runs the collective with the lab's agents (ECMP, one rank per host, ranks in
host order, as the model's linear ring), evaluates the flow model for the same spec, workload and
QPs under ECMP (the model's hash, not Open vSwitch's) and the ideal split, and prints both with
the model's error. What the model leaves out shows up as that error: RoCE headers and ACKs (about
2% of the bytes at a 4 KiB path MTU), pacing and scheduling jitter, queues and losses.
"""

from __future__ import annotations

import json

from fabriclab.errors import LabError
from fabriclab.model import evaluate, flows
from fabriclab.model.graph import ClosGraph
from fabriclab.model.routes import Routes
from fabriclab.table import format_table
from fabriclab.units import human_size, parse_sizes

MODEL_SCHEMES = ("ecmp", "ideal")


def register(sub):
    q = sub.add_parser("calibrate", help="run a collective in the emulation and in the flow model, "
                                         "side by side with the model's error (needs root)")
    q.add_argument("spec", metavar="SPEC", help="spec name or YAML path (one NIC per host, one plane)")
    q.add_argument("--collective", choices=flows.COLLECTIVES, default="allreduce")
    q.add_argument("--sizes", default="256K,1M", help="message sizes (default 256K,1M)")
    q.add_argument("--qps", type=int, default=1, help="QPs per connection")
    q.add_argument("--sport-mode", dest="sport_mode", choices=flows.SPORT_MODES, default="qp")
    q.add_argument("--iterations", type=int, default=3)
    q.add_argument("--format", choices=("table", "json"), default="table")
    q.set_defaults(func=cmd_calibrate)


def check_calibratable(spec):
    """The model's ring runs over hosts; the emulation's over NICs: they match for one NIC, one
    plane (the model splits multiplane traffic evenly, the agents round-robin QPs over planes)."""
    if spec.nics_per_host != 1 or spec.planes != 1:
        raise LabError(f"calibration needs one NIC per host on one plane; {spec.name!r} has "
                       f"{spec.nics_per_host} NIC(s) on {spec.planes} plane(s)")


def model_rows(spec, collective, sizes, qps=1, sport_mode="qp"):
    """Per size and scheme: the flow model's CCT and busbw for the spec."""
    graph = ClosGraph.from_spec(spec)
    routes = Routes(graph)
    out = {}
    for size in sizes:
        work = flows.build(graph, collective, size, qps, sport_mode, "linear")
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
        entry = {"size": size, "emulated_cct_s": row["time_s"]["mean"],
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
                    iterations=3):
    """Emulate, model, compare: returns (the emulation's results document, comparison rows)."""
    from fabriclab import collective_cmd
    from fabriclab.lab import Lab
    from fabriclab.traffic.collective import CollectiveSpec, Launcher

    check_calibratable(spec)
    cspec = CollectiveSpec(collective, sizes=tuple(sizes), qps=qps, sport_mode=sport_mode,
                           iterations=iterations)
    lab = Lab(spec)
    launcher = Launcher(lab, cspec)
    # The emulation rounds sizes to whole elements per rank; model the sizes it actually runs.
    modelled = model_rows(spec, collective, [s.size for s in launcher.schedules], qps, sport_mode)
    with lab:
        run = launcher.run()
        doc = collective_cmd.collective_result(lab, run)
    rows = compare(run.sizes, modelled)
    doc["calibration"] = {"model_schemes": list(MODEL_SCHEMES), "rows": rows}
    return doc, rows


def cmd_calibrate(args):
    from fabriclab import results
    from fabriclab.topologies.spec import load_spec

    spec = load_spec(args.spec)
    doc, rows = run_calibration(spec, args.collective, parse_sizes(args.sizes), args.qps,
                                args.sport_mode, args.iterations)
    if args.format == "json":
        print(json.dumps(doc, indent=1))
        return 0
    print(format_table(
        ("size", "emulated CCT ms", "model ECMP ms", "error", "model ideal ms", "error",
         "uplink max/mean emu", "model ECMP", "valid"),
        [(human_size(r["size"]), f"{r['emulated_cct_s'] * 1e3:.1f}", f"{r['ecmp_cct_s'] * 1e3:.1f}",
          f"{100 * r['ecmp_error']:+.1f} %", f"{r['ideal_cct_s'] * 1e3:.1f}",
          f"{100 * r['ideal_error']:+.1f} %", r["emulated_uplink_max_mean"],
          r["ecmp_uplink_max_mean"], "yes" if r["valid"] else "no (CPU saturated)")
         for r in rows],
        title=f"{args.collective} on {spec.name}: emulation vs flow model "
              f"({len(doc['ranks'])} ranks, {args.qps} QP(s), links {spec.host_rate_mbps:g} Mbit/s)"))
    print(f"\nresults: {results.write_result(doc)}")
    return 0
