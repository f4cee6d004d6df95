"""`fabriclab replay TRACE [TRACE ...]`: a real job's collectives, in order, replayed on a fabric.

    fabriclab replay examples/traces/ddp4/kineto-rank0.json --spec default
    fabriclab replay examples/traces/ddp4/chakra-rank0.json --ranks 4 --spec default
    fabriclab replay A.json B.json --spec default          # two jobs at once, each on its own hosts

Each trace (a PyTorch profiler Kineto JSON or a Chakra ET JSON, jobs/traces.py) becomes a
replay job of one run (jobs/replay.py): its ranks on hosts in `--placement` order (the first
trace's ranks on the first hosts, the next trace's on the hosts after them, or as `--hosts` lists them),
its collectives run in order with their compute gaps. The table gives per collective the trace's
size and time beside the lab's CCT and that CCT in real time, then the job's communication time
both ways. `--check` reads the traces and checks the plan against the fabric without building it.
"""

from __future__ import annotations

import pathlib

from fabriclab.apps import DEFAULT_ROUTING
from fabriclab.cli import running
from fabriclab.errors import LabError


def register(subparsers):
    from fabriclab.traffic.softroce import BACKENDS
    from fabriclab.jobs.traces import FORMATS

    p = subparsers.add_parser("replay", help="replay the collectives of real training traces (Kineto or "
                                             "Chakra JSON) on a fabric, CCT against the trace's")
    p.add_argument("traces", nargs="+", metavar="TRACE", help="a trace file; several run as jobs at once")
    p.add_argument("--spec", default="default", help="spec file or shipped spec name (default: default)")
    p.add_argument("--routing", default=DEFAULT_ROUTING, help=f"controller app (default: {DEFAULT_ROUTING})")
    p.add_argument("--trace-format", choices=FORMATS, help="the traces' format (default: detected)")
    p.add_argument("--ranks", type=int, help="a Chakra trace's rank count (Chakra does not record it)")
    p.add_argument("--hosts", help="comma-separated hosts for the traces' ranks, in order (default: the "
                                   "fabric's hosts in --placement order)")
    p.add_argument("--placement", choices=("order", "topology", "random"), default="order",
                   help="the order hosts are handed out in without --hosts: order, topology (grouped by "
                        "leaf) or random (seeded by --seed), as the collective verb places ranks")
    p.add_argument("--size-scale", type=float, default=1.0,
                   help="divide every message size by this (default 1: the trace's sizes)")
    p.add_argument("--gap-scale", type=float,
                   help="multiply every compute gap by this (default: the spec's time scale / --size-scale)")
    p.add_argument("--max-gap", type=float, default=1.0, metavar="S",
                   help="cap on one compute gap in the lab, s (default 1)")
    p.add_argument("--verify", action="store_true", help="carry real values and check every output")
    p.add_argument("--qps", type=int, default=1, help="QPs per connection (default 1)")
    p.add_argument("--chunk", default="64K", help="NIC message size (default 64K)")
    p.add_argument("--backend", choices=BACKENDS, default="udp",
                   help="udp (the lab's RoCEv2 agents, default), rxe (soft-RoCE) or auto")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--sample-ms", type=float, default=5.0, help="port sampling interval (default 5 ms)")
    p.add_argument("--check", action="store_true", help="read the traces and check the plan; build nothing")
    running.add_output_args(p)
    p.set_defaults(func=cmd_replay)


def placed_hosts(fabric, placement, seed):
    """Every host of the fabric in the order the collective engine places ranks (one NIC each)."""
    from fabriclab.traffic.collective import CollectiveSpec, place_ranks

    return [r.host for r in place_ranks(fabric, CollectiveSpec(nics=1, placement=placement, seed=seed))]


def replay_specs(args, fabric_hosts):
    """A ReplaySpec per trace, each on its own hosts (`fabric_hosts` in the order to hand out)."""
    from fabriclab.units import parse_size
    from fabriclab.jobs import traces
    from fabriclab.jobs.replay import ReplaySpec

    loaded = [traces.load(path, args.trace_format, args.ranks) for path in args.traces]
    wanted = sum(t.world for t in loaded)
    if args.hosts:
        hosts = [h for h in args.hosts.split(",") if h]
        if len(hosts) != wanted:
            raise LabError(f"--hosts lists {len(hosts)} hosts; the traces have {wanted} ranks in all")
    else:
        hosts = list(fabric_hosts)
        if len(hosts) < wanted:
            raise LabError(f"the traces have {wanted} ranks in all; the fabric has {len(hosts)} hosts")
    specs, taken = [], 0
    for trace in loaded:
        spec = ReplaySpec(trace, hosts=tuple(hosts[taken:taken + trace.world]), size_scale=args.size_scale,
                          gap_scale=args.gap_scale, max_gap_s=args.max_gap, verify=args.verify, qps=args.qps,
                          chunk_bytes=parse_size(args.chunk), backend=args.backend, seed=args.seed)
        spec.check()
        specs.append(spec)
        taken += trace.world
    return specs


def job_names(paths):
    """A job name per trace from its folder and file name (ddp4-kineto-rank0), made unique."""
    from fabriclab.workflows.plan import slug

    names = []
    for path in paths:
        p = pathlib.Path(path)
        stem = pathlib.Path(p.stem).stem if p.suffix == ".gz" else p.stem      # rank0.json.gz: rank0
        base = slug(f"{p.parent.name}-{stem}" if p.parent.name else stem)[:40].strip("-") or "trace"
        name, k = base, 2
        while name in names:
            name, k = f"{base}-{k}", k + 1
        names.append(name)
    return names


def replay_plan(spec, routing, specs, names, args):
    from fabriclab.workflows.plan import Job, Metrics, Plan, RunPlan

    source = {"command": "replay", "routing": str(routing),
              **{k: v for k, v in vars(args).items() if k not in ("func", "command") and not callable(v)}}
    run = RunPlan(str(routing), routing=routing, jobs=[Job(n, s) for n, s in zip(names, specs)])
    plan = Plan(name=f"{spec.name}-replay", kind="replay", spec=spec, runs=[run],
                metrics=Metrics(sample_ms=args.sample_ms, bin_ms=max(50.0, args.sample_ms)), source=source)
    plan.check()
    return plan


def cmd_replay(args):
    from fabriclab.lab.controller import check_app
    from fabriclab.results import tables
    from fabriclab.topologies.fabric import Fabric
    from fabriclab.topologies.spec import load_spec
    from fabriclab.workflows import pipeline

    spec = load_spec(args.spec)
    routing = check_app(args.routing)
    specs = replay_specs(args, placed_hosts(Fabric(spec), args.placement, args.seed))
    plan = replay_plan(spec, routing, specs, job_names(args.traces), args)
    if args.check:
        pipeline.prepare(plan)
        for job in plan.runs[0].jobs:
            t = job.workload.trace
            print(f"{t.path}: ok: {t.format} ({t.form}), {t.world} ranks, {len(t.ops)} collectives to replay"
                  + (f", skipped {', '.join(f'{k} x{v}' for k, v in t.skipped.items())}" if t.skipped else "")
                  + f"; job {job.name} on {', '.join(job.workload.hosts)}")
        return 0
    heading = (f"bringing up {spec.name} with {args.routing}; replaying "
               + ", ".join(f"{j.name} ({len(j.workload.trace.ops)} collectives)" for j in plan.runs[0].jobs) + " ...")
    return running.execute(plan, args, heading, {"table": tables.replay_table}, bar=True)
