"""A fake OpenFlow switch and fabric that answer "where does this packet go?" (faucet's
clib/fakeoftable.py FakeOFTable.is_output is the model).

FakeOFTable applies the os-ken messages the controller core sends (OFPFlowMod, OFPGroupMod) the way
a strict switch would, refusing what OpenFlow or Open vSwitch would refuse and what would leave a
flow or group pointing at a missing group. `forward(packet)` runs the highest-priority matching
entry's actions (set_field rewrites, output, IN_PORT, controller, select groups with every live
member, fast-failover groups by watched port or group, ALL groups with a copy per bucket) and
returns the *choices* the switch may make: a list of alternatives, each a list of copies
(port, packet as rewritten).

`choose(packet)` makes the one choice Open vSwitch would for that packet instead: a select group
picks its bucket by the group's selection method as ofproto-dpif does (`hash`: the live bucket
with the highest hash x weight score; `dp_hash`: a table of hash values shared out by weight with
Webster's method), over a hash of the packet's 5-tuple of the fake's own.

FakeFabric wires one FakeOFTable per switch as the Fabric cables them and traces a packet from a
host port through every switch: `trace()` returns the possible *scenarios*, one per combination
of select-group choices, each the tuple of deliveries (a host port, the controller, a drop) that
the packet's copies end in, with the switches each copy crossed; `route()` the one scenario the
switches' selection methods choose, so counting many flows gives the shares of each path.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import itertools
from dataclasses import dataclass

from os_ken.ofproto import ofproto_v1_5 as ofp
from os_ken.ofproto import ofproto_v1_5_parser as parser

from fabriclab.apps.ovs_groups import SelectionMethodProperty
from fabriclab.apps.hashing import flow_hash, ovs_group_hash, ovs_hash_bucket

CONTROLLER = "controller"
MAX_HOPS = 16


@dataclass(frozen=True)
class Packet:
    """The header fields the fabric's entries match on or rewrite."""

    in_port: int
    ipv4_dst: str
    ipv4_src: str = "10.0.0.1"
    eth_type: int = 0x0800
    ip_proto: int = 17
    udp_src: int | None = 49152
    udp_dst: int | None = 4791
    eth_dst: str = ""

    def field(self, name):
        return getattr(self, name, None)

    def with_fields(self, **fields):
        return dataclasses.replace(self, **fields)


class FakeDatapath:
    """What the core needs of a datapath: its id, OpenFlow 1.5's ofproto and parser, xids."""

    ofproto = ofp
    ofproto_parser = parser

    def __init__(self, dpid):
        self.id = dpid
        self.xid = 0

    def set_xid(self, msg):
        self.xid += 1
        msg.set_xid(self.xid)
        return self.xid


def _matches(value, wanted):
    if value is None:
        return False
    if isinstance(wanted, tuple):                      # (value, mask)
        base, mask = wanted
        if isinstance(base, str):
            ip, net, bits = (int(ipaddress.IPv4Address(x)) for x in (value, base, mask))
            return ip & bits == net & bits
        return value & mask == base & mask
    if isinstance(wanted, str) and "." in wanted:
        return ipaddress.IPv4Address(value) == ipaddress.IPv4Address(wanted)
    return value == wanted


@dataclass(frozen=True)
class Entry:
    priority: int
    match: tuple          # (field, value) pairs as OFPMatch.items() gives them
    actions: tuple
    cookie: int = 0

    def covers(self, packet):
        return all(_matches(packet.field(name), wanted) for name, wanted in self.match)


class FakeOFTable:
    def __init__(self, name=""):
        self.name = name
        self.flows = {}          # (priority, match) -> Entry
        self.groups = {}         # group id -> (type, buckets)
        self.methods = {}        # select group id -> selection method ("" when none was given)
        self.params = {}         # select group id -> its selection method's parameter (the basis)
        self.dead_ports = set()
        self.packet_outs = []
        self.barriers = []       # xids of the barrier requests received, not yet answered

    # -- applying messages --------------------------------------------------------------------------
    def apply(self, messages):
        for msg in messages:
            if isinstance(msg, parser.OFPFlowMod):
                self._flow_mod(msg)
            elif isinstance(msg, parser.OFPGroupMod):
                self._group_mod(msg)
            elif isinstance(msg, parser.OFPPacketOut):
                self.packet_outs.append(msg)
            elif isinstance(msg, parser.OFPBarrierRequest):
                self.barriers.append(msg.xid)
            elif not isinstance(msg, (parser.OFPPortDescStatsRequest,
                                      parser.OFPFlowDescStatsRequest, parser.OFPPortStatsRequest)):
                raise AssertionError(f"{self.name}: unexpected message {type(msg).__name__}")

    def _flow_mod(self, msg):
        match = tuple(msg.match.items())
        key = (msg.priority, match)
        if msg.command == ofp.OFPFC_ADD:
            actions = []
            for inst in msg.instructions:
                assert isinstance(inst, parser.OFPInstructionActions) and inst.type == ofp.OFPIT_APPLY_ACTIONS, inst
                actions.extend(inst.actions)
            for gid in self._group_refs(actions):
                assert gid in self.groups, f"{self.name}: flow added before its group {gid}: {match}"
            self.flows[key] = Entry(msg.priority, match, tuple(actions), msg.cookie)
        elif msg.command == ofp.OFPFC_DELETE_STRICT:
            assert key in self.flows, f"{self.name}: deleting a flow that is not there: {key}"
            del self.flows[key]
        elif msg.command == ofp.OFPFC_DELETE:
            assert not match and msg.table_id == ofp.OFPTT_ALL, "only a full wipe is expected"
            self.flows.clear()
        else:
            raise AssertionError(f"{self.name}: unexpected flow command {msg.command}")

    def _group_mod(self, msg):
        gid = msg.group_id
        if msg.command == ofp.OFPGC_DELETE:
            if gid == ofp.OFPG_ALL:
                assert not any(self._group_refs(e.actions) for e in self.flows.values()), \
                    f"{self.name}: groups wiped while flows use them"
                self.groups.clear()
                return
            assert gid in self.groups, f"{self.name}: group {gid} deleted but absent"
            users = [e for e in self.flows.values() if gid in self._group_refs(e.actions)]
            assert not users, f"{self.name}: group {gid} deleted while flows use it: {users[:2]}"
            chained = [g for g, (_t, buckets) in self.groups.items()
                       if any(gid in self._bucket_groups(b) for b in buckets)]
            assert not chained, f"{self.name}: group {gid} deleted while groups {chained} chain to it"
            del self.groups[gid]
            self.methods.pop(gid, None)
            return
        if msg.command == ofp.OFPGC_ADD:
            assert gid not in self.groups, f"{self.name}: group {gid} added twice"
        elif msg.command == ofp.OFPGC_MODIFY:
            assert gid in self.groups, f"{self.name}: group {gid} modified before it exists"
        else:
            raise AssertionError(f"{self.name}: unexpected group command {msg.command}")
        assert msg.type in (ofp.OFPGT_SELECT, ofp.OFPGT_ALL, ofp.OFPGT_FF), msg.type
        for bucket in msg.buckets:
            for chained in self._bucket_groups(bucket):
                assert chained in self.groups, f"{self.name}: group {gid} chains to missing group {chained}"
        if msg.type == ofp.OFPGT_FF:
            assert all(self._watch(b) for b in msg.buckets), "a fast-failover bucket must watch something"
        methods = [p for p in msg.properties if isinstance(p, SelectionMethodProperty)]
        if methods:
            assert msg.type == ofp.OFPGT_SELECT and len(methods) == 1
            assert methods[0].method in ("hash", "dp_hash"), methods[0].method
            assert methods[0].method == "hash" or not methods[0].fields, "OVS refuses fields with dp_hash"
        self.groups[gid] = (msg.type, tuple(msg.buckets))
        self.methods[gid] = methods[0].method if methods else ""
        self.params[gid] = methods[0].param if methods else 0

    @staticmethod
    def _group_refs(actions):
        return [a.group_id for a in actions if isinstance(a, parser.OFPActionGroup)]

    @classmethod
    def _bucket_groups(cls, bucket):
        refs = cls._group_refs(bucket.actions)
        refs += [p.watch for p in bucket.properties
                 if isinstance(p, parser.OFPGroupBucketPropWatch) and p.type == ofp.OFPGBPT_WATCH_GROUP]
        return refs

    @staticmethod
    def _watch(bucket):
        for prop in bucket.properties:
            if isinstance(prop, parser.OFPGroupBucketPropWatch):
                return prop.type, prop.watch
        return None

    def snapshot(self):
        """The tables in a canonical form: equal snapshots forward every packet alike."""
        flows = {key: (e.cookie, tuple(str(a) for a in e.actions)) for key, e in self.flows.items()}
        groups = {gid: (kind, tuple(str(b) for b in buckets)) for gid, (kind, buckets) in self.groups.items()}
        return flows, groups

    # -- ports -----------------------------------------------------------------------------------------
    def set_port(self, port, live):
        (self.dead_ports.discard if live else self.dead_ports.add)(port)

    @staticmethod
    def weight(bucket):
        for prop in bucket.properties:
            if isinstance(prop, parser.OFPGroupBucketPropWeight):
                return prop.weight
        return 1

    def _bucket_live(self, bucket):
        watch = self._watch(bucket)
        if watch is None:
            return True
        kind, target = watch
        if kind == ofp.OFPGBPT_WATCH_PORT:
            return target not in self.dead_ports
        return self._group_live(target)

    def _group_live(self, gid):
        _type, buckets = self.groups[gid]
        return any(self._bucket_live(b) for b in buckets)

    # -- forwarding --------------------------------------------------------------------------------------
    def lookup(self, packet):
        """The entry that handles `packet`, or None (a table miss drops it: no miss entry here)."""
        hits = [e for e in self.flows.values() if e.covers(packet)]
        if not hits:
            return None
        top = max(e.priority for e in hits)
        best = [e for e in hits if e.priority == top]
        assert len({e.actions for e in best}) == 1, \
            f"{self.name}: {packet} matches {len(best)} entries of priority {top} with different actions"
        return best[0]

    def forward(self, packet):
        """[[(port | CONTROLLER, packet)]]: the alternatives, each the copies it sends. A packet
        the switch drops has one alternative with no copies."""
        entry = self.lookup(packet)
        if entry is None:
            return [[]]
        return self._run(entry.actions, packet)

    def _run(self, actions, packet):
        choices = [([], packet)]
        for action in actions:
            if isinstance(action, parser.OFPActionSetField):
                choices = [(outs, p.with_fields(**{action.key: action.value})) for outs, p in choices]
            elif isinstance(action, parser.OFPActionOutput):
                choices = [(outs + self._output(action.port, p), p) for outs, p in choices]
            elif isinstance(action, parser.OFPActionGroup):
                # a bucket works on its own copy: its rewrites do not reach the actions after it
                choices = [(outs + more, p) for outs, p in choices for more in self._group(action.group_id, p)]
            else:
                raise AssertionError(f"{self.name}: unexpected action {action}")
        return [outs for outs, _p in choices]

    @staticmethod
    def _output(port, packet):
        if port == ofp.OFPP_CONTROLLER:
            return [(CONTROLLER, packet)]
        if port == ofp.OFPP_IN_PORT:
            return [(packet.in_port, packet)]
        if port == packet.in_port:
            return []                     # OpenFlow drops an output to the ingress port
        return [(port, packet)]

    def _group(self, gid, packet):
        kind, buckets = self.groups[gid]
        live = [b for b in buckets if self._bucket_live(b)]
        if kind == ofp.OFPGT_SELECT:
            choices = [c for b in live for c in self._run(b.actions, packet)]
            return choices or [[]]
        if kind == ofp.OFPGT_FF:
            return self._run(live[0].actions, packet) if live else [[]]
        # ALL: every bucket sends its copy; select choices inside buckets multiply
        per_bucket = [self._run(b.actions, packet) for b in buckets]
        return [[out for part in combo for out in part] for combo in itertools.product(*per_bucket)]


    # -- one choice, as Open vSwitch makes it -------------------------------------------------------------
    def choose(self, packet):
        """[(port | CONTROLLER, packet)]: the copies the switch sends for `packet`, each select
        group's bucket picked by its selection method."""
        entry = self.lookup(packet)
        return [] if entry is None else self._run_one(entry.actions, packet)

    def _run_one(self, actions, packet):
        outs = []
        for action in actions:
            if isinstance(action, parser.OFPActionSetField):
                packet = packet.with_fields(**{action.key: action.value})
            elif isinstance(action, parser.OFPActionOutput):
                outs += self._output(action.port, packet)
            elif isinstance(action, parser.OFPActionGroup):
                outs += self._group_one(action.group_id, packet)
            else:
                raise AssertionError(f"{self.name}: unexpected action {action}")
        return outs

    def _group_one(self, gid, packet):
        kind, buckets = self.groups[gid]
        if kind == ofp.OFPGT_ALL:
            return [out for b in buckets for out in self._run_one(b.actions, packet)]
        live = [b for b in buckets if self._bucket_live(b)]
        if not live:
            return []
        if kind == ofp.OFPGT_FF:
            return self._run_one(live[0].actions, packet)
        # the fields hashed from the group's basis: `hash` takes hash_uint64(param), dp_hash the
        # param's low half (ofproto-dpif-xlate.c)
        param = self.params.get(gid, 0)
        fields = (packet.ipv4_src, packet.ipv4_dst, packet.ip_proto or 0, packet.udp_src or 0, packet.udp_dst or 0)
        if self.methods[gid] == "dp_hash":
            h = flow_hash(*fields, seed=param & 0xFFFFFFFF)
        else:
            h = ovs_group_hash(*fields, basis=param)
        if self.methods[gid] == "dp_hash":
            table = dp_hash_table([self.weight(b) for b in buckets])
            for i in range(len(table)):
                bucket = buckets[table[(h + i) % len(table)]]
                if self._bucket_live(bucket):
                    return self._run_one(bucket.actions, packet)
            return []
        # `hash` (and the default): the live bucket with the highest (hash & 0xffff) x weight
        best = ovs_hash_bucket(h, [(b.bucket_id, self.weight(b)) for b in live])
        return self._run_one(next(b for b in live if b.bucket_id == best).actions, packet)


def dp_hash_table(weights):
    """Open vSwitch's dp_hash table for buckets of `weights`: the bucket of each hash value
    (ofproto-dpif.c group_setup_dp_hash_table: Webster's method over a power of two of values)."""
    total, smallest = sum(weights), min(w for w in weights if w > 0)
    slots = max(-(-total // smallest), min(len(weights) * 4, 256))
    n_hash = max(16, 1 << (slots - 1).bit_length())
    assert n_hash <= 256, f"OVS would refuse dp_hash for weights {weights}"
    divisors = [1] * len(weights)
    table = []
    for _ in range(n_hash):
        values = [w / d for w, d in zip(weights, divisors)]
        winner = values.index(max(values))          # the first of equal values wins, as in OVS
        divisors[winner] += 2
        table.append(winner)
    return table


# -- a whole fabric ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Delivery:
    kind: str            # "host" | "controller" | "drop" | "loop"
    where: str           # the host port's interface, or the switch (and port) where it ended
    packet: Packet
    hops: tuple          # (switch, in_port) of every switch crossed, in order

    @property
    def switches(self):
        return tuple(switch for switch, _port in self.hops)


class FakeFabric:
    def __init__(self, fabric):
        self.fabric = fabric
        self.tables = {name: FakeOFTable(name) for name in fabric.switches}
        self.datapaths = {name: FakeDatapath(s.dpid) for name, s in fabric.switches.items()}
        self._by_dpid = {s.dpid: name for name, s in fabric.switches.items()}
        self.wires = {}          # (switch, port) -> ("switch", name, port, link) | ("host", HostPort, None, link)
        for link in fabric.fabric_links:
            self.wires[(link.a, link.a_port)] = ("switch", link.b, link.b_port, link)
            self.wires[(link.b, link.b_port)] = ("switch", link.a, link.a_port, link)
        for host in fabric.hosts.values():
            for port in host.ports:
                link = next(k for k in fabric.host_links if k.a_intf == port.intf)
                self.wires[(port.leaf, port.leaf_port)] = ("host", port, None, link)
        self.down = set()        # Link.key of cables that carry nothing
        self.sent = []           # every message applied, in order

    def switch_of(self, dp):
        return self._by_dpid[dp.id]

    def apply(self, sends):
        """Apply the core's [(datapath, message)] to the switches' tables, in order."""
        for dp, msg in sends:
            self.sent.append(msg)
            self.tables[self.switch_of(dp)].apply([msg])

    def acknowledge(self, core, switches=None):
        """Answer the barriers the switches hold (all, or those of `switches`), in order."""
        for name, dp in self.datapaths.items():
            if switches is None or name in switches:
                table = self.tables[name]
                xids, table.barriers = table.barriers, []
                for xid in xids:
                    self.apply(core.barrier_reply(dp, xid))

    def connect(self, core, switches=None):
        """Switches connect and describe their ports (live unless their cable is cut), as OVS
        does; the core's messages are applied and its barriers answered."""
        for name in switches or self.fabric.switches:
            dp = self.datapaths[name]
            self.apply(core.switch_features(dp))
            ports = {}
            for port, intf in self.fabric.switch_ports(name).items():
                wire = self.wires.get((name, port))
                ports[port] = (intf, wire is None or wire[3].key not in self.down)
            self.apply(core.port_desc(dp, ports))
        self.acknowledge(core)

    def port_event(self, core, link, up, acknowledge=True):
        """Cut or mend a cable and report it to the core from both ends, as OVS would."""
        self.set_link(link, up)
        for switch, port in ((link.a, link.a_port), (link.b, link.b_port)):
            if switch in self.datapaths:
                self.apply(core.port_status(self.datapaths[switch], port, up))
        if acknowledge:
            self.acknowledge(core)

    def set_link(self, link, up):
        """Cut or mend a cable: its ports go dead (the groups watching them react at once)."""
        (self.down.discard if up else self.down.add)(link.key)
        for switch, port in ((link.a, link.a_port), (link.b, link.b_port)):
            if switch in self.tables:
                self.tables[switch].set_port(port, up)

    def packet(self, src, dst_ip, **fields):
        """A packet a host port sends to `dst_ip`, addressed to the MAC ARP gives for it."""
        owner = self.fabric.ip_owner.get(dst_ip)
        fields.setdefault("eth_dst", owner.mac if owner else "")
        return Packet(in_port=src.leaf_port, ipv4_src=src.ip, ipv4_dst=dst_ip, **fields)

    def trace(self, src, packet):
        """Every scenario for `packet` sent by host port `src`: [(Delivery, ...)]."""
        return self._walk(src.leaf, packet, (), 0)

    def route(self, src, packet):
        """The one scenario the switches' selection methods choose for `packet` from `src`."""
        return self._follow(src.leaf, packet, (), 0)

    def _follow(self, switch, packet, hops, depth):
        hops = hops + ((switch, packet.in_port),)
        if depth > MAX_HOPS:
            return (Delivery("loop", switch, packet, hops),)
        copies = self.tables[switch].choose(packet)
        if not copies:
            return (Delivery("drop", switch, packet, hops),)
        out = ()
        for port, copy in copies:
            if port == CONTROLLER:
                out += (Delivery("controller", switch, copy, hops),)
                continue
            wire = self.wires.get((switch, port))
            if wire is None or wire[3].key in self.down:
                out += (Delivery("drop", f"{switch}:{port}", copy, hops),)
            elif wire[0] == "host":
                out += (Delivery("host", wire[1].intf, copy, hops),)
            else:
                out += self._follow(wire[1], copy.with_fields(in_port=wire[2]), hops, depth + 1)
        return out

    def deliveries(self, src, packet):
        """Every delivery of every scenario, flattened (when the scenarios need no telling apart)."""
        return [d for scenario in self.trace(src, packet) for d in scenario]

    def _walk(self, switch, packet, hops, depth):
        hops = hops + ((switch, packet.in_port),)
        if depth > MAX_HOPS:
            return [(Delivery("loop", switch, packet, hops),)]
        scenarios = []
        for choice in self.tables[switch].forward(packet):
            if not choice:
                scenarios.append((Delivery("drop", switch, packet, hops),))
                continue
            per_copy = [self._leave(switch, port, out, hops, depth) for port, out in choice]
            for combo in itertools.product(*per_copy):
                scenarios.append(tuple(d for part in combo for d in part))
        return scenarios

    def _leave(self, switch, port, packet, hops, depth):
        if port == CONTROLLER:
            return [(Delivery("controller", switch, packet, hops),)]
        wire = self.wires.get((switch, port))
        if wire is None or wire[3].key in self.down:
            return [(Delivery("drop", f"{switch}:{port}", packet, hops),)]
        kind, peer, peer_port, _link = wire
        if kind == "host":
            return [(Delivery("host", peer.intf, packet, hops),)]
        return self._walk(peer, packet.with_fields(in_port=peer_port), hops, depth + 1)
