"""The selection stage's adaptive routing and data-path failover on the kernel's BPF test runner
(BPF_PROG_TEST_RUN, a fake clock, veths and no fabric): every decision is the one its Python twin,
`ar_choices`, allows, in its proportions.

- AR sends a packet to the member with the least queued bytes: the stage's virtual queue (bytes
  sent less the link's rate since) or, once linked, the larger of it and the queue model's
  occupancy, divided by the member's weight and compared in quanta; ties go by weight.
- A packet that finds its port without carrier marks it down and goes to a live member; no later
  choice takes the port until it is back. With carrier off the stage only notes it.
"""

import ctypes
import os
import socket
import subprocess

import pytest

from fabriclab.apps.select_stage import (QSTAT_OCC_OFFSET, QSTAT_SIZE, STAGE_MARK, SelectStage,
                                         ar_choices)
from fabriclab.queues import datapath
from fabriclab.traffic import roce

pytestmark = pytest.mark.lab

PASS, REDIRECT = 0xFFFFFFFF, 7          # TC_ACT_UNSPEC (-1) and TC_ACT_REDIRECT
NET = "10.1.2.0"
RATE_MBPS = 10.0                        # 1250 bytes per ms
T0 = 10_000_000_000


TAG = "fabriclab-test artest"            # the veths' alias: what marks a pair as this file's


def _remove_stale_pairs():
    """Delete the pairs a killed run of this file left (their alias names a pid that is gone)."""
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if f"alias {TAG} pid=" not in line:
            continue
        pid = line.rsplit("pid=", 1)[1].split()[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            subprocess.run(["ip", "link", "del", line.split(":")[1].strip().split("@")[0]],
                           capture_output=True)


@pytest.fixture
def veths():
    _remove_stale_pairs()
    names = [f"art{os.getpid()}x{i}" for i in range(3)]     # at most 13 characters, and this run's
    try:
        for name in names:
            subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", name + "p"],
                           check=True)
            subprocess.run(["ip", "link", "set", name, "alias", f"{TAG} pid={os.getpid()}"], check=True)
            subprocess.run(["ip", "link", "set", name, "up"], check=True)
            subprocess.run(["ip", "link", "set", name + "p", "up"], check=True)
        yield names
    finally:
        for name in names:
            subprocess.run(["ip", "link", "del", name], capture_output=True)


@pytest.fixture
def stage_of(veths, request):
    """A loaded stage in a mode, on the veths (members of one group toward NET)."""
    stages = []

    def make(mode="ar", weights=None, **settings):
        stage = SelectStage(f"/sys/fs/bpf/fabriclab/test-{request.node.name[:40]}-{len(stages)}/select", mode,
                            **settings).load()
        stages.append(stage)
        weights = weights or {}
        members = [(v, weights.get(v, 1)) for v in veths]
        stage.set_members({(v, NET): members for v in veths})
        stage.set_ports({v: (RATE_MBPS, i + 1) for i, v in enumerate(veths)})
        stage.set_clock(T0)
        return stage

    yield make
    for stage in stages:
        stage.close()


def index(name):
    return socket.if_nametoindex(name)


def roce_frame(sport=49152, qp=7, dst="10.1.2.1"):
    return (b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00"
            + roce.build_ipv4_udp_roce_packet("10.1.1.1", dst, sport, 0x0A, qp, 0, b"x" * 64))


FILLER = b"\xff" * 6 + b"\x02" * 6 + b"\x08\x06" + bytes(986)     # 1000 bytes, not IP: only queued


def fill(stage, veth, nbytes):
    """Queue `nbytes` at a port's virtual queue (frames the stage passes where they were sent)."""
    for _ in range(nbytes // len(FILLER)):
        assert stage.test_run(FILLER, index(veth))[0] == PASS


def decisions(stage, at, count=1, **frame):
    picks = {}
    for _ in range(count):
        verdict, chosen, event = stage.test_run(roce_frame(**frame), index(at))
        assert event == "ar" and verdict == (PASS if chosen == index(at) else REDIRECT)
        picks[chosen] = picks.get(chosen, 0) + 1
    return picks


def by_index(veths, probabilities):
    return {index(v): p for v, p in probabilities.items()}


def within(picks, probabilities, count):
    """Each member's count within 4.5 standard deviations of what the probabilities say."""
    assert set(picks) <= set(probabilities), (picks, probabilities)
    for member, p in probabilities.items():
        sd = (count * p * (1 - p)) ** 0.5
        assert abs(picks.get(member, 0) - count * p) <= 4.5 * sd + 1, (picks, probabilities)


def test_ar_sends_every_packet_to_the_shortest_virtual_queue(veths, stage_of):
    stage = stage_of("ar", quantum=0)
    a, b, c = veths
    fill(stage, a, 10_000)
    fill(stage, b, 3_000)
    depths = {a: 10_000, b: 3_000, c: 0}
    assert ar_choices(depths) == {c: 1.0}
    assert decisions(stage, a, 50) == {index(c): 50}
    # 3 ms later the link has drained 3750 bytes of each: b is empty too, and ties with c
    stage.set_clock(T0 + 3_000_000)
    expect = ar_choices({a: 6_250, b: 0, c: 0})
    assert expect == {b: 0.5, c: 0.5}
    within(decisions(stage, a, 400), by_index(veths, expect), 400)
    stats = stage.stats()
    assert stats["ar_tied"] >= 1 and stats["ar_virtual"] == 450 and stats["ar_queue_model"] == 0
    assert stats["depth"] == "virtual queue"


def test_ar_compares_depths_in_quanta_and_divides_them_by_weight(veths, stage_of):
    a, b, c = veths
    stage = stage_of("ar", quantum=4096)
    fill(stage, a, 10_000)
    fill(stage, b, 3_000)
    expect = ar_choices({a: 10_000, b: 3_000, c: 0}, quantum=4096)
    assert expect == {b: 0.5, c: 0.5}             # 3000 bytes is less than a quantum: a tie
    within(decisions(stage, a, 400), by_index(veths, expect), 400)
    # weights: c has half the capacity behind it, so its 2000 bytes count as 4000
    weighted = stage_of("ar", quantum=0, weights={a: 2, b: 2, c: 1})
    fill(weighted, a, 10_000)
    fill(weighted, b, 3_000)
    fill(weighted, c, 2_000)
    expect = ar_choices({a: 10_000, b: 3_000, c: 2_000}, {a: 2, b: 2, c: 1})
    assert expect == {b: 1.0}
    assert decisions(weighted, a, 50) == {index(b): 50}


def test_ar_splits_members_within_a_quantum_by_weight(veths, stage_of):
    a, b, c = veths
    weights = {a: 1, b: 2, c: 1}
    # a packet left by `a` is queued there: a quantum of a megabyte keeps every member tied
    stage = stage_of("ar", quantum=1 << 20, weights=weights)
    expect = ar_choices({a: 0, b: 0, c: 0}, weights, quantum=1 << 20)
    assert expect == {a: 0.25, b: 0.5, c: 0.25}
    within(decisions(stage, a, 800), by_index(veths, expect), 800)


def queue_map(rows):
    fd = datapath.libbpf().bpf_map_create(2, None, 4, QSTAT_SIZE, rows, None)
    assert fd >= 0
    return datapath.Map(fd, ctypes.c_uint32, datapath.QStat)


def test_ar_reads_the_queue_models_occupancy_over_its_classes(veths, stage_of):
    assert ctypes.sizeof(datapath.QStat) == QSTAT_SIZE and datapath.QStat.occ.offset == QSTAT_OCC_OFFSET
    a, b, c = veths
    rows = len(veths) * datapath.NCLASS
    stage = stage_of("ar", quantum=0, queue_rows=rows)
    stats = queue_map(rows)
    try:
        occupancy = {a: (0, 0, 500), b: (4_000, 100, 0), c: (0, 0, 0)}      # lossless, control, lossy
        for port, (veth, classes) in enumerate(occupancy.items()):
            for cls, occ in enumerate(classes):
                stats.update(port * datapath.NCLASS + cls, datapath.QStat(occ=occ))
        # before the model is linked only the virtual queues count
        fill(stage, b, 2_000)
        fill(stage, c, 3_000)
        assert decisions(stage, a, 10) == {index(a): 10}
        assert stage.use_queue_map(stats.fd)
        # linked, a port's depth is the larger of its occupancy (over every class) and its
        # virtual queue (the serialization backlog): a max(500, ~1.2K), b max(4100, 2000),
        # c max(0, 3000)
        assert decisions(stage, a, 10) == {index(a): 10}
        stats.update(0, datapath.QStat(occ=5_000))                        # a: lossless 5000
        assert ar_choices({a: 5_500, b: 4_100, c: 3_000}) == {c: 1.0}
        assert decisions(stage, a, 20) == {index(c): 20}
        stats.update(2 * datapath.NCLASS, datapath.QStat(occ=9_000))      # c: 9000 over its 3000
        assert decisions(stage, a, 20) == {index(b): 20}
        counters = stage.stats()
        assert counters["ar_queue_model"] == 50 and counters["ar_virtual"] == 10
        assert counters["depth"] == "queue model"
    finally:
        stats.close()
    # a map of another size does not fit: the stage says why and keeps its virtual queues
    other = stage_of("ar", queue_rows=rows)
    wrong = queue_map(rows + 3)
    try:
        assert not other.use_queue_map(wrong.fd)
        assert "does not fit" in other.depth_source()
    finally:
        wrong.close()


def set_carrier(veth, up):
    """Cut a veth's cable at the far end: the near end stays administratively up, carrier off."""
    subprocess.run(["ip", "link", "set", veth + "p", "up" if up else "down"], check=True)


def test_a_port_without_carrier_leaves_every_choice_in_the_data_path(veths, stage_of):
    a, b, c = veths
    stage = stage_of("ar", quantum=0)
    if not stage.reads_carrier:
        pytest.skip("this kernel does not let a tc program read its device (bpf_cast_to_kern_ctx, "
                    "Linux 6.3+): a dead member leaves when the controller recomputes")
    fill(stage, a, 5_000)
    fill(stage, b, 5_000)                       # c is the shortest queue
    assert decisions(stage, a, 5) == {index(c): 5}
    set_carrier(c, False)
    # the packet the stage had sent to c arrives there (marked) and finds no carrier: it goes on
    # to a live member, and c is marked down
    verdict, chosen, event = stage.test_run(roce_frame(), index(c), mark=STAGE_MARK)
    assert (verdict, event) == (REDIRECT, "rescued") and chosen in (index(a), index(b))
    assert set(decisions(stage, a, 100)) <= {index(a), index(b)}
    records = stage.port_records()
    assert records[c]["down_events"] == 1
    assert records[c]["last_chosen_ns"] <= records[c]["down_seen_ns"]      # never chosen after
    counters = stage.stats()
    assert counters["rescued"] == 1 and counters["skipped_down"] >= 100 and counters["carrier"] == "data path"
    # the cable comes back; the controller's recompute clears the mark (sysfs says carrier 1)
    set_carrier(c, True)
    stage.forget_down_ports_that_are_up()
    assert decisions(stage, a, 5) == {index(c): 5}


def test_with_carrier_off_the_stage_only_notes_a_dead_port(veths, stage_of):
    a, b, c = veths
    stage = stage_of("ar", quantum=0, carrier=False)
    fill(stage, a, 5_000)
    fill(stage, b, 5_000)
    set_carrier(c, False)
    verdict, _chosen, event = stage.test_run(roce_frame(), index(c), mark=STAGE_MARK)
    assert verdict == PASS and event is None     # passed to the dead port, as OVS chose
    assert decisions(stage, a, 5) == {index(c): 5}
    assert stage.stats()["carrier"] == "controller"
    if stage.reads_carrier:
        assert stage.port_records()[c]["down_events"] == 1


def test_eecmp_and_flowlet_skip_a_member_marked_down(veths, stage_of):
    from fabriclab.apps.select_stage import eecmp_member

    a, b, c = veths
    hashed = stage_of("hash")
    if not hashed.reads_carrier:
        pytest.skip("this kernel does not let a tc program read its device")
    set_carrier(b, False)
    hashed.test_run(roce_frame(), index(b), mark=STAGE_MARK)
    for qp in range(64, 96):
        _, picked, _ = hashed.test_run(roce_frame(qp=qp), index(a))
        assert picked == index(eecmp_member(veths, "10.1.1.1", "10.1.2.1", 49152, qp, down={b}))
    flowlet = stage_of("flowlet", gap_ns=500_000)
    flowlet.test_run(roce_frame(), index(b), mark=STAGE_MARK)
    for sport in range(1000, 1032):
        _, picked, _ = flowlet.test_run(roce_frame(sport=sport), index(a))
        assert picked in (index(a), index(c))
