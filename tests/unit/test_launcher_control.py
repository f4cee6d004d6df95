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
