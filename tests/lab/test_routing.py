"""The routing apps on real fabrics and the selection stage's logic on the kernel's BPF test runner.

- A swap points every switch at the new app's own port, so none waits out a reconnect backoff.
- E-ECMP spreads QPs that share one source port over both spines; ECMP does not.
- TE places two elephants from one leaf on different spines, and falls back when a link fails.
- Flowlet switching moves a flow that went idle to the less-loaded uplink.
- Path pinning sends everything to one host up the uplink its slice picks, whatever the 5-tuple,
  and falls back to the other uplink when that one fails.
- The stage itself (BPF_PROG_TEST_RUN, a fake clock, no network): the E-ECMP choice is the
  Python hash's; a flowlet keeps its member within the gap and moves after it.
"""

import pathlib
import socket
import subprocess
import threading
import time

import pytest

from fabriclab.measure import telemetry
from fabriclab.apps.select_stage import SelectStage, eecmp_member, flow_hash
from fabriclab.lab.controller import connected_switches
from fabriclab.lab.lab import Lab
from fabriclab.topologies.spec import load_spec
from fabriclab.traffic import roce
from fabriclab.traffic.collective import CollectiveSpec, run_collective

pytestmark = pytest.mark.lab

TWO_BY_TWO = pathlib.Path(__file__).parents[1] / "two_by_two.yaml"
UPLINKS = ("l1-eth3", "l1-eth4")        # l1's ports to s1 and s2 (ports 1-2 face its hosts)


@pytest.fixture(scope="module")
def lab():
    with Lab(load_spec(str(TWO_BY_TWO)), routing="ecmp") as lab:
        assert {lab.fabric.switch_ports("l1")[p] for p in (3, 4)} == set(UPLINKS)
        yield lab


def uplink_packets(run_traffic):
    before = telemetry.read_counters(UPLINKS)
    result = run_traffic()
    after = telemetry.read_counters(UPLINKS)
    return {i: after[i]["tx_packets"] - before[i]["tx_packets"] for i in UPLINKS}, result


def shared_port_qps(lab):
    spec = CollectiveSpec(collective="bisection", sizes=(256 * 1024,), hosts=("h1", "h3"), qps=8,
                          sport_mode="shared", iterations=2, warmup=0)
    return run_collective(lab, spec)


def test_a_swap_moves_every_switch_to_the_new_apps_port(lab):
    """The mechanism behind a swap that does not wait for OVS's reconnect backoff (a second or
    more on the same target): the new app listens on its own port, the switches' Controller rows
    are pointed there in one transaction, and OVS connects to a new target at once."""
    before = lab.controller.port
    lab.set_routing("te" if lab.controller.app != "te" else "ecmp")
    after = lab.controller.port
    assert after != before
    out = subprocess.run(["ovs-vsctl", "--format=json", "--columns=target", "find", "Controller",
                          f'target="tcp:{lab.controller.listen}:{before}"'], capture_output=True, text=True)
    assert '"data":[]' in out.stdout.replace(" ", ""), out.stdout     # no row left on the old port
    # The app said it programmed every switch; OVSDB's is_connected follows within its refresh
    deadline = time.monotonic() + 10
    while connected_switches(lab.controller.listen, after) < len(lab.fabric.switches) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert connected_switches(lab.controller.listen, after) == len(lab.fabric.switches)


def test_eecmp_spreads_shared_source_port_qps_and_ecmp_does_not(lab, figure):
    lab.set_routing("ecmp")
    ecmp, _ = uplink_packets(lambda: shared_port_qps(lab))
    lab.set_routing("eecmp")
    eecmp, run = uplink_packets(lambda: shared_port_qps(lab))
    stats = lab.stage_stats()
    # one 5-tuple: one uplink
    assert figure("ECMP: min uplink share of packets", min(ecmp.values()) / sum(ecmp.values())) < 0.05, ecmp
    # 8 QPs: both uplinks
    assert figure("E-ECMP: min uplink share of packets", min(eecmp.values()) / sum(eecmp.values())) > 0.2, eecmp
    assert stats["roce"] > 0 and stats["redirected"] > 0
    assert run.sizes[0]["counters"]["out_of_sequence"] == 0            # per-QP paths keep order


def elephants(lab, iterations=2, progress=None):
    spec = CollectiveSpec(collective="bisection", sizes=(512 * 1024,), hosts=("h1", "h2", "h3", "h4"),
                          placement="order", iterations=iterations, warmup=0)
    return run_collective(lab, spec, progress=progress)


def placement_while_running(lab, seen):
    """A progress callback keeping the TE placement as it was during the job (once the job ends,
    the launcher retracts it and TE empties the placement)."""
    def progress(*_):
        seen.setdefault("placement", lab.te_placement())
    return progress


def test_te_places_two_elephants_on_different_spines(lab, figure):
    lab.set_routing("te:period_s=0.5")
    seen = {}
    counts, run = uplink_packets(lambda: elephants(lab, progress=placement_while_running(lab, seen)))
    placement = seen["placement"]
    from_l1 = [p for p in placement["placed"] if p["leaf"] == "l1"]
    assert {p["host_port"] for p in from_l1} == {"h1-n0", "h2-n0"}
    assert {p["uplink_intf"] for p in from_l1} == set(UPLINKS)
    assert all(p["source"].startswith("job:") for p in from_l1)
    assert figure("TE: min uplink share of packets", min(counts.values()) / sum(counts.values())) > 0.35, counts
    assert figure("TE: bisection busbw / NIC rate", run.sizes[0]["busbw_fraction_of_nic"]) > 0.6


def test_te_falls_back_when_its_link_fails_and_recompute_repairs(lab):
    lab.set_routing("te:period_s=0.5")
    done = {}

    def run():
        done["run"] = elephants(lab, iterations=4)

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not [p for p in (lab.te_placement() or {}).get("placed", [])
                                               if p["leaf"] == "l1"]:
        time.sleep(0.05)
    placed = [p for p in lab.te_placement()["placed"] if p["leaf"] == "l1"]
    victim = placed[0]["path"][1]                     # the spine one elephant was placed through
    time.sleep(0.3)
    lab.link_down("l1", victim)
    try:
        # the next recompute (period 0.5 s) places the running job again on what is left
        deadline = time.monotonic() + 5
        after = {}
        while time.monotonic() < deadline and not (after.get("down_links") and after.get("jobs")):
            time.sleep(0.05)
            after = lab.te_placement() or {}
        worker.join(60)
        assert "run" in done, "the collective did not finish after the TE link failed"
        assert after["down_links"], after
        again = [p for p in after["placed"] if p["leaf"] == "l1"]
        assert again and all(victim not in p["path"] for p in again), after
    finally:
        lab.link_up("l1", victim)
    assert done["run"].sizes[0]["iterations"] == 4


SENDER = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("{src}", {sport}))
for _ in range({count}):
    s.sendto(b"x" * 1000, ("{dst}", 5000))
    time.sleep({pause})
"""


def send_udp(lab, host, src, dst, sport, count, pause=0.001, wait=True):
    code = SENDER.format(src=src, dst=dst, sport=sport, count=count, pause=pause)
    proc = lab.host(host).popen(["python3", "-c", code], stdout=subprocess.DEVNULL)
    if wait:
        proc.wait(30)
    return proc


def test_flowlet_moves_an_idle_flow_to_the_less_loaded_uplink(lab, figure):
    lab.set_routing("flowlet:gap_us=50000,load_window_us=300000")
    h1, h2, h3 = (lab.fabric.hosts[h].ports[0].ip for h in ("h1", "h2", "h3"))
    members = sorted(UPLINKS)
    first, _ = uplink_packets(lambda: send_udp(lab, "h1", h1, h3, 40000, 50))
    home = max(first, key=first.get)
    away = next(i for i in UPLINKS if i != home)
    # one flowlet: the burst kept its member
    assert figure("first burst: packets of 50 on its uplink", first[home]) >= 45, first
    # A second flow to keep `home` busy. It goes to the least-loaded member, ties broken from its
    # hash's member, so its source port is one whose hash starts at `home`; stray frames on the
    # uplinks (ARP, the controller's probes) can still tip the tie the other way, and then the
    # next such port is tried.
    ports = (p for p in range(41000, 43000) if members[flow_hash(h2, h3, 17, p, 5000) % 2] == home)
    for _attempt in range(4):
        time.sleep(0.7)                               # both windows forget the earlier traffic
        base = telemetry.read_counters(UPLINKS)
        other = send_udp(lab, "h2", h2, h3, next(ports), 1500, wait=False)
        busy, deadline = None, time.monotonic() + 5
        while busy is None and time.monotonic() < deadline:
            now = telemetry.read_counters(UPLINKS)
            busy = next((i for i in UPLINKS if now[i]["tx_packets"] - base[i]["tx_packets"] >= 30), None)
            time.sleep(0.005)
        if busy == home:
            break
        other.kill()
        other.wait(5)
    else:
        pytest.fail(f"a second flow never landed on {home}, the first flow's uplink")
    before = lab.stage_stats()
    second, _ = uplink_packets(lambda: send_udp(lab, "h1", h1, h3, 40000, 50))
    other.wait(30)
    after = lab.stage_stats()
    assert after["flowlet_moved"] > before["flowlet_moved"]
    # the first flow's second burst (50 packets) left by the other, idle uplink
    assert figure("second burst: packets of 50 on the idle uplink", second[away]) >= 45, second
    assert after["gap_histogram_us"], after


# -- the stage on the BPF test runner ---------------------------------------------------------------
@pytest.fixture
def veths():
    names = [f"fltest{i}" for i in range(3)]
    for name in names:
        subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", name + "p"], check=True)
        # Up at both ends, as a fabric's cables are: the stage leaves a member without carrier.
        for end in (name, name + "p"):
            subprocess.run(["ip", "link", "set", end, "up"], check=True)
    try:
        yield names
    finally:
        for name in names:
            subprocess.run(["ip", "link", "del", name], capture_output=True)


def roce_frame(src, dst, sport, qp):
    return (b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00"
            + roce.build_ipv4_udp_roce_packet(src, dst, sport, 0x0A, qp, 0, b"x" * 64))


def test_stage_hash_matches_python(veths):
    stage = SelectStage(f"/sys/fs/bpf/fabriclab/test-{id(veths)}/select", "hash").load()
    try:
        stage.set_members({(v, "10.1.2.0"): veths for v in veths})
        index = {v: socket.if_nametoindex(v) for v in veths}
        chosen = set()
        for qp in range(64, 96):
            verdict, picked, _ = stage.test_run(roce_frame("10.1.1.1", "10.1.2.1", 49152, qp), index[veths[0]])
            expect = eecmp_member(veths, "10.1.1.1", "10.1.2.1", 49152, qp)
            assert picked == index[expect]
            assert verdict == (-1 & 0xFFFFFFFF if expect == veths[0] else 7)   # pass or redirect
            chosen.add(expect)
        assert chosen == set(veths)
        # each port hashes from its switch's basis once the controller wrote it (apps/hashing.py)
        basis = 0x5EED1234
        stage.set_ports({v: (10.0, 0, basis) for v in veths})
        moved = 0
        for qp in range(64, 96):
            _verdict, picked, _ = stage.test_run(roce_frame("10.1.1.1", "10.1.2.1", 49152, qp), index[veths[0]])
            expect = eecmp_member(veths, "10.1.1.1", "10.1.2.1", 49152, qp, seed=basis)
            assert picked == index[expect]
            moved += expect != eecmp_member(veths, "10.1.1.1", "10.1.2.1", 49152, qp)
        assert moved > 0                          # another basis, other choices
        # a destination with no group entry is left to OVS's choice
        verdict, picked, _ = stage.test_run(roce_frame("10.1.1.1", "10.1.3.1", 1, 1), index[veths[0]])
        assert picked == 0 and stage.stats()["no_members"] == 1
    finally:
        stage.close()


def test_flowlet_gap_logic_on_a_fake_clock(veths):
    stage = SelectStage(f"/sys/fs/bpf/fabriclab/test-fl-{id(veths)}/select", "flowlet",
                        gap_ns=500_000, window_ns=1_000_000).load()
    try:
        stage.set_members({(v, "10.1.2.0"): veths for v in veths})
        index = {v: socket.if_nametoindex(v) for v in veths}
        flow = roce_frame("10.1.1.1", "10.1.2.1", 49152, 5)
        t = 10_000_000_000
        stage.set_clock(t)
        _, first, event = stage.test_run(flow, index[veths[0]])
        assert event == "new" and first in index.values()
        for step in range(5):                      # within the gap: the same member every time
            t += 400_000
            stage.set_clock(t)
            _, picked, event = stage.test_run(flow, index[veths[1]])
            assert (picked, event) == (first, "kept")
        # load the flow's member (non-IP frames pass where they are sent and count as its load),
        # then leave the gap: the flow moves to a member that sent nothing
        arp = b"\xff" * 6 + b"\x02" * 6 + b"\x08\x06" + bytes(986)
        for _ in range(20):
            stage.test_run(arp, first)
        t += 600_000
        stage.set_clock(t)
        _, picked, event = stage.test_run(flow, first)
        assert picked != first and event == "moved"
        stats = stage.stats()
        assert stats["flowlet_kept"] == 5 and stats["flowlet_moved"] >= 1
        assert stats["gap_histogram_us"]["256-512"] >= 5 and stats["gap_histogram_us"]["512-1024"] >= 1
    finally:
        stage.close()


def test_pinning_keeps_each_destination_on_its_slices_uplink_and_falls_back(lab):
    """h3 and h4 are slices 0 and 1 under l2: with l1's two uplinks, each takes one of them for
    every source port; with h3's uplink down, h3's packets take the other (the hashed fallback),
    and the pin is back once it is up."""
    lab.set_routing("pinning")
    h1, h3, h4 = (lab.fabric.hosts[h].ports[0].ip for h in ("h1", "h3", "h4"))
    members = sorted(UPLINKS)
    taken = {}
    for dst, name in ((h3, "h3"), (h4, "h4")):
        for sport in (40001, 40002, 40003, 40004):
            counts, _ = uplink_packets(lambda: send_udp(lab, "h1", h1, dst, sport, 20, pause=0.0005))
            used = [i for i in UPLINKS if counts[i] >= 20]
            assert len(used) == 1 and sum(counts.values()) < 20 + 5, (name, sport, counts)   # + ARP and LLDP
            taken.setdefault(name, set()).update(used)
    assert taken == {"h3": {members[0]}, "h4": {members[1]}}, taken    # slice 0 -> first uplink, 1 -> second
    lab.link_down("l1", "s1")
    try:
        counts, _ = uplink_packets(lambda: send_udp(lab, "h1", h1, h3, 40001, 20, pause=0.0005))
        assert counts[members[1]] >= 20, counts
    finally:
        lab.link_up("l1", "s1")
    counts, _ = uplink_packets(lambda: send_udp(lab, "h1", h1, h3, 40001, 20, pause=0.0005))
    assert counts[members[0]] >= 20, counts
