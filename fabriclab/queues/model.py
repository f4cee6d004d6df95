"""The queue model of a running fabric: one owner for its data path, gates, PFC agent and counters.

    model = QueueModel(fabric, net, run_id)   # after Mininet built the fabric with queue trees
    model.start()
    model.counters()                          # per port and class
    model.set_ecn("spine", kmin=..., kmax=..., pmax=..., mode=...)
    model.storm("h1", seconds=2)              # h1's NIC streams pauses at its leaf
    model.stop()

Every cabled interface is a port (switch ports and host NICs alike). A port's egress tree is
`shaping.queued_commands`: htb at the link rate with a strict-priority control class and the
lossless and lossy classes sharing the rest, a tbf pause gate under the lossless class. The eBPF
programs on clsact (egress and ingress) classify, account, mark and signal pauses; the PFC agent
(a thread) closes and opens gates. With `ecn_mechanism="red"` (full kernels) the switch ports'
lossless and lossy classes get RED qdiscs that mark instead of the program (queues/red.py).

A fabric split over machines (fabriclab.cluster.cluster) runs one model per machine, each for the
ports of the nodes placed there (`placement`, `here`), with maps for every port: the lab's model
holds the other machines' models as `peers` (cluster/remotequeues.py) and reads and changes the fabric
through all of them. A cable between machines is a VXLAN tunnel: the program on the interface the
tunnels leave by sees a port's departures on its own machine (`wire`), and a pause for a port on
another machine is relayed there, its time covered by that cable's headroom (`relay_ms`).
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import subprocess
import sys
import time

from fabriclab.errors import LabError
from fabriclab.loading import excerpt
from fabriclab.queues import config
from fabriclab.queues.datapath import AR_MAX_MEMBERS, NCLASS, STAT_FIELDS, ArGroup, ArKey, DataPath, Port, QCfg, QStat
from fabriclab.queues.agentproc import AgentProcess
from fabriclab.queues.leaks import accounts_of
from fabriclab.queues.pfc import SWITCH_INTERVAL_S
from fabriclab.queues.machine import LocalQueues
from fabriclab.queues.ovsbuf import RECEIVE_BUFFER_BYTES
from fabriclab.queues.red import CLASSES as RED_CLASSES
from fabriclab.queues.red import PLACES as RED_PLACES
from fabriclab.queues.red import RedQdiscs, class_limit, red_params
from fabriclab.system.netns import interface_indexes
from fabriclab.system.shaping import gate_settings

MECHANISM = "ebpf-clsact+tbf-gates"
ECN_MECHANISMS = ("bpf-clsact", "red")
# Counters the model keeps for itself, not reported per port.
INTERNAL_FIELDS = ("xoff_ts", "ce_queued")
# The egress filter's tc priority: prio 1 belongs to the routing apps' selection stage, which must
# choose the port before the model accounts the packet at it.
EGRESS_PRIO = 3                 # after the selection stage (1) and link loss (2)
# The wire program's tc priority on the interface tunnels leave by (not a lab interface: its other
# filters are not ours); its handle is the run's link group, the lab's tag.
WIRE_PRIO = 0xFAB


@dataclasses.dataclass
class PortInfo:
    idx: int
    name: str            # interface name
    node: str
    role: str            # host | leaf | spine
    peer: int
    peer_node: str
    rate_mbps: float
    buffer: int
    ns_pid: int | None   # None: the root namespace (switch ports)
    ifindex: int = 0
    open_rate_bytes: int = 0
    open_burst: int = 0
    closed_burst: int = 0
    gate_limit: int = 0
    delay_ms: float = 0.0  # the cable's one-way lab delay: the pause's round trip needs headroom
    relay_ms: float = 0.0  # the peer is on another machine: a pause's relay there, covered too


def port_table(fabric, placement=None, relay_ms=0.0):
    """PortInfo per cabled interface, both ends of every link, peers cross-referenced; a cable
    whose ends `placement` ({node: machine}) puts on two machines gets `relay_ms` at both."""
    ports = []
    for link in fabric.links:
        a, b = len(ports), len(ports) + 1
        for idx, node, intf, peer, peer_node in ((a, link.a, link.a_intf, b, link.b),
                                                 (b, link.b, link.b_intf, a, link.a)):
            role = "host" if node in fabric.hosts else fabric.switches[node].role
            rate, burst, closed, limit = gate_settings(link.rate_mbps, fabric.spec.mtu)
            ports.append(PortInfo(idx, intf, node, role, peer, peer_node, link.rate_mbps,
                                  fabric.buffer_bytes(node), None, 0, rate, burst, closed, limit,
                                  fabric.spec.lab_delay_ms(link.kind)))
            if placement is not None and placement[link.a] != placement[link.b]:
                ports[-1].relay_ms = relay_ms
    return ports


def check_relay_headroom(ports, spec, mtu):
    """LabError when a switch port cabled to another machine has no room left for XOFF once its
    headroom covers the pause's relay there (known only at start, from the measured round trips).
    Unchecked, XOFF went below zero and wrapped in the data path's unsigned field: that port never
    paused, and its lossless class dropped instead (2026-11-28, a guest under software emulation)."""
    if not spec.pfc.enabled:
        return
    frame = config.frame_bytes(mtu)
    for p in ports:
        if p.role == "host" or not p.relay_ms:
            continue
        xoff, _xon, headroom = config.pfc_thresholds(p.buffer, p.rate_mbps, mtu, spec.pfc, p.delay_ms + p.relay_ms)
        if xoff < 2 * frame:
            raise LabError(f"queues.pfc: {p.name} is cabled to another machine; the {p.relay_ms:g} ms a pause takes "
                           f"to reach it (from the round trips measured at start) needs {headroom} B of headroom, which leaves "
                           f"XOFF at {xoff} B of its {p.buffer} B buffer: grow buffers.{p.role}, or lower "
                           f"pfc.reaction_ms or the rate")


class QueueModel:
    def __init__(self, fabric, net, run_id, spec=None, ecn_mechanism="bpf-clsact", placement=None, here=None,
                 namespaces=None, tunnels=None, underlays=(), wire_handle=None, relay=None, relay_ms=0.0,
                 record=None):
        """`net`: the Mininet network, whose hosts' shells read their interfaces (None: the
        hosts' namespaces are `namespaces`, {host: PID}). On a split fabric: `placement` {node:
        machine} and `here` this machine; `tunnels` {interface: VXLAN id} for this machine's
        ends of cables between machines, which leave by the interfaces `underlays`, where the
        wire program is a filter with handle `wire_handle` (the run's link group); `relay(kind,
        port)` carries a pause for another machine's port there; `relay_ms` the time that takes.
        `record(pid)` tells the run of the PFC agent's process."""
        self.fabric, self.net, self.run_id = fabric, net, run_id
        self.spec = spec or fabric.spec.queues
        if self.spec is None:
            raise LabError(f"fabric {excerpt(fabric.spec.name)} has no queues: section (the queue model is off)")
        if ecn_mechanism not in ECN_MECHANISMS:
            raise LabError(f"ECN mechanism must be one of {', '.join(ECN_MECHANISMS)}, got {excerpt(ecn_mechanism)}")
        self.ecn_mechanism = ecn_mechanism
        # The PFC settings the agent runs: the watchdog in lab ms (the spec's default is real time)
        self.pfc = dataclasses.replace(self.spec.pfc, watchdog_ms=config.watchdog_lab_ms(
            self.spec.pfc, fabric.spec.time_scale))
        self.red = None              # RedQdiscs when RED marks
        self.ports = port_table(fabric, placement, relay_ms)
        check_relay_headroom(self.ports, self.spec, fabric.spec.mtu)
        self.by_name = {p.name: p for p in self.ports}
        self.placement, self.here = placement, here
        self.local = [p for p in self.ports if placement is None or placement[p.node] == here]
        self.namespaces = dict(namespaces or {})
        self.tunnels = dict(tunnels or {})
        self.underlays, self.wire_handle, self.relay = tuple(underlays), wire_handle, relay
        self.wired = []              # underlays the wire program is attached to
        self._clsact_added = set()   # ... of which the model added the clsact qdisc
        self.peers = {}              # machine -> its model (cluster/remotequeues.py), set by the lab
        self.node_ids = {name: i for i, name in enumerate(sorted([*fabric.switches, *fabric.hosts]))}
        self.ecn_override = {}       # port index -> EcnProfile set on the running fabric
        self.cuts = {}               # switch -> the fraction of its buffer a buffer fault left it
        self.mine = LocalQueues(self)    # this machine's part; `peers` the others' (one Protocol)
        # OVS's receive drops on every machine, and when they were read, for every reader
        # (concurrent jobs each report from their own start)
        self._ovs_readings = collections.deque(maxlen=1024)    # (time.monotonic_ns(), sum)
        self.record = record
        self.datapath = None
        self.agent = None            # the PFC agent's process (queues/agentproc.py)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self):
        try:
            self._find_interfaces()
            self.datapath = DataPath(self.run_id, len(self.ports)).load()
            self._write_config()
            self._attach()
            if self.ecn_mechanism == "red":
                self.red = RedQdiscs()
                for p in self._red_ports():
                    self._set_red(p, create=True)
            # The lab's samplers keep the short GIL switch interval the agent once set here.
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
            self.agent = AgentProcess(self.run_id, self.datapath.pins, self.local, self.pfc,
                                      accounts_of(self.local, NCLASS, config.CLASSES, self._xon),
                                      len(self.ports) * NCLASS, relay=self.relay, record=self.record)
            self.agent.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        for peer in self.peers.values():
            peer.close()             # its model stops when its input ends
        self.peers = {}
        for dev in self.wired:
            subprocess.run(["tc", "filter", "del", "dev", dev, "egress", "prio", str(WIRE_PRIO),
                            "handle", str(self.wire_handle), "bpf"], capture_output=True)
            # The clsact goes too if the model added it and nothing else filters there now.
            if dev in self._clsact_added and not any(_tc_lines("filter", "show", "dev", dev, way)
                                                     for way in ("ingress", "egress")):
                subprocess.run(["tc", "qdisc", "del", "dev", dev, "clsact"], capture_output=True)
        self.wired = []
        self._clsact_added = set()
        if self.agent is not None:
            self.agent.stop()
            self.agent = None
        if self.red is not None:
            self.red.close()
            self.red = None
        if self.datapath is not None:
            self.datapath.close()
            self.datapath = None

    def _find_interfaces(self):
        switch_ports = None
        for node_name in {p.node for p in self.local}:
            mine = [p for p in self.local if p.node == node_name]
            in_host = node_name in self.fabric.hosts
            pid = (self.net.get(node_name).pid if self.net is not None else self.namespaces.get(node_name)) \
                if in_host else None
            if in_host and pid is None:
                raise LabError(f"queue model: no namespace given for host {excerpt(node_name)}")
            if in_host:
                indexes = interface_indexes(pid, node_name)
            else:
                switch_ports = switch_ports if switch_ports is not None else interface_indexes(None, "the switches")
                indexes = switch_ports
            for port in mine:
                if port.name not in indexes:
                    raise LabError(f"queue model: {node_name} has no interface {port.name}")
                port.ifindex, port.ns_pid = indexes[port.name], pid

    def _write_config(self):
        dp = self.datapath
        for d, cls in enumerate(self.spec.dscp_classes()):
            dp.dscp_class.update(d, ctypes.c_uint32(cls))
        for p in self.ports:
            peer = self.ports[p.peer]
            dp.ports.update(p.idx, Port(p.idx, peer.idx, self.node_ids[p.node], self.node_ids[peer.node],
                                            p.role != "host", peer.role != "host",
                                            self._machine(p) != self._machine(peer)))
            self._write_thresholds(p)
        for p in self._tunnel_ends():
            dp.wire.update(self.tunnels[p.name], ctypes.c_uint32(p.idx))

    def _thresholds(self, p, cls, ecn=None):
        return config.thresholds(self.spec, p.role, cls, p.buffer, p.rate_mbps, self.fabric.spec.mtu, ecn,
                                 p.delay_ms + p.relay_ms)

    def _write_thresholds(self, p):
        for cls in range(NCLASS):
            t = self._thresholds(p, cls, self.ecn_override.get(p.idx))
            ecn_mode = t.ecn_mode if p.role != "host" else 0
            if self._red_marks(p) and config.CLASSES[cls] in RED_CLASSES:
                ecn_mode = config.ECN_QDISC       # RED marks; the program counts its marks
            self.datapath.qcfg.update(p.idx * NCLASS + cls, QCfg(
                ecn_mode, t.kmin, t.kmax, t.pmax, t.limit,
                # hosts do not account ingress bytes (they are sinks), so never send XOFF
                int(t.pfc), t.xoff, t.xon, t.headroom_limit, 0))

    def _tunnel_ends(self):
        return [p for p in self.local if p.name in self.tunnels]

    def _machine(self, p):
        return self.placement[p.node] if self.placement is not None else self.here

    def _xon(self, p, cls):
        """The XON threshold of port p's class cls where that class pauses, else None."""
        t = self._thresholds(p, cls)
        return t.xon if t.pfc else None

    # -- RED (ecn_mechanism "red") ---------------------------------------------------------------
    def _red_marks(self, p):
        """RED qdiscs mark this port (the "ar" mode needs the group's depths: the program marks)."""
        profile = self.ecn_override.get(p.idx) or self.spec.ecn_for(p.role)
        return self.ecn_mechanism == "red" and p.role != "host" and profile.mode != "ar"

    def _red_ports(self):
        return [p for p in self.local if self._red_marks(p)]

    def red_settings(self, p, cls):
        """The RedParams of port `p`'s class `cls` ("lossless" | "lossy") under its ECN profile."""
        profile = self.ecn_override.get(p.idx) or self.spec.ecn_for(p.role)
        return red_params(profile, p.buffer, class_limit(cls, p.buffer, self.fabric.spec.mtu))

    def _set_red(self, p, create=False):
        if self._machine(p) != self.here:
            return                   # its machine's model sets it
        for cls in RED_CLASSES:
            self.red.set(p.ifindex, cls, self.red_settings(p, cls), create=create, what=p.name)

    def _attach(self):
        pins = self.datapath
        lines = []
        for p in self.local:
            lines.append((p, [f"qdisc replace dev {p.name} clsact",
                              f"filter replace dev {p.name} egress prio {EGRESS_PRIO} handle 1 bpf da pinned "
                              f"{pins.program_pin('fq_egress')} classid {port_classid(p.idx)}",
                              f"filter replace dev {p.name} ingress prio 1 handle 1 bpf da pinned "
                              f"{pins.program_pin('fq_ingress')} classid {port_classid(p.idx)}"]))
        # tc runs in each port's network namespace but in the lab's mount namespace, where the
        # programs are pinned (a Mininet host's shell may see a /sys of its own).
        by_ns = {}
        for p, cmds in lines:
            by_ns.setdefault(p.ns_pid, []).extend(cmds)
        for ns_pid, cmds in by_ns.items():
            argv = ["tc", "-batch", "-"] if ns_pid is None else \
                ["nsenter", f"--net=/proc/{ns_pid}/ns/net", "tc", "-batch", "-"]
            proc = subprocess.run(argv, input="\n".join(cmds) + "\n", capture_output=True, text=True)
            if proc.returncode != 0:
                where = "switch ports" if ns_pid is None else self._ns_owner(ns_pid)
                raise LabError(f"attaching the queue model on {where} failed: "
                               f"{(proc.stderr.strip().splitlines() or ['?'])[0]}")
        for dev in self.underlays if self._tunnel_ends() else ():
            if not any(" clsact " in line for line in _tc_lines("qdisc", "show", "dev", dev)):
                self._clsact_added.add(dev)
            proc = subprocess.run(["tc", "-batch", "-"], capture_output=True, text=True, input=(
                f"qdisc replace dev {dev} clsact\n"
                f"filter add dev {dev} egress prio {WIRE_PRIO} handle {self.wire_handle} bpf da pinned "
                f"{pins.program_pin('fq_wire')}\n"))
            if proc.returncode != 0:
                raise LabError(f"attaching the queue model's wire program to {dev} failed: "
                               f"{(proc.stderr.strip().splitlines() or ['?'])[0]}")
            self.wired.append(dev)

    def machines(self):
        """Every machine's part of the model, this one's first (queues/machine.py)."""
        return [self.mine, *self.peers.values()]

    def ensure_ovs_buffers(self):
        """Make room in OVS's sockets on this machine (see ovsbuf and LocalQueues)."""
        return self.mine.ensure_ovs_buffers()

    def ovs_drops_total(self):
        """Frames OVS's port sockets dropped since the model enlarged them (on every machine)."""
        total = sum(m.ovs_drops() for m in self.machines())
        self._ovs_readings.append((time.monotonic_ns(), total))
        return total

    def _ns_owner(self, ns_pid):
        return next((p.node for p in self.ports if p.ns_pid == ns_pid), f"pid {ns_pid}")

    # -- runtime control ------------------------------------------------------------------------
    def set_ecn(self, target, mode=None, kmin=None, kmax=None, pmax=None, reset=False):
        """Change ECN marking on a running fabric: target is a role (leaf, spine), a switch name or
        a port (interface) name. Unset fields keep each port's current values; reset=True goes back
        to the spec's profile. Returns the ports changed. Checked here first: a refused change
        reaches no machine."""
        changed = self.mine.set_ecn(target, mode=mode, kmin=kmin, kmax=kmax, pmax=pmax, reset=reset)
        for peer in self.peers.values():
            peer.set_ecn(target, **({"reset": True} if reset else
                                    {"mode": mode, "kmin": kmin, "kmax": kmax, "pmax": pmax}))
        return changed

    def set_ecn_here(self, target, mode=None, kmin=None, kmax=None, pmax=None, reset=False):
        """set_ecn in this machine's maps and qdiscs (every port's thresholds are in each
        machine's maps; RED qdiscs only on its own ports)."""
        ports = [p for p in self._ports_of(target) if p.role != "host"]
        if not ports:
            raise LabError(f"no switch port matches {excerpt(target)} (a role leaf/spine/super_spine, a switch or an interface)")
        if reset:
            for p in ports:
                self.ecn_override.pop(p.idx, None)
                self._write_thresholds(p)
                if self.red is not None:
                    self._set_red(p)
            return [p.name for p in ports]
        if mode is not None and mode not in config.ECN_MODES:
            raise LabError(f"ECN mode must be one of {', '.join(config.ECN_MODES)}, got {excerpt(mode)}")
        if pmax is not None and not 0 < pmax <= 1:
            raise LabError(f"pmax must be in (0, 1], got {pmax}")
        changes = {k: v for k, v in (("mode", mode), ("kmin", kmin), ("kmax", kmax), ("pmax", pmax))
                   if v is not None}
        updated = {}
        for p in ports:
            current = self.ecn_override.get(p.idx) or self.spec.ecn_for(p.role)
            profile = dataclasses.replace(current, **changes)
            lo, hi = config.ecn_thresholds(p.buffer, profile)
            if hi < lo:
                raise LabError(f"{p.name}: kmax ({hi}) must be >= kmin ({lo})")
            updated[p.idx] = profile
        self.ecn_override.update(updated)
        for p in ports:
            self._write_thresholds(p)
            if self.red is not None:
                self._set_red(p)
        return [p.name for p in ports]

    def set_ar_groups(self, groups):
        """The "ar" ECN mode's groups, {(switch, destination /24 as an integer): [member
        interfaces]} (apps/paths.ar_groups: the lab rewrites them when cables go down or come
        back), into this machine's data path; entries no longer given are removed. A member that
        is not a port of the model is an error. Returns the number of groups written."""
        wanted = {}
        for (switch, net), members in groups.items():
            if switch not in self.node_ids or switch in self.fabric.hosts:
                raise LabError(f"ar group: no switch {excerpt(switch)} in the queue model")
            ports = [self.by_name.get(name) for name in members]
            if any(p is None or p.node != switch for p in ports):
                raise LabError(f"ar group of {switch}: {excerpt(members)} are not all its ports")
            if not 1 <= len(ports) <= AR_MAX_MEMBERS:
                raise LabError(f"ar group of {switch}: {len(ports)} members (1 to {AR_MAX_MEMBERS} fit)")
            wanted[(self.node_ids[switch], net)] = [p.idx for p in ports]
        table = self.datapath.ar_groups
        for key in table.keys():
            if (key.node, key.net) not in wanted:
                table.delete(key)
        for (node, net), idxs in wanted.items():
            table.update(ArKey(node, net), ArGroup(len(idxs), (ctypes.c_uint32 * AR_MAX_MEMBERS)(*idxs)))
        return len(wanted)

    def cut_buffer(self, switch, fraction):
        """A buffer fault: each port of `switch` queues at most `fraction` of its buffer per class
        and tail-drops the rest, lossless class included (1 restores it), on every machine.
        Checked here first: a refused cut reaches no machine. Returns the ports cut."""
        ports = self.mine.cut_buffer(switch, fraction)
        for peer in self.peers.values():
            peer.cut_buffer(switch, fraction)
        return ports

    def cut_buffer_here(self, switch, fraction):
        """cut_buffer in this machine's maps (every port's limits are in each machine's maps)."""
        fraction = config.check_cut(fraction)
        if switch not in self.fabric.switches:
            raise LabError(f"no switch {excerpt(switch)} in fabric {excerpt(self.fabric.spec.name)}")
        ports = [p for p in self.ports if p.node == switch]
        for p in ports:
            limit = config.cut_limit(p.buffer, fraction)
            for cls in range(NCLASS):
                self.datapath.cut.update(p.idx * NCLASS + cls, ctypes.c_uint32(limit))
        if fraction < 1:
            self.cuts[switch] = fraction
        else:
            self.cuts.pop(switch, None)
        return [p.name for p in ports]

    def cables_down(self, intfs, down):
        """The ports `intfs` lost (down=True) or got back their cable: while it is down, the leak
        repair holds no bytes waiting in their queues (queues/leaks.py)."""
        for m in self.machines():
            m.cables_down(intfs, down)

    def empty_queues(self, intfs):
        """Ports whose cable is down hold nothing (LocalQueues.empty_queues), on every machine."""
        for m in self.machines():
            m.empty_queues(intfs)

    def _ports_of(self, target):
        if target in config.SWITCH_ROLES:
            return [p for p in self.ports if p.role == target]
        if target in self.by_name:
            return [self.by_name[target]]
        return [p for p in self.ports if p.node == target]

    def storm(self, host_port, seconds):
        """A PFC storm: the NIC `host_port` (a host or interface name) pauses its leaf port for
        `seconds` (0 stops a storm). Returns the leaf port's name."""
        ref = self.fabric.host_port(host_port)
        if ref is None:
            raise LabError(f"no host or host port {excerpt(host_port)} in fabric {excerpt(self.fabric.spec.name)}")
        if not seconds >= 0:
            raise LabError(f"storm duration must be >= 0 seconds, got {excerpt(seconds)}")
        leaf_port = self.ports[self.by_name[ref.intf].peer]
        self.storm_port(leaf_port.idx, seconds)
        return leaf_port.name

    def storm_port(self, idx, seconds):
        """Hold port `idx`'s lossless gate closed for `seconds`, on the machine it runs on."""
        self._machine_of(idx).storm(idx, seconds)

    def pause(self, kind, idx, waited_ns=0):
        """A pause (EV_XOFF / EV_XON) a data path sent `waited_ns` ago to port `idx` of another
        machine than its own: for its gate here, or passed on to the machine it runs on."""
        self._machine_of(idx).pause(kind, idx, waited_ns)

    def _machine_of(self, idx):
        """The part of the model (MachineQueues) that runs port `idx`."""
        machine = self._machine(self.ports[idx])
        return self.mine if machine == self.here else self.peers[machine]

    # -- reading --------------------------------------------------------------------------------
    def read_rows(self):
        """(stats, bias), every row, as one machine's maps would hold them: a row's counters are
        spread over the machines its port's packets were seen on (merge_rows)."""
        if not self.peers:
            return self.mine.read_rows()
        return merge_rows([m.read_rows() for m in self.machines()])

    def counters(self, nonzero=False):
        """One row per port and class: the data path's counters plus the gate's."""
        self.ovs_drops_total()        # a reading for report(since_ns) to start from
        gates, red = {}, {}
        for m in self.machines():
            gates.update(m.gates())
            red.update(m.red())
        stats, bias = self.read_rows()
        rows = []
        for p in self.ports:
            for cls in range(NCLASS):
                row = p.idx * NCLASS + cls
                st = stats[row]
                values = {f: getattr(st, f) for f in STAT_FIELDS if f not in INTERNAL_FIELDS}
                # held as the data path uses it: less the leaked bytes repaired (queues/leaks.py)
                values["held"] -= bias[row]
                values["held_repaired"] = bias[row]
                if self._red_marks(p) and config.CLASSES[cls] in RED_PLACES:
                    # RED's own counters: what it marked (packets that came in CE included) and
                    # dropped (never, unless its backstop overflowed).
                    r = red.get((p.name, config.CLASSES[cls]), {})
                    values["red_marked"] = r.get("marked", 0)
                    values["red_drops"] = r.get("early", 0) + r.get("pdrop", 0)
                values["paused"] = bool(st.paused)
                values["pause_ms"] = round(values.pop("pause_ns", 0) / 1e6, 3)
                row = {"port": p.name, "node": p.node, "role": p.role, "peer": self.ports[p.peer].name,
                       "class": config.CLASSES[cls], **values}
                if cls == config.LOSSLESS:
                    row.update(gates.get(p.idx, {}))
                if nonzero and not any(row.get(k) for k in ("tx_pkts", "rx_pkts", "drops", "pause_tx",
                                                             "pause_rx", "gate_closes")):
                    continue
                rows.append(row)
        return rows

    def report(self, before, since_ns=0):
        """What changed since `before` (a counters() list): per port and class, the counters that
        moved (high-water marks as they are now), plus totals, the watchdog's alarms and the PFC
        agent's reaction times since `since_ns` (time.monotonic_ns())."""
        old = {(r["port"], r["class"]): r for r in before}
        rows, totals = [], {}
        for row in self.counters():
            prev = old.get((row["port"], row["class"]), {})
            moved = {k: (v if k.endswith("_hwm") else round(v - prev.get(k, 0), 3))
                     for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                     and k not in ("occ", "held")}
            if not any(moved.get(k) for k in ("tx_pkts", "rx_pkts", "drops", "pause_tx", "pause_rx", "gate_closes",
                                              "held_repaired")):
                continue
            rows.append({"port": row["port"], "node": row["node"], "role": row["role"], "class": row["class"],
                         **moved})
            for key in ("marks", "drops", "lossless_drops", "wd_drops", "pause_tx", "pause_ms", "held_repaired",
                        *(("red_marked", "red_drops") if self.ecn_mechanism == "red" else ())):
                totals[key] = round(totals.get(key, 0) + moved.get(key, 0), 3)
        # A frame OVS dropped on receive was counted into its switch and never left it: the leak
        # repair takes its bytes off (leak_repairs), but the frame is lost. Not zero: suspect run.
        now = self.ovs_drops_total()
        totals["ovs_receive_drops"] = now - next(
            (total for ns, total in reversed(self._ovs_readings) if ns <= since_ns), 0)
        return {"mechanism": MECHANISM, "ecn_mechanism": self.ecn_mechanism, "totals": totals, "ports": rows,
                "alarms": self.alarms(), "leak_repairs": self.leak_repairs(since_ns),
                "pfc_reaction": self.reaction_stats(since_ns)}

    def reaction_stats(self, since_ns=0):
        """The PFC agent's reaction times (pfc.py); on a split fabric, each other machine's too."""
        stats = self.mine.reaction_stats(since_ns)
        if self.peers and stats is not None:
            stats["machines"] = {name: peer.reaction_stats(since_ns) for name, peer in self.peers.items()}
        return stats

    def alarms(self):
        return self.mine.alarms() + self._from_peers("alarms")

    def leak_repairs(self, since_ns=0):
        """The leaked accounts repaired since `since_ns` (time.monotonic_ns()), oldest first."""
        return self.mine.leak_repairs(since_ns) + self._from_peers("leak_repairs", since_ns)

    def errors(self):
        return self.mine.errors() + [f"{name}: {e}" for name, peer in self.peers.items() for e in peer.errors()]

    def _from_peers(self, what, *args):
        """The other machines' records of `what`, each tagged with its machine."""
        return [{**r, "machine": name} for name, peer in self.peers.items() for r in getattr(peer, what)(*args)]

    def describe(self):
        """What results record about the model: mechanism, classes and the thresholds in force."""
        mtu = self.fabric.spec.mtu
        per_role = {}
        # per role, its port with the longest cable: the smallest XOFF (the most headroom)
        for p in sorted(self.ports, key=lambda p: -(p.delay_ms + p.relay_ms)):
            if p.role in per_role:
                continue
            t = self._thresholds(p, config.LOSSLESS)
            mode = next(m for m, i in config.ECN_MODE_IDS.items() if i == t.ecn_mode)
            ecn = {"mode": mode if p.role != "host" else "off",
                   "kmin": t.kmin, "kmax": t.kmax, "pmax": t.pmax / config.PROB_ONE}
            if self._red_marks(p):
                ecn["red"] = {cls: red_params(self.spec.ecn_for(p.role), p.buffer,
                                              class_limit(cls, p.buffer, mtu)).describe()
                              for cls in RED_CLASSES}
            per_role[p.role] = {"buffer_bytes": p.buffer, "rate_mbps": p.rate_mbps, "ecn": ecn,
                                "pfc": {"xoff": t.xoff, "xon": t.xon, "headroom": t.headroom_limit - t.xoff,
                                        "cable_delay_ms": p.delay_ms,
                                        **({"relay_ms": p.relay_ms} if p.relay_ms else {})} if t.pfc else None}
        scale = self.fabric.spec.time_scale or 1.0
        watchdog = self.pfc.watchdog_ms
        return {"mechanism": MECHANISM, "ecn_mechanism": self.ecn_mechanism,
                "watchdog": {"lab_ms": watchdog, "real_ms": watchdog / scale if watchdog else 0,
                             "from": "spec" if self.spec.pfc.watchdog_ms is not None else
                             f"{config.REAL_WATCHDOG_MS:g} ms real x time scale {scale:g}"},
                "ovs_send_buffer_bytes": self.mine.ovs_send_buffer,
                "ovs_receive_buffer_bytes": RECEIVE_BUFFER_BYTES if self.mine.ovs_receive_sockets else None,
                "spec": self.spec.to_dict(), "ports_by_role": per_role,
                **({"machines": self._machines()} if self.peers else {})}

    def _machines(self):
        """Where the model runs on a split fabric: the ports per machine and what crosses."""
        crossing = [p for p in self.ports if self._machine(p) != self._machine(self.ports[p.peer])]
        return {"ports": {str(m): sum(1 for p in self.ports if self._machine(p) == m)
                          for m in sorted({self._machine(p) for p in self.ports}, key=str)},
                "crossing_ports": sorted(p.name for p in crossing),
                "relay_ms": max((p.relay_ms for p in crossing), default=0.0),
                "pauses_across": "relayed through the lab's SSH connections (cluster/remotequeues.py)"}


def _tc_lines(*argv):
    """What `tc ARGV` prints, a line each (nothing when tc fails: the device is gone)."""
    proc = subprocess.run(["tc", *argv], capture_output=True, text=True)
    return proc.stdout.splitlines() if proc.returncode == 0 else []


def merge_stats(arrays):
    """One array of QStat rows (numpy, any shape) from each machine's of that shape: counters add
    up (a machine counts only the packets it sees), high-water marks and flags take the largest."""
    import numpy as np

    out = arrays[0].copy()
    for more in arrays[1:]:
        for field in out.dtype.names:
            if field.endswith("_hwm") or field in ("paused", "xoff_ts"):
                out[field] = np.maximum(out[field], more[field])
            elif field != "pad":
                out[field] += more[field]
    return out


def merge_rows(readings):
    """merge_stats of each machine's (stats, bias) as its maps hold them; the biases add up."""
    import numpy as np

    out = merge_stats([np.frombuffer(bytes(s), dtype=np.dtype(QStat)) for s, _ in readings])
    bias = sum(np.frombuffer(bytes(b), dtype=np.int64) for _, b in readings)
    n = len(out)
    return (QStat * n).from_buffer_copy(out.tobytes()), (ctypes.c_int64 * n).from_buffer_copy(bias.tobytes())


def port_classid(idx):
    """The tc classid that tells the eBPF program which port it runs on (PORT_MAJOR there)."""
    return f"fab:{idx + 1:x}"

