"""The queue model on a real fabric: counters that match the packets sent, ECN marks above the
threshold and not below, PFC pauses that keep an incast lossless, tail drops in the lossy class,
and the PFC watchdog on a pause storm."""

import os
import re
import signal
import time

import pytest

from fabriclab.errors import LabError
from fabriclab.lab.lab import Lab
from fabriclab.queues import agentproc, datapath
from fabriclab.system import doctor
from fabriclab.queues.config import PfcSettings, QueueSpec
from fabriclab.queues.model import MECHANISM
from fabriclab.topologies.spec import FabricSpec
from fabriclab.traffic.collective import CollectiveSpec, run_collective

from .labutil import lab_processes, port_towards, queue_delta, queue_snapshot

pytestmark = pytest.mark.lab

# Two hosts per leaf, two spines, 20 Mbit/s everywhere: a 3:1 incast into h2 congests l1's port
# towards h2; the senders are h1 (same leaf) and h3, h4 (across the spines).
SPEC = FabricSpec(name="t-queue", leaves=2, spines=2, hosts_per_leaf=2, host_rate_mbps=20,
                  fabric_rate_mbps=20, real_host_rate_mbps=400_000,
                  queues=QueueSpec(pfc=PfcSettings(watchdog_ms=300, restore_ms=500)))
INCAST = ("h2", "h1", "h3", "h4")       # rank 0 (the Gather root) first


def test_stopping_the_lab_unpins_the_programs():
    """Runs before the module's fabric exists (both use the names l1, s1...)."""
    spec = FabricSpec(name="t-queue2", leaves=2, spines=1, hosts_per_leaf=1, queues=QueueSpec())
    with Lab(spec) as lab:
        pins = datapath.pin_dir(lab.run.id)
        assert pins.exists()
        # the default watchdog: a switch's 200 ms, here unscaled (the spec states no real rate)
        assert lab.queues.describe()["watchdog"] == {"lab_ms": 200.0, "real_ms": 200.0,
                                                     "from": "200 ms real x time scale 1"}
    assert not pins.exists()
    assert not os.path.exists(pins)


def test_a_pfc_agent_that_dies_is_reported_and_the_lab_still_stops():
    """Runs before the module's fabric exists too. The agent is a process of its own: its death
    must show as an error of the run, never as a hang or a silently lossy fabric."""
    spec = FabricSpec(name="t-queue3", leaves=2, spines=1, hosts_per_leaf=1, queues=QueueSpec())
    with Lab(spec) as lab:
        pid = lab.queues.agent.proc.pid
        assert lab.queues.errors() == []
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while lab.queues.agent.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        errors = lab.queues.errors()
        assert len(errors) == 1 and "PFC agent" in errors[0] and "-9" in errors[0], errors
        with pytest.raises(LabError, match="PFC agent"):
            lab.queues.storm("h1", 0.1)
    assert not any(agentproc.MODULE in cmd for _pid, cmd in lab_processes())


def test_the_pfc_agent_is_a_real_time_process_recorded_with_the_run():
    spec = FabricSpec(name="t-queue3", leaves=2, spines=1, hosts_per_leaf=1, queues=QueueSpec())
    with Lab(spec) as lab:
        pid = lab.queues.agent.proc.pid
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        assert agentproc.MODULE.encode() in cmdline and lab.run.id.encode() in cmdline
        assert {"pid": pid, "role": "pfc-agent", "match": agentproc.MODULE} in lab.run.data["processes"]
        threads = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        policies = {os.sched_getscheduler(t) for t in threads}
        # doctor's probe says whether this machine lets a process take SCHED_FIFO; where it does,
        # every thread of the agent runs it (the ring's poller and the pipe's reader)
        if doctor.probe().realtime:
            assert policies == {os.SCHED_FIFO} and lab.queues.agent.scheduling == "SCHED_FIFO 10", policies
        else:
            assert policies == {os.SCHED_OTHER} and "SCHED_FIFO refused" in lab.queues.agent.scheduling
    assert not os.path.exists(f"/proc/{pid}/cmdline") or not open(f"/proc/{pid}/cmdline", "rb").read()


@pytest.fixture(scope="module")
def lab():
    with Lab(SPEC) as running:
        yield running





def settled(lab, within_s=2.0, classes=("lossless", "control", "lossy")):
    """Every queue and every ingress account is back to zero (nothing leaked); the last packets
    of a run may still be on their way for a moment."""
    deadline = time.monotonic() + within_s
    while True:
        left = [(r["port"], r["class"], r["occ"], r["held"]) for r in lab.queues.counters()
                if (r["occ"] or r["held"]) and r["class"] in classes]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def test_model_runs_and_results_say_which_mechanism(lab):
    info = lab.queues.describe()
    assert info["mechanism"] == MECHANISM
    assert info["watchdog"] == {"lab_ms": 300, "real_ms": 300 / SPEC.time_scale, "from": "spec"}
    assert info["ports_by_role"]["leaf"]["pfc"]["xoff"] > 0
    if lab.datapath == "user":            # the kernel datapath has no shared packet socket to enlarge
        assert info["ovs_send_buffer_bytes"] >= 64 * 2**20
    else:
        assert info["ovs_send_buffer_bytes"] is None
    assert (lab.queues.datapath.pins / "fq_egress").exists()
    out = lab.host("h1").cmd("tc filter show dev h1-n0 egress")
    assert "fq_egress" in out and "direct-action" in out


def test_counters_match_the_packets_sent(lab):
    before = queue_snapshot(lab)
    h3 = lab.fabric.hosts["h3"].ports[0].ip
    out = lab.host("h1").cmd(f"ping -n -q -c 20 -i 0.05 -s 1000 -Q 0x68 {h3}")   # TOS 0x68: DSCP 26
    assert " 20 received" in out
    after = queue_snapshot(lab)
    tx, rx = queue_delta(after, before, "tx_pkts"), queue_delta(after, before, "rx_pkts")
    assert tx[("h1-n0", "lossless")] == 20 and rx[("h1-n0", "lossless")] == 20      # requests out, replies in
    assert tx[("h3-n0", "lossless")] == 20 and rx[("h3-n0", "lossless")] == 20
    # Every packet a port sent arrived at the other end of its cable, hop by hop.
    for (port, cls), n in tx.items():
        peer = after[(port, cls)]["peer"]
        assert rx.get((peer, cls)) == n, (port, peer, cls)
    # 1000 B of ICMP payload + 8 + 20 + 14 = 1042 B per frame
    assert queue_delta(after, before, "tx_bytes")[("h1-n0", "lossless")] == 20 * 1042
    assert settled(lab) == []


def test_ecn_marks_above_the_threshold_and_not_below(lab, figure):
    lab.queues.set_ecn("leaf", mode="step", kmin=20 * 1024)
    lab.queues.set_ecn("spine", mode="step", kmin=20 * 1024)
    # One flow at line rate: its queues never reach 20 KiB, nothing is marked.
    before = queue_snapshot(lab)
    run = run_collective(lab, CollectiveSpec("bisection", sizes=(256 * 1024,), hosts=("h1", "h3"),
                                             iterations=1, warmup=0))
    after = queue_snapshot(lab)
    assert run.sizes[0]["counters"].get("ce_marked", 0) == 0
    assert queue_delta(after, before, "marks") == {}
    # 3:1 incast: l1's port towards h2 queues past 20 KiB and marks; receivers count the CEs.
    before = after
    run = run_collective(lab, CollectiveSpec("gather", sizes=(512 * 1024,), hosts=INCAST,
                                             iterations=1, warmup=0))
    after = queue_snapshot(lab)
    marks = queue_delta(after, before, "marks")
    hot = port_towards(lab, "h2")
    assert marks.get((hot, "lossless"), 0) > 0, marks
    assert figure("3:1 incast hot port queue high-water mark, bytes", after[(hot, "lossless")]["occ_hwm"]) > 20 * 1024
    assert run.sizes[0]["counters"]["ce_marked"] > 0
    # Host NICs never mark; only switch ports do.
    assert all(after[key]["role"] != "host" for key in marks)
    lab.queues.set_ecn("leaf", reset=True)
    lab.queues.set_ecn("spine", reset=True)
    assert lab.queues.datapath.qcfg.lookup(lab.queues.by_name["s1-eth1"].idx * 3).kmin == SPEC.buffers.spine // 5


def test_lossless_incast_pauses_upstream_and_loses_nothing(lab):
    before = queue_snapshot(lab)
    run = run_collective(lab, CollectiveSpec("gather", sizes=(1 << 20,), hosts=INCAST, iterations=2,
                                             warmup=0, verify=True))
    after = queue_snapshot(lab)
    row = run.sizes[0]
    assert row["verify"]["ok"] and row["valid"]
    counters = row["counters"]
    assert counters.get("retransmitted_packets", 0) == 0 and counters.get("local_ack_timeout_err", 0) == 0
    pause_tx, pause_rx = queue_delta(after, before, "pause_tx"), queue_delta(after, before, "pause_rx")
    assert pause_tx and pause_rx
    # Each XOFF an ingress port sent was received by the port at the other end of its cable.
    for (port, cls), n in pause_tx.items():
        assert cls == "lossless" and after[(port, cls)]["role"] in ("leaf", "spine")
        assert pause_rx[(after[(port, cls)]["peer"], cls)] == n
    # h1 shares l1 with h2: its NIC is paused directly.
    assert pause_rx.get(("h1-n0", "lossless"), 0) > 0
    # The run's result carries the same counters (what `collective` writes to results.json).
    assert run.queues["totals"]["pause_tx"] == sum(pause_tx.values())
    assert run.queues["totals"]["lossless_drops"] == 0
    reaction = run.queues["pfc_reaction"]
    assert reaction["pauses"] > 0 and reaction["scheduling"] == lab.queues.agent.scheduling, reaction
    assert queue_delta(after, before, "gate_closes").get(("h1-n0", "lossless"), 0) > 0
    assert queue_delta(after, before, "lossless_drops") == {} and queue_delta(after, before, "drops") == {}
    assert queue_delta(after, before, "pause_ms").get((port_towards(lab, "h1"), "lossless"), 0) > 0
    assert settled(lab) == []
    assert lab.queues.errors() == []


def test_the_lossy_class_tail_drops_and_does_not_pause(lab):
    before = queue_snapshot(lab)
    h2 = lab.fabric.hosts["h2"].ports[0].ip
    server = lab.host("h2")
    server.cmd("for p in 5301 5302 5303; do iperf3 -s -1 -D -p $p; done")
    for host, port in (("h1", 5301), ("h3", 5302), ("h4", 5303)):
        lab.host(host).sendCmd(f"iperf3 -u -b 20M -l 8000 -t 1.5 -c {h2} -p {port} >/dev/null 2>&1; echo done")
    for host in ("h1", "h3", "h4"):
        lab.host(host).waitOutput()
    after = queue_snapshot(lab)
    hot = port_towards(lab, "h2")
    drops = queue_delta(after, before, "drops")
    assert drops.get((hot, "lossy"), 0) > 0, drops
    assert after[(hot, "lossy")]["occ_hwm"] <= SPEC.buffers.leaf
    assert queue_delta(after, before, "pause_tx") == {}
    # The lossy class's ingress accounts can be off by a packet (see docs/queues.md); only the
    # lossless class's drive pauses, and those must be exact.
    assert settled(lab, classes=("lossless",)) == []


def test_the_watchdog_fires_on_a_pause_storm_and_drops_the_stuck_queue(lab):
    hot = lab.queues.storm("h2", 2.0)          # h2's NIC streams pauses at its leaf port for 2 s
    assert hot == port_towards(lab, "h2")
    h2 = lab.fabric.hosts["h2"].ports[0].ip
    before = queue_snapshot(lab)
    lab.host("h1").cmd(f"ping -n -q -c 15 -i 0.1 -W 1 -Q 0x68 {h2}")
    after = queue_snapshot(lab)
    alarms = [a for a in lab.queues.alarms() if a["port"] == hot]
    assert alarms and alarms[0]["paused_ms"] >= 300 and alarms[0]["action"] == "drop"
    assert after[(hot, "lossless")]["watchdog_fires"] >= 1
    assert queue_delta(after, before, "wd_drops").get((hot, "lossless"), 0) > 0
    lab.queues.storm("h2", 0)
    time.sleep(SPEC.queues.pfc.restore_ms / 1000 + 0.2)     # the watchdog's restoration period ends
    out = lab.host("h1").cmd(f"ping -n -q -c 3 -i 0.2 -Q 0x68 {h2}")
    assert " 3 received" in out
    assert lab.queues.errors() == []


def test_bad_runtime_changes_are_refused(lab):
    with pytest.raises(LabError, match="no switch port matches 'h1'"):
        lab.queues.set_ecn("h1", kmin=1000)
    with pytest.raises(LabError, match="ECN mode must be one of"):
        lab.queues.set_ecn("leaf", mode="wred")
    with pytest.raises(LabError, match=re.escape("kmax (1000) must be >= kmin (2000)")):
        lab.queues.set_ecn("l1", kmin=2000, kmax=1000)
    with pytest.raises(LabError, match="no host or host port 'h9'"):
        lab.queues.storm("h9", 1)


def test_prompt_commands_show_and_change_the_model(lab, capsys):
    from fabriclab.cli.prompt import LabPrompt

    prompt = LabPrompt.__new__(LabPrompt)        # the commands only need the lab (no Mininet CLI loop)
    prompt.lab = lab
    lab.host("h1").cmd(f"ping -n -q -c 2 -i 0.1 -Q 0x68 {lab.fabric.hosts['h3'].ports[0].ip}")
    prompt.onecmd("queues h1")
    out = capsys.readouterr().out
    assert "h1-n0" in out and "lossless" in out and "XOFF sent" in out
    prompt.onecmd("ecn spine step 30K")
    assert "ECN step on 4 port(s)" in capsys.readouterr().out
    assert lab.queues.datapath.qcfg.lookup(lab.queues.by_name["s1-eth1"].idx * 3).kmin == 30 * 1024
    prompt.onecmd("ecn spine default")
    assert "ECN as the spec says on 4 port(s)" in capsys.readouterr().out
    prompt.onecmd("storm h9 1")
    assert capsys.readouterr().out.strip() == "error: no host or host port 'h9' in fabric 't-queue'"
    prompt.onecmd("queues nowhere")
    assert "error: no node or port 'nowhere'" in capsys.readouterr().out


def test_clean_unpins_what_a_killed_run_left_and_keeps_live_runs(lab):
    from fabriclab.lab.clean import clean

    stale = datapath.PIN_ROOT / "20000101-000000-dead00"
    stale.mkdir(parents=True)
    report = clean()
    assert not stale.exists()
    assert any("dead00" in line and "unpinned" in line for line in report)
    assert (lab.queues.datapath.pins / "fq_ingress").exists()
