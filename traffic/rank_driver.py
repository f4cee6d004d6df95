"""One rank of a collective: the launcher's protocol and the schedule engine, over any RNIC.

A rank agent runs inside a Mininet host's network namespace, connects to the launcher's control
socket (`rank_channel`) and serves commands until told to stop:

    -> {"hello": r, "pid": p, ...}   at once; the RNIC may add what the launcher must exchange
    {"prepare": i, "in_place": b}
                              build the schedule and memory for the i-th message size, out of
                              place or in place (b, default false) -> "ready"
    {"run": k, "start_at": t} run iteration k, starting at unix time t -> "done" with timings,
                              counters and (verify mode) the check against numpy (null where
                              the in-place result is undefined)
    {"status": true}          what this rank is still waiting for -> "status"
    {"stop": true}            send the final counters -> "final", then exit
    anything else             the RNIC's (the verbs agent's "connect")

`RankDriver` is that part, written once: it walks the rank's step DAG (`engine.RankEngine`),
cuts each transfer into NIC messages of `chunk_bytes` (RDMA WRITE with immediate = the
transfer's tag), spreads them over the connection's QPs (QP scaling: split each message, or
whole messages in turn; seed 000 section 4.2.4), admits them within the receiver's CTS grant
when CTS is on (seed 000 section 5.2.2), and reports iterations. It moves no bytes itself: an
RNIC does, composed in by the entry point that starts the agent:

    traffic/agent.py        UdpRnic: the lab's RNIC on raw sockets (every kernel)
    traffic/verbs_agent.py  VerbsRnic: RDMA verbs on soft-RoCE devices

An RNIC is built as `make_rnic(config, driver)` and offers:

    open() -> [QP]                  its QPs; each has qpn, peer, channel, port_index and a
                                    QpActivity as `activity`
    hello() -> dict                 what the launcher's hello must carry besides rank and pid
    selectables() -> [(file, callback(now))]   what the event loop watches for it
    on_control(message) -> reply or None       a command the driver does not know
    make_memory(regions) -> Memory             the rank's memory in verify mode
    check_schedule(schedule)        LabError if it cannot run this schedule
    post(qp, message, data)         queue one NIC message (data: its bytes, or None for zeros)
    poll(now) -> when or None       do what is due; when to be called again
    totals(), qp_counters(), port_reports(), status() -> dicts for done/final/status messages
    plane_bytes() -> [bytes]        data sent on each plane (port) so far
    plb_report() -> dict or None    the plane load balancer's record (`plb`), for "final"
    close()

A QP's `usable` says whether the driver may deal new NIC messages to it (False while software
load balancing has given its plane up); `port_index` is its plane, None when its packets take
every plane.

and reports back with `message_sent`, `message_received` and `grant`; a QP that failed raises
PeerError naming the peer.

Errors: a bad config or host exits 2 with one line on stderr; a failed QP (the peer is dead or
unreachable) is reported to the launcher with the peer's rank, then the agent exits 1. The
agent exits when the launcher goes away.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass

from fabriclab.errors import LabError
from fabriclab.traffic import schedules, sockets
from fabriclab.traffic.engine import RankEngine
from fabriclab.traffic.rank_channel import ControlChannel, LauncherGone

QP_METHODS = ("round-robin", "split")
MAX_IDLE_WAIT_S = 0.05
"""The longest the event loop sleeps when nothing is due: bounds how late a start time is seen
(a run's start_at comes with 50 ms of margin) at 20 idle wake-ups a second."""
def pxn_locality(ranks):
    """Per rank its (host, NIC index), from the launcher's rank table: what PXN relays by."""
    return [(r["host"], r["nic"]) for r in ranks]


OUTPUT_REGIONS = ("output", "work", "scratch")
"""What a collective writes: zeroed before each iteration in verify mode (the input is put back
after, since in place it lives in one of them)."""


class PeerError(Exception):
    """A QP towards `peer` failed (the retry counter ran out: the peer is dead or unreachable)."""

    def __init__(self, peer, message):
        super().__init__(message)
        self.peer = peer


@dataclass(frozen=True)
class NicMessage:
    """One RDMA WRITE WITH IMMEDIATE (= tag) of `nbytes`, from local memory to the peer's."""

    tag: int
    nbytes: int
    src_region: str
    src_offset: int
    dst_region: str
    dst_offset: int


class QpActivity:
    """When a QP moved bytes: over the run (unix times) and in the current iteration
    (monotonic), as the done and final messages report it."""

    __slots__ = ("first_send", "it_bytes", "it_first", "it_last", "last_ack")

    def __init__(self):
        self.first_send = self.last_ack = None
        self.it_first = self.it_last = None
        self.it_bytes = 0

    def new_iteration(self):
        self.it_first = self.it_last = None
        self.it_bytes = 0

    def sending(self, nbytes, now, clock_offset):
        if self.first_send is None:
            self.first_send = now + clock_offset
        if self.it_first is None:
            self.it_first = now
        self.it_bytes += nbytes

    def acknowledged(self, now, clock_offset):
        self.last_ack = now + clock_offset

    def completed(self, now):
        self.it_last = now


class Connection:
    """This rank's QPs to one peer on one channel, with QP scaling and CTS credit."""

    def __init__(self, peer, channel, qps):
        self.peer, self.channel, self.qps = peer, channel, qps
        self.rr = 0
        self.pending = deque()          # chunks waiting for CTS credit: (transfer, offset, bytes)
        self.granted_to_me = 0          # cumulative bytes the peer lets me write (CTS)
        self.posted = 0                 # cumulative bytes I have posted to it
        self.granted_by_me = 0          # cumulative bytes I let the peer write
        self.received = 0               # cumulative bytes the peer wrote to me
        self.cts_due = False
        self.last_cts = 0.0
        self.received_at_cts = 0


class RankDriver:
    """The launcher's protocol and one rank's progress through the collective, over `rnic`."""

    def __init__(self, config, make_rnic):
        self.config = config
        self.rank = config["rank"]
        self.ranks = config["ranks"]
        self.transport = config["transport"]
        self.collective = config["collective"]
        self.sizes = config["sizes"]
        self.verify = config.get("verify", False)
        self.cts = self.transport.get("cts") or {}
        self.cts_enabled = bool(self.cts.get("enabled"))
        self.clock_offset = time.time() - time.monotonic()
        self.qps = []
        self.connections = {}
        self.control = None
        self.selector = selectors.DefaultSelector()
        self.schedule = None
        self.memory = None
        self.input = None               # verify mode: this rank's input tensor
        self.reference = None
        self.engine = None
        self.round = 0                  # "run" commands so far
        self.early = []                 # (round or None, tag, bytes) arrived before their round
        self.transfer_parts = {}        # tag -> NIC messages not yet acknowledged
        self.start_mono = None
        self.iteration = None
        self.iteration_start = None
        self.counter_mark = None
        self.plane_mark = None
        self.cpu_mark = 0.0
        self.stopping = False
        self.rnic = make_rnic(config, self)

    # -- set-up ------------------------------------------------------------------------------------

    def open(self):
        self.qps = self.rnic.open()
        for qp in self.qps:
            key = (qp.peer, qp.channel)
            self.connections.setdefault(key, Connection(qp.peer, qp.channel, []))
            self.connections[key].qps.append(qp)
        window = self.cts.get("buffers", 0) * self.transport["chunk_bytes"]
        for conn in self.connections.values():
            if self.cts_enabled:
                conn.granted_by_me = window
                conn.cts_due = True
            else:
                conn.granted_to_me = float("inf")
        for fileobj, callback in self.rnic.selectables():
            self.selector.register(fileobj, selectors.EVENT_READ, callback)
        self.control = ControlChannel(self.config["control"])
        self.selector.register(self.control, selectors.EVENT_READ, self.read_control)
        self.tell({"hello": self.rank, "pid": os.getpid(), **self.rnic.hello()})

    def close(self):
        self.rnic.close()
        if self.control:
            self.control.close()

    def tell(self, message):
        self.control.tell(message)

    def describe(self, rank):
        info = self.ranks[rank]
        return f"rank {rank} ({info['host']} {info['addresses'][0]})"

    @property
    def running(self):
        """An iteration is under way on this rank."""
        return self.engine is not None

    # -- the protocol ------------------------------------------------------------------------------

    def read_control(self, _now=None):
        for message in self.control.messages():
            self.on_control(message)

    def on_control(self, message):
        if "prepare" in message:
            self.prepare(message["prepare"], message.get("in_place", False))
            self.tell({"ready": message["prepare"]})
        elif "run" in message:
            self.run(message["run"], message["start_at"])
        elif "status" in message:
            self.tell({"status": self.rank, "state": self.status()})
        elif "stop" in message:
            self.tell(self.final())
            self.stopping = True
        else:
            reply = self.rnic.on_control(message)
            if reply is not None:
                self.tell(reply)

    def status(self):
        state = {"running": False}
        if self.engine is not None:
            state = {"running": True, "iteration": self.iteration,
                     "waiting_for": [{"tag": tag, "from": src, "bytes": missing}
                                     for tag, src, missing in self.engine.pending_recvs()[:8]],
                     "unacked_sends": self.engine.unacked_sends,
                     "cts_blocked": [{"peer": c.peer, "bytes": sum(p[2] for p in c.pending)}
                                     for c in self.connections.values() if c.pending]}
        return {**state, **self.rnic.status()}

    def final(self):
        return {"final": self.rank, "totals": self.rnic.totals(),
                "cpu_s": round(time.process_time(), 3), "qps": self.rnic.qp_counters(),
                "ports": self.rnic.port_reports(), "plb": self.rnic.plb_report()}

    # -- the collective -------------------------------------------------------------------------

    def prepare(self, size_index, in_place=False):
        c = self.collective
        name, algorithm = c["program"][size_index] if c.get("program") else (c["collective"], c["algorithm"])
        self.schedule = schedules.build(name, len(self.ranks), self.sizes[size_index],
                                        algorithm=algorithm, channels=c["channels"],
                                        piece_bytes=c["piece_bytes"], imbalance=c["imbalance"],
                                        seed=c["seed"], root=c["root"], in_place=in_place,
                                        pxn=pxn_locality(self.ranks) if c.get("pxn") else None)
        self.rnic.check_schedule(self.schedule)
        self.memory = self.input = self.reference = None
        if self.verify:
            self.memory = self.rnic.make_memory(self.schedule.regions[self.rank])
            inputs = [rank_input(self.config["data_seed"], r, buffers["input"].nbytes // 4)
                      for r, buffers in enumerate(self.schedule.buffers)]
            self.input = inputs[self.rank]
            if self.schedule.defined:
                self.reference = schedules.reference_outputs(self.schedule, inputs)[self.rank]
            self.reset_memory()

    def buffer(self, name):
        """This rank's send ("input") or receive ("output") buffer as a float32 array, wherever
        it lives (in place, inside the other one); None when the rank has none."""
        where = self.schedule.buffers[self.rank][name]
        if where is None:
            return None
        start = where.offset // schedules.ELEMENT_BYTES
        return self.memory.arrays[where.region][start:start + where.nbytes // schedules.ELEMENT_BYTES]

    def reset_memory(self):
        """Zero what the collective writes (verify mode), so that a write that never came shows,
        then put the input in its place again (in place, the last iteration overwrote it).

        At prepare and when an iteration is done, not when the next is announced: a fast peer's
        writes for it may land before this rank hears of it (none of them where the input is)."""
        if self.memory is not None:
            for name in OUTPUT_REGIONS:
                if name in self.memory.bytes:
                    self.memory.arrays[name][:] = 0
            self.buffer("input")[:] = self.input

    def run(self, iteration, start_at):
        self.round += 1
        self.iteration = iteration
        self.start_mono = start_at - self.clock_offset
        self.iteration_start = None
        self.counter_mark = self.rnic.totals()
        self.plane_mark = self.rnic.plane_bytes()
        self.cpu_mark = time.process_time()
        for qp in self.qps:
            qp.activity.new_iteration()

    def begin(self, now):
        """start_at has come: start the rank's step DAG."""
        expected = self.round % 256
        stray = [r for r, _t, _n in self.early if r is not None and r != expected]
        if stray:
            raise LabError(f"a write of round {stray[0]} arrived before round {expected} began")
        self.start_mono = None
        self.iteration_start = now
        self.transfer_parts = {}
        self.engine = RankEngine(self.schedule.programs[self.rank], self.post_transfer, self.memory)
        early, self.early = self.early, []
        self.engine.start()
        for _round, tag, nbytes in early:
            self.engine.received(tag, nbytes)
        self.check_done(now)

    def post_transfer(self, transfer):
        conn = self.connections[(transfer.dst, transfer.channel)]
        chunk = self.transport["chunk_bytes"]
        chunks = 0
        for off in range(0, transfer.nbytes, chunk):
            conn.pending.append((transfer, off, min(chunk, transfer.nbytes - off)))
            chunks += 1
        # One per chunk until it is admitted and its parts (QP scaling's split) are known.
        self.transfer_parts[transfer.tag] = chunks
        self.admit(conn)

    @staticmethod
    def usable_qps(conn):
        """The connection's QPs that may take new messages (all of them if none may: software
        load balancing has given every plane up, and the QPs go on trying)."""
        usable = [qp for qp in conn.qps if qp.usable]
        return usable or conn.qps

    def parts(self, conn, off, length):
        """The NIC messages of one chunk, as (QP, offset, bytes): a whole message to the next
        QP in turn, or the chunk split over the QPs. Chosen when the chunk is posted to the
        NIC, so a QP that software load balancing gave up since gets nothing new."""
        if self.transport["qp_method"] == "split" and len(conn.qps) > 1:
            qps = self.usable_qps(conn)
            return [(qps[i], off + o * 4, k * 4)
                    for i, (o, k) in enumerate(schedules.split(length // 4, len(qps))) if k]
        qps = conn.qps
        for _ in range(len(qps)):
            qp = qps[conn.rr % len(qps)]
            conn.rr += 1
            if qp.usable:
                return [(qp, off, length)]
        qp = qps[conn.rr % len(qps)]
        conn.rr += 1
        return [(qp, off, length)]

    def admit(self, conn):
        """Post the connection's waiting NIC messages that fit within the peer's CTS grant."""
        while conn.pending and conn.posted + conn.pending[0][2] <= conn.granted_to_me:
            transfer, chunk_off, length = conn.pending.popleft()
            conn.posted += length
            parts = self.parts(conn, chunk_off, length)
            if len(parts) > 1:
                self.transfer_parts[transfer.tag] += len(parts) - 1
            for qp, off, nbytes in parts:
                message = NicMessage(transfer.tag, nbytes, transfer.src_region,
                                     transfer.src_off + off, transfer.dst_region,
                                     transfer.dst_off + off)
                data = (self.memory.view(transfer.src_region, transfer.src_off + off, nbytes)
                        if self.memory is not None else None)
                self.rnic.post(qp, message, data)

    def grant(self, conn, granted):
        """The peer's CTS: it lets this rank write `granted` bytes in all."""
        if granted > conn.granted_to_me:
            conn.granted_to_me = granted
            self.admit(conn)

    def message_sent(self, tag, now):
        """The peer acknowledged one NIC message of transfer `tag`."""
        left = self.transfer_parts.get(tag)
        if left is None:
            return
        if left > 1:
            self.transfer_parts[tag] = left - 1
            return
        del self.transfer_parts[tag]
        if self.engine is not None:
            self.engine.sent(tag)
            self.check_done(now)

    def message_received(self, qp, tag, nbytes, now, round_=None):
        """A NIC message of transfer `tag` (of iteration `round_` mod 256, where the RNIC
        carries it) is in memory."""
        conn = self.connections[(qp.peer, qp.channel)]
        conn.received += nbytes
        if self.cts_enabled:
            conn.granted_by_me += nbytes
            conn.cts_due = True
        if self.engine is None:
            self.early.append((round_, tag, nbytes))
            return
        if round_ is not None and round_ != self.round % 256:
            raise LabError(f"a write of round {round_} from {self.describe(qp.peer)} arrived "
                           f"during round {self.round % 256}")
        self.engine.received(tag, nbytes)
        self.check_done(now)

    def check_done(self, now):
        if self.engine is None or not self.engine.done:
            return
        self.engine = None
        report = {"done": self.iteration,
                  "start": self.iteration_start + self.clock_offset,
                  "end": now + self.clock_offset,
                  "counters": _delta(self.rnic.totals(), self.counter_mark),
                  "cpu_s": round(time.process_time() - self.cpu_mark, 4),
                  "plane_tx_bytes": [now_ - mark for now_, mark in
                                     zip(self.rnic.plane_bytes(), self.plane_mark or ())],
                  "flows": [{"qpn": qp.qpn, "peer": qp.peer, "channel": qp.channel,
                             "plane": None if qp.port_index is None else qp.port_index + 1,
                             "bytes": qp.activity.it_bytes,
                             "seconds": round(qp.activity.it_last - qp.activity.it_first, 6)}
                            for qp in self.qps
                            if qp.activity.it_bytes and qp.activity.it_last is not None]}
        if self.verify:
            report["verify"] = self.check_output()
        self.reset_memory()
        self.tell(report)

    def check_output(self):
        """This rank's receive buffer against numpy's answer; None when the schedule's result
        is undefined (in-place AlltoAll), so there is nothing to check."""
        import numpy as np

        if not self.schedule.defined:
            return None
        expected = self.reference
        if expected is None:
            return {"ok": True, "elements": 0}
        out = self.buffer("output")
        diff = np.abs(out - expected)
        bad = np.flatnonzero(diff > 0)
        result = {"ok": bad.size == 0, "elements": int(expected.size),
                  "max_abs_err": float(diff.max()) if diff.size else 0.0,
                  "mismatches": int(bad.size)}
        if bad.size:
            i = int(bad[0])
            result["first_mismatch"] = {"index": i, "got": float(out[i]), "want": float(expected[i])}
        return result

    # -- the loop ---------------------------------------------------------------------------------

    def serve(self):
        """Run until told to stop or the launcher goes away (LauncherGone)."""
        monotonic = time.monotonic
        while not self.stopping:
            now = monotonic()
            if self.start_mono is not None and now >= self.start_mono:
                self.begin(now)
            wake = now + MAX_IDLE_WAIT_S
            due = self.rnic.poll(now)
            if due is not None and due < wake:
                wake = due
            if self.start_mono is not None and self.start_mono < wake:
                wake = self.start_mono
            for key, _mask in self.selector.select(max(0.0, wake - monotonic())):
                key.data(monotonic())


def rank_input(seed, rank, count):
    """A rank's input tensor: small integers as float32, so every sum is exact in any order."""
    import numpy as np

    rng = np.random.default_rng([seed, rank])
    return rng.integers(-64, 64, count).astype(np.float32)


def _delta(now, mark):
    return {key: value - (mark or {}).get(key, 0) for key, value in now.items()}


def main(argv, make_rnic, module, prog):
    """Run one rank's agent over the RNIC `make_rnic` builds, until the launcher stops it."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}",
                                     description="collective agent for one rank (a host NIC)")
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    sockets.die_with_parent()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
    try:
        with open(args.config, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as exc:
        print(f"{prog}: error: cannot read config {args.config}: {exc}", file=sys.stderr)
        return 2
    driver = RankDriver(config, make_rnic)
    try:
        driver.open()
        driver.serve()
    except LabError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except PeerError as exc:
        message = f"{driver.describe(driver.rank)}: {exc} towards {driver.describe(exc.peer)}"
        print(f"{prog}: error: {message}", file=sys.stderr)
        try:
            driver.tell({"error": message, "peer": exc.peer})
        except OSError:
            pass
        return 1
    except LauncherGone:
        return 0
    finally:
        driver.close()
    return 0
