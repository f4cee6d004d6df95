"""The centralized TE os-ken app (seed 000, section 4.3): collector, traffic matrix, CSPF engine and
switch programmer in one controller process.

- Collector: the live topology is the spec's fabric with the links LinkState reports down.
- Traffic matrix: every `period_s` the app asks each switch for its TE entries' byte counters
  (flow statistics, cookie-filtered) and its port counters; demands come from the jobs the
  traffic launcher announces in the run's jobs.json (read at once when it changes) plus measured
  rates of entries no job announced.
- Engine: `te.cspf`. Programmer: TeRouting's desired state, sent as a diff by FabricApp.
The placement is written to te-placement.json beside the status file after every recompute
(the prompt's `te` command shows it), and the status carries a summary.
"""

from __future__ import annotations

import json
import os
import pathlib
import threading
import time

from os_ken.controller import ofp_event
from os_ken.controller.handler import MAIN_DISPATCHER, set_ev_cls
from os_ken.lib import hub

from fabriclab.apps.base_app import FabricApp, guarded
from fabriclab.apps.te import (TE_COOKIE, TE_COOKIE_MASK, TeRouting, cspf, job_demands,
                               merge_demands)

STATS_TIMEOUT_S = 1.0
JOBS_POLL_S = 0.05


class TeApp(FabricApp):
    routing_class = TeRouting

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        folder = pathlib.Path(self.status_path).parent if self.status_path else pathlib.Path(".")
        self.jobs_path = folder / "jobs.json"
        self.placement_path = folder / "te-placement.json"
        self.period = float(self.options.get("period_s", 1.0))
        self.max_utilization = float(self.options.get("max_utilization", 1.0))
        self.min_mbps = float(self.options.get("min_mbps", 0.1))
        self.by_match = {}                  # (leaf, in_port, destination leaf index) -> DemandKey
        for key in self.routing.keys:
            dst = self.fabric.switches[key.dst_leaf]
            self.by_match[(key.leaf, key.in_port, dst.index)] = key
        self.replies = {}                   # switch -> {"flows": [...], "ports": [...]}
        self.waiting = set()
        self.replies_done = threading.Event()
        self.last_counts = None             # (time, {DemandKey: bytes}, {(switch, port): tx bytes})
        self.jobs, self.jobs_mtime = {}, None
        self.te = {"recomputes": 0, "placed": 0, "unplaced": 0, "demands": 0, "jobs": [],
                   "period_s": self.period, "last": None, "compute_ms": None,
                   "placement_file": str(self.placement_path)}
        hub.spawn(self._loop)

    # -- the periodic engine ----------------------------------------------------------------------
    def _loop(self):
        next_run = time.monotonic() + self.period
        while True:
            time.sleep(JOBS_POLL_S)
            changed = self._read_jobs()
            if changed or time.monotonic() >= next_run:
                try:
                    self.recompute_te(reason="jobs" if changed else "period")
                except Exception:           # noqa: BLE001 - the engine must outlive one bad cycle
                    self.logger.exception("TE recompute failed")
                next_run = time.monotonic() + self.period

    def _read_jobs(self):
        try:
            mtime = os.stat(self.jobs_path).st_mtime_ns
        except OSError:
            mtime = None
        if mtime == self.jobs_mtime:
            return False
        self.jobs_mtime = mtime
        try:
            self.jobs = json.loads(self.jobs_path.read_text()).get("jobs", {}) if mtime else {}
        except (OSError, ValueError):
            self.jobs = {}
        return True

    def recompute_te(self, reason="period"):
        t0 = time.monotonic()
        counts = self._collect()
        now = time.monotonic()
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
        with self.lock:
            down = self.links.down_links()
            placement = cspf(self.fabric, demands, down, self.max_utilization, link_load)
            self.routing.placement = placement
            self.te.update(recomputes=self.te["recomputes"] + 1, placed=len(placement.placed),
                           unplaced=len(placement.unplaced), demands=len(demands),
                           jobs=sorted(self.jobs), last=time.time(), reason=reason,
                           compute_ms=round((time.monotonic() - t0) * 1e3, 2))
            self._recompute()
        self._write_placement(placement, demands, measured_flows, link_load, down)

    def _link_load(self, measured_links):
        """(link key, from node) -> Mbit/s measured leaving that node on that link."""
        out = {}
        for link in self.fabric.fabric_links:
            for node, port in ((link.a, link.a_port), (link.b, link.b_port)):
                if (node, port) in measured_links:
                    out[(link.key, node)] = measured_links[(node, port)]
        return out

    def _write_placement(self, placement, demands, measured_flows, link_load, down):
        doc = {"time": time.time(), "app": "te", "options": self.options, **self.te,
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
        tmp = self.placement_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, self.placement_path)

    # -- statistics ---------------------------------------------------------------------------------
    def _collect(self):
        """Ask every connected switch for its TE entries' and ports' counters; wait for the
        replies (bounded). Returns ({DemandKey: bytes}, {(switch, port): tx bytes}) or None."""
        with self.lock:
            targets = {name: dp for name, dp in self.datapaths.items() if name in self.links.connected}
            self.replies = {name: {"flows": [], "ports": [], "parts": 0} for name in targets}
            self.waiting = {(name, kind) for name in targets for kind in ("flows", "ports")}
            self.replies_done.clear()
        if not targets:
            return None
        for name, dp in targets.items():
            ofp, parser = dp.ofproto, dp.ofproto_parser
            # OFPMP_FLOW_DESC: Open vSwitch answers OpenFlow 1.5's flow-statistics-only request with an error.
            dp.send_msg(parser.OFPFlowDescStatsRequest(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY,
                                                   TE_COOKIE, TE_COOKIE_MASK, parser.OFPMatch()))
            dp.send_msg(parser.OFPPortStatsRequest(dp, 0, ofp.OFPP_ANY))
        if not self.replies_done.wait(STATS_TIMEOUT_S):
            self.logger.warning("TE: statistics missing from %s", sorted(self.waiting)[:4])
        flows, ports = {}, {}
        with self.lock:
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
        parts = address.split(".")
        return self.by_match.get((switch, in_port, int(parts[2])))

    def _reply(self, ev, kind):
        name = self.by_dpid.get(ev.msg.datapath.id)
        with self.lock:
            got = self.replies.get(name)
            if got is None:
                return
            got[kind].extend(ev.msg.body)
            if not ev.msg.flags & ev.msg.datapath.ofproto.OFPMPF_REPLY_MORE:
                self.waiting.discard((name, kind))
                if not self.waiting:
                    self.replies_done.set()

    @set_ev_cls(ofp_event.EventOFPFlowDescStatsReply, MAIN_DISPATCHER)
    @guarded
    def _flow_stats(self, ev):
        self._reply(ev, "flows")

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    @guarded
    def _port_stats(self, ev):
        self._reply(ev, "ports")

    def extra_status(self):
        return {"te": dict(getattr(self, "te", {}))}


