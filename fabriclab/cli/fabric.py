"""The lab's verbs: check, specs, up (interactive), run (scripted), demo (the README's experiment)."""

from __future__ import annotations

import json
import os
import re
import sys

from fabriclab.lab.controller import check_app
from fabriclab.errors import LabError
from fabriclab.table import format_table, progress_bar
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec, shipped_specs

DEFAULT_SPEC = "default"
_FAULT_RE = re.compile(r"^([A-Za-z0-9]+)-([A-Za-z0-9]+)(?:#(\d+))?@(\d+(?:\.\d*)?|\.\d+)$")


def parse_fault(text, up):
    """'l1-s1@2.5' or 'l1-s1#2@2.5' (parallel member 2) -> (seconds, node1, node2, member, up)."""
    m = _FAULT_RE.match(text)
    if not m:
        raise LabError(f"bad link event {text!r}: expected NODE-NODE@SECONDS, e.g. l1-s1@2 "
                       f"(or l1-s1#2@2 for the second parallel link)")
    member = int(m.group(3)) - 1 if m.group(3) else None
    if member is not None and member < 0:
        raise LabError(f"bad link event {text!r}: parallel links are numbered from 1")
    return float(m.group(4)), m.group(1), m.group(2), member, up


def register(subparsers):
    p = subparsers.add_parser("check", help="validate spec files offline (nothing is built)")
    p.add_argument("specs", nargs="+", metavar="SPEC", help="spec file or shipped spec name")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_check)

    p = subparsers.add_parser("specs", help="list the specs shipped in topologies/")
    p.set_defaults(func=cmd_specs)

    p = subparsers.add_parser("up", help="bring a fabric up and open the lab prompt")
    _fabric_args(p)
    p.add_argument("--script", metavar="FILE",
                   help="run the prompt commands in FILE first (then read the terminal, until EOF)")
    p.set_defaults(func=cmd_up)

    p = subparsers.add_parser("run", help="bring a fabric up, run all-pairs RoCEv2 traffic, "
                                          "report, tear down")
    _fabric_args(p)
    _traffic_args(p)
    p.set_defaults(func=cmd_run)

    p = subparsers.add_parser("demo", help="the default experiment: default fabric, ECMP, all-pairs "
                                           "traffic, uplink balance table")
    p.add_argument("--spec", default=DEFAULT_SPEC, help="spec file or shipped name (default: default)")
    p.add_argument("--routing", default="ecmp")
    p.add_argument("--verbose", action="store_true")
    _traffic_args(p)
    p.set_defaults(func=cmd_run, faults=None)


def _fabric_args(p):
    p.add_argument("spec", metavar="SPEC", help="spec file or shipped spec name (see `fabriclab specs`)")
    p.add_argument("--routing", default="ecmp", help="controller app (default: ecmp)")
    p.add_argument("--verbose", action="store_true", help="show Mininet's and the lab's progress")


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
    p.add_argument("--out", help="results folder (default results/<time>-<spec>/)")
    p.add_argument("--format", choices=("table", "json"), default="table")


def cmd_check(args):
    docs = []
    for ref in args.specs:
        fabric = Fabric(load_spec(ref))    # SpecError (one line) on any problem
        docs.append(fabric.summary())
    if args.format == "json":
        print(json.dumps(docs, indent=1))
    else:
        rows = [(d["name"], d["kind"], d["planes"], d["switches"], d["hosts"], d["host_ports"],
                 d["links"], d["oversubscription"], d["time_scale"]) for d in docs]
        print(format_table(("spec", "kind", "planes", "switches", "hosts", "host ports", "links",
                            "oversub", "time scale"), rows))
        print("ok: " + ", ".join(d["name"] for d in docs))
    return 0


def cmd_specs(_args):
    rows = []
    for name in shipped_specs():
        spec = load_spec(name)
        s = Fabric(spec).summary()
        rows.append((name, spec.kind, s["switches"], s["hosts"], spec.description.split("\n")[0][:70]))
    print(format_table(("spec", "kind", "switches", "hosts", "description"), rows))
    return 0


def cmd_up(args):
    from fabriclab.lab.lab import Lab
    from fabriclab.cli.prompt import run_prompt

    spec = load_spec(args.spec)
    check_app(args.routing)
    if args.script and not os.path.isfile(args.script):
        raise LabError(f"no script file {args.script!r}")
    lab = Lab(spec, routing=args.routing, verbose=args.verbose)
    print(f"bringing up {spec.name} with {args.routing} ...", flush=True)
    with lab:
        print(f"fabric up in {lab.timings['up_s']:.1f} s: {len(lab.fabric.switches)} switches, "
              f"{len(lab.fabric.hosts)} hosts, datapath {lab.datapath}. Type `help` for lab commands.")
        run_prompt(lab, script=args.script)
    print("fabric torn down")
    return 0


def cmd_run(args):
    from fabriclab.results import document
    from fabriclab.lab.lab import Lab
    from fabriclab.traffic.allpairs import all_pairs_plan
    from fabriclab.traffic.launcher import run_traffic

    spec = load_spec(args.spec)
    check_app(args.routing)
    faults = [parse_fault(t, False) for t in args.link_down] + [parse_fault(t, True) for t in args.link_up]
    if args.duration <= 0:
        raise LabError(f"--duration must be > 0 s, got {args.duration}")
    lab = Lab(spec, routing=args.routing, verbose=args.verbose)
    plan = all_pairs_plan(lab.fabric, load=args.load, flows_per_pair=args.flows_per_pair)
    for at, a, b, member, _up in faults:
        lab.resolve_link(a, b, member)    # unknown nodes or links fail before anything is built
        if at >= args.duration:
            raise LabError(f"link event at {at} s is after the traffic ends ({args.duration} s)")
    workload = {"kind": "all-pairs", "duration_s": args.duration, "load": args.load,
                "flows_per_pair": args.flows_per_pair, "sport_mode": args.sport_mode,
                "faults": [{"at_s": at, "link": f"{a}-{b}", "member": member, "up": up}
                           for at, a, b, member, up in faults]}
    table = args.format == "table"
    if table:
        print(f"bringing up {spec.name} ({len(lab.fabric.switches)} switches, "
              f"{len(lab.fabric.hosts)} hosts) with {args.routing} ...", flush=True)
    with lab:
        if table:
            print(f"fabric up in {lab.timings['up_s']:.1f} s (datapath {lab.datapath}); "
                  f"{sum(len(f) for f in plan.values())} RoCEv2 flows for {args.duration:g} s ...",
                  flush=True)
        actions = [(at, _link_action(lab, a, b, member, up)) for at, a, b, member, up in faults]
        run = run_traffic(lab, plan, duration_s=args.duration, sport_mode=args.sport_mode,
                          actions=actions, progress=progress_bar if table and sys.stdout.isatty() else None)
        doc = document.build_result(lab, workload, run)
    doc["timings_s"] = {k: round(v, 3) for k, v in lab.timings.items()}
    path = document.write_result(doc, args.out)
    if table:
        print()
        print(document.uplink_table(doc["links"]))
        print()
        print(document.summary_table(doc))
        print(f"\nresults: {path}\nfabric torn down in {lab.timings['down_s']:.1f} s")
    else:
        print(json.dumps(doc, indent=1))
    return 0 if doc["valid"] else 1


def _link_action(lab, a, b, member, up):
    def action():
        links = lab.set_link(a, b, up, member)
        return {"links": [link.label for link in links], "up": up}
    action.description = f"link {a}-{b}{'' if member is None else f'#{member + 1}'} {'up' if up else 'down'}"
    return action
