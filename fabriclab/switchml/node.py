"""The SwitchML processes on the lab's hosts: an aggregator (the switch logic on a server beside a
switch) or a worker, each a UDP loop around the state machines in aggregator.py and worker.py.

    python -m fabriclab.switchml.node CONFIG.json [--start-at UNIX_TIME | --start-on-stdin]

An aggregator says {"ready": NAME} once its socket is bound, runs until its `stop_file` appears
(the launcher puts it there, on whichever machine the aggregator runs) or SIGTERM, and then
prints its counters as one JSON line. A worker waits for the shared start time (given, or read
once it said ready: traffic/start_gate.py), aggregates its tensor `iterations` times (each
continuing the slots' versions), saves the last result to `output` (.npy) and prints its timings
and counters as JSON; its `stop_file`, when it appears, ends it early (a cancelled run: over SSH,
killing the session here does not reach the worker there).

Addresses come from the launcher (launcher.py): a worker sends to its switch's service address,
which OpenFlow steers to the aggregator; an aggregator multicasts by sending once to its group
address, which the switch copies to every member, and unicasts to a member's own address.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import selectors
import signal
import socket
import sys
import time

import numpy as np

from fabriclab.switchml.aggregator import Aggregator
from fabriclab.switchml.job import JobConfig
from fabriclab.switchml.packet import MalformedPacket, decode, encode
from fabriclab.switchml.pool import MULTICAST, UNICAST
from fabriclab.switchml.worker import Worker
from fabriclab.traffic import start_gate

PORT = 27182
MAX_START_DELAY_S = 600.0      # a later start is a clock or launcher mistake
STOP_POLL_S = 0.2              # an idle aggregator, or any worker, looks for its stop file this often
RECEIVE_BUFFER = 4 * 2**20


class Stop(Exception):
    pass


def _socket(address, port=PORT):
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
    sock.bind((address, port))
    sock.setblocking(False)
    return sock


def tensor_for(spec, rank):
    """The tensor worker `rank` contributes: seeded, so the launcher can recompute the exact sum.
    int32 values are small enough that any worker count sums without overflow."""
    rng = np.random.default_rng([spec["seed"], rank])
    if spec["dtype"] == "int32":
        return rng.integers(-1000, 1000, size=spec["elements"], dtype=np.int32)
    return rng.standard_normal(spec["elements"]).astype(spec["dtype"])


def run_aggregator(cfg):
    agg = Aggregator(cfg["capacity"], slot_elements=cfg["slot_elements"], level=cfg["level"],
                     name=cfg["name"])
    routes = {}
    for job in cfg["jobs"]:
        agg.admit(JobConfig(job["job_id"], len(job["children"]), job["slots"], job["elements"]),
                  upstream=job.get("upstream"))
        routes[job["job_id"]] = job
    sock = _socket(cfg.get("bind", "0.0.0.0"), cfg.get("port", PORT))
    sent = received = malformed = 0
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(Stop()))
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    stop_file = cfg.get("stop_file")
    print(json.dumps({"ready": cfg["name"]}), flush=True)
    try:
        while True:
            if not sel.select(STOP_POLL_S) and stop_file and os.path.exists(stop_file):
                raise Stop()
            while True:
                try:
                    data, _ = sock.recvfrom(65536)
                except BlockingIOError:
                    break
                received += 1
                try:
                    packet = decode(data)
                except MalformedPacket:
                    malformed += 1
                    continue
                for dest, out in agg.handle(packet):
                    job = routes[out.job]
                    if dest.kind == MULTICAST:
                        target = (job["group"], PORT)
                    elif dest.kind == UNICAST:
                        target = (job["children"][dest.worker], PORT)
                    else:
                        target = (job["parent"], job.get("parent_port", PORT))
                    sock.sendto(encode(out), target)
                    sent += 1
    except (Stop, KeyboardInterrupt):
        pass
    counters = dict(agg.totals(), received=received, sent=sent, malformed=malformed)
    print(json.dumps({"name": cfg["name"], "level": cfg["level"], "counters": counters}), flush=True)


def run_worker(cfg):
    job = cfg["job"]
    config = JobConfig(job["job_id"], job["workers_here"], job["slots"], job["elements"])
    tensor = tensor_for(cfg["tensor"], cfg["rank"])
    sock = _socket(cfg["address"])
    service = (cfg["service"], PORT)
    stop_file = cfg.get("stop_file")

    def stopped():
        if stop_file and os.path.exists(stop_file):
            print(json.dumps({"error": "stopped by the launcher"}), flush=True)
            sys.exit(5)
    if cfg.get("start_on_stdin") or cfg.get("start_file"):
        try:
            cfg["start_at"] = start_gate.ready_then_start(f"w{cfg['rank']}", stopped=stopped,
                                                          path=cfg.get("start_file"))
        except start_gate.GateError as exc:
            print(json.dumps({"error": str(exc)}), flush=True)
            sys.exit(6)
    while (delay := cfg["start_at"] - time.time()) > 0:
        stopped()
        time.sleep(min(delay, STOP_POLL_S))
    looked = time.monotonic()
    previous, iterations, totals = None, [], {}
    sends, resends = [], []          # the first iteration's send times (s from its start): Figure 7
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    for _ in range(cfg["iterations"]):
        worker = Worker(tensor, job=config, worker_id=cfg["worker_id"], workers=job["workers"],
                        timeout=cfg["timeout_s"], after=previous)
        deadline = time.monotonic() + cfg["deadline_s"]
        t0 = time.monotonic()
        first = previous is None

        def send(packets):
            for p in packets:
                sock.sendto(encode(p), service)
                if first:
                    (resends if p.retransmit else sends).append(round(time.monotonic() - t0, 5))
        send(worker.start(t0))
        while not worker.done:
            now = time.monotonic()
            if now - looked > STOP_POLL_S:
                stopped()
                looked = now
            if now > deadline:
                print(json.dumps({"error": f"no result within {cfg['deadline_s']:.0f} s",
                                  "counters": dict(worker.counters)}), flush=True)
                sys.exit(4)
            wait = max(0.0, min(worker.next_deadline or now + 0.05, deadline, now + STOP_POLL_S) - now)
            out = []
            if sel.select(wait):
                while True:
                    try:
                        data, _ = sock.recvfrom(65536)
                    except BlockingIOError:
                        break
                    try:
                        out += worker.on_packet(decode(data), time.monotonic())
                    except MalformedPacket:
                        worker.counters["malformed"] += 1
            out += worker.on_timer(time.monotonic())
            send(out)
        iterations.append(worker.finished_at - worker.started_at)
        for key, value in worker.counters.items():
            totals[key] = totals.get(key, 0) + value
        previous = worker
    np.save(cfg["output"], previous.result)
    bounds = previous.error_bound()
    bound = float(bounds.max()) if bounds.size else 0.0
    print(json.dumps({"rank": cfg["rank"], "tat_s": iterations, "counters": totals,
                      "error_bound": bound, "sends": sends, "resends": resends}), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fabriclab.switchml.node")
    parser.add_argument("config")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--start-at", type=float, default=None,
                      help="a worker's start (unix time on this machine's clock), over its config's")
    when.add_argument(start_gate.FLAG, action="store_true",
                      help="a worker: say ready on stdout, then read its start time on stdin")
    when.add_argument(start_gate.FILE_FLAG, dest="start_file", default=None, metavar="PATH",
                      help="a worker: say ready on stdout, then wait for PATH to hold its start time")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    with open(args.config) as f:
        cfg = json.load(f)
    if args.start_at is not None:
        if not math.isfinite(args.start_at) or args.start_at - time.time() > MAX_START_DELAY_S:
            parser.error(f"--start-at is not a time within {MAX_START_DELAY_S:.0f} s from now")
        cfg["start_at"] = args.start_at
    cfg["start_on_stdin"] = args.start_on_stdin
    cfg["start_file"] = args.start_file
    (run_aggregator if cfg["role"] == "aggregator" else run_worker)(cfg)


if __name__ == "__main__":
    main()
