"""The all-pairs workload: every host port streams RoCEv2 RDMA WRITEs to its peers.

Pure planning, no network: which flows each host sends, with QP numbers and rates. A host port
talks to the port of the same NIC index on the same plane of every other host (as a collective
library pairs rails), so multi-NIC and multiplane fabrics carry one stream set per rail and plane.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fabriclab.errors import LabError
from fabriclab.loading import excerpt

FIRST_QPN = 0x11   # QPNs below this are reserved by RDMA (QP0, QP1)
SPORT_MODES = ("qp", "shared")
MAX_FLOWS_PER_PAIR = 64          # QPs per host pair; beyond this the agents' CPU, not the fabric, sets rates
MAX_DURATION_S = 3600.0
MIN_DURATION_S = 0.1                 # shorter than a few sampling intervals measures nothing
# Flows of one all-pairs job in all: each is a paced QP in a host's agent and a dict here; past
# this the agents' CPU and memory, not the fabric, would set the rates.
MAX_FLOWS = 65_536


@dataclass(frozen=True)
class AllPairsSpec:
    """What `run` and `demo` send: every host port streams to its peers for `duration_s`, each
    port offering `load` x its link rate in total over `flows_per_pair` QPs per peer."""

    duration_s: float = 5.0
    load: float = 0.5
    flows_per_pair: int = 1
    sport_mode: str = "qp"

    def check(self):
        """Raise LabError naming the first bad field."""
        d = self.duration_s
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d) \
                or not MIN_DURATION_S <= d <= MAX_DURATION_S:
            raise LabError(f"all-pairs: duration_s must be in [{MIN_DURATION_S:g}, {MAX_DURATION_S:g}] seconds, "
                           f"got {excerpt(d)}")
        load = self.load
        # A load that rounds every flow's rate to nothing is no load either.
        if isinstance(load, bool) or not isinstance(load, (int, float)) or not math.isfinite(load) \
                or not 1e-3 <= load <= 1.0:
            raise LabError(f"all-pairs: load must be in [0.001, 1] (a fraction of the link rate), got {excerpt(load)}")
        n = self.flows_per_pair
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_FLOWS_PER_PAIR:
            raise LabError(f"all-pairs: flows_per_pair must be a whole number in 1..{MAX_FLOWS_PER_PAIR}, "
                           f"got {excerpt(n)}")
        if self.sport_mode not in SPORT_MODES:
            raise LabError(f"all-pairs: sport_mode must be qp or shared, got {excerpt(self.sport_mode)}")


def peers(fabric, port):
    return [p for host in fabric.hosts.values() if host.name != port.host
            for p in host.ports if p.nic == port.nic and p.plane == port.plane]


def all_pairs_plan(fabric, load=0.8, flows_per_pair=1):
    """{host: [flow dict for the traffic agent]}; each port offers `load` x its link rate in total."""
    if isinstance(load, bool) or not isinstance(load, (int, float)) or not 0 < load <= 1.0:
        raise LabError(f"load must be in (0, 1], got {load}")
    if isinstance(flows_per_pair, bool) or not isinstance(flows_per_pair, int) or flows_per_pair < 1:
        raise LabError(f"flows per pair must be a whole number >= 1, got {excerpt(flows_per_pair)}")
    if len(fabric.hosts) < 2:
        raise LabError(f"fabric {excerpt(fabric.spec.name)} has one host: all-pairs traffic needs two")
    total = sum(len(peers(fabric, port)) for host in fabric.hosts.values() for port in host.ports) * flows_per_pair
    if total > MAX_FLOWS:
        raise LabError(f"all-pairs on fabric {excerpt(fabric.spec.name)} with {flows_per_pair} flow(s) per "
                       f"pair is {total} flows; one machine's agents run at most {MAX_FLOWS}")
    plan = {}
    for host in fabric.hosts.values():
        flows = []
        for port in host.ports:
            dests = peers(fabric, port)
            rate = fabric.spec.host_rate_mbps * load / (len(dests) * flows_per_pair)
            for dst in dests:
                dst_host = fabric.hosts[dst.host]
                for k in range(flows_per_pair):
                    # A QP per (peer, flow) at each end, as a collective opens one per connection.
                    flows.append({
                        "id": f"{port.intf}>{dst.intf}#{k}",
                        "src": port.ip, "dst": dst.ip,
                        "src_qpn": FIRST_QPN + (dst_host.index * flows_per_pair + k),
                        "dst_qpn": FIRST_QPN + (host.index * flows_per_pair + k),
                        "sport": None,
                        "rate_mbps": round(rate, 6),
                    })
        plan[host.name] = flows
    return plan
