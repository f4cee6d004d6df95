"""The PFC agent's process without a network: its start request checked as hostile, its answers
over a fake agent, and the real process's ends (a start it cannot carry out, its input closing,
a death the lab sees as an error rather than a hang)."""

import json
import os
import subprocess
import sys
import time
import types

import pytest

from fabriclab.errors import LabError
from fabriclab.queues import agentproc
from fabriclab.queues.agentproc import AgentProcess, start_config
from fabriclab.queues.config import PfcSettings
from fabriclab.queues.datapath import EV_XOFF, EV_XON
from fabriclab.queues.leaks import Account
from fabriclab.system.remotechannel import Channel

PORT = ["l1-eth1", None, 7, 1250, 3000, 1500, 60000]       # after idx: name ... gate_limit


def port(idx=0, **changes):
    row = [idx, *PORT]
    for key, value in changes.items():
        row[agentproc.PORT_FIELDS.index(key)] = value
    return row


def request(**changes):
    base = {"pins": "/sys/fs/bpf/fabriclab/20261128-040000-a1b2c3/queues", "rows": 12, "relay": False,
            "ports": [port(0), port(3, name="s1-eth2", ns_pid=4242)],
            "pfc": {"watchdog_ms": 40.0, "watchdog_action": "drop", "restore_ms": 100.0},
            "accounts": [[1, "l1-eth1", "lossless", [4, 7], 9000, 3], [2, "l1-eth1", "lossy", [], None, None]]}
    base.update(changes)
    return {"start": base}


def test_a_start_request_becomes_the_agents_ports_settings_and_accounts():
    got = start_config(request())
    assert sorted(got["ports"]) == [0, 3] and got["ports"][3].ns_pid == 4242 and got["ports"][0].ifindex == 7
    assert got["pfc"].watchdog_ms == 40.0 and got["pfc"].watchdog_action == "drop"
    assert got["accounts"][0] == Account(1, "l1-eth1", "lossless", (4, 7), 9000, 3)
    assert str(got["pins"]) == "/sys/fs/bpf/fabriclab/20261128-040000-a1b2c3/queues"


@pytest.mark.parametrize("changes", [
    {"pins": "/tmp/x"}, {"pins": "/sys/fs/bpf/fabriclab/../../etc"}, {"rows": 0}, {"rows": True},
    {"relay": "yes"}, {"ports": []}, {"ports": [port(12)]}, {"ports": [port(0, name="x" * 16)]},
    {"ports": [port(0, ifindex=0)]}, {"ports": [port(0, open_rate_bytes=-1)]}, {"ports": [port(0)[:-1]]},
    {"ports": [port(0, ns_pid="1")]}, {"pfc": {"watchdog_ms": float("nan"), "watchdog_action": "drop",
                                              "restore_ms": 1}},
    {"pfc": {"watchdog_ms": 1, "watchdog_action": "explode", "restore_ms": 1}},
    {"pfc": {"watchdog_ms": 1, "watchdog_action": "drop", "restore_ms": 1, "extra": 1}},
    {"accounts": [[1, "p", "lossless", [99], None, None]]}, {"accounts": [[1, "p", "lossless", [], -5, None]]},
    {"accounts": "all"}, {"surprise": 1}])
def test_a_malformed_start_request_is_refused_naming_what(changes):
    msg = request(**changes)
    with pytest.raises(ValueError, match="start|expected"):
        start_config(msg)


def test_a_start_request_must_be_the_only_key():
    with pytest.raises(ValueError, match="expected"):
        start_config({**request(), "also": 1})


class FakeAgent:
    def __init__(self):
        self.state = {0: None, 3: None}
        self.rows = 12
        self.leaks = types.SimpleNamespace(dead=[], set_dead=lambda rows, down: self.leaks.dead.append((rows, down)))
        self.storms, self.relayed_calls, self.errors, self.alarms = [], [], [], [{"port": "l1-eth1"}]

    def storm(self, idx, seconds):
        self.storms.append((idx, seconds))

    def relayed(self, kind, idx, waited_ns=0):
        if idx not in self.state:
            raise ValueError("no such port here")
        self.relayed_calls.append((kind, idx, waited_ns))

    def note(self, text):
        self.errors.append(text)

    def reaction_stats(self, since_ns=0):
        return {"pauses": 2, "since": since_ns}

    def repairs_since(self, since_ns=0):
        return [{"port": "l1-eth1", "t_ns": since_ns + 1}]

    def snapshot(self):
        return {0: {"gate_closes": 1}, 3: {"gate_closes": 0}}


def answer(agent, msg):
    return agentproc._answer(agent, msg if isinstance(msg, str) else json.dumps(msg))


def test_the_agent_answers_each_request_and_refuses_what_is_malformed():
    agent = FakeAgent()
    assert answer(agent, {"storm": [3, 0.5]}) == {"done": 1} and agent.storms == [(3, 0.5)]
    assert answer(agent, {"dead": [[1, 2], True]}) == {"done": 1} and agent.leaks.dead == [([1, 2], True)]
    assert answer(agent, {"reaction": 5}) == {"reaction": {"pauses": 2, "since": 5}}
    assert answer(agent, {"repairs": 5}) == {"repairs": [{"port": "l1-eth1", "t_ns": 6}]}
    # a guest machine booted seconds ago, asked about a run longer than that: before its clock's zero
    assert answer(agent, {"reaction": -30_000_000_000}) == {"reaction": {"pauses": 2, "since": -30_000_000_000}}
    assert answer(agent, "snapshot\n") == {"snapshot": [[0, {"gate_closes": 1}], [3, {"gate_closes": 0}]]}
    assert answer(agent, "alarms") == {"alarms": [{"port": "l1-eth1"}]}
    for bad in ({"storm": [1, 1]}, {"storm": [3, -1]}, {"storm": [3, float("inf")]}, {"dead": [[99], True]},
                {"dead": [[1], "yes"]}, {"reaction": 1 << 64}, {"reaction": 1.5}, {"what": 1}, {"a": 1, "b": 2}, [1]):
        assert "error" in answer(agent, bad), bad
    assert answer(agent, "{nope") == {"error": "not JSON"}


def test_a_relayed_pause_gets_no_answer_and_a_bad_one_is_kept_as_an_error():
    agent = FakeAgent()
    assert answer(agent, {"pfc": [EV_XOFF, 3, 1_500_000]}) is None
    assert answer(agent, {"pfc": [EV_XON, 1, 0]}) is None                  # not a port of this agent's
    for bad in (["XOFF", 3, 0], [EV_XOFF, 3], [EV_XOFF, 3, -1], [9, 3, 0]):
        assert answer(agent, {"pfc": bad}) is None
    assert agent.relayed_calls == [(EV_XOFF, 3, 1_500_000)] and len(agent.errors) == 5


def test_the_lab_side_carries_a_pfc_settings_and_its_ports_into_the_start_request():
    ports = [types.SimpleNamespace(idx=0, name="l1-eth1", ns_pid=None, ifindex=7, open_rate_bytes=1250,
                                   open_burst=3000, closed_burst=1500, gate_limit=60000, node="l1")]
    handle = AgentProcess("20261128-040000-a1b2c3", "/sys/fs/bpf/fabriclab/20261128-040000-a1b2c3/queues", ports,
                          PfcSettings(watchdog_ms=40.0), [Account(1, "l1-eth1", "lossless", (4,), 9000, 3)], 12)
    got = start_config({"start": handle.config})        # what the lab sends, the agent accepts
    assert got["ports"][0].name == "l1-eth1" and got["accounts"][0].egress_rows == (4,)
    assert got["relay"] is False and got["pfc"].restore_ms == 1000.0


# -- the real process -----------------------------------------------------------------------------
def child(*args):
    return subprocess.run([sys.executable, "-m", agentproc.MODULE, *args], input="", capture_output=True,
                          text=True, timeout=30)


def test_the_process_wants_a_run_id_and_ends_with_its_input():
    assert child().returncode == 2
    assert child("--run-id", "../../etc").returncode == 2
    done = child("--run-id", "20261128-040000-a1b2c3")
    assert done.returncode == 0 and json.loads(done.stdout)["ready"] > 0


def test_a_start_it_cannot_carry_out_is_a_one_line_error_and_leaves_no_process():
    recorded = []
    handle = AgentProcess("20261128-040000-a1b2c3", "/sys/fs/bpf/fabriclab/no-such-run/queues",
                          [types.SimpleNamespace(idx=0, name="l1-eth1", ns_pid=None, ifindex=7, open_rate_bytes=1,
                                                 open_burst=1, closed_burst=1, gate_limit=1)],
                          PfcSettings(watchdog_ms=0), [], 3, record=recorded.append)
    with pytest.raises(LabError, match="not pinned") as err:
        handle.start()
    assert "\n" not in str(err.value) and len(recorded) == 1
    assert handle.proc is None and (not os.path.exists(f"/proc/{recorded[0]}") or _zombie(recorded[0]))


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_an_agent_that_died_is_an_error_on_the_next_request_not_a_hang():
    handle = AgentProcess("20261128-040000-a1b2c3", "/sys/fs/bpf/fabriclab/x/queues", [], PfcSettings(), [], 3)
    channel = Channel.__new__(Channel)          # a stand-in that says it is ready and dies at once
    channel.machine, channel.what = None, "the PFC agent"
    channel.proc = subprocess.Popen([sys.executable, "-c", "import sys; print('{\"ready\": 1}', flush=True); "
                                     "sys.exit('killed by the test')"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    channel.ready()
    handle.talk.attach(channel, "test-agent")
    started = time.monotonic()
    with pytest.raises(LabError, match="the PFC agent: killed by the test"):
        handle.snapshot()
    assert time.monotonic() - started < 10
    assert handle.errors == ["the PFC agent: killed by the test"]     # errors says so instead of raising
    handle.stop()
    assert handle.proc is None
