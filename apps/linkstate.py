"""Which links are up, from what the switches report: connections, port descriptions, port status.

Pure bookkeeping, no OpenFlow: the controller app feeds it events and asks for the failed links.
A link is up only when both of its switches are connected and both ports are live (carrier up and
not administratively down). Host links have one switch end; they count as up when that port is.
"""

from __future__ import annotations


class LinkState:
    def __init__(self, fabric):
        self.fabric = fabric
        self.connected = set()
        self.live = {}              # (switch, port) -> bool
        self.mismatches = {}        # switch -> list of one-line problems with its reported ports

    def switch_connected(self, switch, ports):
        """A switch (re)connected and described its ports: {port_no: (name, live)}."""
        self.connected.add(switch)
        expected = self.fabric.switch_ports(switch)
        problems = []
        for port_no, intf in expected.items():
            reported = ports.get(port_no)
            if reported is None:
                problems.append(f"{switch}: port {port_no} ({intf}) missing")
            elif reported[0] != intf:
                problems.append(f"{switch}: port {port_no} is {reported[0]}, spec says {intf}")
        self.mismatches[switch] = problems
        for port_no in expected:
            self.live[(switch, port_no)] = bool(ports.get(port_no, (None, False))[1])

    def switch_disconnected(self, switch):
        self.connected.discard(switch)

    def port_changed(self, switch, port_no, live):
        """Returns True when the change alters a port the fabric uses."""
        key = (switch, port_no)
        if key not in self.live or self.live[key] == live:
            return False
        self.live[key] = live
        return True

    def port_up(self, switch, port_no):
        return switch in self.connected and self.live.get((switch, port_no), False)

    def down_links(self):
        """Link.key of every fabric link that is not usable."""
        return frozenset(link.key for link in self.fabric.fabric_links
                         if not (self.port_up(link.a, link.a_port) and self.port_up(link.b, link.b_port)))

    def down_host_ports(self):
        return frozenset((link.b, link.b_port) for link in self.fabric.host_links
                         if not self.port_up(link.b, link.b_port))
