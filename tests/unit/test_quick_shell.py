"""Node shells started together (fabriclab/lab/network.py QuickShell): what Mininet's startShell
waits for, its first prompt and one set-up command, is waited for across all nodes at once. Here on
a stand-in for Mininet's Node (the same two steps over a pipe); every lab test's fabric starts its
nodes this way."""

import os

import pytest

from fabriclab.errors import LabError
from fabriclab.lab.network import QuickShell, ready_shells

PROMPT = chr(127)


class FakeNode:
    """Mininet's Node as far as a shell's start goes: read until the prompt, then one command."""

    def __init__(self, name, remote=False):
        self.name, self.isRemote = name, remote
        self.r, self.w = os.pipe()
        self.stdout = os.fdopen(self.r, "r")
        self.log = []
        if remote:
            os.write(self.w, PROMPT.encode())    # its shell is up before it is read
        self.startShell()
        self.cmd("ifconfig lo up")               # a switch's, right after its shell started

    def startShell(self, mnopts=None):
        self.log.append("spawned")
        while not self.read().endswith(PROMPT):
            pass
        self.cmd("unset HISTFILE; stty -echo; set +m")

    def read(self, size=1024):
        return os.read(self.r, size).decode()

    def cmd(self, text):
        self.sendCmd(text)
        return self.waitOutput()

    def sendCmd(self, text):
        self.log.append(f"sent {text}")
        os.write(self.w, PROMPT.encode())        # the shell answers with its prompt

    def waitOutput(self):
        while not self.read().endswith(PROMPT):
            pass
        self.log.append("answered")
        return ""


class Quick(QuickShell, FakeNode):
    pass


def test_every_shell_starts_before_any_is_waited_for_then_each_runs_what_was_held_in_order():
    nodes = [Quick(f"h{i}") for i in range(3)]
    # made without a round trip: nothing sent, nothing read yet
    assert all(node.log == ["spawned"] for node in nodes)
    for node in nodes:
        os.write(node.w, PROMPT.encode())        # the shells' first prompts, in any order
    ready_shells(nodes)
    assert all(node.log == ["spawned", "sent unset HISTFILE; stty -echo; set +m", "answered",
                            "sent ifconfig lo up", "answered"] for node in nodes)
    assert nodes[0].cmd("true") == "" and nodes[0].log[-2:] == ["sent true", "answered"]


def test_a_node_on_another_machine_starts_as_mininet_starts_it():
    node = Quick("h9", remote=True)              # RemoteMixin talks to its shell right after
    assert node.log == ["spawned", "sent unset HISTFILE; stty -echo; set +m", "answered",
                        "sent ifconfig lo up", "answered"]
    ready_shells([node])                         # nothing held: nothing more happens
    assert len(node.log) == 5


def test_a_shell_that_never_prompts_is_named():
    node = Quick("s7")
    with pytest.raises(LabError, match="the shell of s7 did not start within 0 s"):
        ready_shells([node], timeout_s=0.2)
