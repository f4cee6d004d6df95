"""An os-ken app of one's own, as a user brings it: an OpenFlow 1.3 learning switch.

    sudo .venv/bin/fabriclab up examples/apps/one_leaf.yaml --routing osken:examples/apps/learning_switch.py

It is an ordinary `OSKenApp` (the Ryu API), run by the lab the way `osken-manager` would run it:
the lab's own routing apps and their status are out of the way, and the lab waits only until every
switch has connected. A learning switch floods what it has not learned, so it needs a fabric
without loops: one leaf (`one_leaf.yaml`), or a tree.
"""

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import CONFIG_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.lib.packet import ethernet, packet
from os_ken.ofproto import ofproto_v1_3

IDLE_TIMEOUT_S = 60


class LearningSwitch(app_manager.OSKenApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ports = {}                 # {dpid: {MAC: the port it was last seen on}}

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def connected(self, ev):
        """Whatever no entry matches goes to the controller, whole."""
        dp = ev.msg.datapath
        parser, ofp = dp.ofproto_parser, dp.ofproto
        self._add(dp, 0, parser.OFPMatch(), [parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)])

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def packet_in(self, ev):
        msg = ev.msg
        dp = msg.datapath
        parser, ofp = dp.ofproto_parser, dp.ofproto
        in_port = msg.match["in_port"]
        eth = packet.Packet(msg.data).get_protocol(ethernet.ethernet)
        if eth is None:
            return
        table = self.ports.setdefault(dp.id, {})
        table[eth.src] = in_port
        out_port = table.get(eth.dst, ofp.OFPP_FLOOD)
        actions = [parser.OFPActionOutput(out_port)]
        if out_port != ofp.OFPP_FLOOD:
            # the next frames to this address go straight there, without asking
            self._add(dp, 1, parser.OFPMatch(in_port=in_port, eth_dst=eth.dst), actions, IDLE_TIMEOUT_S)
        data = msg.data if msg.buffer_id == ofp.OFP_NO_BUFFER else None
        dp.send_msg(parser.OFPPacketOut(datapath=dp, buffer_id=msg.buffer_id, in_port=in_port,
                                        actions=actions, data=data))

    @staticmethod
    def _add(dp, priority, match, actions, idle_timeout=0):
        parser, ofp = dp.ofproto_parser, dp.ofproto
        instructions = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)]
        dp.send_msg(parser.OFPFlowMod(datapath=dp, priority=priority, match=match, instructions=instructions,
                                      idle_timeout=idle_timeout))
