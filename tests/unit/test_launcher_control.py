"""The collective launcher's waits on its agents, without a network: a rank that says its last
word and exits is not taken for dead, and a rank that exits silently is."""

import selectors
import socket
import types

import pytest

from fabriclab.errors import LabError
from fabriclab.traffic import rank_channel
from fabriclab.traffic.collective import Launcher, _AgentLink


class Exited:
    """A process that has already exited with `code` (stderr says nothing)."""

    def __init__(self, code=0):
        self.returncode = code
        self.stderr = None

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        return self.returncode


def launcher_with(links):
    launcher = Launcher.__new__(Launcher)
    launcher.links = links
    launcher.selector = selectors.DefaultSelector()
    launcher.ranks = [types.SimpleNamespace(host=f"h{r + 1}", ports=[types.SimpleNamespace(intf=f"h{r + 1}-n0")])
                      for r in links]
    return launcher


def exited_link(rank, said):
    """The launcher's end of an agent that wrote `said` (messages) and exited; the socket is not
    registered with the selector, as when select has not reported it yet."""
    ours, theirs = socket.socketpair()
    for message in said:
        theirs.sendall(rank_channel.frame(message))
    theirs.close()
    link = _AgentLink(rank, Exited(0))
    link.sock = ours
    return link


def test_a_final_message_read_after_the_agent_exited_counts():
    launcher = launcher_with({0: exited_link(0, [{"final": 0, "totals": {"tx": 5}}])})
    got = launcher._gather("final", [0], 2.0, "stopping")
    assert got[0]["totals"] == {"tx": 5}


def test_an_agent_that_exits_without_its_message_is_named():
    launcher = launcher_with({0: exited_link(0, [{"ready": 0}])})
    with pytest.raises(LabError, match=r"rank 0 \(h1 h1-n0\): agent died \(exit code 0\) while stopping"):
        launcher._gather("final", [0], 2.0, "stopping")


class FakeSock:
    def __init__(self, incoming=b""):
        self.sent, self.incoming = [], incoming

    def sendall(self, data):
        self.sent.append(data)

    def recv(self, _n):
        data, self.incoming = self.incoming, b""
        return data


def test_a_rank_on_another_clock_gets_start_times_on_its_clock_and_reports_on_this_one():
    link = _AgentLink(1, Exited(), clock_offset_s=-0.75)       # its clock runs 0.75 s behind
    link.sock = FakeSock(rank_channel.frame({"done": 3, "start": 99.25, "end": 100.25, "cpu_s": 0.5})
                         + rank_channel.frame({"ready": 0, "end": 7.0}))
    link.send({"run": 3, "start_at": 100.0})
    link.send({"prepare": 0})
    sent = [rank_channel.Lines().feed(data)[0] for data in link.sock.sent]
    assert sent == [{"run": 3, "start_at": 99.25}, {"prepare": 0}]
    done, ready = link.messages()
    assert done == {"done": 3, "start": 100.0, "end": 101.0, "cpu_s": 0.5}
    assert ready == {"ready": 0, "end": 7.0}                    # only a "done" carries its times
    # its final report's times too: QPs' first send and last ACK, the PLB timeline and events
    final = {"final": 1, "qps": [{"qpn": 17, "first_send": 99.5, "last_ack": None}, "junk"],
             "plb": {"timeline": {"start": 99.0, "t_s": [0.0, 0.5]},
                     "events": [{"t": 99.75, "plane": 2, "event": "removed"}, {"t": True}]}}
    link.sock = FakeSock(rank_channel.frame(final))
    (got,) = link.messages()
    assert got["qps"] == [{"qpn": 17, "first_send": 100.25, "last_ack": None}, "junk"]
    assert got["plb"]["timeline"] == {"start": 99.75, "t_s": [0.0, 0.5]}           # offsets stay
    assert got["plb"]["events"] == [{"t": 100.5, "plane": 2, "event": "removed"}, {"t": True}]
    here = _AgentLink(0, Exited())
    here.sock = FakeSock()
    here.send({"run": 0, "start_at": 5.0})
    assert rank_channel.Lines().feed(here.sock.sent[0]) == [{"run": 0, "start_at": 5.0}]


class Running:
    """A process still running."""

    returncode = None

    def poll(self):
        return None


def test_a_wait_is_given_up_once_its_until_is_true_and_not_before():
    """Noise told to stop gives up the iteration it is in: the wait for "done" ends within a poll
    of `until` turning true, long before its own timeout, and a rank's "done" ends it as before."""
    import threading
    import time

    from fabriclab.traffic.collective import _Abandoned

    ours, theirs = socket.socketpair()
    link = _AgentLink(0, Running())
    link.sock = ours
    launcher = launcher_with({0: link})
    launcher.selector.register(ours, selectors.EVENT_READ, link)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(_Abandoned):
        launcher._gather("done", [0], 30.0, "running gather 1M iteration 3", until=stop.is_set)
    assert 0.25 < time.monotonic() - t0 < 1.0
    # with `until` false, the rank's word is what ends the wait
    theirs.sendall(rank_channel.frame({"done": 3, "end": 1.0}))
    got = launcher._gather("done", [0], 5.0, "running", until=lambda: False)
    assert got[0]["done"] == 3
    theirs.close()
    ours.close()
