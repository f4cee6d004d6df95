"""Centralized TE's engine (seed 000, section 4.3): traffic matrix, CSPF, placement, without os-ken.

- Collector: the live topology is the spec's fabric with the links the core sees down.
- Traffic matrix: every `period_s` the adapter asks each switch for its TE entries' byte counters
  (flow statistics, cookie-filtered) and its port counters (`requests`), hands the replies in
  (`reply`), and waits for them (bounded); demands come from the jobs the traffic launcher
  announces (`jobs_changed`, which also wakes the engine at once) plus measured rates of
  entries no job announced.
- Engine: `te.cspf`. Programmer: TeRouting's desired state, which the core sends as a diff.
The placement goes to te-placement.json after every cycle (the prompt's `te` command shows it);
the status carries a summary (`status`).
"""

from __future__ import annotations

import dataclasses
import threading
import time

from fabriclab.apps import openflow
from fabriclab.apps.control import TeStatus
from fabriclab.apps.te import TE_COOKIE, TE_COOKIE_MASK, cspf, job_demands, merge_demands

STATS_TIMEOUT_S = 1.0


class TeEngine:
    def __init__(self, config, routing, clock=time.monotonic, wall=time.time):
        """`routing`: the TeRouting the core programs; the engine sets its placement."""
        self.fabric = config.fabric
        self.routing = routing
        self.options = dict(config.options)
        self.placement_file = str(config.files.te_placement)
        self.period = float(self.options.get("period_s", 1.0))
        self.max_utilization = float(self.options.get("max_utilization", 1.0))
        self.min_mbps = float(self.options.get("min_mbps", 0.1))
        self.clock, self.wall = clock, wall
        self.by_match = {}                  # (leaf, in_port, destination leaf index) -> DemandKey
        for key in routing.keys:
            self.by_match[(key.leaf, key.in_port, self.fabric.switches[key.dst_leaf].index)] = key
        self.jobs = {}                      # name -> control.Job
        self.wake = threading.Event()       # set when the jobs change: recompute now
        self.replies = {}                   # switch -> {"flows": [...], "ports": [...]}
        self.waiting = set()
        self.replies_done = threading.Event()
        self.last_counts = None             # (time, {DemandKey: bytes}, {(switch, port): tx bytes})
        self.summary = TeStatus(period_s=self.period, placement_file=self.placement_file)
        self.doc = None                     # the last placement document

    # -- jobs --------------------------------------------------------------------------------------------
    def jobs_changed(self, jobs):
        self.jobs = dict(jobs)
        self.wake.set()

    # -- statistics ----------------------------------------------------------------------------------------
    def requests(self, datapaths):
        """Start a collection from {switch: dp}: the [(dp, message)] to send."""
        self.replies = {name: {"flows": [], "ports": []} for name in datapaths}
        self.waiting = {(name, kind) for name in datapaths for kind in ("flows", "ports")}
        self.replies_done.clear()
        if not self.waiting:
            self.replies_done.set()
        sends = []
        for dp in datapaths.values():
            sends.append((dp, openflow.flow_stats_request(dp, TE_COOKIE, TE_COOKIE_MASK)))
            sends.append((dp, openflow.port_stats_request(dp)))
        return sends

    def reply(self, switch, kind, body, more):
        """A statistics reply ('flows' | 'ports') from `switch`; `more`: further parts follow."""
        got = self.replies.get(switch)
        if got is None:
            return
        got[kind].extend(body)
        if not more:
            self.waiting.discard((switch, kind))
            if not self.waiting:
                self.replies_done.set()

    def wait_replies(self, timeout=STATS_TIMEOUT_S):
        """Wait for the replies (bounded); returns the (switch, kind) still missing."""
        self.replies_done.wait(timeout)
        return sorted(self.waiting)

    def counters(self):
        """({DemandKey: bytes}, {(switch, port): tx bytes}) from the replies, None without any."""
        if not self.replies:
            return None
        flows, ports = {}, {}
        for name, got in self.replies.items():
            for stat in got["flows"]:
                key = self._flow_key(name, stat)
                if key is not None:
                    flows[key] = stat.stats["byte_count"] if "byte_count" in stat.stats else 0
            for stat in got["ports"]:
                ports[(name, stat.port_no)] = stat.tx_bytes
        return flows, ports

    def _flow_key(self, switch, stat):
        try:
            in_port = stat.match["in_port"]
            dst = stat.match["ipv4_dst"]
        except KeyError:
            return None
        address = dst[0] if isinstance(dst, tuple) else dst
        return self.by_match.get((switch, in_port, int(address.split(".")[2])))

    # -- placement -------------------------------------------------------------------------------------------
    def place(self, counts, down, reason, started):
        """Place the demands on the fabric without the `down` links; sets the routing's placement
        (the caller then recomputes the core). `counts`: counters() of this cycle."""
        now = self.clock()
        measured_flows, measured_links = {}, {}
        if counts is not None and self.last_counts is not None:
            then, flows0, ports0 = self.last_counts
            dt = max(now - then, 1e-3)
            for key, value in counts[0].items():
                measured_flows[key] = max(0, value - flows0.get(key, value)) * 8 / dt / 1e6
            for hop, value in counts[1].items():
                measured_links[hop] = max(0, value - ports0.get(hop, value)) * 8 / dt / 1e6
        if counts is not None:
            self.last_counts = (now, counts[0], counts[1])
        link_load = self._link_load(measured_links)
        demands = merge_demands(self.fabric, job_demands(self.fabric, self.jobs), measured_flows, self.min_mbps)
        placement = cspf(self.fabric, demands, down, self.max_utilization, link_load)
        self.routing.placement = placement
        s = self.summary
        self.summary = TeStatus(s.recomputes + 1, len(placement.placed), len(placement.unplaced), len(demands),
                                tuple(sorted(self.jobs)), self.period, self.wall(),
                                round((self.clock() - started) * 1e3, 2), reason, self.placement_file)
        self.doc = self._document(placement, demands, measured_flows, link_load, down)
        return placement

    def _link_load(self, measured_links):
        """(link key, from node) -> Mbit/s measured leaving that node on that link."""
        out = {}
        for link in self.fabric.fabric_links:
            for node, port in ((link.a, link.a_port), (link.b, link.b_port)):
                if (node, port) in measured_links:
                    out[(link.key, node)] = measured_links[(node, port)]
        return out

    def _document(self, placement, demands, measured_flows, link_load, down):
        summary = dataclasses.asdict(self.summary) | {"jobs": list(self.summary.jobs)}
        return {"time": self.wall(), "app": "te", "options": self.options, **summary,
                "down_links": [list(k) for k in sorted(down)],
                "demands": [{"leaf": d.key.leaf, "in_port": d.key.in_port, "dst_leaf": d.key.dst_leaf,
                             "host_port": d.host_port, "mbps": round(d.mbps, 3), "source": d.source}
                            for d in demands],
                "measured_flows_mbps": {f"{k.leaf}:{k.in_port}->{k.dst_leaf}": round(v, 3)
                                        for k, v in sorted(measured_flows.items(),
                                                           key=lambda kv: (kv[0].leaf, kv[0].in_port,
                                                                           kv[0].dst_leaf)) if v > 0},
                "measured_links_mbps": [{"link": "-".join(map(str, k[0])), "from": k[1], "mbps": round(v, 3)}
                                        for k, v in sorted(link_load.items(), key=lambda kv: repr(kv[0]))],
                **placement.to_dict(self.fabric, demands)}

    def status(self):
        return self.summary
