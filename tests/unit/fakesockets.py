"""The agent's sockets over an in-memory wire, for tests of the udp RNIC: what a raw sender sends
goes to `wire.carry(packet)`; a listener reads the (UDP payload, TOS, (source, port)) datagrams the
wire put in its address's inbox, as the kernel would hand them over."""

import socket


class RawSocket:
    def __init__(self, wire, src=None):
        self.wire, self.src = wire, src

    def sendto(self, packet, _flags, _address):
        self.wire.carry(packet)
        return len(packet)

    def queued(self):
        """The bytes the wire says wait in this port's egress queue (`wire.deep`)."""
        return getattr(self.wire, "deep", {}).get(self.src, 0)

    def close(self):
        pass


class Listener:
    def __init__(self, wire, address):
        self.inbox = wire.inboxes[address]

    def setblocking(self, _flag):
        pass

    def recvmsg(self, _size, _ancillary):
        if not self.inbox:
            raise BlockingIOError
        payload, tos, source = self.inbox.popleft()
        return payload, [(socket.IPPROTO_IP, socket.IP_TOS, bytes([tos]))], 0, source

    def close(self):
        pass


def rank_drivers(configs, rnic):
    """A rank driver per agent config over `rnic` (a UdpRnic), opened, with no event loop: the
    test turns it by hand, and what it would tell the launcher collects in `driver.told`."""
    from types import SimpleNamespace

    from fabriclab.traffic import rank_driver

    drivers = []
    for config in configs:
        driver = rank_driver.RankDriver(config, rnic)
        driver.selector = SimpleNamespace(register=lambda *a: None)
        driver.told = []
        driver.tell = driver.told.append
        driver.open()
        drivers.append(driver)
    return drivers
