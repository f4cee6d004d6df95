"""Soft-RoCE (rdma_rxe) for the collective engine: which backend runs a collective, what the
32-bit immediate of its RDMA WRITEs carries, and the rxe devices on the hosts' NICs.

Two backends move a collective's bytes. `udp` is the lab's own RNIC in Python (traffic/agent.py):
RoCEv2 packets through raw sockets, on every kernel. `rdma_rxe` runs the same schedules over real
RDMA verbs (traffic/verbs_agent.py) on the kernel's soft-RoCE devices, where the kernel has them.
`select_backend` makes the choice from the spec and doctor's `roce` mechanism.

Where the rxe devices sit. An rxe device sends and receives through UDP sockets and routes of the
initial network namespace only (seen on Debian's 6.1: a device on an interface inside a Mininet
host sends nothing; rxe learned network namespaces only in recent kernels), so each rank port gets
an attachment that keeps the host's NIC in charge of the wire:

    root namespace                        host namespace (Mininet)
    rdma device flrxe-<tag>-<k>
      on veth flr<tag><k>  <------------>  flr<tag><k>p  --tc redirect-->  h1-n0 --> fabric
      (the port's IP and MAC)                            <--tc redirect--  (UDP 4791 to the IP)

The root-side veth carries the port's address and MAC, so the device's RoCEv2 GID is the port's
(::ffff:10.p.l.s) and its packets leave through the host's NIC, its shaper and its leaf exactly as
the port's own would. tc on the host side moves RoCEv2 packets between the two (mirred redirect):
what the device sends goes out of the NIC's egress, and UDP 4791 arriving for the port's address
goes to the device. In the root namespace the port's address is local only to its own veth: its
route in the `local` table moves to a table of the attachment, which policy rules consult for the
device's own sends (from the address, locally generated) and for packets arriving on the veth;
a permanent neighbour entry per peer gives the peer's NIC MAC, so nothing ARPs. The veth is shaped
to the port's line rate over a queue rxe cannot overflow, as an RNIC paces itself (see
Attachment.root_script). The agent runs in the host's namespace as the udp agent does (RDMA
devices are shared by all namespaces).

Everything an attachment creates in the root namespace is tagged: the veth joins the run's link
group and is recorded as a run interface (the rdma device goes with its netdev), and the rules
carry protocol RULE_PROTOCOL, so `fabriclab clean` removes those of a killed run
(`remove_leftovers`).
"""

from __future__ import annotations

import json
import os
import random
import secrets
import subprocess
from dataclasses import dataclass

from fabriclab.loading import excerpt
from fabriclab.system import shaping
from fabriclab.errors import LabError

BACKENDS = ("auto", "udp", "rxe")
"""What a spec may ask for: doctor's choice, the raw-socket agent, or soft-RoCE verbs."""
UDP = "udp"
RXE = "rdma_rxe"
"""What ran, as a result says it: doctor's names for the `roce` mechanisms."""

TAG_BITS = 24
ROUND_BITS = 8
MAX_TAG = (1 << TAG_BITS) - 1


def encode_immediate(round_, tag):
    """The 32-bit immediate of an RDMA WRITE: the iteration round (mod 256) in the top byte, the
    schedule's transfer tag in the low 24 bits. The receiver's completion carries it back, so the
    engine learns which transfer `byte_len` bytes belong to, and a write from another iteration
    is caught instead of being counted."""
    if not 0 <= tag <= MAX_TAG:
        raise ValueError(f"transfer tag {tag} does not fit the immediate's {TAG_BITS} bits")
    return ((round_ % (1 << ROUND_BITS)) << TAG_BITS) | tag


def decode_immediate(immediate):
    """(round mod 256, transfer tag) of an immediate made by encode_immediate."""
    if not 0 <= immediate < 1 << 32:
        raise ValueError(f"immediate {excerpt(immediate)} is not a 32-bit value")
    return immediate >> TAG_BITS, immediate & MAX_TAG


# -- which backend ------------------------------------------------------------------------------

def udp_only_features(spec):
    """(field, why) for each thing `spec` asks for that only the udp backend does."""
    out = []
    if spec.cts:
        out.append(("cts", "clear-to-send admission rides on the lab's own packets"))
    if spec.dcqcn is not None:
        out.append(("dcqcn", "rdma_rxe has no DCQCN"))
    if spec.cc != "dcqcn":
        out.append(("cc", f"rdma_rxe cannot run {spec.cc} congestion control (only its own DCQCN)"))
    if spec.spray != 1:
        out.append(("spray", "rdma_rxe derives one UDP source port per QP"))
    if spec.sport_mode != "qp":
        out.append(("sport_mode", "rdma_rxe derives the UDP source port from the QP number"))
    if spec.pxn:
        out.append(("pxn", "rxe devices reach each other through the fabric, so PXN's intra-host "
                           "hop would cross it"))
    if spec.plb != "static":
        out.append(("plb", "an rxe device is one port: its QPs cannot choose a plane"))
    elif spec.reorder_mode() == "place":
        out.append(("reorder", "rdma_rxe NAKs a packet ahead of the expected PSN (go-back-N)"))
    return out


def select_backend(spec, roce):
    """The backend that runs `spec` ("udp" or "rdma_rxe"), given doctor's `roce` Mechanism.

    udp: always. rxe: soft-RoCE, or a LabError saying why it cannot run here or with this spec.
    auto: rdma_rxe where doctor chose it and the spec needs nothing only the udp backend has,
    else udp (the result says which ran).
    """
    if spec.backend not in BACKENDS:
        raise LabError(f"collective: backend must be one of {', '.join(BACKENDS)}, got {excerpt(spec.backend)}")
    if spec.backend == "udp":
        return UDP
    blockers = udp_only_features(spec)
    if spec.backend == "rxe":
        if roce.mechanism != RXE:
            raise LabError(f"collective: backend rxe needs soft-RoCE, which this machine lacks "
                           f"({roce.note}); use --backend udp or auto")
        if blockers:
            name, why = blockers[0]
            raise LabError(f"collective: {name} needs the udp backend ({why}); drop it or use "
                           f"--backend udp")
        return RXE
    return RXE if roce.mechanism == RXE and not blockers else UDP


def backend_for(spec):
    """select_backend with this machine's doctor (probed only when the spec leaves a choice)."""
    if spec.backend == "udp":
        return UDP
    from fabriclab.system import doctor

    return select_backend(spec, doctor.mechanisms(doctor.probe())["roce"])


def ib_timeout(seconds):
    """The IB local ACK timeout exponent t (4.096 us x 2^t) that first covers `seconds`."""
    for t in range(1, 32):
        if 4.096e-6 * (1 << t) >= seconds:
            return t
    return 31


IB_MTU = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}
"""RoCE path MTU in bytes -> enum ibv_mtu."""

DEVICE_COUNTERS = {
    "sent_pkts": "tx_packets", "rcvd_pkts": "rx_packets",
    "out_of_seq_request": "out_of_sequence", "duplicate_request": "duplicate_request",
    "rcvd_seq_err": "naks_received", "completer_retry_err": "retries",
    "retry_exceeded_err": "retry_exceeded", "rcvd_rnr_err": "rnr_naks_received",
    "send_rnr_err": "rnr_naks_sent", "ack_deferred": "ack_deferred", "send_err": "send_errors",
}
"""rxe's port counters -> the names results use (the udp agent's where they mean the same).
`retries` counts the requester's go-back-N restarts (after a NAK or a local ACK timeout), not
packets: rxe does not count retransmitted packets."""


def hw_counters(device):
    """An rdma device's port counters, as the root namespace's sysfs shows them ({} if none).
    (A process in another network namespace may see the device without its counters.)"""
    folder = f"/sys/class/infiniband/{device}/ports/1/hw_counters"
    out = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(folder, name), encoding="ascii") as handle:
                text = handle.read().strip()
        except OSError:
            continue
        if text.isdigit():
            out[name] = int(text)
    return out


def result_counters(raw):
    """Device counters under the names results use."""
    return {DEVICE_COUNTERS[name]: value for name, value in raw.items() if name in DEVICE_COUNTERS}


# -- attachments ------------------------------------------------------------------------------------

RULE_PROTOCOL = 241
"""The `protocol` of every policy rule an attachment adds: how `clean` finds them."""
RULE_PREF = 4791
FILTER_PREF = 4791
NETDEV_PREFIX = "flr"
DEVICE_PREFIX = "flrxe-"
TABLE_BASE = 0x46520000
RXE_INFLIGHT_SKBS = 64
"""rxe's per-QP limit on packets handed to the network and not yet freed (RXE_INFLIGHT_SKBS_PER_QP_HIGH)."""


def device_queue_bytes(qps_per_port, mtu):
    """A send queue for a paced rxe device that its QPs cannot overflow."""
    return (RXE_INFLIGHT_SKBS * max(qps_per_port, 1) + RXE_INFLIGHT_SKBS) * (mtu + 14)


@dataclass(frozen=True)
class Attachment:
    """One rank port's rxe device and the plumbing between it and the host's NIC."""

    rank: int
    host: str
    plane: int           # 1-based
    nic_intf: str        # the host's NIC port (inside the host)
    ip: str
    mac: str
    netdev: str          # veth end in the root namespace, carrying ip and mac
    peer: str            # its other end, inside the host
    device: str          # the rdma device on netdev
    table: int           # routing table with the address's routes
    subnet: str          # the plane's addresses, reached on-link
    mtu: int
    neighbours: tuple    # (ip, mac) of every other rank port on the plane
    rate_mbps: float = 0.0    # the port's line rate: the device is paced at it (0: not paced)
    queue_bytes: int = 0      # the device's send queue under that pacing

    def root_script(self, link_group):
        """Root-namespace shell lines: the veth, its address and routes, the rules (run with set -e)."""
        dev = self.netdev
        lines = [
            f"ip link set {dev} address {self.mac} mtu {self.mtu} group {link_group}",
            f"sysctl -qw net.ipv6.conf.{dev}.disable_ipv6=1 net.ipv4.conf.{dev}.accept_local=1 "
            f"net.ipv4.conf.{dev}.rp_filter=0",
            f"ethtool -K {dev} tx off rx off sg off tso off gso off gro off >/dev/null 2>&1 || true",
            f"ip addr add {self.ip}/32 dev {dev}",
            f"ip link set {dev} up",
            # The address is local only to this device: other ranks' devices live in this
            # namespace too, and must reach it through the fabric, not the loopback.
            f"ip route del local {self.ip} dev {dev} table local",
            f"ip route add {self.subnet} dev {dev} table {self.table}",
            f"ip route add local {self.ip} dev {dev} table {self.table}",
        ]
        lines += [f"ip neigh replace {ip} lladdr {mac} dev {dev} nud permanent"
                  for ip, mac in self.neighbours]
        if self.rate_mbps > 0:
            # An RNIC sends at its line rate and never drops its own packets. rxe sends as fast as
            # the CPU lets it, so its device is paced here, over a queue deeper than rxe lets a QP
            # fill (it stops a QP at RXE_INFLIGHT_SKBS packets not yet sent): rxe waits, nothing
            # is lost before the wire.
            lines += [" ".join(cmd) for cmd in shaping.shaping_commands(
                dev, self.rate_mbps, max(self.queue_bytes, self.mtu + 14), self.mtu)]
        lines += [f"ip rule add {sel} lookup {self.table} pref {RULE_PREF} protocol {RULE_PROTOCOL}"
                  for sel in self.rule_selectors()]
        return lines

    def rule_selectors(self):
        return (f"from {self.ip} iif lo", f"iif {self.netdev}")

    def host_script(self):
        """Host-namespace lines: the veth's end up, RoCEv2 redirected both ways."""
        udp4791 = "protocol ip u32 match ip protocol 17 0xff match ip dport 4791 0xffff"
        return [
            f"ip link set {self.peer} mtu {self.mtu} up",
            f"ethtool -K {self.peer} tx off rx off sg off tso off gso off gro off >/dev/null 2>&1 || true",
            f"tc qdisc add dev {self.peer} clsact",
            f"tc filter add dev {self.peer} ingress pref {FILTER_PREF} {udp4791} "
            f"action mirred egress redirect dev {self.nic_intf}",
            # The NIC may already have a clsact (the queue model's); share it.
            f"tc qdisc add dev {self.nic_intf} clsact 2>/dev/null || true",
            f"tc filter add dev {self.nic_intf} ingress pref {FILTER_PREF} {udp4791} "
            f"match ip dst {self.ip}/32 action mirred egress redirect dev {self.peer}",
        ]


def plan_attachments(ranks, fabric, tag, tables, qps_per_port=1, peers=()):
    """An Attachment per rank port (rank order, then plane). `tag`: a short hex string unique to
    the job (interface and device names are global); `tables`: one free routing table each;
    `qps_per_port`: the most QPs one port of the job has (sizes the paced device's queue);
    `peers`: ranks the devices talk to that get no device of their own (another RNIC on their
    host, such as the lab's own): their ports are neighbours too."""
    ports = [(r, p) for r in ranks for p in r.ports]
    if len(tables) < len(ports):
        raise ValueError(f"{len(ports)} attachments need as many routing tables, got {len(tables)}")
    out = []
    for k, (rank, port) in enumerate(ports):
        netdev = f"{NETDEV_PREFIX}{tag}{k}"
        if len(netdev) + 1 > 15:
            raise LabError(f"collective: too many rank ports for soft-RoCE names ({len(ports)})")
        neighbours = tuple((p.ip, p.mac) for r in (*ranks, *peers) for p in r.ports
                           if p.plane == port.plane and p.ip != port.ip)
        out.append(Attachment(rank.rank, rank.host, port.plane, port.intf, port.ip, port.mac,
                              netdev, netdev + "p", f"{DEVICE_PREFIX}{tag}-{k}", tables[k],
                              f"10.{port.plane}.0.0/16", fabric.spec.mtu, neighbours,
                              fabric.spec.host_rate_mbps,
                              device_queue_bytes(qps_per_port, fabric.spec.mtu)))
    return out


def _run(argv, script=None, timeout=30):
    try:
        return subprocess.run(argv, input=script, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, 127, "", str(exc))


def _first_error(proc):
    for line in (proc.stderr or proc.stdout or "").splitlines():
        if line.strip():
            return line.strip()
    return f"exit status {proc.returncode}"


def _in_host(pid, lines):
    """Run shell lines (set -e) inside the network namespace of process `pid`."""
    return _run(["nsenter", f"--net=/proc/{pid}/ns/net", "sh", "-ec", "\n".join(lines)])


def free_tables(count, rng=None):
    """`count` routing table ids that hold no routes now, near TABLE_BASE."""
    rng = rng or random.Random(secrets.randbits(32))
    used = set()
    out = []
    while len(out) < count:
        table = TABLE_BASE + rng.randrange(1 << 16)
        if table in used:
            continue
        used.add(table)
        if not _run(["ip", "route", "show", "table", str(table)]).stdout.strip():
            out.append(table)
    return out


class SoftRoce:
    """The rxe devices of one collective job: `attach()` before the agents start, `detach()` after
    (idempotent; also undoes a half-made attach)."""

    def __init__(self, lab, ranks, name="collective", qps_per_port=1, peers=()):
        self.lab, self.ranks, self.name = lab, ranks, name
        self.qps_per_port = qps_per_port
        self.peers = tuple(peers)          # ranks reached without a device (plan_attachments)
        self.tag = secrets.token_hex(2)
        self.attachments = []
        self.made = []                      # attachments whose root veth exists

    def attach(self):
        fabric, net, run = self.lab.fabric, self.lab.net, self.lab.run
        self.attachments = plan_attachments(self.ranks, fabric, self.tag,
                                            free_tables(sum(len(r.ports) for r in self.ranks)),
                                            self.qps_per_port, self.peers)
        # Recorded before they exist, so that `clean` finds them after a crash mid-way.
        run.plan([], [a.netdev for a in self.attachments])
        group = run.data["link_group"]
        for att in self.attachments:
            pid = net.get(att.host).pid
            proc = _run(["ip", "link", "add", att.netdev, "type", "veth", "peer", "name", att.peer,
                         "netns", str(pid)])
            if proc.returncode != 0:
                self.detach()
                raise LabError(f"soft-RoCE: cannot create {att.netdev} for {att.host}: {_first_error(proc)}")
            self.made.append(att)
            steps = (("root", lambda a=att: _run(["bash", "-ec", "\n".join(a.root_script(group))])),
                     (att.host, lambda a=att, p=pid: _in_host(p, a.host_script())),
                     ("rdma", lambda a=att: _run(["rdma", "link", "add", a.device, "type", "rxe",
                                                  "netdev", a.netdev])))
            for where, step in steps:
                proc = step()
                if proc.returncode != 0:
                    self.detach()
                    raise LabError(f"soft-RoCE: setting up {att.device} on {att.host} "
                                   f"{att.nic_intf} failed ({where}): {_first_error(proc)}")
        return self.attachments

    def devices(self, rank):
        """The rdma device of each of `rank`'s ports, plane order."""
        return [a.device for a in self.attachments if a.rank == rank]

    def counters(self):
        """{rank: device counters under result names, summed over the rank's ports}."""
        out = {}
        for att in self.attachments:
            mine = out.setdefault(att.rank, dict.fromkeys(DEVICE_COUNTERS.values(), 0))
            for key, value in result_counters(hw_counters(att.device)).items():
                mine[key] += value
        return out

    def add_iteration_counters(self, done, marks):
        """Add each rank's device counters since `marks` (counters() before the iteration) to
        its "done" message: the agents run in the hosts' namespaces, where they may not see them."""
        now = self.counters()
        for rank, message in done.items():
            before = marks.get(rank, {})
            message["counters"].update({key: value - before.get(key, 0)
                                        for key, value in now.get(rank, {}).items()})

    def add_final_counters(self, finals):
        """Each rank's device counters since the devices came up, into its final message."""
        now = self.counters()
        for rank, message in finals.items():
            message["totals"].update(now.get(rank, {}))
            for port in message.get("ports", []):
                port["hw_counters"] = hw_counters(port["device"])

    def detach(self):
        net = self.lab.net
        for att in self.made:
            _run(["rdma", "link", "delete", att.device])
            for sel in att.rule_selectors():
                _run(["ip", "rule", "del", *sel.split(), "lookup", str(att.table),
                      "pref", str(RULE_PREF), "protocol", str(RULE_PROTOCOL)])
            if net is not None:
                node = net.get(att.host)
                if node.pid:
                    # Our filter only: the NIC's clsact may be the queue model's too.
                    _in_host(node.pid, [f"tc filter del dev {att.nic_intf} ingress pref {FILTER_PREF} "
                                        f"2>/dev/null || true"])
            _run(["ip", "link", "del", att.netdev])       # its peer, routes and device go too
        self.made = []


# -- leftovers ------------------------------------------------------------------------------------

def remove_leftovers(live_interfaces=()):
    """Remove what killed jobs left in the root namespace: rdma devices of ours on an interface
    no live run owns (with that interface), and our policy rules whose table is empty (its veth
    is gone). Returns one line per removal."""
    report = []
    links = _run(["rdma", "-j", "link", "show"])
    try:
        entries = json.loads(links.stdout or "[]") if links.returncode == 0 else []
    except ValueError:
        entries = []
    for entry in entries:
        name, netdev = entry.get("ifname", ""), entry.get("netdev")
        if name.startswith(DEVICE_PREFIX) and netdev not in set(live_interfaces):
            _run(["rdma", "link", "delete", name])
            if netdev:
                _run(["ip", "link", "del", netdev])
            report.append(f"soft-RoCE device {name} of a vanished run: deleted")
    rules = _run(["ip", "-j", "rule", "list", "protocol", str(RULE_PROTOCOL)])
    try:
        entries = json.loads(rules.stdout or "[]") if rules.returncode == 0 else []
    except ValueError:
        entries = []
    emptied = set()
    for rule in entries:
        table = str(rule.get("table", ""))
        if not table.isdigit() or _run(["ip", "route", "show", "table", table]).stdout.strip():
            continue
        _run(["ip", "rule", "del", "pref", str(rule.get("priority", RULE_PREF)), "table", table,
              "protocol", str(RULE_PROTOCOL)])
        emptied.add(table)
    if emptied:
        report.append(f"soft-RoCE policy rules of vanished runs: deleted ({len(emptied)} tables)")
    return report
