"""The os-ken adapter against os-ken's own connection handshake.

os-ken hands an OpenFlow message to the handlers registered for the connection's state *when the
message is received*, and its own handler (ofp_handler) moves a connection from CONFIG to MAIN only
after answering its own port description, in its own thread. These tests drive the adapter's real
handler registrations through that handshake in its worst order: every request the adapter sends
is answered before os-ken's thread moves the connection on."""

import logging
import threading

from os_ken.controller import handler, ofp_event
from os_ken.controller.handler import CONFIG_DISPATCHER, MAIN_DISPATCHER
from os_ken.ofproto import ofproto_v1_5_parser as parser

from fabriclab.apps.osken_app import FabricApp

from .fakeoftable import FakeDatapath


class RecordingCore:
    """The core's two handshake calls: ask for the ports, take their description."""

    def __init__(self):
        self.described = []

    def switch_features(self, dp):
        return [(dp, parser.OFPPortDescStatsRequest(dp, 0))]

    def port_desc(self, dp, ports):
        self.described.append((dp.id, ports))
        return []

    def handler_failed(self, name, exc):
        raise AssertionError(f"{name} failed: {exc}")


class Connection(FakeDatapath):
    """One switch's connection: os-ken's state, and requests answered in the state they were sent in."""

    def __init__(self, dpid, app):
        super().__init__(dpid)
        self.app = app
        self.state = CONFIG_DISPATCHER
        self.answered_in = []

    def deliver(self, ev):
        for method in list(self.app.get_handlers(ev, self.state)):
            method(ev)

    def send_msg(self, msg):
        assert isinstance(msg, parser.OFPPortDescStatsRequest), msg
        reply = parser.OFPPortDescStatsReply(self, body=[
            parser.OFPPort(port_no=1, hw_addr="02:00:00:00:00:01", name=b"l1-eth1", config=0,
                           state=0, properties=[])])
        reply.flags = 0
        self.answered_in.append(self.state)
        self.deliver(ofp_event.EventOFPPortDescStatsReply(reply))

    def handshake(self):
        """The features reply arrives in CONFIG; os-ken's handler later moves the connection to MAIN."""
        self.deliver(ofp_event.EventOFPSwitchFeatures(parser.OFPSwitchFeatures(self, datapath_id=self.id)))
        self.state = MAIN_DISPATCHER
        changed = ofp_event.EventOFPStateChange(self)
        changed.state = MAIN_DISPATCHER
        self.deliver(changed)


def _app():
    app = FabricApp.__new__(FabricApp)       # the registrations and _call, not the whole controller
    app.event_handlers, app.observers = {}, {}
    app.lock, app.core, app.logger = threading.RLock(), RecordingCore(), logging.getLogger("test")
    handler.register_instance(app)
    return app


def test_a_switch_is_described_once_however_the_handshake_threads_interleave():
    app = _app()
    connection = Connection(0x11, app)
    connection.handshake()
    assert connection.answered_in == [MAIN_DISPATCHER]
    (dpid, ports), = app.core.described
    assert dpid == 0x11 and ports[1][0] == "l1-eth1"


def test_the_adapter_asks_nothing_of_a_connection_still_in_config():
    # A reply received in CONFIG goes to os-ken's handler alone: no request of ours may be in flight then.
    app = _app()
    features = ofp_event.EventOFPSwitchFeatures(parser.OFPSwitchFeatures(FakeDatapath(0x11), datapath_id=0x11))
    assert list(app.get_handlers(features, CONFIG_DISPATCHER)) == []
