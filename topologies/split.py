"""Where each switch and host of a fabric would run when one fabric is spread over several machines
(issue 21, Mininet's cluster edition), and what that split costs: the cables that cross machines
and what each machine's switches must forward. Plain data; nothing here starts anything.

A split is `by` one of:
- leaf: contiguous blocks of leaf indexes (leaf i of every plane together); a spine is dealt
  round-robin over the machines holding its pod's leaves, a super-spine over all; a host goes with
  the leaf of its NIC 0.
- plane: contiguous blocks of planes (multiplane); a host's NICs reach every plane, so hosts are
  dealt in contiguous blocks too and most host cables cross.
- pod: contiguous blocks of a threetier fabric's pods; super-spines dealt round-robin.
- explicit: `place` names every switch's machine; a host not named goes with its NIC 0's leaf.

Only cables cross machines, never a node: a host's cable to a leaf on another machine is a boundary
link like a leaf's uplink to a spine there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fabriclab.errors import SpecError
from fabriclab.loading import clip, excerpt, fields, is_file, load_yaml, whole
from fabriclab.topologies.fabric import MAX_MACHINES

BY = ("leaf", "plane", "pod", "explicit")


@dataclass(frozen=True)
class SplitSpec:
    by: str
    machines: int
    place: dict = field(default_factory=dict)    # explicit: node name -> machine (1-based)


def parse_split(text):
    """`--split BY:N` (leaf:2, plane:4, pod:2) or the path of an explicit split file, as a
    SplitSpec; SpecError in one line otherwise."""
    if str(text).endswith((".yaml", ".yml")) or is_file(text):
        return load_split(text)
    by, sep, count = str(text).partition(":")
    if not sep or by not in BY or by == "explicit":
        raise SpecError(f"--split {excerpt(text)}: expected leaf:N, plane:N, pod:N or a split file")
    try:
        machines = int(count)
    except ValueError:
        raise SpecError(f"--split {excerpt(text)}: N must be a whole number of machines") from None
    return SplitSpec(by, machines)


def load_split(path):
    """An explicit split from a YAML file: {machines: N, place: {M: [switch and host names]}}."""
    return split_from_doc(load_yaml(path, "split file", error=SpecError), f"split file {clip(path)}")


def split_from_doc(doc, where="split"):
    """An explicit split from a loaded mapping; SpecError in one line on anything else."""
    fields(doc, where, ("machines", "place"), required=("machines", "place"), error=SpecError)
    machines = whole(doc["machines"], f"{where}: machines", 2, MAX_MACHINES, error=SpecError)
    place = doc["place"]
    if not isinstance(place, dict) or not place:
        raise SpecError(f"{where}: place must map a machine number to a list of switch and host names")
    out = {}
    for machine, names in place.items():
        whole(machine, f"{where}: a machine of place", 1, machines, error=SpecError)
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise SpecError(f"{where}: place.{machine} must be a list of switch and host names")
        for name in names:
            if name in out:
                raise SpecError(f"{where}: {excerpt(name)} is placed on machines {out[name]} and {machine}")
            out[name] = machine
    return SplitSpec("explicit", machines, out)


def _blocks(count, machines):
    """Machine (1-based) of items 1..count cut into `machines` contiguous blocks, sizes within one."""
    return {i: (i - 1) * machines // count + 1 for i in range(1, count + 1)}


class Split:
    """A fabric's nodes on machines 1..N: `machine_of`, the `boundary` links and a per-machine
    summary. SpecError (one line) when the split does not fit the fabric."""

    def __init__(self, fabric, split: SplitSpec):
        self.fabric = fabric
        self.spec = split
        if split.by not in BY:
            raise SpecError(f"split: by must be one of {', '.join(BY)}, got {excerpt(split.by)}")
        if not isinstance(split.machines, int) or not 2 <= split.machines <= MAX_MACHINES:
            raise SpecError(f"split: machines must be 2..{MAX_MACHINES}, got {excerpt(split.machines)}")
        self.machine_of = getattr(self, f"_by_{split.by}")()
        empty = [m for m in range(1, split.machines + 1)
                 if not any(self.machine_of[s] == m for s in fabric.switches)]
        if empty:
            raise SpecError(f"split by {split.by}: machine {empty[0]} of {split.machines} would hold no switch; "
                            f"use fewer machines")
        self.boundary = [link for link in fabric.links if self.machine_of[link.a] != self.machine_of[link.b]]

    # -- placements -----------------------------------------------------------------------------
    def _switches(self, role):
        return [s for s in self.fabric.switches.values() if s.role == role]

    def _hosts_by_leaf(self, placed):
        return {h.name: placed[h.ports[0].leaf] for h in self.fabric.hosts.values()}

    def _spread_upper(self, placed, roles=("spine", "super_spine")):
        """Deal spines round-robin over the machines that hold their pod's leaves (in their plane),
        super-spines over every machine."""
        every = list(range(1, self.spec.machines + 1))
        for role in roles:
            groups = {}
            for s in sorted(self._switches(role), key=lambda s: s.index):
                groups.setdefault((s.plane, s.pod), []).append(s.name)
            for (plane, pod), names in groups.items():
                under = sorted({placed[leaf.name] for leaf in self._switches("leaf")
                                if leaf.plane == plane and leaf.pod == pod}) if role == "spine" else every
                placed.update({name: under[i % len(under)] for i, name in enumerate(names)})
        return placed

    def _by_leaf(self):
        leaves = self.fabric.spec.total_leaves
        if leaves < self.spec.machines:
            raise SpecError(f"split by leaf: {leaves} leaves cannot fill {self.spec.machines} machines")
        block = _blocks(leaves, self.spec.machines)
        placed = {s.name: block[s.index] for s in self._switches("leaf")}
        self._spread_upper(placed)
        placed.update(self._hosts_by_leaf(placed))
        return placed

    def _by_plane(self):
        planes = self.fabric.spec.planes
        if planes < self.spec.machines:
            raise SpecError(f"split by plane: {planes} plane(s) cannot fill {self.spec.machines} machines "
                            f"(a multiplane spec with at least as many planes)")
        block = _blocks(planes, self.spec.machines)
        placed = {s.name: block[s.plane] for s in self.fabric.switches.values()}
        hosts = _blocks(len(self.fabric.hosts), self.spec.machines)
        placed.update({h.name: hosts[h.index] for h in self.fabric.hosts.values()})
        return placed

    def _by_pod(self):
        spec = self.fabric.spec
        if spec.kind != "threetier":
            raise SpecError(f"split by pod: spec {excerpt(spec.name)} is {spec.kind}; pods are a threetier spec's zones")
        if spec.pods < self.spec.machines:
            raise SpecError(f"split by pod: {spec.pods} pods cannot fill {self.spec.machines} machines")
        block = _blocks(spec.pods, self.spec.machines)
        placed = {s.name: block[s.pod] for s in self.fabric.switches.values() if s.role != "super_spine"}
        self._spread_upper(placed, roles=("super_spine",))
        placed.update(self._hosts_by_leaf(placed))
        return placed

    def _by_explicit(self):
        place = dict(self.spec.place)
        known = set(self.fabric.switches) | set(self.fabric.hosts)
        unknown = sorted(set(place) - known)
        if unknown:
            raise SpecError(f"split: no switch or host {excerpt(unknown[0])} in fabric {excerpt(self.fabric.spec.name)}")
        missing = [s for s in self.fabric.switches if s not in place]
        if missing:
            raise SpecError(f"split: {len(missing)} switch(es) not placed, e.g. {missing[0]}; an explicit split "
                            f"names every switch's machine")
        for host in self.fabric.hosts.values():
            place.setdefault(host.name, place[host.ports[0].leaf])
        return place

    # -- what it costs --------------------------------------------------------------------------
    def machines(self):
        """Per machine: its switches, hosts, switch ports, the rate its switches forward at most
        (every switch port's link rate, Mbit/s) and its boundary links."""
        fabric = self.fabric
        rows = []
        for m in range(1, self.spec.machines + 1):
            switches = [s for s in fabric.switches if self.machine_of[s] == m]
            ports = [link for link in fabric.links for end in (link.a, link.b)
                     if end in fabric.switches and self.machine_of[end] == m]
            crossing = [link for link in self.boundary if m in (self.machine_of[link.a], self.machine_of[link.b])]
            rows.append({
                "machine": m,
                "switches": len(switches),
                "hosts": sum(1 for h in fabric.hosts if self.machine_of[h] == m),
                "switch_ports": len(ports),
                "forwarding_mbps": sum(link.rate_mbps for link in ports),
                "boundary_links": len(crossing),
                "boundary_mbps": sum(link.rate_mbps for link in crossing),
            })
        return rows

    def summary(self):
        return {
            "by": self.spec.by,
            "machines": self.machines(),
            "boundary_links": len(self.boundary),
            "boundary_mbps": sum(link.rate_mbps for link in self.boundary),
            "boundary_host_links": sum(1 for link in self.boundary if link.kind == "host"),
            "boundary": [{"link": link.label, "kind": link.kind, "rate_mbps": link.rate_mbps,
                          "machines": [self.machine_of[link.a], self.machine_of[link.b]]}
                         for link in self.boundary],
        }
