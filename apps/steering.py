"""Steering as data: the OpenFlow entries that hand an in-network service's traffic (SwitchML's
aggregation) to a server beside a switch, and copy that server's results to a group of hosts.

A programmable switch would aggregate in its own pipeline. Here, as in seed 003 section 7, a server
cabled to the switch does that work and the switch's flow table hides the difference:

- a *service* address belongs to a switch: packets to it (UDP, one port) are rewritten to the
  server's MAC and IP and sent out of the port towards it;
- a *group* address belongs to a switch too: packets to it go to an OpenFlow ALL group with one
  bucket per member, each rewriting the copy to that member before sending it on;
- a *route* forwards a service or group address from another switch towards the one that owns it
  (a leaf's aggregator reaching its spine's).

The controller answers ARP for these addresses with SERVICE_MAC, so hosts address them like any
neighbour. The lab writes the plan as JSON (`steering.json` in the run folder); the routing app
merges `steering_state()` into the state it programs, so steering survives recomputes and restarts.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from fabriclab.apps.ecmp import Flow, SwitchState, match

PRIO_STEER = 900               # above host routes (500) and prefixes (100); ARP (1000) is disjoint
PRIO_HAIRPIN = 901             # the same entries for packets that must leave by the port they came in
IN_PORT = "in_port"            # Rewrite.port for OpenFlow's IN_PORT: a plain output to it is dropped
GROUP_BASE = 0x60000000        # above ECMP (plane << 16 | leaf) and fast-failover (0x4...) group ids
SERVICE_MAC = "02:fa:b1:00:00:01"
STEER_COOKIE = 0x5E5E0000


@dataclass(frozen=True)
class Rewrite:
    """Set the destination MAC and IP, then output on `port`."""

    mac: str
    ip: str
    port: int


@dataclass(frozen=True)
class ReplicateGroup:
    """An OpenFlow ALL group: every bucket gets its own rewritten copy."""

    buckets: tuple


class SteeringError(ValueError):
    """A plan that names an unknown switch or port, or reuses an address."""


def _address(value, where):
    try:
        return str(ipaddress.IPv4Address(value))
    except (ipaddress.AddressValueError, ValueError):
        raise SteeringError(f"{where}: {value!r} is not an IPv4 address") from None


def _target(entry, switch, ports, where):
    try:
        mac, ip, via = entry["mac"], _address(entry["ip"], where), int(entry["via"])
    except (KeyError, TypeError, ValueError) as exc:
        raise SteeringError(f"{where}: needs mac, ip and via ({exc})") from None
    if via not in ports:
        raise SteeringError(f"{where}: {switch} has no port {via}")
    return Rewrite(mac, ip, via)


def parse_plan(fabric, plan):
    """Check a plan against the fabric; returns {switch: [(kind, address, detail)]} in plan order."""
    out, owners = {}, {}
    for kind in ("services", "groups", "routes"):
        for i, entry in enumerate(plan.get(kind) or []):
            where = f"steering {kind}[{i}]"
            switch = entry.get("switch") if isinstance(entry, dict) else None
            if switch not in fabric.switches:
                raise SteeringError(f"{where}: no switch {switch!r}")
            ports = set(fabric.switch_ports(switch))
            address = _address(entry.get("address"), where)
            if (switch, address) in owners:
                raise SteeringError(f"{where}: {address} is already steered on {switch} by {owners[(switch, address)]}")
            owners[(switch, address)] = where
            if kind == "services":
                detail = (int(entry.get("udp_dst", 0)), _target(entry.get("to") or {}, switch, ports, where))
                if not 0 < detail[0] < 65536:
                    raise SteeringError(f"{where}: udp_dst must be a port number")
            elif kind == "groups":
                members = entry.get("members") or []
                if not members:
                    raise SteeringError(f"{where}: a group needs members")
                detail = tuple(_target(m, switch, ports, f"{where}.members[{j}]") for j, m in enumerate(members))
            else:
                via = entry.get("via")
                if via not in ports:
                    raise SteeringError(f"{where}: {switch} has no port {via!r}")
                detail = via
            out.setdefault(switch, []).append((kind, address, detail))
    return out


def steering_state(fabric, plan):
    """{switch: SwitchState} holding only the steering entries of `plan` (see module doc).

    OpenFlow drops an output to the port a packet came in by, which steering needs: a spine steers
    leaf 1's packets to a server behind leaf 1, and copies a result from there back to leaf 1. So
    each service and group gets, per port it outputs to, a hairpin twin matching that in_port and
    sending to IN_PORT instead (for a group, a twin group)."""
    states = {}
    next_group = GROUP_BASE
    for switch, entries in parse_plan(fabric, plan).items():
        state = states.setdefault(switch, SwitchState())
        for kind, address, detail in entries:
            if kind == "services":
                udp_dst, to = detail
                fields = dict(eth_type=0x0800, ip_proto=17, ipv4_dst=address, udp_dst=udp_dst)
                state.flows.add(Flow(PRIO_STEER, match(**fields), ("rewrite", to.mac, to.ip, to.port),
                                     STEER_COOKIE))
                state.flows.add(Flow(PRIO_HAIRPIN, match(in_port=to.port, **fields),
                                     ("rewrite", to.mac, to.ip, IN_PORT), STEER_COOKIE))
            elif kind == "groups":
                state.groups[next_group] = ReplicateGroup(detail)
                state.flows.add(Flow(PRIO_STEER, match(eth_type=0x0800, ipv4_dst=address),
                                     ("group", next_group), STEER_COOKIE))
                next_group += 1
                for port in sorted({b.port for b in detail}):
                    twin = tuple(Rewrite(b.mac, b.ip, IN_PORT if b.port == port else b.port) for b in detail)
                    state.groups[next_group] = ReplicateGroup(twin)
                    state.flows.add(Flow(PRIO_HAIRPIN, match(eth_type=0x0800, ipv4_dst=address, in_port=port),
                                         ("group", next_group), STEER_COOKIE))
                    next_group += 1
            else:
                state.flows.add(Flow(PRIO_STEER, match(eth_type=0x0800, ipv4_dst=address),
                                     ("output", detail), STEER_COOKIE))
    return states


def merged(desired, steering):
    """The routing app's desired state with the steering entries added (group ids do not clash).
    Switch states that gain entries are copies: an app may hand out states it keeps."""
    out = dict(desired)
    for switch, extra in steering.items():
        base = desired.get(switch) or SwitchState()
        out[switch] = SwitchState(flows=set(base.flows) | extra.flows, groups={**base.groups, **extra.groups})
    return out


def arp_addresses(plan):
    """Every service and group address of a plan, with the plane's switches that own it."""
    return {entry["address"]: entry["switch"] for kind in ("services", "groups")
            for entry in plan.get(kind) or []}
