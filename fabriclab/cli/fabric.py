"""The lab's verbs: check, specs, up (interactive), run (scripted), demo (the README's experiment)."""

from __future__ import annotations

import json
import os
import sys

from fabriclab.apps import DEFAULT_ROUTING
from fabriclab.cli import running
from fabriclab.errors import LabError
from fabriclab.lab.controller import check_app
from fabriclab.table import format_table
from fabriclab.topologies.fabric import Fabric, beyond_one_machine, summary
from fabriclab.topologies.spec import load_spec, shipped_specs
from fabriclab.topologies.split import Split, parse_split
from fabriclab.view import DEFAULT_ADDRESS, METRICS_ADDRESS

DEFAULT_SPEC = "default"


def register(subparsers):
    p = subparsers.add_parser("check", help="validate spec files offline (nothing is built)")
    p.add_argument("specs", nargs="+", metavar="SPEC", help="spec file or shipped spec name")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--split", metavar="BY:N|FILE",
                   help="also show the fabric spread over N machines by leaf, plane or pod (leaf:2), or as "
                        "an explicit split file: what each machine forwards and which cables cross")
    p.set_defaults(func=cmd_check)

    p = subparsers.add_parser("specs", help="list the specs shipped in topologies/")
    p.set_defaults(func=cmd_specs)

    p = subparsers.add_parser("up", help="bring a fabric up and open the lab prompt")
    _fabric_args(p)
    p.add_argument("--verbose", action="store_true", help="show Mininet's and the lab's progress")
    p.add_argument("--script", metavar="FILE",
                   help="run the prompt commands in FILE first (then read the terminal, until EOF)")
    p.add_argument("--web", nargs="?", const=DEFAULT_ADDRESS, metavar="ADDR:PORT",
                   help=f"serve the live fabric view (default {DEFAULT_ADDRESS}; port 0: any free one); "
                        "the URL it prints carries the page's token")
    p.add_argument("--metrics", nargs="?", const=METRICS_ADDRESS, metavar="ADDR:PORT",
                   help=f"serve Prometheus metrics at /metrics (default {METRICS_ADDRESS}): ports' bytes, "
                        "packets and drops, the queue model's queues, marks and pauses, the prompt's jobs")
    p.add_argument("--split", metavar="BY:N|FILE",
                   help="spread the fabric over the machines of --inventory (leaf:2, plane:2, pod:2 or a "
                        "split file; see `check --split`): one fabric, cables between machines as tunnels")
    p.add_argument("--inventory", metavar="FILE",
                   help="the machines for --split (an ansible inventory; this machine the one with "
                        "ansible_connection=local, each with fabriclab_private_ip)")
    p.set_defaults(func=cmd_up)

    p = subparsers.add_parser("run", help="bring a fabric up, run all-pairs RoCEv2 traffic, "
                                          "report, tear down")
    _fabric_args(p)
    _traffic_args(p)
    p.set_defaults(func=cmd_run)

    p = subparsers.add_parser("demo", help="the default experiment: default fabric, ECMP, all-pairs "
                                           "traffic, uplink balance table")
    p.add_argument("--spec", default=DEFAULT_SPEC, help="spec file or shipped name (default: default)")
    p.add_argument("--routing", default=DEFAULT_ROUTING, help=f"controller app (default: {DEFAULT_ROUTING})")
    _traffic_args(p)
    p.set_defaults(func=cmd_run)


def _fabric_args(p):
    p.add_argument("spec", metavar="SPEC", help="spec file or shipped spec name (see `fabriclab specs`)")
    p.add_argument("--routing", default=DEFAULT_ROUTING, help=f"controller app (default: {DEFAULT_ROUTING})")


def _traffic_args(p):
    p.add_argument("--duration", type=float, default=5.0, help="seconds of traffic (default 5)")
    # 0.5 keeps the default fabric well inside this 2-core machine's software-switch budget.
    p.add_argument("--load", type=float, default=0.5,
                   help="offered load per host port, fraction of its link rate (default 0.5)")
    p.add_argument("--flows-per-pair", type=int, default=1, help="flows (QPs) per host pair")
    p.add_argument("--sport-mode", choices=("qp", "shared"), default="qp",
                   help="UDP source port per QP (qp) or one per NIC pair (shared)")
    p.add_argument("--link-down", action="append", default=[], metavar="A-B@T",
                   help="take a link down T seconds into the traffic (repeatable)")
    p.add_argument("--link-up", action="append", default=[], metavar="A-B@T",
                   help="bring a link up T seconds into the traffic (repeatable)")
    p.add_argument("--sample-ms", type=float, default=5.0, help="port sampling interval (default 5 ms)")
    p.add_argument("--seed", type=int, default=0,
                   help="the run's hash seed: with each switch's dpid, its hash basis (default 0; a "
                        "routing that sets seed= keeps its own)")
    # perftest: ib_write_bw's text, a block per flow (results/perftest.py)
    running.add_output_args(p, formats=("table", "json", "perftest"))


def cmd_check(args):
    specs = [load_spec(ref) for ref in args.specs]    # SpecError (one line) on any problem
    docs = [summary(spec) for spec in specs]          # counted, not built: a spec of any size answers at once
    if args.split is not None:
        split = parse_split(args.split)
        for spec, doc in zip(specs, docs):
            doc["split"] = Split(Fabric(spec), split).summary()
    if args.format == "json":
        print(json.dumps(docs, indent=1))
    else:
        rows = [(d["name"], d["kind"], d["cabling"], d["planes"], d["switches"], d["hosts"],
                 d["host_ports"], d["links"], d["oversubscription"], d.get("cross_zone_oversubscription", "-"),
                 d["time_scale"]) for d in docs]
        print(format_table(("spec", "kind", "cabling", "planes", "switches", "hosts", "host ports",
                            "links", "oversub", "cross-zone", "time scale"), rows))
        for d in docs:
            if "split" in d:
                print(split_table(d["name"], d["split"]))
        print("ok: " + ", ".join(d["name"] for d in docs))
    for spec in specs:
        too_big = beyond_one_machine(spec)
        if too_big:
            print(f"note: {too_big}", file=sys.stderr)
    return 0


def split_table(name, split):
    rows = [(m["machine"], m["switches"], m["hosts"], m["switch_ports"], f"{m['forwarding_mbps']:g}",
             m["boundary_links"], f"{m['boundary_mbps']:g}") for m in split["machines"]]
    title = (f"{name} split by {split['by']} over {len(split['machines'])} machines: {split['boundary_links']} "
             f"cables cross ({split['boundary_host_links']} of them host cables), {split['boundary_mbps']:g} Mbit/s")
    return format_table(("machine", "switches", "hosts", "switch ports", "forwards Mbit/s",
                         "crossing cables", "crossing Mbit/s"), rows, title=title)


def cmd_specs(_args):
    rows = []
    for name in shipped_specs():
        spec = load_spec(name)
        s = Fabric(spec).summary()
        rows.append((name, spec.kind, s["switches"], s["hosts"], spec.description.split("\n")[0][:70]))
    print(format_table(("spec", "kind", "switches", "hosts", "description"), rows))
    return 0


def cmd_up(args):
    from fabriclab.cli.prompt import run_prompt
    from fabriclab.lab.lab import Lab
    from fabriclab.view.server import WebServer
    from fabriclab.workflows.session import Session

    spec = load_spec(args.spec)
    routing = check_app(args.routing)
    if args.script and not os.path.isfile(args.script):
        raise LabError(f"no script file {args.script!r}")
    lab = Lab(spec, routing=routing, verbose=args.verbose, **cluster_args(args))
    session = Session(lab)
    if args.web:                      # the address is taken before anything is built
        session.web = WebServer(lab, session, args.web).bind()
    if args.metrics:
        from fabriclab.view.metrics import MetricsServer

        try:
            session.metrics = MetricsServer(lab, session, args.metrics).bind()
        except BaseException:
            session.close()
            raise
    where = f" over {', '.join(m.name for m in lab.machines)}" if lab.machines else ""
    print(f"bringing up {spec.name} with {args.routing}{where} ...", flush=True)
    try:
        with lab:
            print(f"fabric up in {lab.timings['up_s']:.1f} s: {len(lab.fabric.switches)} switches, "
                  f"{len(lab.fabric.hosts)} hosts, datapath {lab.datapath}. Type `help` for lab commands.")
            if lab.split is not None:
                print(split_table(spec.name, lab.split.summary()))
            if session.web:
                print(session.web.serve().banner(), flush=True)
            if session.metrics:
                print(session.metrics.serve().banner(), flush=True)
            try:
                run_prompt(lab, script=args.script, session=session)
            finally:
                session.close()
    finally:
        session.close()               # a fabric that failed to come up: free the address
    print("fabric torn down")
    return 0


def cluster_args(args):
    """Lab's split and cluster from --split and --inventory (both or neither)."""
    if args.split is None and args.inventory is None:
        return {}
    if args.split is None or args.inventory is None:
        raise LabError("--split and --inventory go together: how to spread the fabric, and over which machines")
    from fabriclab.cluster.cluster import Cluster
    from fabriclab.cluster.machine import machines_from_inventory

    return {"split": parse_split(args.split), "cluster": Cluster(machines_from_inventory(args.inventory))}


def allpairs_plan(args, kind="run"):
    """The plan of `run` and `demo` (and the prompt's `traffic`): one all-pairs job."""
    from fabriclab.traffic.allpairs import AllPairsSpec
    from fabriclab.workflows.plan import Job, Metrics, link_events, single_run

    from fabriclab.apps import RoutingError

    spec = load_spec(args.spec)
    routing = check_app(args.routing)
    try:
        routing = routing.with_seed(getattr(args, "seed", 0))
    except RoutingError as exc:
        raise LabError(f"--seed: {exc}") from None
    workload = AllPairsSpec(duration_s=args.duration, load=args.load, flows_per_pair=args.flows_per_pair,
                            sport_mode=args.sport_mode)
    source = {"command": kind, "spec": args.spec, "routing": str(routing), "duration_s": args.duration,
              "load": args.load, "flows_per_pair": args.flows_per_pair, "sport_mode": args.sport_mode,
              "link_down": list(args.link_down), "link_up": list(args.link_up)}
    return single_run(spec.name, kind, spec, Job("traffic", workload), routing=routing,
                      faults=link_events(args.link_down, args.link_up),
                      metrics=Metrics(sample_ms=args.sample_ms, bin_ms=max(50.0, args.sample_ms)), source=source)


def cmd_run(args):

    plan = allpairs_plan(args, "demo" if args.command == "demo" else "run")
    heading = (f"bringing up {plan.spec.name} with {args.routing}; all-pairs RoCEv2 traffic for "
               f"{args.duration:g} s ...")
    from fabriclab.results import perftest

    return running.execute(plan, args, heading, {"table": allpairs_tables, "perftest": perftest.render}, bar=True)


def allpairs_tables(doc):
    from fabriclab.results import tables

    _run, _name, job = tables.job_of(doc, "all-pairs")
    return "\n" + tables.uplink_table(job["links"]) + "\n\n" + tables.allpairs_summary(doc)
