"""The all-pairs RoCEv2 traffic agent: one per host.

Runs inside one Mininet host's network namespace::

    python -m fabriclab.traffic.generator --config CONFIG.json --out RESULT.json

and, at an agreed wall-clock time, sends paced RC RDMA WRITE traffic for the flows it is given
while counting the RoCEv2 traffic it receives. It needs no RDMA device: packets are built by
`fabriclab.traffic.roce` and sent through a raw IPv4 socket with IP_HDRINCL, so the IP header
(DSCP/ECN, ID, DF), the UDP source port and the ICRC on the wire are exactly the ones computed
here. A real RoCE NIC or soft-RoCE would accept them. Each flow is a `WriteStream` on the lab's
one RNIC core, shared with the collective agents: `ports.RawPort` per source address, `pacer`
for when each packet goes, `send_policy` for refused sends. The receive side is
`roce_receiver`'s.

Config (JSON object; unknown keys are errors)::

    listen        bool   count RoCEv2 packets arriving on UDP 4791 (default false)
    flows         list   [{"id", "src", "dst", "src_qpn", "dst_qpn", "sport", "rate_mbps"}]
                         sport null -> derived from the QP pair like Linux RDMA does
    start_at      float  unix time to start sending (all agents of a run get the same); null = now
    duration_s    float  how long to send
    payload_bytes int    RDMA payload per packet (the path MTU's payload, e.g. 1024; multiple of 4)
    message_bytes int    size of one RDMA WRITE, split into FIRST/MIDDLE/LAST packets
    dscp, ecn     int    IP traffic class of every packet (default 26 and ECT(0))
    linger_s      float  how long the receiver keeps counting after the senders stop
    quiet_s       float  end the linger sooner, once nothing has arrived for this long after the
                         senders stopped (null: linger it all; a launcher sets it only where no
                         PFC pause can hold packets back, see traffic/launcher.py)
    sport_mode    str    "qp" (default) or "shared": every QP of a NIC pair uses one source port

A flow's `rate_mbps` is paced on Ethernet frame bytes (IP datagram + 14-byte Ethernet header, the
bytes Linux interface counters and htb count), so a flow of N Mbit/s fills N Mbit/s of a link.

Sending and receiving run in two processes (the receiver is forked) so that they do not share
one GIL. The agent stops by itself after start_at + duration_s + linger_s, and on SIGTERM or
SIGINT writes what it has (with "interrupted": true).

Result (JSON object)::

    host_addresses  IPv4 addresses of this namespace
    config          the run parameters that shape the numbers (start_at, duration_s, sizes, ...)
    sent            {flow id: {src, dst, sport, src_qpn, dst_qpn, rate_mbps, achieved_mbps,
                     packets, bytes (RDMA payload), wire_bytes (Ethernet frames), enobufs (sends
                     refused by a full qdisc/socket buffer, retried), send_errors (routing
                     errors, retried), behind_s (schedule given up to CPU stalls), start, end}}
    received        [{src, sport, dst, dst_qpn, packets, bytes, wire_bytes, oos (PSN not the
                     expected one), late (PSN behind: duplicate or overtaken), ce (ECN CE
                     marked), first, last}], one per (source address, source port, dest QP)
    malformed       UDP 4791 datagrams too short or truncated to be RoCEv2
    errors          problems that spoil the run (exit status 1, the first also on stderr)
    warnings        problems worth knowing (late start, rate not reached, routing errors)
    interrupted     true if stopped by a signal

Times are unix seconds (arrivals are kernel receive timestamps). Exit status: 0 when the run
completed without errors, 1 when it completed with errors, 2 when the config or the host is
unusable (one line on stderr, nothing written).
"""

import argparse
import ipaddress
import json
import math
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace

from fabriclab.errors import LabError
from fabriclab.traffic import roce, send_policy, sockets, start_gate
from fabriclab.traffic.pacer import Pace, Pacer
from fabriclab.traffic.ports import IpIds, RawPort
from fabriclab.traffic.roce_receiver import Receiver, ReceiverProcess

CONFIG_DEFAULTS = {
    "listen": False,
    "flows": [],
    "start_at": None,
    "payload_bytes": 1024,
    "message_bytes": 65536,
    "dscp": roce.DEFAULT_DSCP,
    "ecn": roce.DEFAULT_ECN,
    "linger_s": 1.0,
    "quiet_s": None,
    "sport_mode": "qp",
}
CONFIG_REQUIRED = ("duration_s",)
FLOW_KEYS = ("id", "src", "dst", "src_qpn", "dst_qpn", "sport", "rate_mbps")
SPORT_MODES = ("qp", "shared")

MAX_LINGER_S = 600.0
"""A receiver counts at most this long after the senders stop."""
MAX_START_DELAY_S = 600.0
"""An agent waits at most this long for start_at: a bigger delay is a clock or config mistake."""
MAX_PAYLOAD_BYTES = 9000
STOP_POLL_S = 0.1
"""How often a waiting sender checks its stop event."""
LATE_START_WARNING_S = 0.05


# -- configuration --------------------------------------------------------------------------------

@dataclass(frozen=True)
class FlowSpec:
    """One QP-to-QP stream of RDMA WRITEs."""

    id: str
    src: str
    dst: str
    src_qpn: int
    dst_qpn: int
    sport: int
    rate_mbps: float
    sport_derived: bool


@dataclass(frozen=True)
class AgentConfig:
    listen: bool
    flows: tuple
    start_at: float
    duration_s: float
    payload_bytes: int
    message_bytes: int
    dscp: int
    ecn: int
    linger_s: float
    sport_mode: str
    quiet_s: float | None = None


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _int_field(where, name, value, low, high):
    if not _is_int(value) or not low <= value <= high:
        raise LabError(f"{where}: {name} must be an integer in {low}..{high}, got {value!r}")
    return value


def _number_field(where, name, value, *, minimum=None, positive=False):
    if not _is_number(value):
        raise LabError(f"{where}: {name} must be a number, got {value!r}")
    if positive and value <= 0:
        raise LabError(f"{where}: {name} must be > 0, got {value!r}")
    if minimum is not None and value < minimum:
        raise LabError(f"{where}: {name} must be >= {minimum}, got {value!r}")
    return float(value)


def _unicast_address(where, name, value):
    if not isinstance(value, str):
        raise LabError(f"{where}: {name} must be an IPv4 address string, got {value!r}")
    try:
        address = ipaddress.IPv4Address(value)
    except ValueError:
        raise LabError(f"{where}: {name} is not an IPv4 address: {value!r}") from None
    if (address.is_multicast or address.is_unspecified or address.is_loopback
            or address == ipaddress.IPv4Address("255.255.255.255")):
        raise LabError(f"{where}: {name} must be a unicast host address, got {value}")
    return str(address)


def _check_keys(where, data, known):
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise LabError(f"{where}: unknown key {unknown[0]!r} "
                       f"(known keys: {', '.join(sorted(known))})")


def parse_flow(data, index, sport_mode):
    """Validate one flow object; the error names the flow and the field."""
    where = f"flows[{index}]"
    if not isinstance(data, dict):
        raise LabError(f"{where}: must be an object, got {type(data).__name__}")
    if isinstance(data.get("id"), str) and data["id"]:
        where = f"flow {data['id']!r}"
    _check_keys(where, data, FLOW_KEYS)
    missing = [key for key in FLOW_KEYS if key not in data and key != "sport"]
    if missing:
        raise LabError(f"{where}: missing key {missing[0]!r}")
    if not isinstance(data["id"], str) or not data["id"]:
        raise LabError(f"{where}: id must be a non-empty string, got {data['id']!r}")
    src = _unicast_address(where, "src", data["src"])
    dst = _unicast_address(where, "dst", data["dst"])
    if src == dst:
        raise LabError(f"{where}: src and dst are the same address {src}")
    src_qpn = _int_field(where, "src_qpn", data["src_qpn"], 1, roce.QPN_MASK)
    dst_qpn = _int_field(where, "dst_qpn", data["dst_qpn"], 1, roce.QPN_MASK)
    rate = _number_field(where, "rate_mbps", data["rate_mbps"], positive=True)
    sport = data.get("sport")
    if sport is None:
        sport = roce.udp_source_port(src_qpn, dst_qpn, shared=sport_mode == "shared",
                                     src=src, dst=dst)
        derived = True
    else:
        sport = _int_field(where, "sport", sport, 1, 0xFFFF)
        derived = False
    return FlowSpec(id=data["id"], src=src, dst=dst, src_qpn=src_qpn, dst_qpn=dst_qpn,
                    sport=sport, rate_mbps=rate, sport_derived=derived)


def parse_config(data, now=None):
    """Validate a config object (already decoded from JSON) into an `AgentConfig`.

    Raises `LabError` whose one-line message names the offending field (and flow).
    """
    if not isinstance(data, dict):
        raise LabError(f"config: must be a JSON object, got {type(data).__name__}")
    _check_keys("config", data, set(CONFIG_DEFAULTS) | set(CONFIG_REQUIRED))
    for key in CONFIG_REQUIRED:
        if key not in data:
            raise LabError(f"config: missing key {key!r}")
    merged = {**CONFIG_DEFAULTS, **data}
    if not isinstance(merged["listen"], bool):
        raise LabError(f"config: listen must be true or false, got {merged['listen']!r}")
    if merged["sport_mode"] not in SPORT_MODES:
        raise LabError(f"config: sport_mode must be one of {', '.join(SPORT_MODES)}, "
                       f"got {merged['sport_mode']!r}")
    duration = _number_field("config", "duration_s", merged["duration_s"], positive=True)
    linger = _number_field("config", "linger_s", merged["linger_s"], minimum=0)
    quiet = merged["quiet_s"]
    if quiet is not None:
        quiet = _number_field("config", "quiet_s", quiet, positive=True)
    for name, value in (("linger_s", linger), ("quiet_s", quiet)):
        if value is not None and value > MAX_LINGER_S:
            raise LabError(f"config: {name} must be <= {MAX_LINGER_S:.0f} s, got {value!r}")
    payload = _int_field("config", "payload_bytes", merged["payload_bytes"], 4, MAX_PAYLOAD_BYTES)
    if payload % 4:
        raise LabError(f"config: payload_bytes must be a multiple of 4 (only a message's last "
                       f"packet may be padded), got {payload}")
    message = _int_field("config", "message_bytes", merged["message_bytes"], 1, 0xFFFFFFFF)
    dscp = _int_field("config", "dscp", merged["dscp"], 0, 63)
    ecn = _int_field("config", "ecn", merged["ecn"], 0, 3)
    start_at = merged["start_at"]
    if start_at is not None:
        start_at = _number_field("config", "start_at", start_at, positive=True)
        now = time.time() if now is None else now
        if start_at - now > MAX_START_DELAY_S:
            raise LabError(f"config: start_at is {start_at - now:.0f} s in the future (more than "
                           f"{MAX_START_DELAY_S:.0f} s); check the clock or the config")
    if not isinstance(merged["flows"], list):
        raise LabError(f"config: flows must be a list, got {type(merged['flows']).__name__}")
    flows = tuple(parse_flow(flow, i, merged["sport_mode"])
                  for i, flow in enumerate(merged["flows"]))
    seen = set()
    for flow in flows:
        if flow.id in seen:
            raise LabError(f"flow {flow.id!r}: duplicate flow id")
        seen.add(flow.id)
    if not flows and not merged["listen"]:
        raise LabError("config: nothing to do: no flows and listen is false")
    return AgentConfig(listen=merged["listen"], flows=flows, start_at=start_at,
                       duration_s=duration, payload_bytes=payload, message_bytes=message,
                       dscp=dscp, ecn=ecn, linger_s=linger, sport_mode=merged["sport_mode"], quiet_s=quiet)


def load_config(path, start_at=None):
    """Read and validate a config file; `start_at`, when given, replaces the file's."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as exc:
        raise LabError(f"cannot read config {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise LabError(f"config {path} is not valid JSON: {exc.msg} at line {exc.lineno} "
                       f"column {exc.colno}") from None
    if start_at is not None and isinstance(data, dict):
        data["start_at"] = start_at
    return parse_config(data)


# -- sending --------------------------------------------------------------------------------------

class WriteStream:
    """One flow as a `pacer` sender: an endless stream of RDMA WRITE messages at the flow's rate.

    Builds the message being written packet by packet (FIRST/MIDDLE/LAST with the next PSN and
    IP ID) and counts what went.
    """

    def __init__(self, spec, config, rng):
        self.spec = spec
        self.dst = spec.dst
        self.dscp = config.dscp
        self.ecn = config.ecn
        self.message_bytes = config.message_bytes
        self.segments = roce.write_message_segments(config.message_bytes, config.payload_bytes)
        self.payloads = {size: bytes(size) for _, size in self.segments}
        self.segment = 0
        self.message = 0
        # A real QP starts at a random PSN and the IP ID counter anywhere; random starts
        # also exercise the 24-bit and 16-bit wrap-around in every long run.
        self.psn = rng.randrange(roce.PSN_MODULUS)
        self.ip_ids = IpIds(rng.randrange(1, 0x10000))
        self.rkey = rng.randrange(1, 1 << 32)
        self.vaddr_base = rng.randrange(1, 1 << 20) << 12
        self.pace = Pace(spec.rate_mbps)
        # QPs are paced independently on a NIC: start each flow at a random point of its first
        # packet interval, or flows of equal rate stay in phase and burst into the queue together.
        first_frame = roce.ETH_HEADER_LEN + roce.ROCE_OVERHEAD + roce.RETH_LEN + self.segments[0][1]
        self.phase_s = rng.random() * first_frame * self.pace.seconds_per_byte
        self.end = 0.0
        self.held = None
        self.queued = False
        self.size = 0                  # payload bytes of the packet built last
        self.packets = 0
        self.bytes = 0
        self.wire_bytes = 0
        self.enobufs = 0
        self.send_errors = 0
        self.first = None
        self.last = None
        self.failed = False
        self.failure = None            # the fatal send error, if any
        self.unreachable = None        # the first routing error, if any

    def start(self, start_mono, end_mono):
        self.pace.due = start_mono + self.phase_s
        self.end = end_mono

    def has_packet(self):
        return self.pace.due < self.end

    def next_packet(self, _now=None):
        """Build the next packet; the stream moves on (a refused packet is held and resent)."""
        opcode, size = self.segments[self.segment]
        reth = None
        if opcode in roce.RETH_OPCODES:
            vaddr = self.vaddr_base + (self.message * self.message_bytes) % (1 << 40)
            reth = (vaddr, self.rkey, self.message_bytes)
        last = opcode in (roce.OP_RC_RDMA_WRITE_LAST, roce.OP_RC_RDMA_WRITE_ONLY)
        packet = roce.build_ipv4_udp_roce_packet(
            self.spec.src, self.spec.dst, self.spec.sport, opcode, self.spec.dst_qpn, self.psn,
            self.payloads[size], reth=reth, ack_req=last, dscp=self.dscp, ecn=self.ecn,
            ip_id=self.ip_ids.take())
        self.size = size
        self.psn = roce.psn_add(self.psn)
        self.segment += 1
        if self.segment == len(self.segments):
            self.segment = 0
            self.message += 1
        return packet

    def sent(self, wire_len, now):
        self.packets += 1
        self.bytes += self.size
        self.wire_bytes += wire_len
        if self.first is None:
            self.first = now
        self.last = now
        self.pace.charge(wire_len, now)

    def refused(self, refusal, _now):
        if refusal.kind is send_policy.BUSY:
            self.enobufs += 1
        elif refusal.kind is send_policy.UNREACHABLE:
            if not self.send_errors:
                self.unreachable = refusal.error
            self.send_errors += 1
        else:
            self.failed = True
            self.failure = refusal.error

    @property
    def behind_s(self):
        """Schedule given up to CPU stalls (see pacer.MAX_BURST_S)."""
        return self.pace.behind_s


class HostSender:
    """Paces every flow of this host from one thread.

    One `RawPort` per source address (bound to it, so that `ip rule from <src>` policy routing
    chooses the NIC) with a `Pacer` serving the flows that leave through it: each flow is due
    at its own rate; flows due together take turns, and under sustained backpressure they share
    the link about equally, as a NIC's round-robin QP arbiter would.
    """

    def __init__(self, config, stop_event, seed=None):
        self.config = config
        self.stop_event = stop_event
        rng = random.Random(seed)
        self.flows = [WriteStream(spec, config, rng) for spec in config.flows]
        self.errors = []
        self.warnings = []
        self.ports = {}                # source address -> RawPort
        self.pacers = {}               # source address -> Pacer
        self._clock_offset = 0.0
        self.started = None

    def open_sockets(self):
        """Create and bind the raw sockets; failures are the user's to fix (LabError)."""
        for flow in self.flows:
            src = flow.spec.src
            if src not in self.ports:
                self.ports[src] = RawPort(src, f"flow {flow.spec.id!r}")
        self.pacers = {src: Pacer(port) for src, port in self.ports.items()}

    def close(self):
        for port in self.ports.values():
            port.close()
        self.ports.clear()

    def _unix(self, mono):
        return mono + self._clock_offset

    def run(self, start_mono, end_mono):
        """Send until `end_mono` (time.monotonic) or until the stop event is set."""
        self._clock_offset = time.time() - time.monotonic()
        self.started = start_mono
        for flow in self.flows:
            flow.start(start_mono, end_mono)
            self.pacers[flow.spec.src].activate(flow, start_mono)
        pacers = list(self.pacers.values())
        stop = self.stop_event
        monotonic = time.monotonic
        while not stop.is_set():
            now = monotonic()
            wake = None
            for pacer in pacers:
                due = pacer.pump(now)
                if due is not None and (wake is None or due < wake):
                    wake = due
            if wake is None:
                break
            time.sleep(min(max(0.0, wake - monotonic()), STOP_POLL_S))
        self._report_refusals()
        self._check_flows(end_mono)

    def _report_refusals(self):
        for flow in self.flows:
            spec = flow.spec
            if flow.failed:
                detail = send_policy.failure_detail(flow.failure, len(flow.held or b""), spec.dst)
                self.errors.append(f"flow {spec.id!r}: {detail}")
            elif flow.send_errors:
                self.warnings.append(f"flow {spec.id!r}: {flow.unreachable.strerror} sending to "
                                     f"{spec.dst} from {spec.src}; retried "
                                     f"({flow.send_errors} refusals)")

    def _check_flows(self, end_mono):
        """Warnings for slow or stalled flows, errors for flows that never sent anything."""
        for flow in self.flows:
            if flow.failed:
                continue
            if flow.first is None:
                if flow.send_errors or flow.enobufs:
                    self.errors.append(
                        f"flow {flow.spec.id!r}: sent nothing: every attempt was refused "
                        f"({flow.send_errors} routing errors, {flow.enobufs} ENOBUFS)")
                continue
            elapsed = min(time.monotonic(), end_mono) - self.started
            if elapsed < 0.2:
                continue
            achieved = flow.wire_bytes * 8 / elapsed / 1e6
            if achieved < 0.9 * flow.spec.rate_mbps:
                self.warnings.append(
                    f"flow {flow.spec.id!r}: sent {achieved:.1f} of {flow.spec.rate_mbps:g} Mbit/s "
                    f"(sender CPU-bound or link backpressure: {flow.enobufs} ENOBUFS)")
            elif flow.behind_s > 0.02 * elapsed:
                self.warnings.append(
                    f"flow {flow.spec.id!r}: fell {flow.behind_s:.3f} s behind its schedule "
                    f"(the agent was starved of CPU)")

    def result(self):
        out = {}
        for flow in self.flows:
            spec = flow.spec
            start = self._unix(flow.first) if flow.first is not None else None
            end = self._unix(flow.last) if flow.last is not None else None
            span = (flow.last - flow.first) if flow.packets > 1 else 0.0
            # Rate over the sending span: n packets occupy n inter-packet gaps of schedule.
            achieved = (flow.wire_bytes * 8 / (span * flow.packets / (flow.packets - 1)) / 1e6
                        if span > 0 else 0.0)
            out[spec.id] = {
                "src": spec.src, "dst": spec.dst, "sport": spec.sport,
                "src_qpn": spec.src_qpn, "dst_qpn": spec.dst_qpn,
                "rate_mbps": spec.rate_mbps, "achieved_mbps": round(achieved, 4),
                "packets": flow.packets, "bytes": flow.bytes, "wire_bytes": flow.wire_bytes,
                "enobufs": flow.enobufs, "send_errors": flow.send_errors,
                "behind_s": round(flow.behind_s, 6),
                "start": start, "end": end,
            }
        return out


# -- the agent ------------------------------------------------------------------------------------

class HostAgent:
    """Ties one host's sender and receiver to the shared start time and writes the result."""

    def __init__(self, config, seed=None, gate=None):
        self.config = config
        self.gate = gate               # gate(stopped) -> the start time, once the sockets are open
        self.stop_event = threading.Event()
        self.sender = HostSender(config, self.stop_event, seed) if config.flows else None
        self.receiver = None
        self.received = []
        self.malformed = 0
        self.warnings = []
        self.errors = []
        self.interrupted = False
        self.late_start_s = 0.0        # how long after start_at sending began (it could not begin earlier)

    def run(self):
        """Open sockets (LabError if the host cannot run this config), wait, send, count."""
        config = self.config
        receiver = Receiver() if config.listen else None
        try:
            if self.sender:
                self.sender.open_sockets()
        except LabError:
            if receiver:
                receiver.close()
            raise
        try:
            if self.gate is not None:
                # said ready with every socket open: the launcher's start time comes back
                start = self.gate(self.stop_event.is_set)
                config = self.config = replace(config, start_at=start)
            start_unix = config.start_at if config.start_at is not None else time.time()
            # Listening starts now (a peer may start a little early); sending at start_at.
            delay = start_unix - time.time()
            start_mono = time.monotonic() + max(delay, 0.0)
            self.late_start_s = round(max(0.0, -delay), 4)
            if delay < -LATE_START_WARNING_S:
                self.warnings.append(f"started {-delay:.3f} s after start_at")
            end_mono = start_mono + config.duration_s
            if receiver:
                self.receiver = ReceiverProcess(receiver)
                self.receiver.start(end_mono + config.linger_s,
                                    quiet=(end_mono, config.quiet_s) if config.quiet_s else None)
            if self.sender:
                while not self.stop_event.is_set() and time.monotonic() < start_mono:
                    time.sleep(max(0.0, min(start_mono - time.monotonic(), STOP_POLL_S)))
                self.sender.run(start_mono, end_mono)
        except BaseException:
            self.stop_event.set()
            raise
        finally:
            if self.sender:
                self.sender.close()
            if self.receiver:
                if self.stop_event.is_set():
                    self.receiver.stop()
                report = self.receiver.collect()
                self.received = report.get("received", [])
                self.malformed = report.get("malformed", 0)
                if "error" in report:
                    self.errors.append(report["error"])
            elif receiver:
                receiver.close()

    def stop(self, *_):
        """Stop sending and receiving now (signal handlers call this)."""
        self.stop_event.set()
        if self.receiver:
            self.receiver.stop()

    def result(self):
        errors = list(self.errors)
        warnings = list(self.warnings)
        if self.sender:
            errors += self.sender.errors
            warnings += self.sender.warnings
        return {
            "host_addresses": sockets.host_addresses(),
            "config": {"start_at": self.config.start_at, "duration_s": self.config.duration_s,
                       "linger_s": self.config.linger_s, "quiet_s": self.config.quiet_s,
                       "payload_bytes": self.config.payload_bytes,
                       "message_bytes": self.config.message_bytes, "dscp": self.config.dscp,
                       "ecn": self.config.ecn, "sport_mode": self.config.sport_mode},
            "interrupted": self.interrupted,
            "sent": self.sender.result() if self.sender else {},
            "received": self.received,
            "malformed": self.malformed,
            "errors": errors,
            "warnings": warnings,
            "late_start_s": self.late_start_s,
        }


def write_json(path, data):
    """Write atomically (temp file + rename) so a reader never sees half a result."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.write("\n")
    os.replace(tmp, path)


def _gate(path):
    """The agent's side of the launcher's common start: on stdin, or from the file `path`."""
    def gate(stopped):
        try:
            return start_gate.ready_then_start("generator", stopped=stopped, path=path)
        except start_gate.GateError as exc:
            raise LabError(str(exc)) from None
    return gate


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m fabriclab.traffic.generator",
        description="RoCEv2 traffic agent for one lab host: paced RDMA WRITE flows out, "
                    "counters in.")
    parser.add_argument("--config", required=True, help="agent config (JSON)")
    parser.add_argument("--out", required=True, help="where to write the result (JSON)")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--start-at", type=float, default=None, metavar="UNIX_TIME",
                      help="when to start sending, instead of the config's start_at")
    when.add_argument(start_gate.FLAG, action="store_true",
                      help="say ready on stdout once the sockets are open, then read the start time "
                           "on stdin (the launcher's agents on its own machine)")
    when.add_argument(start_gate.FILE_FLAG, dest="start_file", default=None, metavar="PATH",
                      help="say ready on stdout, then wait for PATH to hold the start time (the "
                           "launcher's agents on another machine, started over SSH)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed for initial PSNs, IP IDs and R_Keys (default: random)")
    args = parser.parse_args(argv)
    prog = "fabriclab-generator"
    try:
        config = load_config(args.config, args.start_at)
        out_dir = os.path.dirname(os.path.abspath(args.out))
        if not os.path.isdir(out_dir):
            raise LabError(f"result directory {out_dir} does not exist")
        agent = HostAgent(config, seed=args.seed, gate=_gate(args.start_file) if args.start_on_stdin or args.start_file else None)

        def on_signal(signum, _frame):
            agent.interrupted = True
            agent.stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        agent.run()
        result = agent.result()
        write_json(args.out, result)
    except LabError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    if result["errors"]:
        print(f"{prog}: error: {result['errors'][0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
