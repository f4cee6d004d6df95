"""The controller's ARP responder: the leaves send every ARP request to the controller, which
answers for the fabric's host ports and for steered service and group addresses, so the Clos never
floods. Frames in, frames out; the caller sends the reply back out of the port the request came in.
"""

from __future__ import annotations

from os_ken.lib.packet import arp, ethernet, packet

from fabriclab.apps.steering import SERVICE_MAC

ETH_TYPE_ARP = 0x0806


class ArpResponder:
    def __init__(self, fabric):
        self.fabric = fabric

    def reply(self, switch, frame, services=None):
        """The reply frame to an ARP request `frame` that reached `switch`, or None when the request
        is not one to answer. `services` maps steered addresses to the switch that owns each.

        Answers only within the plane the request came from: planes are separate fabrics."""
        here = self.fabric.switches.get(switch)
        if here is None:
            return None
        request = packet.Packet(frame).get_protocol(arp.arp)
        if request is None or request.opcode != arp.ARP_REQUEST:
            return None
        target = self.fabric.ip_owner.get(request.dst_ip)
        if target is not None and target.plane == here.plane:
            mac = target.mac
        else:
            owner = self.fabric.switches.get((services or {}).get(request.dst_ip))
            if owner is None or owner.plane != here.plane:
                return None
            mac = SERVICE_MAC                 # a switch's service or group address
        reply = packet.Packet()
        reply.add_protocol(ethernet.ethernet(dst=request.src_mac, src=mac, ethertype=ETH_TYPE_ARP))
        reply.add_protocol(arp.arp(opcode=arp.ARP_REPLY, src_mac=mac, src_ip=request.dst_ip,
                                   dst_mac=request.src_mac, dst_ip=request.src_ip))
        reply.serialize()
        return bytes(reply.data)
