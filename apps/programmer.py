"""Which version of the desired state each switch holds, as the switches have confirmed it.

Every recompute is a new *generation*. Programming a switch sends the diff between what it was last
sent and what it should hold now, then a barrier; the barrier's reply confirms that the switch has
applied everything up to that generation (OpenFlow processes a connection's messages in order and
answers a barrier only after all that came before it). The fabric is *programmed* when every
switch is connected and has confirmed the current generation; that is what the lab waits for.

A switch that (re)connects is in an unknown state: its first diff starts with a reset.
"""

from __future__ import annotations

from fabriclab.apps import openflow
from fabriclab.apps.ecmp import diff


class Programmer:
    def __init__(self, bases=None):
        self.bases = bases or {}  # switch -> the hash basis its select groups hash from
        self.generation = 0
        self.installed = {}     # switch -> SwitchState last sent
        self.synced = {}        # switch -> generation confirmed by a barrier reply
        self.pending = {}       # (switch, xid) -> generation its barrier confirms

    def forget(self, switch, confirmed=False):
        """The switch's table is unknown (it reconnected): wipe it at the next program. With
        `confirmed`, also drop what it confirmed (it disconnected)."""
        self.installed.pop(switch, None)
        if confirmed:
            self.synced.pop(switch, None)
            self.pending = {k: g for k, g in self.pending.items() if k[0] != switch}

    def program(self, desired, datapaths):
        """Start a new generation: bring every switch in `datapaths` ({switch: dp}) to
        desired[switch]. Returns [(dp, message)] in the order to send them."""
        self.generation += 1
        sends = []
        for switch, dp in datapaths.items():
            state = desired[switch]
            for op in diff(self.installed.get(switch), state):
                sends.extend((dp, msg) for msg in openflow.messages(dp, op, self.bases.get(switch, 0)))
            self.installed[switch] = state
            barrier = openflow.barrier(dp)
            self.pending[(switch, barrier.xid)] = self.generation
            sends.append((dp, barrier))
        return sends

    def confirm(self, switch, xid):
        """A barrier reply arrived. Returns True when it advanced what the switch confirmed."""
        generation = self.pending.pop((switch, xid), None)
        if generation is None or generation < self.synced.get(switch, -1):
            return False
        self.synced[switch] = generation
        return True

    def programmed(self, switches, connected):
        """True when every one of `switches` is in `connected` and confirmed this generation."""
        return all(s in connected and self.synced.get(s) == self.generation for s in switches)
