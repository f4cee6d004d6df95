"""`fabriclab benchmark`: bring-up and teardown times, throughput ceilings, the queue model's cost."""

from __future__ import annotations

import json

from fabriclab.errors import LabError
from fabriclab.table import format_table
from fabriclab.topologies.spec import load_spec
from fabriclab.units import human_size
from fabriclab.workflows import benchmark


BRINGUP_COLUMNS = ("fabric", "switches", "hosts", "links", "build s", "then programmed s", "teardown s")


def register(subparsers):
    p = subparsers.add_parser("benchmark", help="bring-up/teardown times and single-pair throughput")
    p.add_argument("--sizes", default=None,
                   help=f"fabrics as LEAVESxSPINESxHOSTS_PER_LEAF, comma separated (default {benchmark.DEFAULT_SIZES}; "
                        "'' for none; with --inventory: none unless given, each split by leaf)")
    p.add_argument("--specs", default="",
                   help="also time the bring-up of these specs (names or paths, comma separated), "
                        "e.g. meta_dc")
    p.add_argument("--seconds", type=float, default=5.0, help="seconds per throughput measurement")
    p.add_argument("--skip-pair", action="store_true", help="leave out the host-pair throughput")
    p.add_argument("--skip-collective", action="store_true", help="leave out the AllReduce busbw")
    p.add_argument("--skip-queues", action="store_true",
                   help="leave out the queue model's overhead (host pair, model off vs on)")
    p.add_argument("--inventory", metavar="FILE",
                   help="measure instead what crossing machines costs: a small fabric on this machine, "
                        "then split by leaf over this ansible inventory's machines (docs/cluster.md)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=run_benchmark)


def run_benchmark(args):
    if args.inventory is not None:
        return run_crossing(args)
    text = benchmark.DEFAULT_SIZES if args.sizes is None else args.sizes
    sizes = benchmark.parse_fabric_sizes(text) if text else []
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
    print(format_table(BRINGUP_COLUMNS, [tuple(r.values()) for r in bring], title="Bring-up and teardown"))
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


def run_crossing(args):
    """`benchmark --inventory FILE`: one machine against the fabric split by leaf over the
    inventory's machines."""
    from fabriclab.lab.cluster import machines_from_inventory

    sizes = benchmark.parse_fabric_sizes(args.sizes) if args.sizes else []
    machines = machines_from_inventory(args.inventory)
    few = [f"{leaves}x{spines}x{hosts}" for leaves, spines, hosts in sizes if leaves < len(machines)]
    if few:
        raise LabError(f"--sizes {few[0]}: a split by leaf over {len(machines)} machines needs at least "
                       f"{len(machines)} leaves")
    result = benchmark.bench_crossing(machines)
    bring = benchmark.bench_bringup(benchmark.size_specs(sizes), machines=machines) if sizes else []
    if args.format == "json":
        print(json.dumps({**result, "split_bringup": bring}, indent=1))
        return 0
    print(format_table(crossing_columns(result), crossing_rows(result),
                       title=f"Crossing machines: {result['spec']}, every link {result['rate_mbps']:g} Mbit/s, "
                             f"{result['pings']} pings per pair, ring AllReduce of "
                             f"{human_size(result['allreduce_bytes'])}"))
    if bring:
        print()
        print(format_table(BRINGUP_COLUMNS, [tuple(r.values()) for r in bring],
                           title=f"Bring-up and teardown, split by leaf over {len(machines)} machines"))
    return 0


def crossing_columns(result):
    local, across = ("-".join(result[k]) for k in ("local_pair", "across_pair"))
    return ("placement", "bring-up s", "teardown s", f"RTT {local} ms (same machine)",
            f"RTT {across} ms (across)", "busbw Mbit/s")


def crossing_rows(result):
    def rtt(row, pair):
        if row[f"{pair}_avg_ms"] is None:
            return f"no reply ({row[f'{pair}_received']} of {result['pings']})"
        return f"{row[f'{pair}_avg_ms']:.2f} ({row[f'{pair}_min_ms']:.2f}-{row[f'{pair}_max_ms']:.2f})"
    return [(r["placement"], r["bringup_s"], r["teardown_s"], rtt(r, "local"), rtt(r, "across"),
             r["busbw_mbps"]) for r in result["rows"]]
