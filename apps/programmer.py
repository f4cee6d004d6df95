"""Which version of the desired state each switch holds, as the switches have confirmed it.

Every recompute is a new *generation*. Programming a switch sends the diff between what it was last
sent and what it should hold now, then a barrier; the barrier's reply confirms that the switch has
applied everything up to that generation (OpenFlow processes a connection's messages in order and
answers a barrier only after all that came before it). The fabric is *programmed* when every
switch is connected and has confirmed the current generation; that is what the lab waits for.

A switch that (re)connects is in an unknown state: its first diff starts with a reset.

A switch that a new generation changes nothing on gets no message: its last barrier, answered or
still on its way, confirms the new generation as well (it covers everything the switch was sent,
and that is all this generation wants of it). Every switch connecting recomputes the fabric, so a
barrier to every switch at every generation cost 48 x 48 round trips and status writes while
32x16x8's switches connected.
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
        self.last_barrier = {}  # switch -> xid of the barrier last sent to it

    def forget(self, switch, confirmed=False):
        """The switch's table is unknown (it reconnected): wipe it at the next program. With
        `confirmed`, also drop what it confirmed (it disconnected)."""
        self.installed.pop(switch, None)
        if confirmed:
            self.synced.pop(switch, None)
            self.last_barrier.pop(switch, None)
            self.pending = {k: g for k, g in self.pending.items() if k[0] != switch}

    def program(self, desired, datapaths):
        """Start a new generation: bring every switch in `datapaths` ({switch: dp}) to
        desired[switch]. Returns [(dp, message)] in the order to send them."""
        self.generation += 1
        sends = []
        for switch, dp in datapaths.items():
            state = desired[switch]
            ops = diff(self.installed.get(switch), state)
            if not ops and switch in self.installed:
                self._carry(switch)
                continue
            for op in ops:
                sends.extend((dp, msg) for msg in openflow.messages(dp, op, self.bases.get(switch, 0)))
            self.installed[switch] = state
            barrier = openflow.barrier(dp)
            self.pending[(switch, barrier.xid)] = self.generation
            self.last_barrier[switch] = barrier.xid
            sends.append((dp, barrier))
        return sends

    def _carry(self, switch):
        """Nothing new for `switch`: what confirms (or confirmed) its last barrier confirms this
        generation."""
        key = (switch, self.last_barrier.get(switch))
        if key in self.pending:
            self.pending[key] = self.generation
        elif switch in self.synced:
            self.synced[switch] = self.generation

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
