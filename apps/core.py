"""The controller's logic, without os-ken: switch events in, OpenFlow messages out.

`ControllerCore` knows the fabric (checked against the ports each switch reports), keeps LinkState
from connections and port status, asks the routing class for the desired state on every change,
merges the steering plan into it, and lets the Programmer send only the difference followed by a
barrier. It answers ARP (ArpResponder) and publishes a Status after every change through the
`publish` callable it is given. Each event method returns the [(datapath, message)] to send, in
order; the os-ken adapter (osken_app.py) only sends them, as faucet's valve.py / faucet.py do.

Not thread-safe: the adapter calls it under one lock.
"""

from __future__ import annotations

import logging
import os
import time

from fabriclab.apps import openflow
from fabriclab.apps.arp import ArpResponder
from fabriclab.apps.control import SteeringPlan, SteeringStatus, Status
from fabriclab.apps.hashing import switch_bases
from fabriclab.apps.linkstate import LinkState
from fabriclab.apps.programmer import Programmer
from fabriclab.apps.steering import SteeringError, arp_addresses, merged, steering_state

log = logging.getLogger(__name__)

MAX_ERRORS = 50          # switch and handler errors kept (the status shows the last 20)
MAX_EVENTS = 200         # link events kept (the status shows the last 50)


class ControllerCore:
    def __init__(self, config, routing, publish=None, clock=time.time):
        """`config`: control.AppConfig; `routing`: an object with desired(down_links) -> {switch:
        SwitchState} (ecmp.py, te.py); `publish(Status)` is called after every change."""
        self.config = config
        self.fabric = config.fabric
        self.routing = routing
        self.publish = publish or (lambda status: None)
        self.clock = clock
        self.links = LinkState(self.fabric)
        self.bases = switch_bases(self.fabric, config.options)
        self.programmer = Programmer(self.bases)
        self.arp = ArpResponder(self.fabric)
        self.by_dpid = {s.dpid: s.name for s in self.fabric.switches.values()}
        self.datapaths = {}            # switch name -> datapath
        self.unknown_dpids = set()
        self.errors = []               # OpenFlow errors the switches returned, handler failures
        self.events = []               # link events, oldest first
        self.steering = {}             # switch -> SwitchState of the steering plan
        self.steering_addresses = {}   # steered address -> owning switch (answered by ARP)
        self.steering_status = SteeringStatus()
        self.stage = None              # optional: before_program(desired, connected), status()
        self.te = None                 # optional: status()

    # -- switch lifecycle -----------------------------------------------------------------------------
    def switch_features(self, dp):
        """A switch connected: ask for its ports (programming waits for their description)."""
        name = self.by_dpid.get(dp.id)
        if name is None:
            self.unknown_dpids.add(dp.id)
            log.warning("switch with dpid %016x is not in the fabric; ignoring it", dp.id)
            self._publish()
            return []
        self.datapaths[name] = dp
        return [(dp, openflow.port_desc_request(dp))]

    def port_desc(self, dp, ports):
        """The switch described its ports: {port_no: (name, live)}. Its tables are unknown, so
        the next program wipes them first."""
        name = self.by_dpid.get(dp.id)
        if name is None:
            return []
        self.links.switch_connected(name, ports)
        for problem in self.links.mismatches[name]:
            log.warning("fabric mismatch: %s", problem)
        self.programmer.forget(name)
        self._event("switch_connected", name)
        return self.recompute()

    def disconnected(self, dp):
        name = self.by_dpid.get(dp.id) if dp.id is not None else None
        if name is None or self.datapaths.get(name) is not dp:
            return []                  # an old connection of a switch that has reconnected
        del self.datapaths[name]
        self.links.switch_disconnected(name)
        self.programmer.forget(name, confirmed=True)
        self._event("switch_disconnected", name)
        return self.recompute()

    def port_status(self, dp, port_no, live):
        name = self.by_dpid.get(dp.id)
        if name is None or not self.links.port_changed(name, port_no, live):
            return []
        self._event("port_up" if live else "port_down", f"{name}:{port_no}")
        return self.recompute()

    def barrier_reply(self, dp, xid):
        name = self.by_dpid.get(dp.id)
        if self.programmer.confirm(name, xid):
            self._publish()
        return []

    def switch_error(self, dp, kind, code, xid):
        """A switch refused a message: shown in the status (`ctl` at the prompt)."""
        name = self.by_dpid.get(dp.id, f"{dp.id:016x}")
        self._error(f"{name}: OpenFlow error type {kind} code {code} (xid {xid})")
        return []

    def handler_failed(self, where, exc):
        self._error(f"controller: {where}: {type(exc).__name__}: {exc}")

    # -- ARP ------------------------------------------------------------------------------------------
    def packet_in(self, dp, in_port, frame):
        reply = self.arp.reply(self.by_dpid.get(dp.id), frame, self.steering_addresses)
        return [] if reply is None else [(dp, openflow.packet_out(dp, in_port, reply))]

    # -- steering (in-network services, see steering.py) -------------------------------------------
    def steering_changed(self, plan):
        """A new steering plan (control.SteeringPlan; None: no plan). A plan the fabric refuses
        keeps the old one installed and shows the reason in the status."""
        plan = plan or SteeringPlan()
        try:
            state = steering_state(self.fabric, plan.plan)
        except SteeringError as exc:
            self.steering_status = SteeringStatus(plan.generation, str(exc))
            self._publish()
            return []
        self.steering = state
        self.steering_addresses = arp_addresses(plan.plan)
        self.steering_status = SteeringStatus(plan.generation, "")
        return self.recompute()

    # -- routing ------------------------------------------------------------------------------------------
    def recompute(self):
        """A new generation: the routing's desired state for the links that are up, with the
        steering plan merged in, sent to every switch whose ports are known."""
        desired = merged(self.routing.desired(self.links.down_links()), self.steering)
        if self.stage is not None:
            self.stage.before_program(desired, self.links.connected)
        ready = {name: dp for name, dp in self.datapaths.items() if name in self.links.connected}
        sends = self.programmer.program(desired, ready)
        self._publish()
        return sends

    @property
    def programmed(self):
        return self.programmer.programmed(self.fabric.switches, self.links.connected)

    # -- status --------------------------------------------------------------------------------------------
    def _event(self, kind, subject):
        self.events.append({"time": self.clock(), "event": kind, "subject": subject})
        del self.events[:-MAX_EVENTS]

    def _error(self, text):
        log.error("%s", text)
        self.errors.append(text)
        del self.errors[:-MAX_ERRORS]
        self._publish()

    def status(self):
        return Status(
            app=self.config.app, options=dict(self.config.options), pid=os.getpid(), time=self.clock(),
            generation=self.programmer.generation, connected=tuple(sorted(self.links.connected)),
            synced=dict(self.programmer.synced), programmed=self.programmed,
            down_links=self.links.down_links(),
            mismatches=tuple(p for problems in self.links.mismatches.values() for p in problems),
            unknown_dpids=tuple(sorted(self.unknown_dpids)), switch_errors=tuple(self.errors[-20:]),
            events=tuple(self.events[-50:]), steering=self.steering_status,
            te=self.te.status() if self.te is not None else None,
            stage=self.stage.status() if self.stage is not None else None)

    def _publish(self):
        self.publish(self.status())
