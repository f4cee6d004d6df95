"""Bring-up and teardown hygiene: nothing left behind, bad input refused early, `clean` repairs."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from fabriclab.errors import LabError
from fabriclab.lab.lab import Lab
from fabriclab.lab.runstate import RUN_ROOT
from fabriclab.topologies.spec import load_spec
from tests.lab import labutil

pytestmark = pytest.mark.lab

FABRICLAB = [sys.executable, "-m", "fabriclab.cli.main"]


def cli(*args, timeout=120, **kw):
    return subprocess.run(FABRICLAB + list(args), capture_output=True, text=True, timeout=timeout, **kw)


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def programmed_runs(pid):
    """The run folders of process `pid` whose controller has programmed every switch: only that
    process's, so a run another test left behind is never mistaken for it."""
    runs = []
    for status in (RUN_ROOT / "runs").glob("*/controller.json"):
        try:
            owner = json.loads((status.parent / "state.json").read_text()).get("pid")
            if owner == pid and json.loads(status.read_text()).get("programmed"):
                runs.append(status.parent)
        except (OSError, ValueError):
            pass
    return runs


def test_teardown_leaves_nothing_behind():
    before = labutil.resources()
    with Lab(load_spec("tiny")) as lab:
        during = labutil.resources()
        assert labutil.leaked(before, during)["bridges"] == sorted(lab.fabric.switches)
        assert len(labutil.leaked(before, during)["netns"]) == len(lab.fabric.hosts)
    assert labutil.leaked(before, labutil.resources()) == {}


@pytest.mark.parametrize("args, message", [
    (["run", "no-such-spec"], "no spec file 'no-such-spec'"),
    (["run", "tiny", "--routing", "magic"], "unknown routing app 'magic'"),
    (["run", "tiny", "--link-down", "l1-s9@1"], "no node 's9'"),
    (["run", "tiny", "--link-down", "l1-s1@99", "--duration", "2"], "after the traffic ends"),
    (["run", "tiny", "--load", "0"], "load must be in [0.001, 1]"),
    (["run", "tiny", "--duration", "0"], "duration_s must be in [0.1, 3600] seconds"),
])
def test_bad_input_fails_in_one_line_before_anything_is_built(args, message):
    before = labutil.resources()
    proc = cli(*args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fabriclab: error: "), proc.stderr
    assert message in lines[0]
    assert labutil.leaked(before, labutil.resources()) == {}


def test_bad_spec_file_fails_before_anything_is_built(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nleaves: 2\nspines: 0\nhost_rate: -5\ncolour: red\n")
    before = labutil.resources()
    proc = cli("run", str(bad))
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert "\n" not in line
    assert "unknown key 'colour'" in line and "spines must be >= 1" in line and "host_rate" in line
    assert labutil.leaked(before, labutil.resources()) == {}


def test_a_switch_that_never_reaches_the_controller_is_named_with_ovs_view(monkeypatch):
    """One bridge is pointed at a port nobody listens on: start gives up in one line that names
    the switch and what Open vSwitch says of it, and tears everything down."""
    from apps import control
    from fabriclab.lab import network

    populate = network.populate

    def miswired(net, fabric, run, *args, **kw):
        populate(net, fabric, run, *args, **kw)
        subprocess.run(["ovs-vsctl", "set-controller", "l2", "tcp:127.0.0.1:9"], check=True)
        # l2 may have reached the controller first: go on once the controller has seen it leave
        status = control.RunFiles(run.dir).status
        wait_for(lambda: "l2" not in control.read_status(status).connected, 20, "l2 to disconnect")

    monkeypatch.setattr(network, "populate", miswired)
    before = labutil.resources()
    with pytest.raises(LabError) as caught:
        Lab(load_spec("tiny")).start(timeout=4)
    line = str(caught.value)
    assert "\n" not in line
    assert "switches not connected: l2" in line, line
    assert "Open vSwitch: l2 state=BACKOFF, last_error=Connection refused" in line, line
    assert labutil.leaked(before, labutil.resources()) == {}


def test_the_controller_hears_a_switch_leave_and_reprograms_it_when_back():
    """os-ken's native hub never ends a closed connection by itself: the runner's echo requests
    are what make a lost switch show in the status (and `programmed` false) within seconds."""
    from apps import control
    from fabriclab.lab import network

    with Lab(load_spec("tiny")) as lab:
        target = subprocess.run(["ovs-vsctl", "get-controller", "l2"], capture_output=True,
                                text=True, check=True).stdout.strip()
        status = control.RunFiles(lab.run.dir).status
        subprocess.run(["ovs-vsctl", "set-controller", "l2", "tcp:127.0.0.1:9"], check=True)
        wait_for(lambda: "l2" not in control.read_status(status).connected, 10, "the controller to see l2 leave")
        assert not lab.controller.snapshot().programmed
        assert network.controller_connections(["l2"])["l2"] != "connected"
        generation = lab.controller.snapshot().generation
        subprocess.run(["ovs-vsctl", "set-controller", "l2", target], check=True)
        lab.controller.wait_programmed(timeout=20, after_generation=generation - 1)
        # OVS refreshes the status columns of its database every few seconds
        wait_for(lambda: network.controller_connections(["l2"]) == {"l2": "connected"}, 15, "OVS to agree")
        assert labutil.unreachable(lab)[1] == []


def test_unknown_host_is_a_clear_error():
    with Lab(load_spec("tiny")) as lab:
        with pytest.raises(LabError, match="no host 'h99'"):
            lab.host("h99")
        with pytest.raises(LabError, match="no host or host port 'h99'"):
            lab.paths("h1", "h99")


def test_clean_repairs_a_killed_run():
    before = labutil.resources()
    proc = subprocess.Popen([sys.executable, "-c",
                             "from fabriclab.lab.lab import Lab; from fabriclab.topologies.spec import load_spec;"
                             "import time; Lab(load_spec('tiny')).start(); time.sleep(300)"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: programmed_runs(proc.pid), 60, "the fabric to come up")
        proc.kill()                        # SIGKILL: no teardown runs
        proc.wait()
        # The hosts' shells die with their pty (and with them the namespaces); the OVS bridges,
        # veths and the controller (its own session) outlive the killed run.
        left = labutil.leaked(before, labutil.resources())
        assert left.get("bridges") and left.get("veths") and left.get("processes"), left
        out = cli("clean")
        assert out.returncode == 0, out.stderr
        assert "stopped" in out.stdout
    finally:
        if proc.poll() is None:
            proc.kill()
        cli("clean")      # whatever happened above, leave nothing for the next test
    assert labutil.leaked(before, labutil.resources()) == {}
    assert not list((RUN_ROOT / "runs").glob("*"))


def test_a_killed_lab_takes_its_pfc_agent_with_it():
    """The PFC agent's process stops when its pipe from the lab closes, before any `clean`: a
    SIGKILLed lab leaves no agent holding its maps open or its gates' sockets."""
    before = labutil.resources()
    proc = subprocess.Popen([sys.executable, "-c",
                             "from fabriclab.lab.lab import Lab; from fabriclab.topologies.spec import FabricSpec;"
                             "from fabriclab.queues.config import QueueSpec; import time;"
                             "Lab(FabricSpec(name='t-kill', leaves=2, spines=1, hosts_per_leaf=1,"
                             " queues=QueueSpec())).start(); time.sleep(300)"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    agents = lambda: [pid for pid, cmd in labutil.lab_processes() if "fabriclab.queues.agentproc" in cmd]  # noqa: E731
    try:
        wait_for(lambda: programmed_runs(proc.pid), 60, "the fabric to come up")
        (agent,) = wait_for(agents, 10, "the PFC agent")
        proc.kill()
        proc.wait()
        wait_for(lambda: not agents(), 10, "the PFC agent to end with its input")
    finally:
        if proc.poll() is None:
            proc.kill()
        cli("clean")
    assert labutil.leaked(before, labutil.resources()) == {}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupting_a_run_tears_it_down(sig):
    before = labutil.resources()
    proc = subprocess.Popen(FABRICLAB + ["run", "tiny", "--duration", "30"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=labutil.sigint_as_at_a_terminal)
    try:
        run_dir = wait_for(lambda: programmed_runs(proc.pid), 60, "the fabric to come up")[0]
        wait_for(lambda: (run_dir / "traffic").exists(), 30, "traffic to start")
        time.sleep(1.0)
        sent = time.monotonic()
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (proc.returncode, time.monotonic() - sent, err)
    assert "Traceback" not in err, err
    # What the lab killed on its way out may take a moment to be gone: a CI run (2026-11-28) saw
    # one lab process and its namespace still there as the command returned. Nothing may be left
    # once that moment has passed.
    deadline = time.monotonic() + 5
    while labutil.leaked(before, labutil.resources()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert labutil.leaked(before, labutil.resources()) == {}
    assert not run_dir.exists()


def test_stopping_a_lab_ends_what_its_jobs_left_running_in_the_hosts():
    """An agent a job had no time to kill (a Ctrl-C while its thread slept: CI once saw two
    hosts' namespaces kept alive this way) is ended by the lab's own stop."""
    before = labutil.resources()
    lab = Lab(load_spec("tiny")).start()
    try:
        agent = lab.net.get("h1").popen([sys.executable, "-c", "import time; time.sleep(120)",
                                         "fabriclab.traffic.agent"])
        lab.run.add_process(agent.pid, "traffic-agent", "fabriclab.traffic.agent")
    finally:
        lab.stop()
    assert agent.wait(5) is not None
    assert labutil.leaked(before, labutil.resources()) == {}


def test_clean_leaves_a_live_run_alone():
    with Lab(load_spec("tiny")) as lab:
        out = cli("clean")
        assert out.returncode == 0
        assert f"run {lab.run.id} is live" in out.stdout
        assert lab.ping(lab.fabric.hosts["h1"].ports[0], lab.fabric.hosts["h2"].ports[0])


def test_clean_touches_nothing_the_lab_did_not_create():
    """A killed run's record names `s1` and `s1-eth1`; since then a user made their own bridge,
    veth pair and namespace with the lab's names. `clean` drops the record and leaves them: a
    bridge without the run's OVS tag and an interface outside the run's link group are not ours."""
    from fabriclab.lab.runstate import LINK_GROUP_BASE, RunState

    def sh(*args):
        return subprocess.run(args, capture_output=True, text=True)

    # a process of the user's whose command line holds the recorded `mininet:h1` as a prefix
    user_proc = subprocess.Popen(["bash", "-c", "exec -a mininet:h12 sleep 60"])
    state = RunState.create("tiny")
    state.data.update(pid=2 ** 22 + 4321, cmdline="gone", bridges=["s1"], interfaces=["s1-eth1"],
                      link_group=LINK_GROUP_BASE + 7,
                      processes=[{"pid": user_proc.pid, "role": "host-shell", "match": "mininet:h1"}])
    state.save()
    sh("ovs-vsctl", "add-br", "s1", "--", "set", "bridge", "s1", "datapath_type=netdev")
    sh("ip", "link", "add", "s1-eth1", "type", "veth", "peer", "name", "s1-eth1p")
    sh("ip", "netns", "add", "h1")
    try:
        out = cli("clean")
        assert out.returncode == 0, out.stderr
        assert f"run {state.id}: stopped 0 processes, deleted 0 bridges and 0 interfaces" in out.stdout
        assert not state.dir.exists()
        assert sh("ovs-vsctl", "br-exists", "s1").returncode == 0
        assert os.path.exists("/sys/class/net/s1-eth1")
        assert "h1" in sh("ip", "netns", "list").stdout.split()
        assert user_proc.poll() is None
    finally:
        user_proc.kill()
        user_proc.wait()
        sh("ovs-vsctl", "--if-exists", "del-br", "s1")
        sh("ip", "link", "del", "s1-eth1")
        sh("ip", "netns", "del", "h1")
        state.remove()


def test_sigkill_at_random_points_then_clean_leaves_nothing_and_spares_the_users(figure):
    """20 runs killed with SIGKILL at random moments of bring-up, traffic and teardown. After
    each, a user makes a bridge, a veth pair and a namespace with the lab's names wherever the
    killed run left the name free; `clean` then removes every trace of the run and none of them."""
    import random

    def sh(*args):
        return subprocess.run(args, capture_output=True, text=True)

    rng = random.Random(20)
    before = labutil.resources()
    command = FABRICLAB + ["run", "tiny", "--duration", "1"]
    # One run to the end first: kills spread over all of its time (Python and bring-up, 1 s of
    # traffic, teardown, results; 4.2-4.5 s on 2026-11-29, 5.9 s on a slower machine), a few
    # after it ended
    t0 = time.monotonic()
    assert subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    whole = time.monotonic() - t0
    spared = 0
    for i in range(20):
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.3, whole + 0.3))
        proc.kill()
        proc.wait()
        users = []
        if sh("ovs-vsctl", "br-exists", "s1").returncode == 2:
            sh("ovs-vsctl", "add-br", "s1", "--", "set", "bridge", "s1", "datapath_type=netdev")
            users.append("bridge")
        if not os.path.exists("/sys/class/net/s1-eth1"):
            sh("ip", "link", "add", "s1-eth1", "type", "veth", "peer", "name", "s1-eth1p")
            users.append("veth")
        sh("ip", "netns", "add", "h1")
        try:
            out = cli("clean")
            assert out.returncode == 0 and "Traceback" not in out.stderr, (i, out.stderr)
            left = labutil.leaked(before, labutil.resources())
            mine = {"bridges": ["s1"] if "bridge" in users else [],
                    "veths": sorted(["s1-eth1", "s1-eth1p"]) if "veth" in users else []}
            assert {k: v for k, v in left.items() if v != mine.get(k)} == {}, (i, left)
            assert not list((RUN_ROOT / "runs").glob("*")), i
            assert ("bridge" not in users) or sh("ovs-vsctl", "br-exists", "s1").returncode == 0, i
            assert ("veth" not in users) or os.path.exists("/sys/class/net/s1-eth1"), i
            assert "h1" in sh("ip", "netns", "list").stdout.split(), i
            spared += len(users)
        finally:
            sh("ovs-vsctl", "--if-exists", "del-br", "s1")
            if "veth" in users:
                sh("ip", "link", "del", "s1-eth1")
            sh("ip", "netns", "del", "h1")
    # the user's objects met a killed run's record often enough
    assert figure("user bridges and veths clean spared, 20 kills", spared) >= 5
