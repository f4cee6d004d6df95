"""A spec's fabric as data another program reads: switches with their datapath ids and ports,
hosts with their ports' addresses, and every cable with the port number at each end.

    fabriclab export fabric default --out fabric.json

This is what a controller the lab did not start needs to program the fabric (the lab's own apps
build the same Fabric from the spec in Python): OpenFlow port numbers are the ones the lab gives
each interface, datapath ids the ones each bridge is created with. Nothing is built.
"""

from __future__ import annotations

import json

FORMAT_VERSION = 1


def topology(fabric):
    """The fabric as one JSON-ready dict (the shape docs/cli.md describes)."""
    spec = fabric.spec
    ports = {name: [] for name in fabric.switches}
    for link in fabric.links:
        ends = ((link.a, link.a_port, link.a_intf, link.b, link.b_port, link.b_intf),
                (link.b, link.b_port, link.b_intf, link.a, link.a_port, link.a_intf))
        for node, port, intf, peer, peer_port, peer_intf in ends:
            if node in ports:
                # a host is no OpenFlow switch: its end has an interface, no port number
                ports[node].append({"port": port, "intf": intf, "peer": peer,
                                    "peer_port": peer_port if peer in ports else None, "peer_intf": peer_intf,
                                    "rate_mbps": link.rate_mbps, "kind": link.kind})
    return {
        "format": "fabriclab-topology", "version": FORMAT_VERSION,
        "name": spec.name, "kind": spec.kind, "cabling": spec.cabling, "planes": spec.planes,
        "mtu": spec.mtu, "host_rate_mbps": spec.host_rate_mbps, "fabric_rate_mbps": spec.fabric_rate_mbps,
        "time_scale": spec.time_scale,
        "switches": [{"name": s.name, "role": s.role, "plane": s.plane, "pod": s.pod, "dpid": s.dpid,
                      "dpid_hex": f"{s.dpid:016x}", "ports": sorted(ports[s.name], key=lambda p: p["port"])}
                     for s in fabric.switches.values()],
        "hosts": [{"name": h.name, "group": h.group,
                   "ports": [{"intf": p.intf, "nic": p.nic, "plane": p.plane, "mac": p.mac, "ip": p.ip,
                              "leaf": p.leaf, "leaf_port": p.leaf_port} for p in h.ports]}
                  for h in fabric.hosts.values()],
        "links": [{"a": link.a, "a_port": link.a_port if link.a in ports else None, "a_intf": link.a_intf,
                   "b": link.b, "b_port": link.b_port,
                   "b_intf": link.b_intf, "rate_mbps": link.rate_mbps, "kind": link.kind, "plane": link.plane,
                   "label": link.label} for link in fabric.links],
    }


def to_json(fabric):
    return json.dumps(topology(fabric), indent=1) + "\n"
