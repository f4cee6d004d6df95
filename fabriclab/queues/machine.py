"""One machine's part of the queue model, behind one Protocol.

A fabric split over machines runs a queue model on each (fabriclab.cluster.cluster). The lab's model
reads and changes all of them through the same calls: `LocalQueues` for this machine (its data
path's maps, its PFC agent, its RED qdiscs, Open vSwitch's sockets), `RemoteQueues`
(cluster/remotequeues.py) for another one, over the lab's SSH connection, where the helper answers
each call with that machine's own LocalQueues. tests/unit/test_remotequeues.py checks both
against `MachineQueues`, so the twins cannot drift apart unseen.
"""

from __future__ import annotations

import threading
from typing import Protocol

from fabriclab.errors import LabError
from fabriclab.queues.datapath import NCLASS
from fabriclab.queues.ovsbuf import enlarge_ovs_receive_buffers, enlarge_ovs_send_buffer, ovs_receive_drops
from fabriclab.queues.red import PLACES as RED_PLACES


class MachineQueues(Protocol):
    """What the lab's queue model does on each machine of the fabric."""

    def read_rows(self):
        """(stats, bias): this machine's maps, a row per port and class of the whole fabric."""

    def gates(self):
        """{port index: its lossless gate's counters} of this machine's ports."""

    def red(self):
        """{(port name, class): RED's counters} of this machine's ports (empty without RED)."""

    def ensure_ovs_buffers(self):
        """Enlarge OVS's transmit and port receive buffers here; the send buffer's size."""

    def ovs_drops(self):
        """Frames OVS's port sockets here dropped since their buffers were enlarged."""

    def set_ecn(self, target, **settings):
        """Change ECN marking of `target`'s ports in this machine's maps and qdiscs."""

    def cut_buffer(self, switch, fraction):
        """Cut `switch`'s usable buffer to `fraction` (1: whole again) in this machine's maps."""

    def storm(self, idx, seconds):
        """Hold port `idx`'s lossless gate closed for `seconds` (a port of this machine)."""

    def pause(self, kind, idx, waited_ns=0):
        """A pause (XOFF/XON) another machine's data path sent `waited_ns` ago to port `idx` here."""

    def cables_down(self, intfs, down):
        """The ports `intfs` lost (or got back) their cable: the leak repair holds nothing for them."""

    def empty_queues(self, intfs):
        """The ports `intfs` hold no bytes (their cable is down) in this machine's maps."""

    def alarms(self):
        """The PFC watchdog's alarms here."""

    def errors(self):
        """What went wrong here (the agent's notes, relays that failed)."""

    def leak_repairs(self, since_ns=0):
        """The leaked accounts repaired here since `since_ns` (this machine's monotonic ns)."""

    def reaction_stats(self, since_ns=0):
        """The PFC agent's reaction times here since `since_ns`."""

    def close(self):
        """Let go of this machine's part (the model stops what it started)."""


class LocalQueues:
    """This machine's part of `model` (a QueueModel): what the lab's model does here, and what
    the helper on another machine answers the lab's model with."""

    def __init__(self, model):
        self.model = model
        self.ovs_send_buffer = None
        self.ovs_receive_sockets = 0
        # The kernel's socket drop counters reset when read: their sum is kept (concurrent jobs
        # each report from it).
        self._ovs_drops = 0
        self._ovs_lock = threading.Lock()

    def read_rows(self):
        n = len(self.model.ports) * NCLASS
        dp = self.model.datapath
        return dp.stats.lookup_all(n), dp.bias.lookup_all(n)

    def gates(self):
        agent = self.model.agent
        return agent.snapshot() if agent else {}

    def red(self):
        m = self.model
        red = m.red.stats() if m.red is not None else {}
        return {(p.name, cls): red.get((p.ifindex, RED_PLACES[cls][0]), {})
                for p in m._red_ports() for cls in RED_PLACES}

    def ensure_ovs_buffers(self):
        """OVS opens its transmit socket on its first forwarded packet, so one ping goes through
        the fabric first when it is not there yet."""
        m = self.model
        size = enlarge_ovs_send_buffer()
        if size is None and len(m.fabric.hosts) > 1 and m.net is not None:
            first, second = sorted(m.fabric.hosts, key=lambda h: int(h[1:]))[:2]
            m.net.get(first).cmd(f"ping -c 1 -W 1 {m.fabric.hosts[second].ports[0].ip}")
            size = enlarge_ovs_send_buffer()
        if size is None:
            raise LabError("queue model: could not find Open vSwitch's transmit socket to enlarge its "
                           "send buffer; queues deeper than 208 KiB in total would be dropped by OVS")
        self.ovs_send_buffer = size
        self.ovs_receive_sockets = enlarge_ovs_receive_buffers()
        ovs_receive_drops()           # zero the kernel's counters: the sum starts here
        return size

    def ovs_drops(self):
        with self._ovs_lock:
            if self.ovs_receive_sockets:
                self._ovs_drops += ovs_receive_drops()
            return self._ovs_drops

    def set_ecn(self, target, **settings):
        return self.model.set_ecn_here(target, **settings)

    def cut_buffer(self, switch, fraction):
        return self.model.cut_buffer_here(switch, fraction)

    def storm(self, idx, seconds):
        self.model.agent.storm(idx, seconds)

    def pause(self, kind, idx, waited_ns=0):
        self.model.agent.relayed(kind, idx, waited_ns)

    def cables_down(self, intfs, down):
        m = self.model
        ports = [m.by_name[name] for name in intfs if name in m.by_name]
        if m.agent is not None:
            m.agent.set_dead([p.idx * NCLASS + cls for p in ports for cls in range(NCLASS)], down)

    def empty_queues(self, intfs):
        """The kernel reset their qdiscs when the link went down, and what was sent to them since
        was counted and dropped: their occupancy goes back to zero before the link comes up
        (adaptive routing would shun phantom bytes forever)."""
        m = self.model
        for name in intfs:
            p = m.by_name.get(name)
            for cls in range(NCLASS if p is not None else 0):
                row = p.idx * NCLASS + cls
                st = m.datapath.stats.lookup(row)
                if st is not None and (st.occ or st.ce_queued):
                    st.occ, st.ce_queued = 0, 0
                    m.datapath.stats.update(row, st)

    def alarms(self):
        agent = self.model.agent
        return list(agent.alarms) if agent else []

    def errors(self):
        agent = self.model.agent
        return list(agent.errors) if agent else []

    def leak_repairs(self, since_ns=0):
        agent = self.model.agent
        return agent.repairs_since(since_ns) if agent else []

    def reaction_stats(self, since_ns=0):
        agent = self.model.agent
        return agent.reaction_stats(since_ns) if agent else None

    def close(self):
        pass
