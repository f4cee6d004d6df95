"""The os-ken adapter, the one os-ken app of every routing scheme: events in, calls to the
controller core, the core's messages out (faucet.py to the core's valve.py).

The runner (runner.py) hands the app its control.AppConfig as an os-ken context: it puts the
object into AppManager's contexts before run_apps, and os-ken passes every context to each app's
constructor as a keyword argument. From the config's app name (fabriclab.apps.APPS) the adapter
composes the parts: the routing class, TE's engine, the selection stage.

Three threads call in, each under one lock: os-ken's event loop (switch events), the inbox watcher
(the lab's jobs and steering plan, control.InboxWatcher) and, for TE, the engine's cycle.
"""

from __future__ import annotations

import functools
import threading
import time

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.lib import hub
from os_ken.ofproto import ofproto_v1_5

from fabriclab.apps import app_info, control, openflow
from fabriclab.apps.core import ControllerCore
from fabriclab.apps.te_engine import TeEngine

CONFIG_CONTEXT = "fabriclab_config"
# The lab starts the queue model within a few seconds of the controller (after Mininet is built).
LINK_QUEUES_EVERY_S = 0.05
LINK_QUEUES_FOR_S = 120.0


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
                self.core.handler_failed(handler.__name__, exc)
    return wrapper


class FabricApp(app_manager.OSKenApp):
    # OpenFlow 1.5: the version in which a controller can choose the select groups' hash fields.
    OFP_VERSIONS = [ofproto_v1_5.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        config = kwargs.pop(CONFIG_CONTEXT)
        super().__init__(*args, **kwargs)
        self.config = config
        self.lock = threading.RLock()
        info = app_info(config.app)
        routing = info.routing_class()(config.fabric, weighted=config.options.get("weights", False))
        self.core = ControllerCore(config, routing, publish=self._publish)
        self.te = None
        if info.te_engine:
            self.te = self.core.te = TeEngine(config, routing)
        if info.stage is not None:
            self.core.stage = self._load_stage(config, info.stage)
            hub.spawn(self._link_queues)
        self.watcher = control.InboxWatcher(
            config.files, on_jobs=self.te.jobs_changed if self.te else None,
            on_steering=lambda plan: self._call(self.core.steering_changed, plan),
            on_error=self._watch_failed)
        with self.lock:
            self._publish(self.core.status())
        hub.spawn(self.watcher.run)
        if self.te is not None:
            hub.spawn(self._te_loop)

    @staticmethod
    def _load_stage(config, mode):
        from fabriclab.apps.select_stage import SelectStage, StageSync, pins_for, port_settings, stage_settings

        _ports, rows = port_settings(config.fabric)
        stage = SelectStage(pins_for(config.run_id or "adhoc"), mode, queue_rows=rows,
                            **stage_settings(mode, config.options)).load()
        return StageSync(stage, config.fabric, mode, config.run_id or "adhoc", seed=config.options.get("seed", 0),
                         shared=config.options.get("shared_basis", False))

    def _link_queues(self):
        """AR reads the queue model's occupancies, which the lab starts after the controller: try
        until they are there (the stage uses its virtual queues meanwhile)."""
        for _ in range(int(LINK_QUEUES_FOR_S / LINK_QUEUES_EVERY_S)):
            with self.lock:
                if self.core.stage.link_queues():
                    self._publish(self.core.status())
                    return
            hub.sleep(LINK_QUEUES_EVERY_S)

    # -- plumbing ---------------------------------------------------------------------------------------
    def _call(self, method, *args):
        """Call the core and send what it returns, under the lock (so a barrier never overtakes
        the changes it confirms)."""
        with self.lock:
            for dp, msg in method(*args):
                dp.send_msg(msg)

    def _publish(self, status):
        control.write_status(self.config.files.status, status)

    def _watch_failed(self, path, exc):
        self.logger.error("reading %s failed: %s", path, exc)
        with self.lock:
            self.core.handler_failed(f"watch {path.name}", exc)

    # -- switch events ----------------------------------------------------------------------------------
    # A switch is ours once os-ken's own handshake has moved it to MAIN (after its own port
    # description). Asking for ports at the features reply raced that handshake: a reply received
    # while the connection was still in CONFIG went only to os-ken's handler, never to ours, and
    # the switch stayed unconnected for good (seen once in CI on a loaded machine).
    @set_ev_cls(ofp_event.EventOFPStateChange, MAIN_DISPATCHER)
    @guarded
    def _switch_ready(self, ev):
        self._call(self.core.switch_features, ev.datapath)

    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, MAIN_DISPATCHER)
    @guarded
    def _port_desc(self, ev):
        dp = ev.msg.datapath
        self._call(self.core.port_desc, dp, openflow.port_table(dp, ev.msg.body))

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    @guarded
    def _disconnected(self, ev):
        self._call(self.core.disconnected, ev.datapath)

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    @guarded
    def _port_status(self, ev):
        dp, port = ev.msg.datapath, ev.msg.desc
        live = openflow.port_live(dp, port) and ev.msg.reason != dp.ofproto.OFPPR_DELETE
        self._call(self.core.port_status, dp, port.port_no, live)

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    @guarded
    def _barrier(self, ev):
        self._call(self.core.barrier_reply, ev.msg.datapath, ev.msg.xid)

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    @guarded
    def _error(self, ev):
        msg = ev.msg
        self.logger.error("OpenFlow error from %016x, the refused message begins %s", msg.datapath.id,
                          bytes(msg.data[:64]).hex())
        self._call(self.core.switch_error, msg.datapath, msg.type, msg.code, msg.xid)

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    @guarded
    def _packet_in(self, ev):
        msg = ev.msg
        self._call(self.core.packet_in, msg.datapath, msg.match["in_port"], msg.data)

    # -- TE's statistics and cycle ---------------------------------------------------------------------
    def _stats_reply(self, ev, kind):
        if self.te is None:
            return
        msg = ev.msg
        with self.lock:
            self.te.reply(self.core.by_dpid.get(msg.datapath.id), kind, msg.body,
                          bool(msg.flags & msg.datapath.ofproto.OFPMPF_REPLY_MORE))

    @set_ev_cls(ofp_event.EventOFPFlowDescStatsReply, MAIN_DISPATCHER)
    @guarded
    def _flow_stats(self, ev):
        self._stats_reply(ev, "flows")

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    @guarded
    def _port_stats(self, ev):
        self._stats_reply(ev, "ports")

    def _te_loop(self):
        next_run = time.monotonic() + self.te.period
        while True:
            woke = self.te.wake.wait(max(0.0, next_run - time.monotonic()))
            self.te.wake.clear()
            try:
                self._te_cycle("jobs" if woke else "period")
            except Exception as exc:     # noqa: BLE001 - the engine must outlive one bad cycle
                self.logger.exception("TE recompute failed")
                with self.lock:
                    self.core.handler_failed("te cycle", exc)
            next_run = time.monotonic() + self.te.period

    def _te_cycle(self, reason):
        started = time.monotonic()
        with self.lock:
            ready = {n: dp for n, dp in self.core.datapaths.items() if n in self.core.links.connected}
        self._call(self.te.requests, ready)
        missing = self.te.wait_replies()
        if missing:
            self.logger.warning("TE: statistics missing from %s", missing[:4])
        with self.lock:
            self.te.place(self.te.counters(), self.core.links.down_links(), reason, started)
            for dp, msg in self.core.recompute():
                dp.send_msg(msg)
        control.write_placement(self.config.files.te_placement, self.te.doc)
