"""`fabriclab capture`: a live run's ports as pcapng, for Wireshark and tshark.

    fabriclab capture l1-eth2 h1-n0 -w roce.pcapng --filter 'udp port 4791' --count 1000
    fabriclab capture s1-eth1 | wireshark -k -i -
"""

from __future__ import annotations

import sys


def register(subparsers):
    p = subparsers.add_parser("capture", help="capture a running fabric's switch or host ports to pcapng "
                                              "(a file, or stdout for `| wireshark -k -i -`)")
    add_capture_args(p, write_help="pcapng file to write (default: stdout, if not a terminal)")
    p.add_argument("--run", metavar="ID", help="the run to capture from (default: the only one running)")
    p.set_defaults(func=cmd_capture)


def add_capture_args(p, write_help, write_required=False):
    """The options `capture` takes here and at the lab prompt."""
    p.add_argument("ports", nargs="+", metavar="PORT", help="switch ports (l1-eth2) or host ports (h1-n0)")
    p.add_argument("-w", "--write", metavar="FILE", required=write_required, help=write_help)
    p.add_argument("--filter", metavar="BPF", help="a tcpdump filter, e.g. 'udp port 4791' (RoCEv2)")
    p.add_argument("--count", type=int, metavar="N", help="stop after N packets (all ports together)")
    p.add_argument("--seconds", type=float, metavar="S", help="stop after S seconds")
    p.add_argument("--snaplen", type=int, metavar="BYTES", help="bytes kept of each packet (default: all)")


def cmd_capture(args):
    from fabriclab.lab import capture

    run = capture.live_run(args.run)
    job, out = capture.start(run, args.ports, args.write, bpf=args.filter, count=args.count, seconds=args.seconds,
                             snaplen=args.snaplen)
    with out:
        where = args.write if args.write not in (None, "-") else "stdout"
        print(f"capturing {', '.join(name for name, _ in job.ports)} of run {run.id} to {where} "
              f"(Ctrl-C stops)", file=sys.stderr, flush=True)
        got = job.wait()
    print(summary(got), file=sys.stderr)
    return 0


def summary(got):
    """A finished capture in a line, then one per problem (packets the kernel dropped)."""
    per_port = ", ".join(f"{name} {n}" for name, n in got["ports"].items())
    return "\n".join([f"captured {got['packets']} packets in {got['seconds']:.1f} s ({per_port}); "
                      f"stopped: {got['stopped']}"] + [f"capture: {problem}" for problem in got["problems"]])
