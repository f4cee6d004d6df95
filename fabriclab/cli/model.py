"""`fabriclab model`: collective predictions from a hardware profile, and the flow-level fabric model
(`flowcli`); no network is built."""

from __future__ import annotations

import json
import pathlib
import time
from dataclasses import asdict, replace

from fabriclab.errors import LabError
from fabriclab.model import collectives
from fabriclab.model import flows as model_flows
from fabriclab.model.hardware import STAGING_MODES, load_profile, shipped_profiles
from fabriclab.table import format_table
from fabriclab.units import human_size, parse_sizes

DEFAULT_SIZES = "1K,64K,1M,16M,256M,1G"
COLLECTIVE_ALGORITHMS = sorted({f"{c}/{a}" for c, a in collectives.ALGORITHMS} | {"allreduce/hierarchical"})


def predict(profile, collective, algorithm, nodes, size, staging_mode=None):
    """One Cost for a collective over `nodes` nodes of a profile (all their ranks take part),
    its host staging charged as `staging_mode` says (the profile's own mode unless given)."""
    up, out = profile.tiers(staging_mode)
    ranks = profile.ranks_per_node * nodes
    if algorithm == "hierarchical":
        if collective != "allreduce":
            raise LabError("the hierarchical algorithm is modelled for allreduce only")
        cost = collectives.hierarchical_allreduce(size, profile.ranks_per_node, nodes, up, out)
    else:
        fn = collectives.ALGORITHMS.get((collective, algorithm))
        if fn is None:
            raise LabError(f"no model for {collective}/{algorithm} (available: {', '.join(COLLECTIVE_ALGORITHMS)})")
        # A flat algorithm over several nodes runs at the scale-out tier's speed: every ring or
        # exchange step crosses the NICs somewhere, and the slowest step sets the pace.
        tier = out if nodes > 1 else up
        cost = fn(size, ranks, tier.alpha, tier.bw)
    staging = profile.staging_seconds(size, collectives.phases(collective), staging_mode) if nodes > 1 else 0.0
    if staging:
        cost = replace(cost, terms={**cost.terms, "host staging (whole buffer)": staging})
    return cost


def register(subparsers):
    p = subparsers.add_parser("model", help="analytical predictions: collective times from a hardware profile, "
                                            "flow-level fabric model (no network is built)")
    sub = p.add_subparsers(dest="model_command", metavar="WHAT")
    sub.required = True
    q = sub.add_parser("profiles", help="list the shipped hardware profiles")
    q.set_defaults(func=cmd_profiles)
    q = sub.add_parser("collective", help="predict a collective's time, algbw and busbw per message size")
    q.add_argument("--profile", default="h100_8x400g", help="profile name or YAML path")
    q.add_argument("--collective", default="allreduce",
                   choices=sorted({c for c, _ in collectives.ALGORITHMS}))
    q.add_argument("--algorithm", default="ring",
                   help="ring, tree, fully-connected, in-network, hierarchical, pairwise, ring-topology")
    q.add_argument("--nodes", type=int, default=4, help="nodes (all ranks of each take part)")
    q.add_argument("--sizes", default=DEFAULT_SIZES, help=f"message sizes (default {DEFAULT_SIZES})")
    q.add_argument("--staging", choices=STAGING_MODES + ("both",),
                   help="how host staging copies are charged (default: both side by side where the profile "
                        "has staging_copies, else the profile's staging_mode)")
    q.add_argument("--format", choices=("table", "json"), default="table")
    q.add_argument("--out", help="also write results.json into this folder")
    q.set_defaults(func=cmd_collective)
    # The flow-level fabric model (fabric, failures, benchmark) imports this module's parse_sizes.
    from fabriclab.cli import flowmodel as flowcli
    flowcli.register(sub)
    register_calibrate(sub)


def cmd_profiles(_args):
    rows = []
    for name in shipped_profiles():
        prof = load_profile(name)
        rows.append((name, prof.ranks_per_node, f"{prof.scale_up.achievable / 1e9:.0f}",
                     f"{prof.scale_out_bandwidth() / 1e9:.1f}", prof.bottleneck(), prof.description))
    print(format_table(("profile", "ranks/node", "scale-up GB/s", "scale-out GB/s per rank",
                        "scale-out bottleneck", "description"), rows))
    return 0


def cmd_collective(args):
    if args.nodes < 1:
        raise LabError(f"--nodes must be >= 1, got {args.nodes}")
    profile = load_profile(args.profile)
    sizes = parse_sizes(args.sizes)
    chosen = args.staging or ("both" if profile.staging_copies else profile.staging_mode)
    modes = STAGING_MODES if chosen == "both" else (chosen,)
    main_mode = modes[0] if len(modes) == 1 else profile.staging_mode
    rows = []
    for size in sizes:
        by_mode = {}
        for mode in modes:
            c = predict(profile, args.collective, args.algorithm, args.nodes, size, mode)
            by_mode[mode] = {"time_us": c.time * 1e6, "algbw_GBps": c.algbw / 1e9, "busbw_GBps": c.busbw / 1e9,
                             "dominant": c.dominant, "terms_us": {k: v * 1e6 for k, v in c.terms.items()}}
        # the flat fields are the profile's own mode (or the one asked for); both under by_staging
        rows.append({"size": size, **by_mode[main_mode], **({"by_staging": by_mode} if len(modes) > 1 else {})})
    doc = {"kind": "model", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "profile": {**asdict(profile), "scale_out_bandwidth_Bps": profile.scale_out_bandwidth()},
           "collective": args.collective, "algorithm": args.algorithm, "nodes": args.nodes,
           "ranks": profile.ranks_per_node * args.nodes, "staging_modes": list(modes), "rows": rows}
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(doc, indent=1))
        from fabriclab.results import plots
        plots.lines(out / "plot.png", f"{args.collective}/{args.algorithm}, {args.nodes} x {profile.name}",
                    [r["size"] for r in rows],
                    {(f"busbw, {m} staging" if len(modes) > 1 else "busbw"): [_by(r, m)["busbw_GBps"] for r in rows]
                     for m in modes},
                    "message size (bytes)", "busbw (GB/s)",
                    reference=(profile.scale_out_bandwidth() / 1e9, "scale-out bandwidth per rank"))
    if args.format == "json":
        print(json.dumps(doc, indent=1))
        return 0
    staged = (f"; {profile.staging_copies} host staging cop{'y' if profile.staging_copies == 1 else 'ies'}"
              if profile.staging_copies else "")
    title = (f"{args.collective}/{args.algorithm}, {args.nodes} x {profile.name} "
             f"({doc['ranks']} ranks; scale-out {profile.scale_out_bandwidth() / 1e9:.1f} GB/s per rank{staged})")
    if len(modes) == 1:
        header = ("size", "time us", "algbw GB/s", "busbw GB/s", "dominant term")
        cells = [(human_size(r["size"]), f"{r['time_us']:.1f}", f"{r['algbw_GBps']:.2f}", f"{r['busbw_GBps']:.2f}",
                  r["dominant"]) for r in rows]
    else:                             # the two ways of charging host staging, side by side
        header = ["size"] + [f"{what} ({m})" for m in modes for what in ("time us", "busbw GB/s", "dominant term")]
        cells = [[human_size(r["size"])] + [v for m in modes for v in (
            f"{_by(r, m)['time_us']:.1f}", f"{_by(r, m)['busbw_GBps']:.2f}", _by(r, m)["dominant"])] for r in rows]
    print(format_table(header, cells, title=title))
    return 0


def _by(row, mode):
    """A row's figures under one staging mode."""
    return row["by_staging"][mode] if "by_staging" in row else row


# -- model calibrate ----------------------------------------------------------------------------
def register_calibrate(sub):
    q = sub.add_parser("calibrate", help="run a collective in the emulation and in the flow model, "
                                         "side by side with the model's error (needs root)")
    q.add_argument("spec", metavar="SPEC", help="spec name or YAML path (one NIC per host, one plane)")
    q.add_argument("--collective", choices=model_flows.COLLECTIVES, default="allreduce")
    q.add_argument("--sizes", default="256K,1M", help="message sizes (default 256K,1M)")
    q.add_argument("--qps", type=int, default=1, help="QPs per connection")
    q.add_argument("--sport-mode", dest="sport_mode", choices=model_flows.SPORT_MODES, default="qp")
    q.add_argument("--iterations", type=int, default=3)
    q.add_argument("--out", help="results folder (default results/<time>-<name>/)")
    q.add_argument("--format", choices=("table", "json"), default="table")
    q.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args):
    from fabriclab.cli import running
    from fabriclab.topologies.spec import load_spec

    spec = load_spec(args.spec)
    from fabriclab.workflows import calibrate         # the flow model's solvers: scipy (cli/flowmodel.py says why)

    doc, rows = calibrate.run_calibration(spec, args.collective, parse_sizes(args.sizes), args.qps,
                                          args.sport_mode, args.iterations, args.out)
    if args.format == "json":
        print(json.dumps(doc, indent=1))
        return running.exit_code(doc)
    print(format_table(
        ("size", "emulated CCT ms", "model ECMP ms", "error", "model ideal ms", "error",
         "uplink max/mean emu", "model ECMP", "valid"),
        [(human_size(r["size"]), f"{r['emulated_cct_s'] * 1e3:.1f}", f"{r['ecmp_cct_s'] * 1e3:.1f}",
          f"{100 * r['ecmp_error']:+.1f} %", f"{r['ideal_cct_s'] * 1e3:.1f}",
          f"{100 * r['ideal_error']:+.1f} %", r["emulated_uplink_max_mean"],
          r["ecmp_uplink_max_mean"], "yes" if r["valid"] else "no (CPU saturated)")
         for r in rows],
        title=f"{args.collective} on {spec.name}: emulation vs flow model "
              f"({doc['runs'][0]['jobs'][args.collective]['sizes'][0]['ranks']} ranks, {args.qps} QP(s), "
              f"links {spec.host_rate_mbps:g} Mbit/s)"))
    print(f"\nresults: {doc['folder']}/results.json")
    return running.exit_code(doc)
