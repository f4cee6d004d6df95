"""The flow model's own fabric graph: lean integer arrays, built from a spec or from parameters.

`topologies.fabric.Fabric` names every port and interface for Mininet and OpenFlow, which costs
too much memory and time at 32K endpoints. The flow model only needs who connects to whom at
what rate, so this graph keeps nodes and directed links as integers in flat lists. Names,
orderings and addresses follow fabric.py wherever the spec allows, so a leaf's uplinks come in the
same order as its OpenFlow ports and an ECMP choice here means the same bucket there.

Beyond what a FabricSpec can say, the builder takes:
- sizes past the spec's limits (those come from interface names and the 10.x.y.z plan, which the
  model does not need): then addresses are numbered flat in 10.0.0.0/8;
- a 3-tier fat tree: `pods` copies of the leaf/spine tiers, joined by a super-spine tier. Spine k
  of every pod connects to the `superspines` super-spines of group k (the spine "planes" of a
  fat tree; seed 002 Figure 2 keeps rail separation the same way). A threetier spec maps onto
  it (`ClosParams.from_spec`), with the same names, ports and paths as fabric.py.

Node ids: switches 0..S-1, then host ports S..S+P-1. Every cable is two directed links (ids 2c,
2c+1) that fail together.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from types import SimpleNamespace

import numpy as np

from fabriclab.errors import LabError
from fabriclab.loading import excerpt

HOST, FABRIC, CORE = 0, 1, 2                   # link kinds: host-leaf, leaf-spine, spine-superspine
ROLES = ("leaf", "spine", "superspine")        # switch tier 0, 1, 2
MAX_PORTS = 1 << 21                            # host ports: keeps flat addresses inside 10/8
MAX_LINKS = 1 << 23
# Routes keep each switch's distance to each leaf: leaves x switches entries per plane. They are
# 2-byte integers in one table over all planes (planes x this many: 8M entries, 8 planes, 128 MB),
# but the cached next hops grow with them too; 2048 leaves x 2176 switches (the 256K-endpoint
# benchmark) is 4.5M. 100,000 leaves would be 10^10.
MAX_ROUTE_ENTRIES = 1 << 23


@dataclass(frozen=True)
class ClosParams:
    """What the model builds. leaves/spines are per pod and per plane; hosts hang off leaves."""

    name: str = "clos"
    planes: int = 1
    pods: int = 1
    leaves: int = 2
    spines: int = 2
    superspines: int = 0            # per spine group; > 0 makes the fabric 3-tier
    hosts_per_leaf: int = 2         # rail cabling: hosts per rail group
    nics_per_host: int = 1
    cabling: str = "rack"           # rack | rail: NIC i of a group's hosts on the group's leaf i
    parallel_links: int = 1         # per leaf-spine pair
    core_parallel_links: int = 1    # per spine-superspine pair
    host_rate_mbps: float = 10.0
    fabric_rate_mbps: float = 10.0
    core_rate_mbps: float = 0.0     # 0: same as fabric_rate_mbps

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise LabError(f"fabric {excerpt(self.name)}: " + "; ".join(problems))

    def problems(self):
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int":
                low = 0 if f.name == "superspines" else 1
                if isinstance(value, bool) or not isinstance(value, int) or value < low:
                    out.append(f"{f.name} must be a whole number >= {low}, got {excerpt(value)}")
            elif f.type == "float":
                # core_rate_mbps 0 means "as fabric_rate_mbps"; every other rate must be > 0
                number = isinstance(value, (int, float)) and not isinstance(value, bool)
                if not number or not (0 <= value < float("inf")) \
                        or (value == 0 and f.name != "core_rate_mbps"):
                    out.append(f"{f.name} must be a finite number > 0, got {excerpt(value)}")
            elif f.type == "str" and f.name == "cabling" and value not in ("rack", "rail"):
                out.append(f"cabling must be rack or rail, got {excerpt(value)}")
        if out:
            return out
        if self.cabling == "rail" and self.leaves % self.nics_per_host:
            out.append(f"rail cabling needs leaves per pod ({self.leaves}) a multiple of nics_per_host "
                       f"({self.nics_per_host})")
        if self.pods > 1 and self.superspines == 0:
            out.append(f"{self.pods} pods need superspines >= 1 to join them")
        if self.host_ports > MAX_PORTS:
            out.append(f"{self.host_ports} host ports is more than the model's limit of {MAX_PORTS}")
        elif self.link_count > MAX_LINKS:
            out.append(f"{self.link_count} directed links is more than the model's limit of {MAX_LINKS}")
        elif self.route_entries > MAX_ROUTE_ENTRIES:
            out.append(f"routes to every leaf from every switch need {self.route_entries} entries, more than "
                       f"the model's limit of {MAX_ROUTE_ENTRIES} (fewer leaves or planes)")
        return out

    @property
    def route_entries(self):
        """Distance-table entries routing keeps: every leaf's distance from every switch."""
        leaves = self.pods * self.leaves                    # per plane: planes do not meet
        switches = leaves + self.pods * self.spines + self.spines * self.superspines
        return self.planes * leaves * switches

    @classmethod
    def from_spec(cls, spec, **overrides):
        """Parameters of a FabricSpec (any kind), with optional overrides. A threetier spec's
        super_spines count the whole tier; here they are per spine group, as fabric.py wires them."""
        three = getattr(spec, "kind", None) == "threetier"
        base = cls(name=spec.name, planes=spec.planes, leaves=spec.leaves, spines=spec.spines,
                   hosts_per_leaf=spec.hosts_per_leaf, nics_per_host=spec.nics_per_host,
                   cabling=spec.cabling, parallel_links=spec.parallel_links, host_rate_mbps=spec.host_rate_mbps,
                   fabric_rate_mbps=spec.fabric_rate_mbps,
                   pods=spec.pods if three else 1,
                   superspines=spec.super_spines // spec.spines if three else 0,
                   core_rate_mbps=spec.core_rate_mbps if three else 0.0)
        return replace(base, **{k: v for k, v in overrides.items() if v is not None})

    @property
    def tiers(self):
        return 3 if self.superspines else 2

    @property
    def hosts(self):
        groups = self.leaves // self.nics_per_host if self.cabling == "rail" else self.leaves
        return self.pods * groups * self.hosts_per_leaf

    @property
    def rails(self):
        """Ports per host: one per NIC per plane."""
        return self.nics_per_host * self.planes

    @property
    def host_ports(self):
        return self.hosts * self.rails

    @property
    def core_rate(self):
        return self.core_rate_mbps or self.fabric_rate_mbps

    @property
    def link_count(self):
        per_plane = (self.pods * self.leaves * self.spines * self.parallel_links
                     + self.pods * self.spines * self.superspines * self.core_parallel_links)
        return 2 * (self.host_ports + self.planes * per_plane)


class ClosGraph:
    """Switches, host ports and directed links of a ClosParams, as flat lists of integers."""

    def __init__(self, params: ClosParams, spec=None):
        self.params = params
        self.spec = spec
        p = params
        # -- switches: per plane, leaves then spines then superspines (global index over pods)
        self.sw_name, self.sw_tier, self.sw_plane, self.sw_pod, self.sw_local = [], [], [], [], []
        self.leaf_id = {}          # (plane, global leaf index 1..) -> node
        self.spine_id = {}         # (plane, pod, local spine 0..) -> node
        self.superspine_id = {}    # (plane, group, member 0..) -> node
        multi = p.planes > 1
        for plane in range(1, p.planes + 1):
            prefix = f"p{plane}" if multi else ""
            for i in range(p.pods * p.leaves):
                self.leaf_id[plane, i + 1] = self._switch(f"{prefix}l{i + 1}", 0, plane, i // p.leaves, i)
            for j in range(p.pods * p.spines):
                pod, k = divmod(j, p.spines)
                self.spine_id[plane, pod, k] = self._switch(f"{prefix}s{j + 1}", 1, plane, pod, k)
            for g in range(p.spines * p.superspines):
                group, m = divmod(g, p.superspines)
                self.superspine_id[plane, group, m] = self._switch(f"{prefix}ss{g + 1}", 2, plane, -1, group)
        self.n_switches = len(self.sw_name)

        # -- links: host cables first, then leaf-spine, then spine-superspine
        self.link_src, self.link_dst, self.link_cap, self.link_kind = [], [], [], []
        self.cable_member = []       # parallel member index of each cable
        self.port_host, self.port_nic, self.port_plane, self.port_leaf, self.port_ip = [], [], [], [], []
        rail = p.cabling == "rail"
        per_leaf = p.hosts_per_leaf if rail else p.hosts_per_leaf * p.nics_per_host
        lab_plan = p.pods * p.leaves <= 254 and per_leaf <= 253
        for h in range(p.hosts):
            group, in_leaf = divmod(h, p.hosts_per_leaf)
            for nic in range(p.nics_per_host):
                if rail:        # fabric.py's rail groups: NIC i on the group's leaf i
                    leaf_index, slot = group * p.nics_per_host + nic, in_leaf + 1
                else:
                    leaf_index, slot = group, in_leaf * p.nics_per_host + nic + 1
                for plane in range(1, p.planes + 1):
                    port = self.n_switches + len(self.port_host)
                    leaf = self.leaf_id[plane, leaf_index + 1]
                    self.port_host.append(h)
                    self.port_nic.append(nic)
                    self.port_plane.append(plane)
                    self.port_leaf.append(leaf)
                    # fabric.py's 10.<plane>.<leaf>.<slot> where it fits, else flat in 10/8
                    self.port_ip.append((10 << 24) | (plane << 16) | ((leaf_index + 1) << 8) | slot
                                        if lab_plan else (10 << 24) + port - self.n_switches + 1)
                    self._cable(port, leaf, p.host_rate_mbps, HOST, 0)
        for plane in range(1, p.planes + 1):
            for i in range(p.pods * p.leaves):
                leaf = self.leaf_id[plane, i + 1]
                for k in range(p.spines):
                    spine = self.spine_id[plane, i // p.leaves, k]
                    for member in range(p.parallel_links):
                        self._cable(leaf, spine, p.fabric_rate_mbps, FABRIC, member)
        for plane in range(1, p.planes + 1):
            for pod in range(p.pods):
                for k in range(p.spines):
                    spine = self.spine_id[plane, pod, k]
                    for m in range(p.superspines):
                        for member in range(p.core_parallel_links):
                            self._cable(spine, self.superspine_id[plane, k, m], p.core_rate, CORE, member)
        self.n_ports = len(self.port_host)
        self.n_links = len(self.link_src)
        # Directed switch adjacency, links in id order (= a leaf's OpenFlow port order).
        self.adj = [{} for _ in range(self.n_switches)]
        for e in range(2 * self.n_ports, self.n_links):
            self.adj[self.link_src[e]].setdefault(self.link_dst[e], []).append(e)
        self.host_port_ids = [list(range(self.n_switches + h * p.rails, self.n_switches + (h + 1) * p.rails))
                              for h in range(p.hosts)]

    def arrays(self):
        """numpy views of the links for vectorised code, built once: link_src, link_dst,
        link_cap, and each switch's outgoing switch-to-switch links in id order
        (out_links[out_start[x]:out_start[x + 1]])."""
        found = getattr(self, "_arrays", None)
        if found is None:
            src = np.asarray(self.link_src, dtype=np.int64)
            first = 2 * self.n_ports
            # int32: link ids stay below MAX_LINKS, and every cached next-hop array is half the size
            order = (first + np.argsort(src[first:], kind="stable")).astype(np.int32)
            start = np.searchsorted(src[order], np.arange(self.n_switches + 1))
            found = self._arrays = SimpleNamespace(
                link_src=src, link_dst=np.asarray(self.link_dst, dtype=np.int64),
                link_cap=np.asarray(self.link_cap, dtype=np.float64), out_links=order, out_start=start)
        return found

    def _switch(self, name, tier, plane, pod, local):
        self.sw_name.append(name)
        self.sw_tier.append(tier)
        self.sw_plane.append(plane)
        self.sw_pod.append(pod)
        self.sw_local.append(local)
        return len(self.sw_name) - 1

    def _cable(self, lower, upper, rate, kind, member):
        """Two directed links: 2c goes up (lower -> upper tier), 2c+1 comes down."""
        self.link_src += (lower, upper)
        self.link_dst += (upper, lower)
        self.link_cap += (float(rate), float(rate))
        self.link_kind += (kind, kind)
        self.cable_member.append(member)

    # -- queries ---------------------------------------------------------------------------------
    @property
    def route_entries(self):
        """Distance-table entries routing keeps: every leaf's distance from every switch."""
        leaves = self.pods * self.leaves                    # per plane: planes do not meet
        switches = leaves + self.pods * self.spines + self.spines * self.superspines
        return self.planes * leaves * switches

    @classmethod
    def from_spec(cls, spec, **overrides):
        return cls(ClosParams.from_spec(spec, **overrides), spec)

    def up_link(self, port):
        """The link from a host port into its leaf."""
        return 2 * (port - self.n_switches)

    def down_link(self, port):
        return 2 * (port - self.n_switches) + 1

    @property
    def n_cables(self):
        return self.n_links // 2

    def fabric_cables(self):
        """Cables between switches: what the failure studies break (host links stay up)."""
        return range(self.n_ports, self.n_cables)

    @property
    def leaves(self):
        return [n for n in range(self.n_switches) if self.sw_tier[n] == 0]

    def node_name(self, node):
        if node < self.n_switches:
            return self.sw_name[node]
        port = node - self.n_switches
        name = f"h{self.port_host[port] + 1}-n{self.port_nic[port]}"
        return name + (f"p{self.port_plane[port]}" if self.params.planes > 1 else "")

    def link_label(self, e):
        """'l1-s2' like fabric.Link.label (lower tier first, '#2' for the second member)."""
        c = e // 2
        lower, upper = self.link_src[2 * c], self.link_dst[2 * c]
        member = self.cable_member[c]
        return f"{self.node_name(lower)}-{self.node_name(upper)}" + (f"#{member + 1}" if member else "")

    def ip_text(self, port):
        ip = self.port_ip[port - self.n_switches]
        return f"{ip >> 24}.{(ip >> 16) & 255}.{(ip >> 8) & 255}.{ip & 255}"

    def summary(self):
        p = self.params
        return {
            "name": p.name,
            "tiers": p.tiers,
            "planes": p.planes,
            "pods": p.pods,
            "switches": self.n_switches,
            "hosts": p.hosts,
            "host_ports": self.n_ports,
            "cables": self.n_cables,
            "fabric_cables": len(self.fabric_cables()),
            "host_rate_mbps": p.host_rate_mbps,
            "fabric_rate_mbps": p.fabric_rate_mbps,
            "core_rate_mbps": p.core_rate if p.tiers == 3 else None,
            "params": asdict(p),
        }
