"""The fabric graph: every node, port, link and address a spec implies, as plain data.

Built deterministically from a FabricSpec, so the Mininet builder, the controller process and the
CLI all agree on names, datapath ids, OpenFlow port numbers, MACs and addresses without talking to
each other. It serialises to JSON for the controller process. Nothing here starts anything.

Conventions (kept short so interface names stay within Linux's 15 characters):
- switches: leafspine 'l3', 's1'; multiplane 'p2l3', 'p2s1' (plane 2, leaf 3); threetier numbers
  leaves and spines across pods ('l5' is pod 2's first leaf with 4 leaves a pod) and adds the
  super-spines 'ss1'..
- hosts 'h5'; a host port (one per NIC per plane) 'h5-n0' or, multiplane, 'h5-n0p2'
- switch ports are '<switch>-eth<openflow port number>'
- a host port's address is 10.<plane>.<leaf>.<slot>; each leaf owns 10.<plane>.<leaf>.0/24
- rail cabling: leaves come in rail groups of nics_per_host; NIC i of group g's hosts is on leaf
  g*nics_per_host + i + 1 (in every plane), at slot <host's place in its group> + 1
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from fabriclab.errors import SpecError
from fabriclab.loading import excerpt
from fabriclab.topologies.spec import Buffers, FabricSpec, LinkDelay
from fabriclab.queues.config import QueueSpec

ROLE_TIER = {"leaf": 0, "spine": 1, "super_spine": 2}


@dataclass(frozen=True)
class Switch:
    name: str
    role: str        # 'leaf' | 'spine' | 'super_spine' (threetier)
    plane: int       # 1-based
    index: int       # 1-based within its role and plane (across pods)
    dpid: int
    pod: int = 1     # 1-based AI zone of a leaf or spine; 0 for a super-spine (it joins them all)

    @property
    def tier(self):
        return ROLE_TIER[self.role]


@dataclass(frozen=True)
class HostPort:
    host: str
    nic: int         # 0-based NIC of the host
    plane: int       # 1-based plane the port attaches to
    intf: str        # interface name inside the host
    mac: str
    ip: str
    leaf: str        # the leaf switch it is cabled to
    leaf_port: int   # OpenFlow port number on that leaf


@dataclass(frozen=True)
class Host:
    name: str
    index: int       # 1-based
    # 1-based: the one leaf (in every plane) the host sits under; None under rail cabling, where
    # each NIC has its own leaf (HostPort.leaf) and `group` says which hosts share leaves
    leaf_index: int | None
    ports: tuple
    group: int = 0   # 1-based: the hosts sharing its leaves: its leaf (rack) or rail group (rail)

    def nic_ports(self, nic):
        """The ports of one NIC (its rail), in plane order."""
        return sorted((p for p in self.ports if p.nic == nic), key=lambda p: p.plane)


@dataclass(frozen=True)
class Link:
    """A cable. For fabric links a is the lower tier (leaf) and b the upper (spine)."""

    a: str
    a_port: int
    a_intf: str
    b: str
    b_port: int
    b_intf: str
    rate_mbps: float
    kind: str        # 'host' (host port to leaf) | 'fabric' (switch to switch)
    plane: int
    member: int = 0  # which of the parallel links between the same two switches

    @property
    def key(self):
        return (self.a, self.a_port, self.b, self.b_port)

    @property
    def label(self):
        suffix = f"#{self.member + 1}" if self.member else ""
        return f"{self.a}-{self.b}{suffix}"


def leaf_subnet(plane, leaf_index):
    return f"10.{plane}.{leaf_index}.0/24"


def switch_dpid(role, plane, index):
    # tier in the high word, then plane, then index: readable in ovs-ofctl output
    return ((ROLE_TIER[role] + 1) << 32) | (plane << 16) | index


class Fabric:
    """Nodes and links of a spec. Build with Fabric(spec); restore with Fabric.from_json()."""

    def __init__(self, spec: FabricSpec):
        too_big = beyond_any_lab(spec)        # refused from its counts, before a name is made
        if too_big:
            raise SpecError(too_big)
        self.spec = spec
        self.switches = {}
        self.hosts = {}
        self.links = []
        self._build()
        self.port_owner = {(h.leaf, h.leaf_port): h for host in self.hosts.values() for h in host.ports}
        self.ip_owner = {p.ip: p for host in self.hosts.values() for p in host.ports}
        self._between = {}           # {node, node} -> its links in order: find_link without a scan
        for link in self.links:
            self._between.setdefault(frozenset((link.a, link.b)), []).append(link)

    # -- construction -------------------------------------------------------------------------
    def _switch_name(self, role, plane, index):
        prefix = {"leaf": "l", "spine": "s", "super_spine": "ss"}[role]
        return f"p{plane}{prefix}{index}" if self.spec.kind == "multiplane" else f"{prefix}{index}"

    def _build(self):
        spec = self.spec
        tiers = [("leaf", spec.leaves), ("spine", spec.spines)]
        if spec.kind == "threetier":
            tiers.append(("super_spine", spec.super_spines))
        for plane in range(1, spec.planes + 1):
            for role, per_pod in tiers:
                pods = 1 if role == "super_spine" else spec.pods
                for index in range(1, pods * per_pod + 1):
                    name = self._switch_name(role, plane, index)
                    pod = 0 if role == "super_spine" else (index - 1) // per_pod + 1
                    self.switches[name] = Switch(name, role, plane, index, switch_dpid(role, plane, index), pod)

        host_ports_per_leaf = spec.host_ports_per_leaf
        rail = spec.cabling == "rail"
        for h in range(1, spec.hosts + 1):
            name = f"h{h}"
            group = (h - 1) // spec.hosts_per_leaf + 1
            in_leaf = (h - 1) % spec.hosts_per_leaf
            ports = []
            for nic in range(spec.nics_per_host):
                if rail:        # NIC i on rail leaf i of the group, one slot per host there
                    leaf_index, slot = (group - 1) * spec.nics_per_host + nic + 1, in_leaf + 1
                else:
                    leaf_index, slot = group, in_leaf * spec.nics_per_host + nic + 1
                for plane in range(1, spec.planes + 1):
                    intf = f"{name}-n{nic}p{plane}" if spec.kind == "multiplane" else f"{name}-n{nic}"
                    leaf = self._switch_name("leaf", plane, leaf_index)
                    mac = "02:%02x:%02x:%02x:%02x:%02x" % (h >> 8, h & 0xFF, nic, plane, 0x01)
                    port = HostPort(name, nic, plane, intf, mac, f"10.{plane}.{leaf_index}.{slot}",
                                    leaf, slot)
                    ports.append(port)
                    self.links.append(Link(name, -1, intf, leaf, slot, f"{leaf}-eth{slot}",
                                           spec.host_rate_mbps, "host", plane))
            self.hosts[name] = Host(name, h, None if rail else group, tuple(ports), group)

        # Leaf uplinks follow the host ports; spine ports are numbered by leaf (of its pod) then member.
        for plane in range(1, spec.planes + 1):
            for li in range(1, spec.total_leaves + 1):
                leaf = self._switch_name("leaf", plane, li)
                pod, in_pod = divmod(li - 1, spec.leaves)
                for si in range(1, spec.spines + 1):
                    spine = self._switch_name("spine", plane, pod * spec.spines + si)
                    for member in range(spec.parallel_links):
                        lp = host_ports_per_leaf + (si - 1) * spec.parallel_links + member + 1
                        sp = in_pod * spec.parallel_links + member + 1
                        self.links.append(Link(leaf, lp, f"{leaf}-eth{lp}", spine, sp, f"{spine}-eth{sp}",
                                               spec.fabric_rate_mbps, "fabric", plane, member))
        if spec.kind == "threetier":
            self._build_core()

    def _build_core(self):
        """threetier: spine k of every pod joins super-spines (k-1)g+1..kg, g = super_spines /
        spines (model/graph.py's fat tree, so both count the same paths). A spine's uplinks follow
        its leaf ports; a super-spine's port p faces pod p."""
        spec = self.spec
        group = spec.super_spines // spec.spines
        downlinks = spec.leaves * spec.parallel_links
        for pod in range(1, spec.pods + 1):
            for k in range(1, spec.spines + 1):
                spine = self._switch_name("spine", 1, (pod - 1) * spec.spines + k)
                for m in range(1, group + 1):
                    top = self._switch_name("super_spine", 1, (k - 1) * group + m)
                    sp = downlinks + m
                    self.links.append(Link(spine, sp, f"{spine}-eth{sp}", top, pod, f"{top}-eth{pod}",
                                           spec.core_rate_mbps, "fabric", 1))

    # -- queries --------------------------------------------------------------------------------
    @property
    def fabric_links(self):
        return [link for link in self.links if link.kind == "fabric"]

    @property
    def host_links(self):
        return [link for link in self.links if link.kind == "host"]

    def leaves(self, plane=None):
        return [s for s in self.switches.values()
                if s.role == "leaf" and (plane is None or s.plane == plane)]

    def switch_ports(self, switch):
        """OpenFlow port number -> interface name, for every cabled port of a switch."""
        ports = {}
        for link in self.links:
            if link.a == switch:
                ports[link.a_port] = link.a_intf
            if link.b == switch:
                ports[link.b_port] = link.b_intf
        return dict(sorted(ports.items()))

    def find_link(self, node1, node2, member=None):
        """Links between two nodes (in either order); optionally only parallel member `member`."""
        return [link for link in self._between.get(frozenset((node1, node2)), ())
                if member is None or link.member == member]

    def host_port(self, ref):
        """A host port by interface name, by address, or a host's first port by host name."""
        if ref in self.hosts:
            return self.hosts[ref].ports[0]
        if ref in self.ip_owner:
            return self.ip_owner[ref]
        for host in self.hosts.values():
            for port in host.ports:
                if port.intf == ref:
                    return port
        return None

    def pod_of(self, node):
        """The AI zone (1-based pod) of a host or switch; 0 for a super-spine."""
        if node in self.hosts:
            node = self.hosts[node].ports[0].leaf
        return self.switches[node].pod

    @property
    def core_links(self):
        """threetier: the spine <-> super-spine cables, which every cross-zone byte crosses."""
        return [link for link in self.fabric_links if self.switches[link.b].role == "super_spine"]

    def buffer_bytes(self, node):
        role = "host" if node in self.hosts else self.switches[node].role
        return getattr(self.spec.buffers, role)

    def summary(self):
        """Counts and derived figures a person checks before running anything."""
        return summary(self.spec)

    # -- serialisation ----------------------------------------------------------------------------
    def to_json(self):
        return json.dumps({"spec": asdict(self.spec)}, indent=1)

    @classmethod
    def from_json(cls, text):
        return cls.from_spec_dict(json.loads(text)["spec"])

    @classmethod
    def from_spec_dict(cls, data):
        """The fabric of a spec as `FabricSpec.to_dict` wrote it (a results document's `spec`)."""
        data = {k: v for k, v in data.items() if k not in FabricSpec.DERIVED}
        queues = data.get("queues")
        return cls(FabricSpec(**{**data, "buffers": Buffers(**data["buffers"]),
                                 "delay": LinkDelay(**data.get("delay", {})),
                                 "queues": QueueSpec.from_dict(queues) if queues else None}))


def counts(spec):
    """What Fabric(spec) holds, counted from the spec alone (nothing is named or built):
    switches, hosts, host ports and links. A unit test holds them equal to a built fabric's."""
    three = spec.kind == "threetier"
    switches = spec.planes * spec.pods * (spec.leaves + spec.spines) + (spec.super_spines if three else 0)
    host_ports = spec.hosts * spec.nics_per_host * spec.planes
    fabric_links = spec.planes * spec.pods * spec.leaves * spec.spines * spec.parallel_links
    core_links = spec.pods * spec.super_spines if three else 0
    return {"switches": switches, "hosts": spec.hosts, "host_ports": host_ports,
            "links": host_ports + fabric_links + core_links}


def summary(spec):
    """Counts and derived figures a person checks before running anything (Fabric.summary), from
    the spec alone: `check` answers at once for a spec of any size, built or not."""
    n = counts(spec)
    roles = {"host", "leaf", "spine"} | ({"super_spine"} if spec.kind == "threetier" else set())
    return {
        "name": spec.name,
        "kind": spec.kind,
        "cabling": spec.cabling,
        "planes": spec.planes,
        **n,
        "host_rate_mbps": spec.host_rate_mbps,
        "fabric_rate_mbps": spec.fabric_rate_mbps,
        "mtu": spec.mtu,
        "oversubscription": round(spec.oversubscription, 3),
        **({"pods": spec.pods, "super_spines": spec.super_spines,
            "super_spine_rate_mbps": spec.core_rate_mbps,
            "cross_zone_oversubscription": round(spec.cross_zone_oversubscription, 3)}
           if spec.kind == "threetier" else {}),
        "buffers_bytes": {role: size for role, size in asdict(spec.buffers).items() if role in roles},
        "time_scale": spec.time_scale,
        "lab_delay_ms": {kind: spec.lab_delay_ms(kind) for kind in ("host", "fabric")},
    }


# What one machine's lab brings up: Mininet starts nodes one by one (about 0.1 s each) and every
# link is a veth pair with its qdiscs; 48 switches and 256 hosts took 24 s. Past these the
# bring-up takes longer than anyone waits and the links share one forwarding thread's few hundred
# Mbit/s: the flow model (`fabriclab model fabric`) is the tool for such fabrics.
MAX_LAB_NODES = 1024
MAX_LAB_LINKS = 4096
# What a Fabric names at most. A spec may say more (the flow model takes 262,144 endpoints), but
# naming every port costs about 4 us and 0.5 KB a link, and the largest spec the loader takes (99
# planes of 254 leaves, 64 spines and 16 parallel links, 64,262 hosts) is 32 million links: minutes
# and over 10 GB before anything could refuse it. Nodes: a lab split over the most machines a split
# takes (topologies/split.py), each within one machine's bound. Links: 2 s and 250 MB, which
# every single-plane spec the loader takes fits (the largest leafspine has 324,358 links).
MAX_MACHINES = 64
MAX_FABRIC_NODES = MAX_MACHINES * MAX_LAB_NODES
MAX_FABRIC_LINKS = 1 << 19


def _too_many(spec, nodes, links, node_bound, link_bound, where):
    if nodes > node_bound:
        return (f"fabric {excerpt(spec.name)} has {nodes} switches and hosts; {where} at most "
                f"{node_bound} (use `fabriclab model fabric` for larger fabrics)")
    if links > link_bound:
        return (f"fabric {excerpt(spec.name)} has {links} links; {where} at most {link_bound} "
                f"(use `fabriclab model fabric` for larger fabrics)")
    return None


def beyond_one_machine(spec):
    """None when one machine can build the fabric of `spec`, else one line saying which bound it
    passes (from the counts: nothing is built)."""
    n = counts(spec)
    return _too_many(spec, n["switches"] + n["hosts"], n["links"], MAX_LAB_NODES, MAX_LAB_LINKS,
                     "one machine's lab builds")


def beyond_any_lab(spec):
    """None when some lab (one machine, or a split over up to MAX_MACHINES) could build the
    fabric of `spec`, else one line: Fabric(spec) refuses it before naming anything."""
    n = counts(spec)
    return _too_many(spec, n["switches"] + n["hosts"], n["links"], MAX_FABRIC_NODES, MAX_FABRIC_LINKS,
                     f"a lab over {MAX_MACHINES} machines builds")
