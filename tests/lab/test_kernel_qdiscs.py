"""The kernel qdiscs the queue model and the links use where the kernel has them: RED marks ECN in
the switch ports' classes (the eBPF program still accounts and runs PFC) and netem delays every
port by its cable's delay. On a kernel without them the same tests take the fallbacks (the eBPF
program marks; the links run without delay, with one warning) and say so.

One small fabric with the queue model and link delay serves every test here."""

import json
import re
import subprocess
import time

import pytest

from fabriclab.errors import LabError
from fabriclab.results import document
from fabriclab.lab.lab import Lab
from fabriclab.queues.config import PfcSettings, QueueSpec
from fabriclab.topologies.spec import Buffers, FabricSpec, LinkDelay
from fabriclab.traffic.collective import CollectiveSpec, run_collective

from .labutil import port_towards, queue_delta, queue_snapshot
from .tier import check_mechanism, full_tier

pytestmark = [pytest.mark.lab, pytest.mark.fullkernel]

# 2 leaves, 1 spine, 2 hosts per leaf at 20 Mbit/s for 400G (x20000). A cable of 0.25 us real is
# 5 ms in the lab: h1 -> h3 crosses 4 cables each way (40 ms round trip), h1 -> h2 two (20 ms).
# The full-kernel tier runs under software emulation, where the PFC agent can take well over the
# default 5 ms to close a gate: the headroom is sized for 20 ms (and the switch buffers for it).
SPEC = FabricSpec(name="t-kqdisc", leaves=2, spines=1, hosts_per_leaf=2, host_rate_mbps=20,
                  fabric_rate_mbps=20, real_host_rate_mbps=400_000,
                  buffers=Buffers(host=64 * 1024, leaf=192 * 1024, spine=256 * 1024),
                  queues=QueueSpec(pfc=PfcSettings(watchdog_ms=0, reaction_ms=20)),
                  delay=LinkDelay(host_us=0.25, fabric_us=0.25))
INCAST = ("h2", "h1", "h3", "h4")       # the Gather's root first: 3:1 into l1's port towards h2
STEP_KMIN = 20 * 1024


@pytest.fixture(scope="module")
def lab():
    with Lab(SPEC) as running:
        yield running





def qdiscs(dev):
    """`tc -s -d -j qdisc show dev DEV` (a switch port, in the lab's namespace)."""
    out = subprocess.run(["tc", "-s", "-d", "-j", "qdisc", "show", "dev", dev], capture_output=True,
                         text=True, check=True).stdout
    return {q["handle"]: q for q in json.loads(out)}


def min_rtt_ms(lab, src, dst, count=8):
    ip = lab.fabric.hosts[dst].ports[0].ip
    out = lab.host(src).cmd(f"ping -n -q -c {count} -i 0.2 -W 2 {ip}")
    found = re.search(r"= ([\d.]+)/([\d.]+)/([\d.]+)", out)
    assert found, f"ping {src} -> {dst} failed: {out.strip()}"
    return float(found.group(1))


def test_ecn_marks_come_from_red_where_the_kernel_has_it(lab, record_property):
    check_mechanism(record_property, "ecn", lab.ecn_mechanism, "red")
    red = lab.ecn_mechanism == "red"
    assert lab.queues.describe()["ecn_mechanism"] == lab.ecn_mechanism
    assert document.header(lab, 4096)["mechanisms"]["ecn"] == lab.ecn_mechanism
    hot = port_towards(lab, "h2")
    if red:
        # RED under the pause gate (lossless) and in place of the lossy fifo, marking, never dropping.
        tree = qdiscs(hot)
        assert tree["11:"]["kind"] == "red" and tree["11:"]["parent"] == "10:1"
        assert tree["31:"]["kind"] == "red" and tree["31:"]["parent"] == "1:30"
        options = tree["11:"]["options"]
        assert options.get("ecn") is True and options.get("nodrop") is True, options
        assert options["ewma"] == 0                   # the average is the queue a packet finds
    # A live change reaches the marker: RED's thresholds on a full kernel, the program's elsewhere.
    lab.queues.set_ecn("leaf", mode="step", kmin=STEP_KMIN)
    lab.queues.set_ecn("spine", mode="step", kmin=STEP_KMIN)
    if red:
        options = qdiscs(hot)["11:"]["options"]
        assert (options["min"], options["max"]) == (STEP_KMIN, STEP_KMIN)
    try:
        before = queue_snapshot(lab)
        # The lab's own RoCE agents (they send ECT(0) on every data packet); software emulation can
        # run an iteration far slower than its ideal time: be patient.
        run = run_collective(lab, CollectiveSpec("gather", sizes=(256 * 1024,), hosts=INCAST,
                                                 iterations=1, warmup=0, timeout_factor=200,
                                                 backend="udp"))
        after = queue_snapshot(lab)
    except Exception:
        stuck = [(r["port"], r["class"], r["occ"], r["held"], r.get("gate_closed"))
                 for r in lab.queues.counters() if r["occ"] or r["held"] or r.get("gate_closed")]
        print(f"queues when the run failed (port, class, occ, held, gate closed): {stuck}")
        raise
    finally:
        lab.queues.set_ecn("leaf", reset=True)
        lab.queues.set_ecn("spine", reset=True)
    marks = queue_delta(after, before, "marks")
    totals = run.queues["totals"]
    print(f"ecn={lab.ecn_mechanism} marks at {hot}: {marks.get((hot, 'lossless'), 0)}, "
          f"red_marked: {queue_delta(after, before, 'red_marked').get((hot, 'lossless'))}, totals: {totals}, "
          f"ce_marked at receivers: {run.sizes[0]['counters'].get('ce_marked', 0)}, "
          f"pfc reaction: {run.queues['pfc_reaction']}")
    # The 3:1 marks where the senders overlap: at h2's port when h1's flow meets the others', at
    # l2's uplink when only h3's and h4's do (under emulation the agents can start 100 ms apart,
    # a whole flow's time), so the test asks for marks on the incast's path, not at one port.
    path = {hot} | {link.a_intf if link.a == src else link.b_intf
                    for src, dst in (("l2", "s1"), ("s1", "l1")) for link in lab.fabric.find_link(src, dst)}
    marked = {port for (port, cls), n in marks.items() if cls == "lossless" and n > 0}
    assert marked and marked <= path, (marks, path)
    assert run.sizes[0]["counters"].get("ce_marked", 0) > 0
    assert all(after[key]["role"] != "host" for key in marks)
    assert run.queues["ecn_mechanism"] == lab.ecn_mechanism
    if red:
        # RED's own counter saw them too (it also counts packets that came in marked), it dropped
        # nothing, and the gates' netlink changes left every RED in place.
        red_marked = queue_delta(after, before, "red_marked")
        assert all(0 < marks[(port, "lossless")] <= red_marked[(port, "lossless")] for port in marked), \
            (marks, red_marked)
        assert totals["red_marked"] >= totals["marks"] > 0
        assert totals["red_drops"] == 0
        # Every packet a RED marked reached its receiver marked, once.
        assert run.sizes[0]["counters"]["ce_marked"] == totals["marks"]
        options = qdiscs(hot)["11:"]["options"]
        assert options["min"] == SPEC.buffers.leaf // 5       # the spec's profile again
    else:
        assert "red_marked" not in after[(hot, "lossless")]
    assert run.queues["totals"]["lossless_drops"] == 0


def test_a_closed_pause_gate_keeps_the_lossless_queue_and_its_red(lab, record_property):
    """The PFC agent changes the gate's tbf over netlink; the queue under it (RED on a full kernel,
    the tbf's own fifo elsewhere) must keep its packets and, where it is RED, stay RED."""
    check_mechanism(record_property, "ecn", lab.ecn_mechanism, "red")
    hot = port_towards(lab, "h2")
    before = queue_snapshot(lab)[(hot, "lossless")]
    lab.queues.storm("h2", 30)                      # h2's NIC pauses its leaf port: the gate closes
    h1 = lab.host("h1")
    try:
        # Jumbo requests in the lossless class (DSCP 26): a closed gate lets one frame finish, then
        # holds the rest (-w: wait for every reply, however late).
        h1.sendCmd(f"ping -n -c 5 -i 0.05 -w 20 -s 8900 -Q 0x68 {lab.fabric.hosts['h2'].ports[0].ip}")
        held, deadline = 0, time.monotonic() + 15
        while time.monotonic() < deadline:          # the requests wait behind the closed gate
            tree = qdiscs(hot)
            held = tree["10:"].get("qlen", 0)
            if held >= 4:
                break
            time.sleep(0.05)
    finally:
        lab.queues.storm("h2", 0)                   # the storm ends: the gate opens
    out = h1.waitOutput()
    after = queue_snapshot(lab)[(hot, "lossless")]
    print(f"ecn={lab.ecn_mechanism}: {held} request(s) held behind the closed gate of {hot}; "
          f"{out.strip().splitlines()[-2] if out.strip() else out!r}")
    assert held > 0, json.dumps(tree)
    if lab.ecn_mechanism == "red":
        assert tree["11:"]["kind"] == "red" and tree["11:"]["qlen"] == held     # the queue is RED's
    assert after["gate_closes"] > before["gate_closes"]
    # Nothing was flushed when the gate changed: the lossless class dropped nothing and the first 5
    # requests, the ones held, were each answered. (-w makes ping keep sending until 5 replies are
    # in, so it may send more than 5 and stop with later ones in flight: count which were answered.)
    assert after.get("drops", 0) == before.get("drops", 0), (before, after)
    answered = {int(n) for n in re.findall(r"icmp_seq=(\d+) ", out)}
    assert set(range(1, 6)) <= answered, out
    if lab.ecn_mechanism == "red":
        tree = qdiscs(hot)
        assert tree["11:"]["kind"] == "red" and tree["11:"]["parent"] == "10:1"
        assert after["red_marked"] >= before["red_marked"] and after["red_drops"] == 0


def test_links_are_delayed_by_netem_where_the_kernel_has_it(lab, record_property, figure):
    check_mechanism(record_property, "delay", lab.delay_mechanism, "netem")
    header = document.header(lab, 4096)
    assert header["mechanisms"]["delay"] == lab.delay_mechanism
    assert header["scale"]["link_delay"]["real_us"] == {"host": 0.25, "fabric": 0.25}
    assert header["scale"]["link_delay"]["lab_ms"] == {"host": 5.0, "fabric": 5.0}
    host_ms, fabric_ms = SPEC.lab_delay_ms("host"), SPEC.lab_delay_ms("fabric")
    same_leaf = min_rtt_ms(lab, "h1", "h2")         # 2 cables each way
    across = min_rtt_ms(lab, "h1", "h3")            # 4 cables each way
    record_property("rtt_ms", {"same_leaf": same_leaf, "across": across})
    print(f"delay={lab.delay_mechanism} min RTT ms: same leaf {same_leaf}, across the spine {across}")
    if lab.delay_mechanism == "netem":
        assert header["scale"]["link_delay"]["applied"] is True
        out = lab.host("h1").cmd("tc qdisc show dev h1-n0")
        assert re.search(r"qdisc netem 5: root .*delay 5ms", out), out
        assert re.search(r"qdisc htb 1: parent 5:1", out), out
        expected_same, expected_across = 4 * host_ms, 4 * host_ms + 4 * fabric_ms
        slack = 15.0 if full_tier() else 5.0          # software emulation adds its own milliseconds
        assert expected_same <= figure("min RTT same leaf, ms", same_leaf) <= expected_same + slack, same_leaf
        assert expected_across <= figure("min RTT across the spine, ms", across) <= expected_across + slack, across
        # The fabric hops' share of the round trip: 4 more fabric cables.
        assert figure("min RTT across - same leaf, ms", across - same_leaf) == pytest.approx(4 * fabric_ms, abs=slack)
    else:
        # No netem: the run went ahead undelayed, said so once, and its results say none.
        assert header["scale"]["link_delay"]["applied"] is False
        assert [w for w in lab.warnings if "delay" in w] and len(lab.warnings) == 1
        assert figure("min RTT across the spine without netem, ms", across) < 4 * host_ms + 4 * fabric_ms, across


def test_a_latency_fault_changes_the_netem_delay_in_place_or_is_refused(lab, record_property, figure):
    """A switch's latency fault (seed 000, 6.4.1): 0.25 us real more through the spine is 5 ms
    more per crossing at x20000, so 10 ms more on a round trip across it and nothing on one leaf;
    its end gives the spec's delay back. Without netem it is refused in one line, changing nothing."""
    check_mechanism(record_property, "delay", lab.delay_mechanism, "netem")
    if lab.delay_mechanism != "netem":
        with pytest.raises(LabError, match="this kernel has no netem") as err:
            lab.set_latency("s1", 0.25)
        assert "\n" not in str(err.value) and not any(e["event"] == "latency" for e in lab.events)
        assert lab.injected()["latency"] == []
        return
    before_same, before_across = min_rtt_ms(lab, "h1", "h2"), min_rtt_ms(lab, "h1", "h3")
    ports = lab.set_latency("s1", 0.25)
    try:
        assert sorted(ports) == sorted(lab.fabric.switch_ports("s1").values())
        shown = subprocess.run(["tc", "qdisc", "show", "dev", ports[0]], capture_output=True, text=True).stdout
        assert re.search(r"qdisc netem 5: root .*delay 10ms", shown), shown
        assert qdiscs(ports[0])["1:"]["parent"] == "5:1"          # the shaping tree under it, kept
        same, across = min_rtt_ms(lab, "h1", "h2"), min_rtt_ms(lab, "h1", "h3")
        record_property("latency_rtt_ms", {"same_leaf": [before_same, same], "across": [before_across, across]})
        slack = 15.0 if full_tier() else 5.0
        assert figure("latency fault: RTT across the spine gained, ms", across - before_across) == \
            pytest.approx(2 * 0.25 * SPEC.time_scale / 1000, abs=slack)
        assert abs(same - before_same) < slack                   # the spine is not on that path
        assert lab.injected()["latency"] == ["s1 (+0.25 us)"]
    finally:
        lab.set_latency("s1", None)
    assert re.search(r"delay 5ms", subprocess.run(["tc", "qdisc", "show", "dev", ports[0]], capture_output=True,
                                                  text=True).stdout)
    assert lab.injected()["latency"] == []
