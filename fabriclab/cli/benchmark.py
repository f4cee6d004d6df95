"""`fabriclab benchmark`: bring-up and teardown times, throughput ceilings, the queue model's cost."""

from __future__ import annotations

import json

from fabriclab.errors import LabError
from fabriclab.table import format_table
from fabriclab.topologies.spec import load_spec
from fabriclab.units import human_size
from fabriclab.workflows import benchmark


def register(subparsers):
    p = subparsers.add_parser("benchmark", help="bring-up/teardown times and single-pair throughput")
    p.add_argument("--sizes", default=benchmark.DEFAULT_SIZES,
                   help=f"fabrics as LEAVESxSPINESxHOSTS_PER_LEAF, comma separated (default {benchmark.DEFAULT_SIZES}; "
                        "'' for none)")
    p.add_argument("--specs", default="",
                   help="also time the bring-up of these specs (names or paths, comma separated), "
                        "e.g. meta_dc")
    p.add_argument("--seconds", type=float, default=5.0, help="seconds per throughput measurement")
    p.add_argument("--skip-pair", action="store_true", help="leave out the host-pair throughput")
    p.add_argument("--skip-collective", action="store_true", help="leave out the AllReduce busbw")
    p.add_argument("--skip-queues", action="store_true",
                   help="leave out the queue model's overhead (host pair, model off vs on)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=run_benchmark)


def run_benchmark(args):
    sizes = benchmark.parse_fabric_sizes(args.sizes) if args.sizes else []
    specs = [load_spec(ref.strip()) for ref in args.specs.split(",") if ref.strip()]
    if args.seconds <= 0:
        raise LabError(f"--seconds must be > 0, got {args.seconds}")
    bring = benchmark.bench_bringup(benchmark.size_specs(sizes) + specs)
    pair = [] if args.skip_pair else benchmark.bench_pair(args.seconds)
    coll = [] if args.skip_collective else benchmark.bench_collective()
    rc_pair = [] if args.skip_collective else [benchmark.bench_collective_pair()]
    queues = [] if args.skip_queues else benchmark.bench_queue_overhead(args.seconds)
    if args.format == "json":
        print(json.dumps({"bringup": bring, "pair": pair, "rc_pair": rc_pair, "allreduce": coll,
                          "queue_model": queues}, indent=1))
        return 0
    print(format_table(("fabric", "switches", "hosts", "links", "build s", "then programmed s",
                        "teardown s"),
                       [tuple(r.values()) for r in bring], title="Bring-up and teardown"))
    if pair:
        print()
        print(format_table(("tool", "offered Mbit/s", "delivered Mbit/s", "loss", "machine busy",
                            "OVS thread busy"),
                           [tuple(r.values()) for r in pair],
                           title="One host pair, leaf-spine-leaf (3 userspace OVS switches)"))
    if rc_pair:
        print()
        print(format_table(("sender", "line Mbit/s", "delivered Mbit/s", "packets/s", "retransmitted",
                            "sender core busy", "Mbit/s per sender core", "machine busy",
                            "OVS thread busy"),
                           [tuple(r.values()) for r in rc_pair],
                           title="Collective agent, one host pair (RC with ACKs, links below the "
                                 "switch ceiling)"))
    if coll:
        print()
        print(format_table(("size", "ranks", "CCT ms", "ideal ms", "busbw Mbit/s", "busbw / NIC",
                            "machine busy"),
                           [(human_size(r["size"]), *list(r.values())[1:]) for r in coll],
                           title="Ring AllReduce on the idle default fabric (20 Mbit/s links)"))
    if queues:
        print()
        print(format_table(("queue model", "tool", "offered Mbit/s", "delivered Mbit/s", "loss",
                            "machine busy", "OVS thread busy"), [tuple(r.values()) for r in queues],
                           title="Queue model overhead: one host pair, leaf-spine-leaf, model off vs on"))
    return 0
