"""Adaptive routing, weights and data-path failover on real fabrics (2 leaves x 2 spines, two
parallel links per pair, so a link is one of four uplinks and one of a spine's two links to a leaf):

- AR spreads a ring AllReduce's flows over every uplink packet by packet (max/mean <= 1.1), reading
  the queue model's occupancies.
- A spine that keeps one of its two links to l2 (a permanent remote failure): l1's group toward l2
  becomes a dp_hash group weighted 1:1:2:2 in Open vSwitch, weighted ECMP sends about a third of
  the flows through that spine, and AR a third of one flow's packets; unweighted AR half.
- A local link failure: AR's stage takes the dead member out at the first packet that finds it
  without carrier, before the controller hears of it; with the carrier check off the stage keeps
  sending there until the controller rewrites its members, and packets are lost meanwhile.
"""

import dataclasses
import json
import pathlib
import re
import subprocess
import time

import pytest

from fabriclab.apps import select_stage
from fabriclab.lab.lab import Lab
from fabriclab.measure import telemetry
from fabriclab.measure.telemetry import max_mean_ratio
from fabriclab.topologies.spec import load_spec
from fabriclab.traffic.collective import CollectiveSpec, run_collective
from fabriclab.workflows.experiments.routing import ring_order

pytestmark = pytest.mark.lab

SPEC = pathlib.Path(__file__).with_name("ar_two_by_two.yaml")
STREAM_GAP_NS = 500_000                 # 2000 packets/s of 200 bytes: 3.2 Mbit/s, queues stay empty

SENDER = r"""
import socket, struct, time
socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in {sports}]
for s, port in zip(socks, {sports}):
    s.bind(("{src}", port))
t = time.monotonic_ns()
for i in range({count}):
    socks[i % len(socks)].sendto(struct.pack("!I", i) + b"x" * 200, ("{dst}", 5000))
    t += {gap}
    while time.monotonic_ns() < t:
        pass
"""
RECEIVER = r"""
import json, socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("{dst}", 5000))
s.settimeout(1.0)
got = []
try:
    while True:
        got.append(struct.unpack("!I", s.recv(2048)[:4])[0])
except socket.timeout:
    pass
json.dump(got, sys.stdout)
"""


class Stream:
    """UDP packets from h1 to h3, `count` of them every STREAM_GAP_NS, round robin over source
    ports; `lost()` once it has ended."""

    def __init__(self, lab, count, sports=(40000,)):
        self.count = count
        src, self.dst = (lab.fabric.hosts[h].ports[0].ip for h in ("h1", "h3"))
        self.rx = lab.host("h3").popen(["python3", "-c", RECEIVER.format(dst=self.dst)],
                                       stdout=subprocess.PIPE, text=True)
        time.sleep(0.3)
        self.tx = lab.host("h1").popen(["python3", "-c", SENDER.format(
            src=src, dst=self.dst, sports=list(sports), count=count, gap=STREAM_GAP_NS)])

    def lost(self):
        self.tx.wait(60)
        got = json.loads(self.rx.communicate(timeout=60)[0])
        return self.count - len(set(got))


def uplinks(lab, leaf="l1"):
    return {link.a_intf: link for link in lab.fabric.fabric_links if link.a == leaf}


def tx_packets(intfs, run):
    before = telemetry.read_counters(intfs)
    result = run()
    after = telemetry.read_counters(intfs)
    return {i: after[i]["tx_packets"] - before[i]["tx_packets"] for i in intfs}, result


def via_s1(counts, lab):
    ports = uplinks(lab)
    return sum(n for i, n in counts.items() if ports[i].b == "s1") / sum(counts.values())


def ovs_output(switch, src, dst, sport):
    """The port Open vSwitch's own select group sends a UDP flow to (ofproto/trace)."""
    out = subprocess.run(["ovs-appctl", "ofproto/trace", switch,
                          f"in_port=1,udp,nw_src={src},nw_dst={dst},udp_src={sport},udp_dst=5000"],
                         capture_output=True, text=True, check=True).stdout
    return int(re.findall(r"output:(\d+)", out)[-1])


# -- on the lossless fabric ------------------------------------------------------------------------
@pytest.fixture(scope="class")
def lossless():
    with Lab(load_spec(str(SPEC)), routing="ar") as lab:
        yield lab


class TestLossless:
    def test_ar_spreads_a_rings_flows_over_every_uplink(self, lossless, record_property, figure):
        lab = lossless
        if lab.routing != "ar":
            lab.set_routing("ar")
        ring = CollectiveSpec(collective="allreduce", sizes=(512 * 1024,), hosts=ring_order(lab.fabric),
                              iterations=2, warmup=0)
        intfs = [*uplinks(lab, "l1"), *uplinks(lab, "l2")]
        before = telemetry.read_counters(intfs)
        run = run_collective(lab, ring)
        after = telemetry.read_counters(intfs)
        sent = {i: after[i]["tx_bytes"] - before[i]["tx_bytes"] for i in intfs}
        stats = lab.stage_stats()
        counters = run.sizes[0]["counters"]
        for leaf in ("l1", "l2"):
            ratio = max_mean_ratio(sent[i] for i in uplinks(lab, leaf))
            record_property(f"{leaf}_uplink_max_mean", ratio)
            # two flows per leaf over four uplinks
            assert figure(f"{leaf} uplink bytes max/mean", ratio) <= 1.1, (leaf, sent)
        record_property("out_of_sequence", counters.get("out_of_sequence", 0))
        assert stats["depth"] == "queue model" and stats["ar_queue_model"] > 0 and stats["redirected"] > 0
        assert counters.get("local_ack_timeout_err", 0) == 0

    def test_a_remote_failure_weighs_the_degraded_spine_by_its_capacity(self, lossless, record_property, figure):
        lab = lossless
        lab.set_routing("ecmp:weights=on")
        lab.link_down("l2", "s1", member=1)           # s1 keeps one of its two links to l2
        try:
            groups = subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "dump-groups", "l1"],
                                    capture_output=True, text=True, check=True).stdout
            (toward_l2,) = [g for g in groups.splitlines() if "group_id=65538" in g]
            assert "selection_method=dp_hash" in toward_l2
            assert re.findall(r"weight:(\d+)", toward_l2) == ["2", "2"]      # s2's two; s1's are 1
            # weighted ECMP: flows by OVS's dp_hash table, 6 of 16 hash values through s1
            flows = list(range(41000, 41600))
            counts, lost = tx_packets(list(uplinks(lab)), lambda: Stream(lab, len(flows), flows).lost())
            assert lost == 0
            record_property("weighted_ecmp_flows_via_s1", via_s1(counts, lab))
            assert 0.28 <= figure("share of flows via s1, weighted ECMP", via_s1(counts, lab)) <= 0.46, counts
            # AR: one flow's packets, on idle queues split by weight (1/3 through s1), or evenly
            for routing, low, high in (("ar", 0.26, 0.41), ("ar:weights=off", 0.43, 0.57)):
                lab.set_routing(routing)
                counts, lost = tx_packets(list(uplinks(lab)), lambda: Stream(lab, 2000).lost())
                assert lost == 0
                record_property(f"{routing}_packets_via_s1", via_s1(counts, lab))
                share = figure(f"share of packets via s1, {routing}", via_s1(counts, lab))
                assert low <= share <= high, (routing, counts)
        finally:
            lab.link_up("l2", "s1", member=1)


# -- local failure: data path against controller ----------------------------------------------------
@pytest.fixture(scope="class")
def virtual():
    """The same fabric without the queue model: AR's depths are the stage's virtual queues, so
    nothing but the carrier check or the controller steers it off a dead port."""
    spec = dataclasses.replace(load_spec(str(SPEC)), queues=None)
    with Lab(spec, routing="ar") as lab:
        yield lab


def fail_during_stream(lab, routing):
    """A stream h1 -> h3 from a source port Open vSwitch itself sends elsewhere than l1-s1 (OVS
    drops what it sends to a port it has not yet noticed down, before any stage sees it); l1-s1
    fails a third of the way in. Returns (lost packets, controller seconds, the stage's record of
    the dead port, the stage's counters)."""
    lab.set_routing(routing)
    (dead,) = lab.fabric.find_link("l1", "s1", 0)
    src, dst = (lab.fabric.hosts[h].ports[0].ip for h in ("h1", "h3"))
    sport = next(p for p in range(40000, 40100) if ovs_output("l1", src, dst, p) != dead.a_port)
    stream = Stream(lab, 2400, (sport,))
    time.sleep(0.4)
    t0 = time.monotonic()
    try:
        lab.link_down("l1", "s1", member=0)
        controller_s = time.monotonic() - t0
        lost = stream.lost()
        record = select_stage.read_ports(lab.run.id)[dead.a_intf]
        stats = lab.stage_stats()
    finally:
        lab.link_up("l1", "s1", member=0)
    return lost, controller_s, record, stats


class TestLocalFailure:
    def test_the_data_path_leaves_a_dead_member_before_the_controller(self, virtual, record_property, figure):
        lab = virtual
        lost, controller_s, record, stats = fail_during_stream(lab, "ar")
        if stats["carrier"] != "data path":
            pytest.skip("this kernel does not let a tc program read its device: the controller path only")
        record_property("data_path_lost", lost)
        record_property("controller_programmed_ms", round(controller_s * 1e3, 1))
        assert record["down_events"] == 1 and stats["rescued"] >= 1
        assert record["last_chosen_ns"] <= record["down_seen_ns"]      # never chosen once found dead
        # At most what the dead port's queue held when it went: 0-1 on an idle machine, 3 once
        # in a full suite, when Open vSwitch's thread, descheduled, sent a burst.
        assert figure("packets lost, data path", lost) <= 4
        # the controller path: the stage sends to the dead port until its members are rewritten
        lost_off, _s, record_off, stats_off = fail_during_stream(lab, "ar:carrier=off")
        # how long the stage went on choosing the port after a packet found it dead (0: never,
        # the controller's rewrite came first); measured 0.07-13 ms, 4-8 packets lost, in five of
        # six runs, and once the rewrite first (0 ms, 1 packet lost)
        kept_ms = max(0.0, (record_off["chosen_down_ns"] - record_off["down_seen_ns"]) / 1e6)
        record_property("controller_path_lost", lost_off)
        record_property("controller_path_kept_sending_ms", round(kept_ms, 2))
        assert stats_off["carrier"] == "controller" and stats_off["rescued"] == 0
        # without the data path, what went there died
        assert figure("packets lost, controller path", lost_off) >= 1, (kept_ms, lost_off, lost)
