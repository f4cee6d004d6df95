"""`fabriclab benchmark`: bring-up and teardown times, throughput ceilings, the queue model's cost."""

from __future__ import annotations

import json

from fabriclab.errors import LabError
from fabriclab.table import format_table
from fabriclab.topologies.spec import load_spec
from fabriclab.units import human_size
from fabriclab.workflows import benchmark, pfcbench, runphases


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
    p.add_argument("--skip-forwarding", action="store_true",
                   help="leave out the forwarding cost (packets per CPU-second of the switches' forwarding thread)")
    p.add_argument("--inventory", metavar="FILE",
                   help="measure instead what crossing machines costs: a small fabric on this machine, "
                        "then split by leaf over this ansible inventory's machines (docs/cluster.md)")
    p.add_argument("--pfc-reaction", metavar="EXPERIMENTS", nargs="?", const=",".join(pfcbench.DEFAULT_EXPERIMENTS),
                   help="instead: run these experiments (default " + ",".join(pfcbench.DEFAULT_EXPERIMENTS) +
                        ") --draws times each and tabulate the PFC agent's reaction and lossless drops per run")
    p.add_argument("--draws", type=int, default=10, help="with --pfc-reaction: runs of each experiment (default 10)")
    p.add_argument("--quick", action="store_true", help="with --pfc-reaction: the experiments' quick forms")
    p.add_argument("--out", default=None, help="with --pfc-reaction: where the runs' folders go "
                                               "(default results/<time>-pfc-reaction)")
    p.add_argument("--from", dest="from_folders", metavar="DIR", nargs="+",
                   help="instead: tabulate the PFC reaction of results folders already written (experiments, "
                        "catalogues)")
    p.add_argument("--run-phases", action="store_true",
                   help="with --from: where the wall time of those folders' runs went (bring-up, switching the "
                        "app, draining, starting the jobs, the traffic, teardown), per experiment")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=run_benchmark)


def run_pfc_reaction(args):
    from fabriclab.workflows.experiments import EXPERIMENTS

    if args.from_folders:
        rows = pfcbench.read_folders(args.from_folders)
    else:
        names = [n.strip() for n in args.pfc_reaction.split(",") if n.strip()]
        unknown = [n for n in names if n not in EXPERIMENTS]
        if unknown or not names:
            raise LabError(f"--pfc-reaction: unknown experiment {unknown[0][:40]!r}" if unknown
                           else "--pfc-reaction: name at least one experiment")
        if not 1 <= args.draws <= 100:
            raise LabError(f"--draws must be 1..100, got {args.draws}")
        from fabriclab.results import document

        out = args.out or document.default_folder("pfc-reaction")
        rows = pfcbench.run_draws(names, args.draws, args.quick, out)
    totals = pfcbench.summary(rows)
    if args.format == "json":
        print(json.dumps({"runs": rows, "summary": totals}, indent=1))
        return 0
    print(format_table(pfcbench.COLUMNS, pfcbench.table_rows(rows),
                       title="PFC reaction: XOFF to gate closed, wall time, per run"))
    print()
    print(format_table(("experiment", "draws", "runs", "pauses", "worst p99 ms", "worst max ms", "lossless drops"),
                       [(name, s["draws"], s["runs"], s["pauses"], f"{s['worst_p99_ms']:.3f}",
                         f"{s['worst_max_ms']:.3f}", s["lossless_drops"]) for name, s in totals.items()],
                       title="Over all draws"))
    return 0


def run_phases(args):
    if not args.from_folders:
        raise LabError("--run-phases reads results folders: give them with --from DIR...")
    totals = runphases.read_folders(args.from_folders)
    if args.format == "json":
        print(json.dumps(totals, indent=1))
        return 0
    print(format_table(runphases.COLUMNS, runphases.table_rows(totals),
                       title="Wall time by phase, summed over every results.json (seconds)"))
    return 0


def run_benchmark(args):
    if args.run_phases:
        return run_phases(args)
    if args.pfc_reaction is not None or args.from_folders:
        return run_pfc_reaction(args)
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
    forwarding = [] if args.skip_forwarding else benchmark.bench_forwarding(args.seconds)
    if args.format == "json":
        print(json.dumps({"bringup": bring, "pair": pair, "rc_pair": rc_pair, "allreduce": coll,
                          "queue_model": queues, "forwarding": forwarding}, indent=1))
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
    if forwarding:
        print()
        print(format_table(("fabric", "load", "delivered Mbit/s", "switch hops/s", "machine busy",
                            "OVS thread busy", "hops per OVS CPU-s"), [tuple(r.values()) for r in forwarding],
                           title="Forwarding cost: packets forwarded per switch, per CPU-second of OVS's "
                                 "forwarding thread"))
    return 0


def run_crossing(args):
    """`benchmark --inventory FILE`: one machine against the fabric split by leaf over the
    inventory's machines."""
    from fabriclab.cluster.machine import machines_from_inventory

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
