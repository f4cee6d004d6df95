"""The os-ken adapter shared by every routing app: events in, OpenFlow messages out.

It knows the fabric (the same JSON the lab built Mininet from, checked against the ports each
switch reports), keeps LinkState from switch connections and port status, answers ARP for host
ports (so the Clos never floods), asks the app's routing class for the desired state on every
change, and sends only the difference. After each change it publishes a status file that the lab
reads to know when the fabric is programmed and which links the controller considers down.

Subclasses set `routing_class`; the routing logic itself lives in plain classes (see ecmp.py).
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import threading
import time

from os_ken.base import app_manager
from os_ken.lib import hub
from os_ken.controller import ofp_event
from os_ken.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.lib.packet import arp, ethernet, packet
from os_ken.ofproto import ofproto_v1_5

from fabriclab.apps.ecmp import FailoverGroup, diff
from fabriclab.apps.linkstate import LinkState
from fabriclab.apps.ovs_groups import SelectionMethodProperty
from fabriclab.apps.steering import (IN_PORT, SERVICE_MAC, ReplicateGroup, SteeringError, arp_addresses, merged,
                                     steering_state)
from fabriclab.topologies.fabric import Fabric

# Set by the lab's controller runner (fabriclab.apps.runner) for the process it starts.
ENV_FABRIC = "FABRICLAB_FABRIC"
ENV_STATUS = "FABRICLAB_STATUS"
ENV_OPTIONS = "FABRICLAB_APP_OPTIONS"
ENV_RUN_ID = "FABRICLAB_RUN_ID"
ENV_APP = "FABRICLAB_APP"


def guarded(handler):
    """Keep an event handler's exception from ending the app: os-ken's native hub treats any
    Exception as its TaskExit and leaves the app's event loop without a word. Log it and show it
    in the status instead."""
    @functools.wraps(handler)
    def wrapper(self, ev):
        try:
            return handler(self, ev)
        except Exception as exc:        # noqa: BLE001 - reported, and the app goes on
            self.logger.exception("%s failed", handler.__name__)
            with self.lock:
                self.switch_errors.append(f"controller: {handler.__name__}: {type(exc).__name__}: {exc}")
                del self.switch_errors[:-50]
    return wrapper


class FabricApp(app_manager.OSKenApp):
    # OpenFlow 1.5: the version in which a controller can choose the select groups' hash fields.
    OFP_VERSIONS = [ofproto_v1_5.OFP_VERSION]
    routing_class = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        with open(os.environ[ENV_FABRIC]) as f:
            self.fabric = Fabric.from_json(f.read())
        self.status_path = os.environ.get(ENV_STATUS)
        self.options = json.loads(os.environ.get(ENV_OPTIONS) or "{}")
        self.run_id = os.environ.get(ENV_RUN_ID, "")
        self.routing = self.make_routing()
        self.links = LinkState(self.fabric)
        self.by_dpid = {s.dpid: s.name for s in self.fabric.switches.values()}
        self.datapaths = {}        # switch name -> Datapath
        self.installed = {}        # switch name -> SwitchState last sent
        self.generation = 0
        self.synced = {}           # switch name -> generation confirmed by a barrier reply
        self.pending = {}          # (switch, xid) -> generation
        self.link_events = []           # recent link events, for the status file
        self.unknown_dpids = set()
        self.switch_errors = []    # OpenFlow errors the switches returned, newest last
        self.lock = threading.RLock()
        folder = pathlib.Path(self.status_path).parent if self.status_path else pathlib.Path(".")
        self.steering_path = folder / "steering.json"
        self.steering = {"generation": None, "error": "", "addresses": {}}
        self.steering_state, self._steering_mtime = {}, None
        self._write_status()
        hub.spawn(self._watch_steering)

    def make_routing(self):
        """The routing class for this app (subclasses with options override this)."""
        return self.routing_class(self.fabric)

    # -- hooks for apps that add to the base ------------------------------------------------------
    def before_program(self, desired):
        """Called with every switch's desired state before any of it is sent."""

    def extra_status(self):
        """More fields for the status file (the prompt's `ctl` and the lab read them)."""
        return {}

    # -- switch lifecycle -------------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    @guarded
    def _features(self, ev):
        dp = ev.msg.datapath
        name = self.by_dpid.get(dp.id)
        if name is None:
            self.unknown_dpids.add(dp.id)
            self.logger.warning("switch with dpid %016x is not in the fabric; ignoring it", dp.id)
            return
        self.datapaths[name] = dp
        dp.send_msg(dp.ofproto_parser.OFPPortDescStatsRequest(dp, 0))

    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, MAIN_DISPATCHER)
    @guarded
    def _port_desc(self, ev):
        dp = ev.msg.datapath
        name = self.by_dpid.get(dp.id)
        if name is None:
            return
        ports = {p.port_no: (p.name.decode() if isinstance(p.name, bytes) else p.name, self._is_live(dp, p))
                 for p in ev.msg.body}
        with self.lock:
            self.links.switch_connected(name, ports)
            for problem in self.links.mismatches[name]:
                self.logger.warning("fabric mismatch: %s", problem)
            self.installed.pop(name, None)     # unknown state: the first sync wipes the switch
            self._event("switch_connected", name)
            self._recompute()

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    @guarded
    def _disconnected(self, ev):
        dp = ev.datapath
        name = self.by_dpid.get(dp.id) if dp.id is not None else None
        if name is None or self.datapaths.get(name) is not dp:
            return
        with self.lock:
            del self.datapaths[name]
            self.links.switch_disconnected(name)
            self.installed.pop(name, None)
            self.synced.pop(name, None)
            self._event("switch_disconnected", name)
            self._recompute()

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    @guarded
    def _port_status(self, ev):
        dp = ev.msg.datapath
        name = self.by_dpid.get(dp.id)
        if name is None:
            return
        port = ev.msg.desc
        live = self._is_live(dp, port) and ev.msg.reason != dp.ofproto.OFPPR_DELETE
        with self.lock:
            if self.links.port_changed(name, port.port_no, live):
                self._event("port_up" if live else "port_down", f"{name}:{port.port_no}")
                self._recompute()

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    @guarded
    def _barrier(self, ev):
        name = self.by_dpid.get(ev.msg.datapath.id)
        with self.lock:
            gen = self.pending.pop((name, ev.msg.xid), None)
            if gen is not None and gen >= self.synced.get(name, -1):
                self.synced[name] = gen
                self._write_status()

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    @guarded
    def _error(self, ev):
        """A switch refused a message: log it and show it in the status (`ctl` at the prompt)."""
        msg = ev.msg
        name = self.by_dpid.get(msg.datapath.id, f"{msg.datapath.id:016x}")
        text = f"{name}: OpenFlow error type {msg.type} code {msg.code} (xid {msg.xid})"
        self.logger.error("%s: %s", text, bytes(msg.data[:64]).hex())
        with self.lock:
            self.switch_errors.append(text)
            del self.switch_errors[:-50]
            self._write_status()

    @staticmethod
    def _is_live(dp, port):
        ofp = dp.ofproto
        return not (port.state & ofp.OFPPS_LINK_DOWN) and not (port.config & ofp.OFPPC_PORT_DOWN)

    # -- routing ------------------------------------------------------------------------------------
    def _recompute(self):
        self.generation += 1
        desired = merged(self.routing.desired(self.links.down_links()), self.steering_state)
        self.before_program(desired)
        for name, dp in self.datapaths.items():
            if name not in self.links.connected:
                continue    # still waiting for its port description
            ops = diff(self.installed.get(name), desired[name])
            for op in ops:
                for message in self._to_messages(dp, op):
                    dp.send_msg(message)
            self.installed[name] = desired[name]
            barrier = dp.ofproto_parser.OFPBarrierRequest(dp)
            dp.set_xid(barrier)
            self.pending[(name, barrier.xid)] = self.generation
            dp.send_msg(barrier)
        self._write_status()

    def _to_messages(self, dp, op):
        return [self._translate(dp, op)] if op[0] != "reset" else self._reset(dp)

    @staticmethod
    def _reset(dp):
        ofp, parser = dp.ofproto, dp.ofproto_parser
        # Flows first, then groups: a group cannot be deleted while a flow points at it.
        return [
            parser.OFPFlowMod(dp, command=ofp.OFPFC_DELETE, table_id=ofp.OFPTT_ALL,
                              out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY, match=parser.OFPMatch()),
            parser.OFPGroupMod(dp, command=ofp.OFPGC_DELETE, group_id=ofp.OFPG_ALL),
        ]

    @staticmethod
    def _translate(dp, op):
        ofp, parser = dp.ofproto, dp.ofproto_parser
        kind = op[0]
        if kind in ("group_add", "group_mod") and isinstance(op[2], FailoverGroup):
            _, gid, group = op
            buckets = [
                parser.OFPBucket(bucket_id=0, actions=[parser.OFPActionOutput(group.port)], properties=[
                    parser.OFPGroupBucketPropWatch(type_=ofp.OFPGBPT_WATCH_PORT, watch=group.port)]),
                parser.OFPBucket(bucket_id=1, actions=[parser.OFPActionGroup(group.backup)], properties=[
                    parser.OFPGroupBucketPropWatch(type_=ofp.OFPGBPT_WATCH_GROUP, watch=group.backup)])]
            command = ofp.OFPGC_ADD if kind == "group_add" else ofp.OFPGC_MODIFY
            return parser.OFPGroupMod(dp, command=command, type_=ofp.OFPGT_FF, group_id=gid, buckets=buckets)
        if kind in ("group_add", "group_mod") and isinstance(op[2], ReplicateGroup):
            _, gid, group = op
            buckets = [parser.OFPBucket(bucket_id=i, actions=FabricApp._rewrite_actions(parser, b.mac, b.ip, b.port))
                       for i, b in enumerate(group.buckets)]
            command = ofp.OFPGC_ADD if kind == "group_add" else ofp.OFPGC_MODIFY
            return parser.OFPGroupMod(dp, command=command, type_=ofp.OFPGT_ALL, group_id=gid, buckets=buckets)
        if kind in ("group_add", "group_mod"):
            _, gid, ports = op
            # Buckets watch their port: OVS skips a dead local member before we recompute.
            buckets = [parser.OFPBucket(bucket_id=i, actions=[parser.OFPActionOutput(port)], properties=[
                parser.OFPGroupBucketPropWeight(type_=ofp.OFPGBPT_WEIGHT, weight=1),
                parser.OFPGroupBucketPropWatch(type_=ofp.OFPGBPT_WATCH_PORT, watch=port)])
                for i, port in enumerate(ports)]
            command = ofp.OFPGC_ADD if kind == "group_add" else ofp.OFPGC_MODIFY
            return parser.OFPGroupMod(dp, command=command, type_=ofp.OFPGT_SELECT, group_id=gid,
                                      buckets=buckets, properties=[SelectionMethodProperty(parser)])
        if kind == "group_del":
            return parser.OFPGroupMod(dp, command=ofp.OFPGC_DELETE, group_id=op[1])
        flow = op[1]
        match = parser.OFPMatch(**flow.match_dict)
        if kind == "flow_del":
            return parser.OFPFlowMod(dp, command=ofp.OFPFC_DELETE_STRICT, priority=flow.priority,
                                     match=match, out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY)
        action = flow.action
        if action[0] == "output":
            actions = [parser.OFPActionOutput(action[1])]
        elif action[0] == "group":
            actions = [parser.OFPActionGroup(action[1])]
        elif action[0] == "rewrite":
            actions = FabricApp._rewrite_actions(parser, *action[1:])
        else:
            actions = [parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)]
        inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)]
        return parser.OFPFlowMod(dp, cookie=flow.cookie, priority=flow.priority, match=match,
                                 instructions=inst)

    @staticmethod
    def _rewrite_actions(parser, mac, ip, port):
        # OVS fixes the IP and UDP checksums after a set_field on ipv4_dst.
        if port == IN_PORT:
            port = parser.ofproto.OFPP_IN_PORT
        return [parser.OFPActionSetField(eth_dst=mac), parser.OFPActionSetField(ipv4_dst=ip),
                parser.OFPActionOutput(port)]

    # -- steering (in-network services, see steering.py) -------------------------------------------
    def _watch_steering(self):
        while True:
            time.sleep(0.05)
            try:
                mtime = os.stat(self.steering_path).st_mtime_ns
            except OSError:
                mtime = None
            if mtime == self._steering_mtime:
                continue
            self._steering_mtime = mtime
            try:
                plan = json.loads(self.steering_path.read_text()) if mtime else {}
                state = steering_state(self.fabric, plan)
            except (OSError, ValueError, SteeringError) as exc:
                with self.lock:
                    self.steering["error"] = str(exc)
                    self._write_status()
                continue
            with self.lock:
                self.steering_state = state
                self.steering = {"generation": plan.get("generation"), "error": "",
                                 "addresses": arp_addresses(plan)}
                self._recompute()

    # -- ARP ------------------------------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    @guarded
    def _packet_in(self, ev):
        msg = ev.msg
        dp = msg.datapath
        pkt = packet.Packet(msg.data)
        req = pkt.get_protocol(arp.arp)
        if req is None or req.opcode != arp.ARP_REQUEST:
            return
        switch = self.fabric.switches.get(self.by_dpid.get(dp.id))
        target = self.fabric.ip_owner.get(req.dst_ip)
        # Answer only within the plane the request came from: planes are separate fabrics.
        if switch is None:
            return
        if target is not None and target.plane == switch.plane:
            mac, ip = target.mac, target.ip
        else:
            owner = self.fabric.switches.get(self.steering["addresses"].get(req.dst_ip))
            if owner is None or owner.plane != switch.plane:
                return
            mac, ip = SERVICE_MAC, req.dst_ip          # a switch's service or group address
        reply = packet.Packet()
        reply.add_protocol(ethernet.ethernet(dst=req.src_mac, src=mac, ethertype=0x0806))
        reply.add_protocol(arp.arp(opcode=arp.ARP_REPLY, src_mac=mac, src_ip=ip,
                                   dst_mac=req.src_mac, dst_ip=req.src_ip))
        reply.serialize()
        ofp, parser = dp.ofproto, dp.ofproto_parser
        in_port = msg.match["in_port"]
        dp.send_msg(parser.OFPPacketOut(dp, buffer_id=ofp.OFP_NO_BUFFER,
                                        match=parser.OFPMatch(in_port=ofp.OFPP_CONTROLLER),
                                        actions=[parser.OFPActionOutput(in_port)], data=reply.data))

    # -- status --------------------------------------------------------------------------------------
    def _event(self, kind, subject):
        self.link_events.append({"time": time.time(), "event": kind, "subject": subject})
        del self.link_events[:-200]

    def _write_status(self):
        if not self.status_path:
            return
        down = sorted(self.links.down_links())
        status = {
            "app": os.environ.get(ENV_APP) or self.routing.name,
            "options": self.options,
            "pid": os.getpid(),
            "time": time.time(),
            "generation": self.generation,
            "connected": sorted(self.links.connected),
            "synced": self.synced,
            "programmed": (len(self.links.connected) == len(self.fabric.switches)
                           and all(self.synced.get(s) == self.generation for s in self.fabric.switches)),
            "down_links": [list(key) for key in down],
            "mismatches": [p for problems in self.links.mismatches.values() for p in problems],
            "unknown_dpids": sorted(self.unknown_dpids),
            "switch_errors": self.switch_errors[-20:],
            "events": self.link_events[-50:],
            "steering": {k: v for k, v in self.steering.items() if k != "addresses"},
            **self.extra_status(),
        }
        tmp = f"{self.status_path}.tmp"
        with open(tmp, "w") as f:
            json.dump(status, f, indent=1)
        os.replace(tmp, self.status_path)

