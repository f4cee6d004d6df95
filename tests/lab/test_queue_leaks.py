"""The queue model's leak repair on a real fabric: lossless packets Open vSwitch drops (here: to an
address the fabric has no route for) were counted into their leaf and never leave it. Past XOFF
they pause the sender for good; the repair takes the bytes off, and the sender's gate opens with
the watchdog off, so nothing else could have opened it. And what must not need a repair: one flow
whose packets enter a switch by two ports at once (adaptive routing, a PLB's planes) is released
packet by packet against the port each came by."""

import subprocess
import time

import pytest

from fabriclab.lab.lab import Lab
from fabriclab.queues.config import PfcSettings, QueueSpec
from fabriclab.topologies.spec import FabricSpec

from .labutil import port_towards, queue_delta, queue_snapshot

pytestmark = pytest.mark.lab

SPEC = FabricSpec(name="t-leak", leaves=2, spines=2, hosts_per_leaf=1, host_rate_mbps=20,
                  fabric_rate_mbps=20, real_host_rate_mbps=400_000,
                  queues=QueueSpec(pfc=PfcSettings(watchdog_ms=0)))
NOWHERE = "10.1.250.1"           # in the hosts' subnet, owned by none: no switch has a flow for it
FRAME = 1400 + 8 + 20 + 14       # the ping's frame: payload, ICMP, IPv4, Ethernet


@pytest.fixture(scope="module")
def lab():
    with Lab(SPEC) as running:
        assert NOWHERE not in running.fabric.ip_owner
        intf = running.fabric.hosts["h1"].ports[0].intf
        # no ARP for it: the frames go straight to the leaf
        running.host("h1").cmd(f"ip neigh replace {NOWHERE} lladdr 02:00:00:fa:11:01 dev {intf} nud permanent")
        yield running


def lossless(lab, port):
    return next(r for r in lab.queues.counters() if r["port"] == port and r["class"] == "lossless")


def wait_for(predicate, within_s):
    deadline = time.monotonic() + within_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_leak_below_xoff_is_taken_off_the_account(lab):
    leaf = port_towards(lab, "h1")
    since = time.monotonic_ns()
    before = queue_snapshot(lab)
    lab.host("h1").cmd(f"ping -n -q -c 5 -i 0.01 -s 1400 -W 0.2 -Q 0x68 {NOWHERE}")
    assert wait_for(lambda: lossless(lab, leaf)["held_repaired"] - before[(leaf, "lossless")]["held_repaired"]
                    == 5 * FRAME, 2.0), lossless(lab, leaf)
    assert lossless(lab, leaf)["held"] == 0
    after = queue_snapshot(lab)
    assert queue_delta(after, before, "rx_pkts")[(leaf, "lossless")] == 5    # counted in, never out
    assert queue_delta(after, before, "pause_tx").get((leaf, "lossless"), 0) == 0
    fixes = [r for r in lab.queues.leak_repairs(since) if r["port"] == leaf]
    assert sum(r["bytes"] for r in fixes) == 5 * FRAME and not any(r["resumed"] for r in fixes)


def test_a_leak_past_xoff_pauses_the_sender_and_the_repair_resumes_it(lab):
    leaf = port_towards(lab, "h1")
    h1_nic = lab.fabric.hosts["h1"].ports[0].intf
    xoff = lab.queues.describe()["ports_by_role"]["leaf"]["pfc"]["xoff"]
    count = xoff // FRAME + 4
    since = time.monotonic_ns()
    before = queue_snapshot(lab)
    lab.host("h1").cmd(f"ping -n -q -c {count} -i 0.005 -s 1400 -W 0.2 -Q 0x68 {NOWHERE}")
    # Without the repair the leaf would hold h1 paused for good (the watchdog is off).
    assert wait_for(lambda: lossless(lab, leaf)["pause_tx"] > before[(leaf, "lossless")]["pause_tx"], 2.0)
    assert wait_for(lambda: not lossless(lab, h1_nic)["gate_closed"], 2.0), lossless(lab, h1_nic)
    assert wait_for(lambda: lossless(lab, leaf)["held"] == 0, 2.0), lossless(lab, leaf)
    fixes = [r for r in lab.queues.leak_repairs(since) if r["port"] == leaf]
    assert any(r["resumed"] for r in fixes), fixes
    assert sum(r["bytes"] for r in fixes) == count * FRAME
    # The lossless class works again: h1 reaches h2, and the leaf's next arrival clears its
    # paused flag, so it can pause h1 again when it must.
    h2 = lab.fabric.hosts["h2"].ports[0].ip
    assert " 3 received" in lab.host("h1").cmd(f"ping -n -q -c 3 -i 0.1 -W 1 -Q 0x68 {h2}")
    assert not lossless(lab, leaf)["paused"]
    assert lab.queues.alarms() == [] and lab.queues.errors() == []
    report = lab.queues.report(list(before.values()), since_ns=since)
    assert report["totals"]["held_repaired"] == count * FRAME
    assert report["leak_repairs"] == lab.queues.leak_repairs(since)


def test_one_flow_over_two_spines_is_released_against_each_packets_own_port(lab):
    """h1's pings to h2 are one flow to the model (ICMP: no ports). The ECT(1) ones go by spine s2
    and the ECT(0) ones by s1, so l2 takes the flow in by both uplinks at once while its port to
    h2 queues (two senders' worth into one link). Released against the port the flow came by
    last, each uplink's account would drift (one up, the other as far below zero) until the leak
    repair put them back; released per packet, none is needed."""
    ports = lab.queues.ports
    uplink = {ports[p.peer].node: p.name for p in ports if p.node == "l1" and ports[p.peer].node in ("s1", "s2")}
    l2_uplinks = [p.name for p in ports if p.node == "l2" and ports[p.peer].node in ("s1", "s2")]
    h2 = lab.fabric.hosts["h2"].ports[0].ip
    for ecn, spine in ((1, "s2"), (2, "s1")):
        subprocess.run(["ovs-ofctl", "--names", "-O", "OpenFlow13", "add-flow", "l1",
                        f"priority=65000,ip,nw_dst={h2},nw_ecn={ecn},actions=output:{uplink[spine]}"], check=True)
    try:
        since = time.monotonic_ns()
        before = queue_snapshot(lab)
        # two senders of ~11 Mbit/s each into h2's 20 Mbit/s link (lossless class, DSCP 26)
        lab.host("h1").cmd(f"ping -n -q -c 300 -i 0.001 -s 1400 -W 1 -Q 0x69 {h2} > /dev/null 2>&1 & "
                           f"ping -n -q -c 300 -i 0.001 -s 1400 -W 1 -Q 0x6a {h2} > /dev/null 2>&1; wait")
        time.sleep(0.5)                        # drained, and quiet long enough for a repair
        after = queue_snapshot(lab)
    finally:
        for ecn in (1, 2):
            subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "del-flows", "--strict", "l1",
                            f"priority=65000,ip,nw_dst={h2},nw_ecn={ecn}"], check=True)
    came_in = queue_delta(after, before, "rx_pkts")
    assert all(came_in.get((port, "lossless"), 0) >= 100 for port in l2_uplinks), came_in   # both carried it
    for port in l2_uplinks:
        assert after[(port, "lossless")]["held"] == 0, after[(port, "lossless")]
    assert [r for r in lab.queues.leak_repairs(since) if r["port"] in l2_uplinks] == []
