"""The desired state's changes as OpenFlow 1.5 messages: one function per kind of message, each
taking the datapath the message is for (os-ken builds messages against a datapath's ofproto and
parser) and returning messages to send. Nothing here sends, and nothing keeps state.

The ops are diff()'s (apps/ecmp.py): reset, group_add/mod/del (select groups as port tuples or
WeightedGroup, FailoverGroup, ReplicateGroup), flow_add/del with ('output', port) | ('group', id) |
('rewrite', mac, ip, port) | ('controller',) actions.
"""

from __future__ import annotations

from fabriclab.apps.ecmp import FailoverGroup, WeightedGroup, group_ports
from fabriclab.apps.ovs_groups import hash_selection, weighted_selection
from fabriclab.apps.steering import IN_PORT, ReplicateGroup


def messages(dp, op, basis=0):
    """The messages that carry out one diff() op on `dp`, whose select groups hash from `basis`
    (its switch's: apps/hashing.py)."""
    kind = op[0]
    if kind == "reset":
        return reset(dp)
    if kind in ("group_add", "group_mod"):
        return [group_mod(dp, op[1], op[2], add=kind == "group_add", basis=basis)]
    if kind == "group_del":
        return [dp.ofproto_parser.OFPGroupMod(dp, command=dp.ofproto.OFPGC_DELETE, group_id=op[1])]
    if kind == "flow_add":
        return [flow_add(dp, op[1])]
    if kind == "flow_del":
        return [flow_del(dp, op[1])]
    raise ValueError(f"unknown op {op!r}")


def reset(dp):
    ofp, parser = dp.ofproto, dp.ofproto_parser
    # Flows first, then groups: a group cannot be deleted while a flow points at it.
    return [
        parser.OFPFlowMod(dp, command=ofp.OFPFC_DELETE, table_id=ofp.OFPTT_ALL,
                          out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY, match=parser.OFPMatch()),
        parser.OFPGroupMod(dp, command=ofp.OFPGC_DELETE, group_id=ofp.OFPG_ALL),
    ]


def group_mod(dp, gid, group, add=True, basis=0):
    ofp, parser = dp.ofproto, dp.ofproto_parser
    command = ofp.OFPGC_ADD if add else ofp.OFPGC_MODIFY
    if isinstance(group, FailoverGroup):
        buckets = [
            parser.OFPBucket(bucket_id=0, actions=[parser.OFPActionOutput(group.port)], properties=[
                parser.OFPGroupBucketPropWatch(type_=ofp.OFPGBPT_WATCH_PORT, watch=group.port)]),
            parser.OFPBucket(bucket_id=1, actions=[parser.OFPActionGroup(group.backup)], properties=[
                parser.OFPGroupBucketPropWatch(type_=ofp.OFPGBPT_WATCH_GROUP, watch=group.backup)])]
        return parser.OFPGroupMod(dp, command=command, type_=ofp.OFPGT_FF, group_id=gid, buckets=buckets)
    if isinstance(group, ReplicateGroup):
        buckets = [parser.OFPBucket(bucket_id=i, actions=rewrite_actions(dp, b.mac, b.ip, b.port))
                   for i, b in enumerate(group.buckets)]
        return parser.OFPGroupMod(dp, command=command, type_=ofp.OFPGT_ALL, group_id=gid, buckets=buckets)
    # A select group: a tuple of ports, or a WeightedGroup. Buckets watch their port, so OVS skips
    # a dead local member before the controller recomputes.
    buckets = [parser.OFPBucket(bucket_id=i, actions=[parser.OFPActionOutput(port)], properties=[
        parser.OFPGroupBucketPropWeight(type_=ofp.OFPGBPT_WEIGHT, weight=weight),
        parser.OFPGroupBucketPropWatch(type_=ofp.OFPGBPT_WATCH_PORT, watch=port)])
        for i, (port, weight) in enumerate(group_ports(group))]
    method = weighted_selection(parser, basis) if isinstance(group, WeightedGroup) else hash_selection(parser, basis)
    return parser.OFPGroupMod(dp, command=command, type_=ofp.OFPGT_SELECT, group_id=gid,
                              buckets=buckets, properties=[method])


def flow_add(dp, flow):
    ofp, parser = dp.ofproto, dp.ofproto_parser
    action = flow.action
    if action[0] == "output":
        actions = [parser.OFPActionOutput(action[1])]
    elif action[0] == "group":
        actions = [parser.OFPActionGroup(action[1])]
    elif action[0] == "rewrite":
        actions = rewrite_actions(dp, *action[1:])
    elif action[0] == "controller":
        actions = [parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)]
    else:
        raise ValueError(f"unknown flow action {action!r}")
    inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)]
    return parser.OFPFlowMod(dp, cookie=flow.cookie, priority=flow.priority,
                             match=parser.OFPMatch(**flow.match_dict), instructions=inst)


def flow_del(dp, flow):
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return parser.OFPFlowMod(dp, command=ofp.OFPFC_DELETE_STRICT, priority=flow.priority,
                             match=parser.OFPMatch(**flow.match_dict), out_port=ofp.OFPP_ANY,
                             out_group=ofp.OFPG_ANY)


def rewrite_actions(dp, mac, ip, port):
    # OVS fixes the IP and UDP checksums after a set_field on ipv4_dst. OpenFlow drops a plain
    # output to the port a packet came in by; IN_PORT is the way out there.
    parser = dp.ofproto_parser
    if port == IN_PORT:
        port = dp.ofproto.OFPP_IN_PORT
    return [parser.OFPActionSetField(eth_dst=mac), parser.OFPActionSetField(ipv4_dst=ip),
            parser.OFPActionOutput(port)]


def barrier(dp):
    """A barrier request with its xid set (the reply carries it back)."""
    msg = dp.ofproto_parser.OFPBarrierRequest(dp)
    dp.set_xid(msg)
    return msg


def port_desc_request(dp):
    return dp.ofproto_parser.OFPPortDescStatsRequest(dp, 0)


def packet_out(dp, port, frame):
    """Send `frame` out of `port` (the controller's own packet, e.g. an ARP reply)."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return parser.OFPPacketOut(dp, buffer_id=ofp.OFP_NO_BUFFER, match=parser.OFPMatch(in_port=ofp.OFPP_CONTROLLER),
                               actions=[parser.OFPActionOutput(port)], data=frame)


def flow_stats_request(dp, cookie, cookie_mask):
    """The flow entries (with counters) whose cookie matches: OFPMP_FLOW_DESC, because Open vSwitch
    answers OpenFlow 1.5's statistics-only request with an error."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return parser.OFPFlowDescStatsRequest(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY,
                                          cookie, cookie_mask, parser.OFPMatch())


def port_stats_request(dp):
    return dp.ofproto_parser.OFPPortStatsRequest(dp, 0, dp.ofproto.OFPP_ANY)


def port_live(dp, port):
    """A port (OFPPort) is live when its carrier is up and it is not administratively down."""
    ofp = dp.ofproto
    return not (port.state & ofp.OFPPS_LINK_DOWN) and not (port.config & ofp.OFPPC_PORT_DOWN)


def port_table(dp, ports):
    """{port_no: (name, live)} from a port description reply's body."""
    return {p.port_no: (p.name.decode() if isinstance(p.name, bytes) else p.name, port_live(dp, p))
            for p in ports}
