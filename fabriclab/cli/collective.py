"""`fabriclab collective`: run NCCL-style collectives as RoCEv2 traffic and report as nccl-tests does.

    fabriclab collective default --collective allreduce --sizes 64K,256K,1M --verify

brings the fabric up, runs the collective over every host NIC, prints a table per message size
(completion time mean/p50/p99, algbw, busbw and its fraction of the link rate, RNIC counters)
and writes results.json. The lab prompt's `collective` command takes the same options and runs
on the fabric that is already up.
"""

from __future__ import annotations

import argparse
import json
import sys

from fabriclab.errors import LabError
from fabriclab.table import format_table, progress_bar
from fabriclab.units import human_size, parse_sizes

DEFAULT_SIZES = "64K,256K,1M"


def add_collective_args(p):
    from fabriclab.traffic import schedules
    from fabriclab.traffic.agent import QP_METHODS
    from fabriclab.traffic.collective import PLACEMENTS
    from fabriclab.traffic.softroce import BACKENDS

    p.add_argument("--collective", "-c", default="allreduce", choices=schedules.COLLECTIVES)
    p.add_argument("--algorithm", help="allreduce: ring (default) or tree")
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   help=f"message sizes, nccl-tests semantics (default {DEFAULT_SIZES})")
    p.add_argument("--hosts", help="comma-separated hosts taking part (default: all)")
    p.add_argument("--nics", type=int, help="NICs per host used as ranks (default: all)")
    p.add_argument("--placement", choices=PLACEMENTS, default="order",
                   help="rank order: order, topology (grouped by leaf) or random")
    p.add_argument("--channels", type=int, default=1, help="independent rings/trees (default 1)")
    p.add_argument("--qps", type=int, default=1, help="QPs per connection and plane (QP scaling)")
    p.add_argument("--qp-method", choices=QP_METHODS, default="round-robin",
                   help="QP scaling: round-robin whole messages (default) or split each message")
    p.add_argument("--chunk", default="64K", help="NIC message size (default 64K)")
    p.add_argument("--iterations", "-n", type=int, default=5)
    p.add_argument("--warmup", "-w", type=int, default=1)
    p.add_argument("--verify", action="store_true",
                   help="carry real values and check every output against numpy")
    p.add_argument("--sport-mode", choices=("qp", "shared"), default="qp",
                   help="UDP source port per QP (qp) or one per NIC pair (shared)")
    p.add_argument("--spray", type=int, default=1, metavar="N",
                   help="vary the UDP source port per packet over N ports (packet spraying)")
    p.add_argument("--imbalance", type=float, default=4.0, help="alltoallv: max/min block ratio")
    p.add_argument("--root", type=int, default=0, help="gather: the receiving rank")
    p.add_argument("--cts", action="store_true", help="receiver-driven admission (clear-to-send)")
    p.add_argument("--cts-buffers", type=int, default=2,
                   help="channel buffers (of --chunk bytes) a receiver grants per connection")
    p.add_argument("--control-dscp", type=int, default=None,
                   help="DSCP of ACK/NAK/CTS packets (default: the data DSCP 26)")
    p.add_argument("--dcqcn", action="store_true", help="DCQCN at the senders (off by default)")
    p.add_argument("--dcqcn-param", action="append", default=[], metavar="NAME=VALUE",
                   help="a DCQCN NIC parameter, e.g. rpg_ai_rate=10 (repeatable)")
    p.add_argument("--ack-timeout", type=float, help="local ACK timeout, s (default from buffers)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="what moves the bytes: rxe (soft-RoCE, real RDMA verbs), udp (the lab's "
                        "RoCEv2 agents on raw sockets) or auto (default: rxe where doctor finds "
                        "rdma_rxe and the options need nothing udp-only)")


def spec_from_args(args):
    from fabriclab.traffic.collective import CollectiveSpec
    from fabriclab.units import parse_size

    dcqcn = None
    if args.dcqcn or args.dcqcn_param:
        dcqcn = {}
        for item in args.dcqcn_param:
            name, sep, value = item.partition("=")
            if not sep:
                raise LabError(f"--dcqcn-param {item!r}: expected NAME=VALUE")
            try:
                dcqcn[name.strip()] = float(value) if "." in value else int(value)
            except ValueError:
                raise LabError(f"--dcqcn-param {item!r}: {value!r} is not a number") from None
    spec = CollectiveSpec(
        collective=args.collective, sizes=tuple(parse_sizes(args.sizes)), algorithm=args.algorithm,
        hosts=tuple(h for h in args.hosts.split(",") if h) if args.hosts else None, nics=args.nics,
        placement=args.placement, channels=args.channels, qps=args.qps, qp_method=args.qp_method,
        chunk_bytes=parse_size(args.chunk), iterations=args.iterations, warmup=args.warmup,
        verify=args.verify, sport_mode=args.sport_mode, spray=args.spray, imbalance=args.imbalance, root=args.root,
        cts=args.cts, cts_buffers=args.cts_buffers, dcqcn=dcqcn, ack_timeout_s=args.ack_timeout,
        seed=args.seed, backend=args.backend)
    if args.control_dscp is not None:
        spec.control_dscp = args.control_dscp
    spec.check()
    return spec


def register(subparsers):
    p = subparsers.add_parser("collective", help="bring a fabric up, run a collective (nccl-tests "
                                                 "style), report, tear down")
    p.add_argument("spec", metavar="SPEC", help="spec file or shipped spec name")
    p.add_argument("--routing", default="ecmp", help="controller app (default: ecmp)")
    p.add_argument("--verbose", action="store_true")
    add_collective_args(p)
    p.add_argument("--out", help="results folder (default results/<time>-<spec>/)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_collective)


def cmd_collective(args):
    from fabriclab.results import document
    from fabriclab.lab.controller import check_app
    from fabriclab.lab.lab import Lab
    from fabriclab.topologies.spec import load_spec
    from fabriclab.traffic.collective import Launcher

    spec = load_spec(args.spec)
    check_app(args.routing)
    cspec = spec_from_args(args)
    lab = Lab(spec, routing=args.routing, verbose=args.verbose)
    table = args.format == "table"
    # Ranks, hosts and schedules are checked here, before anything is built.
    launcher = Launcher(lab, cspec, progress=progress_bar if table and sys.stdout.isatty() else None)
    with lab:
        if table:
            print(f"fabric {spec.name} up in {lab.timings['up_s']:.1f} s; {cspec.collective} over "
                  f"{len(launcher.ranks)} ranks, sizes {args.sizes} ...", flush=True)
        run = launcher.run()
        doc = collective_result(lab, run)
    path = document.write_result(doc, args.out)
    plot_result(doc, path.parent)
    if table:
        if sys.stdout.isatty():
            print()
        print(collective_table(doc))
        print(f"\nresults: {path}")
    else:
        print(json.dumps(doc, indent=1))
    ok = all(row["valid"] and (row["verify"] is None or row["verify"]["ok"]) for row in doc["sizes"])
    return 0 if ok else 1


def collective_result(lab, run):
    from dataclasses import asdict

    from fabriclab.results import document

    spec = run.spec
    header = document.run_header(lab, run.payload_bytes)
    header["mechanisms"] = {**header.get("mechanisms", {}), "roce": run.backend}
    return {
        **header,
        "kind": "collective",
        # udp: the lab's RNIC in Python, RoCEv2 through raw sockets; rdma_rxe: soft-RoCE verbs.
        "backend": run.backend,
        "workload": {**asdict(spec), "sizes": list(spec.sizes), "hosts": spec.hosts and list(spec.hosts)},
        "transport": {"payload_bytes": run.payload_bytes, "ack_timeout_s": run.ack_timeout_s,
                      "link_rate_mbps": run.link_rate_mbps},
        "ranks": [{"rank": r.rank, "host": r.host, "nic": r.nic, "addresses": [p.ip for p in r.ports]}
                  for r in run.ranks],
        "sizes": run.sizes,
        "rank_counters": {str(rank): final["totals"] for rank, final in sorted(run.finals.items())},
        "qps": [qp for rank, final in sorted(run.finals.items()) for qp in
                [{**q, "rank": rank} for q in final["qps"]]],
        "queues": run.queues,
        "valid": all(row["valid"] for row in run.sizes),
        "elapsed_s": round(run.elapsed_s, 3),
    }


def plot_result(doc, folder):
    """busbw against message size (with the NIC rate), and each size's CCT distribution."""
    from fabriclab.results import plots

    rows = doc["sizes"]
    w = doc["workload"]
    name = f"{w['collective']}/{rows[0]['algorithm']} over {rows[0]['ranks']} ranks on {doc['fabric']['name']}"
    plots.lines(folder / "busbw.png", name, [r["size"] for r in rows],
                {"busbw": [r["busbw_mbps"] for r in rows], "algbw": [r["algbw_mbps"] for r in rows]},
                "message size (bytes)", "Mbit/s",
                reference=(rows[0]["nic_rate_mbps"], "NIC rate"))
    plots.cdfs(folder / "cct.png", f"{name}: completion time per iteration",
               {human_size(r["size"]): [t * 1e3 for t in r["time_s"]["all"]] for r in rows},
               "CCT (ms)")


def collective_table(doc):
    rows = []
    for row in doc["sizes"]:
        t, c = row["time_s"], row["counters"]
        verify = "-" if row["verify"] is None else ("ok" if row["verify"]["ok"] else "FAILED")
        rows.append((human_size(row["size"]), f"{t['mean'] * 1e3:.1f}", f"{t['p50'] * 1e3:.1f}",
                     f"{t['p99'] * 1e3:.1f}", f"{row['algbw_mbps']:.2f}", f"{row['busbw_mbps']:.2f}",
                     f"{100 * row['busbw_fraction_of_nic']:.0f}",
                     row["balance"]["up"].get("max_mean_ratio"),
                     c.get("out_of_sequence", "-"), c.get("retransmitted_packets", c.get("retries", "-")),
                     c.get("local_ack_timeout_err", "-"), c.get("cnp_sent", "-"),
                     verify + ("" if row["valid"] else " (CPU SATURATED)")))
    w = doc["workload"]
    first = doc["sizes"][0]
    scale = doc["scale"]
    title = (f"{w['collective']}/{first['algorithm']} over {first['ranks']} ranks on {doc['fabric']['name']} "
             f"({doc['routing']}), backend {doc.get('backend', 'udp')}, {w['channels']} channel(s), "
             f"{w['qps']} QP(s) per connection "
             f"({w['qp_method']}), links {scale['host_rate_mbps']:g} Mbit/s"
             + (f" (time scale x{scale['time_scale']:.0f})" if scale["time_scale"] else ""))
    return format_table(("size", "CCT mean ms", "p50 ms", "p99 ms", "algbw Mbit/s", "busbw Mbit/s",
                         "busbw % NIC", "uplink max/mean", "OOS",
                         # rdma_rxe counts the requester's go-back-N restarts, not packets
                         "retries" if doc.get("backend") == "rdma_rxe" else "retrans",
                         "timeouts", "CNPs", "verify"), rows, title=title)


def prompt_parser():
    """The same options for the lab prompt's `collective` command (no spec: the fabric is up)."""
    p = argparse.ArgumentParser(prog="collective", add_help=True, exit_on_error=False)
    add_collective_args(p)
    return p
