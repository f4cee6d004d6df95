"""The queue model's leak repair on a real fabric: lossless packets Open vSwitch drops (here: to an
address the fabric has no route for) were counted into their leaf and never leave it. Past XOFF
they pause the sender for good; the repair takes the bytes off, and the sender's gate opens with
the watchdog off, so nothing else could have opened it."""

import time

import pytest

from fabriclab.lab.lab import Lab
from fabriclab.queues.config import PfcSettings, QueueSpec
from fabriclab.topologies.spec import FabricSpec

from .labutil import port_towards, queue_delta, queue_snapshot

pytestmark = pytest.mark.lab

SPEC = FabricSpec(name="t-leak", leaves=2, spines=1, hosts_per_leaf=1, host_rate_mbps=20,
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
