"""`fabriclab collective`: run NCCL-style collectives as RoCEv2 traffic and report as nccl-tests does.

    fabriclab collective default --collective allreduce --sizes 64K,256K,1M --verify

brings the fabric up, runs the collective over every host NIC, prints a table per message size
(completion time mean/p50/p99, algbw, busbw and its fraction of the link rate, RNIC counters)
and writes the results folder. `--in-place` also runs every size in place; `--format nccl` runs
both modes and prints only what nccl-tests prints (results/nccl.py), for scripts that parse its
logs. The lab prompt's `collective` command takes the same options and runs on the fabric that
is already up.
"""

from __future__ import annotations

import argparse

from fabriclab.apps import DEFAULT_ROUTING
from fabriclab.cli import running
from fabriclab.errors import LabError
from fabriclab.loading import excerpt
from fabriclab.units import parse_sizes

DEFAULT_SIZES = "64K,256K,1M"


def add_collective_args(p):
    from fabriclab.traffic import schedules
    from fabriclab.traffic.rank_driver import QP_METHODS
    from fabriclab.traffic.collective import PLACEMENTS
    from fabriclab.traffic.plb import MODES as PLB_MODES, PROBE_TIMEOUTS
    from fabriclab.traffic.cc import DEFAULT as CC_DEFAULT, KINDS as CC_KINDS
    from fabriclab.traffic.softroce import BACKENDS

    p.add_argument("--collective", "-c", default="allreduce", choices=schedules.COLLECTIVES)
    p.add_argument("--algorithm", help="allreduce: ring (default) or tree")
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   help=f"message sizes, nccl-tests semantics (default {DEFAULT_SIZES})")
    p.add_argument("--hosts", help="comma-separated hosts taking part (default: all)")
    p.add_argument("--nics", type=int, help="NICs per host used as ranks (default: all)")
    p.add_argument("--placement", choices=PLACEMENTS, default="order",
                   help="rank order: order, topology (grouped by zone, then leaf: the minimum cut), "
                        "scatter (hosts dealt round-robin over zones), random, or rail (rail by rail, "
                        "so ring neighbours on two hosts share a rail)")
    p.add_argument("--pxn", action=argparse.BooleanOptionalAction, default=None,
                   help="relay a transfer between two hosts' different rails through the sender's "
                        "host (NCCL's PXN); default: on for rail-cabled fabrics with the udp backend")
    p.add_argument("--channels", type=int, default=1, help="independent rings/trees (default 1)")
    p.add_argument("--qps", type=int, default=1, help="QPs per connection and plane (QP scaling)")
    p.add_argument("--qp-method", choices=QP_METHODS, default="round-robin",
                   help="QP scaling: round-robin whole messages (default) or split each message")
    p.add_argument("--chunk", default="64K", help="NIC message size (default 64K)")
    p.add_argument("--iterations", "-n", type=int, default=5)
    p.add_argument("--warmup", "-w", type=int, default=1)
    p.add_argument("--verify", action="store_true",
                   help="carry real values and check every output against numpy")
    p.add_argument("--in-place", action="store_true",
                   help="also run every size in place (the receive buffer aliasing the send buffer, "
                        "as nccl-tests' second half), each mode its own result row")
    p.add_argument("--sport-mode", choices=("qp", "shared"), default="qp",
                   help="UDP source port per QP (qp) or one per NIC pair (shared)")
    p.add_argument("--spray", type=int, default=1, metavar="N",
                   help="vary the UDP source port per packet over N ports (packet spraying)")
    p.add_argument("--imbalance", type=float, default=4.0, help="alltoallv: max/min block ratio")
    p.add_argument("--root", type=int, default=0, help="gather: the receiving rank; scatter: the sending one")
    p.add_argument("--cts", action="store_true", help="receiver-driven admission (clear-to-send)")
    p.add_argument("--cts-buffers", type=int, default=2,
                   help="channel buffers (of --chunk bytes) a receiver grants per connection")
    p.add_argument("--control-dscp", type=int, default=None,
                   help="DSCP of ACK/NAK/CTS packets (default: the data DSCP 26)")
    p.add_argument("--dcqcn", action="store_true", help="DCQCN at the senders (off by default)")
    p.add_argument("--dcqcn-param", action="append", default=[], metavar="NAME=VALUE",
                   help="a DCQCN NIC parameter, e.g. rpg_ai_rate=10 (repeatable)")
    p.add_argument("--cc", choices=tuple(CC_KINDS), default=CC_DEFAULT,
                   help="the senders' congestion control: " + "; ".join(
                       f"{k.name}: {k.summary}" for k in CC_KINDS.values())
                   + f" (default {CC_DEFAULT}; spx is always on, dcqcn with --dcqcn)")
    p.add_argument("--spx-param", action="append", default=[], metavar="NAME=VALUE",
                   help="an SPX CC constant in real units, e.g. cnp_cut=0.5 (repeatable; needs "
                        "--cc spx)")
    p.add_argument("--ack-timeout", type=float, help="local ACK timeout, s (default from buffers)")
    p.add_argument("--seed", type=int, default=1, help="seeds the QPs (their source ports) and the switches' hash bases (default 1)")
    p.add_argument("--plb", choices=PLB_MODES, default="static",
                   help="plane load balancing on a multiplane NIC: per-plane (per-plane CC and the "
                        "shallowest egress queue, per packet), global (one CC across planes), static "
                        "(even split, default), software (NCCL-style, gives a stalled plane up after "
                        "--sw-timeout) or esr (entropy source routing)")
    p.add_argument("--probe-interval", type=float, metavar="S",
                   help="plane probe interval and timeout, s (default: the probe round trip's bound "
                        "on the spec)")
    p.add_argument("--probe-timeouts", type=int, default=PROBE_TIMEOUTS, metavar="N",
                   help=f"consecutive probe timeouts that remove a plane (default {PROBE_TIMEOUTS})")
    p.add_argument("--reorder", choices=("go-back-n", "place"),
                   help="the receiver's way with a packet ahead of the expected PSN: go-back-n (NAK, "
                        "as RoCEv2's RC) or place (write it by its RETH, as a NIC for per-packet load "
                        "balancing does); default place with per-plane, global and esr, else go-back-n")
    p.add_argument("--reorder-timeout", type=float, metavar="S",
                   help="with --reorder place: how long a hole may stay open before the receiver "
                        "NAKs it as lost, s (default: a path's buffers draining)")
    p.add_argument("--cc-idle", type=float, metavar="S",
                   help="per-plane, global, esr: a destination silent this long starts its next burst "
                        "with fresh CC contexts, s (default: the probe interval; 0: never)")
    p.add_argument("--sw-timeout", type=float, metavar="S",
                   help="software plb: stall before a plane is given up, s (default: the ACK timeout)")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="what moves the bytes: rxe (soft-RoCE, real RDMA verbs), udp (the lab's "
                        "RoCEv2 agents on raw sockets) or auto (default: rxe where doctor finds "
                        "rdma_rxe and the options need nothing udp-only)")


def _nic_params(flag, items):
    """NAME=VALUE items into {name: number} (a value with a point or exponent is a float)."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise LabError(f"{flag} {excerpt(item)}: expected NAME=VALUE")
        try:
            out[name.strip()] = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            raise LabError(f"{flag} {excerpt(item)}: {excerpt(value)} is not a number") from None
    return out


def spec_from_args(args):
    from fabriclab.traffic.collective import CollectiveSpec
    from fabriclab.units import parse_size

    dcqcn = None
    if args.dcqcn or args.dcqcn_param:
        dcqcn = _nic_params("--dcqcn-param", args.dcqcn_param)
    spx = None
    if args.spx_param:
        if args.cc != "spx":
            raise LabError("--spx-param needs --cc spx")
        spx = _nic_params("--spx-param", args.spx_param)
    spec = CollectiveSpec(
        collective=args.collective, sizes=tuple(parse_sizes(args.sizes)), algorithm=args.algorithm,
        hosts=tuple(h for h in args.hosts.split(",") if h) if args.hosts else None, nics=args.nics,
        placement=args.placement, channels=args.channels, qps=args.qps, qp_method=args.qp_method,
        chunk_bytes=parse_size(args.chunk), iterations=args.iterations, warmup=args.warmup,
        verify=args.verify, in_place=args.in_place, sport_mode=args.sport_mode, spray=args.spray,
        imbalance=args.imbalance, root=args.root,
        cts=args.cts, cts_buffers=args.cts_buffers, dcqcn=dcqcn, cc=args.cc, spx=spx,
        ack_timeout_s=args.ack_timeout,
        seed=args.seed, backend=args.backend, plb=args.plb, probe_interval_s=args.probe_interval,
        probe_timeouts=args.probe_timeouts, sw_timeout_s=args.sw_timeout, reorder=args.reorder,
        reorder_timeout_s=args.reorder_timeout, cc_idle_s=args.cc_idle, pxn=args.pxn)
    if args.control_dscp is not None:
        spec.control_dscp = args.control_dscp
    spec.check()
    return spec


def register(subparsers):
    p = subparsers.add_parser("collective", help="bring a fabric up, run a collective (nccl-tests "
                                                 "style), report, tear down")
    p.add_argument("spec", metavar="SPEC", help="spec file or shipped spec name")
    p.add_argument("--routing", default=DEFAULT_ROUTING, help=f"controller app (default: {DEFAULT_ROUTING})")
    add_collective_args(p)
    p.add_argument("--sample-ms", type=float, default=5.0, help="port sampling interval (default 5 ms)")
    running.add_output_args(p, formats=("table", "json", "nccl"))
    p.set_defaults(func=cmd_collective)


def collective_plan(spec, routing, cspec, args, kind="collective", sample_ms=5.0):
    """The plan of `collective` and of the prompt's `collective`: one run, one collective job."""
    from fabriclab.workflows.plan import Job, Metrics, single_run

    source = {"command": kind, "routing": str(routing),
              **{k: v for k, v in vars(args).items() if k not in ("func", "command") and not callable(v)}}
    return single_run(f"{spec.name}-{cspec.collective}", kind, spec, Job(cspec.collective, cspec),
                      routing=routing, metrics=Metrics(sample_ms=sample_ms, bin_ms=max(50.0, sample_ms)),
                      source=source)


def cmd_collective(args):
    from fabriclab.lab.controller import check_app
    from fabriclab.results import nccl, tables
    from fabriclab.topologies.spec import load_spec

    from fabriclab.apps import RoutingError

    spec = load_spec(args.spec)
    routing = check_app(args.routing)
    if args.format == "nccl":
        args.in_place = True            # nccl-tests runs every size both ways
    cspec = spec_from_args(args)
    try:                                # the seed draws the QPs and the switches' hash bases
        routing = routing.with_seed(args.seed)
    except RoutingError as exc:
        raise LabError(f"--seed: {exc}") from None
    plan = collective_plan(spec, routing, cspec, args, sample_ms=args.sample_ms)
    return running.execute(plan, args, f"bringing up {spec.name} with {args.routing}; {cspec.collective}, "
                                       f"sizes {args.sizes} ...",
                           {"table": tables.collective_table, "nccl": nccl.render}, bar=True)


def prompt_parser():
    """The same options for the lab prompt's `collective` command (no spec: the fabric is up)."""
    p = argparse.ArgumentParser(prog="collective", add_help=True, exit_on_error=False)
    add_collective_args(p)
    return p
