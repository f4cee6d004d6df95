"""Collectives as RoCEv2 traffic on real fabrics: results checked against numpy, RNIC counters,
CTS admission, failures that name the rank."""

import os
import re
import signal
import threading
import time

import pytest

from fabriclab.errors import LabError
from fabriclab.lab.lab import Lab
from fabriclab.topologies.spec import FabricSpec
from fabriclab.traffic import schedules
from fabriclab.traffic.collective import CollectiveSpec, run_collective

from . import labutil

pytestmark = pytest.mark.lab

# 4 ranks, two per leaf, two spines: every collective crosses the spines.
# 20 Mbit/s standing for 400 Gbit/s: DCQCN's NIC timers are stretched by the same x20000.
SPEC = FabricSpec(name="t-coll", leaves=2, spines=2, hosts_per_leaf=2,
                  host_rate_mbps=20, fabric_rate_mbps=20, real_host_rate_mbps=400_000)


@pytest.fixture(scope="module")
def lab():
    with Lab(SPEC) as running:
        yield running


VARIANTS = [(c, a) for c in schedules.COLLECTIVES for a in schedules.ALGORITHMS.get(c, ("ring",))]


def test_every_collective_completes_with_verified_results(lab):
    """Each collective carries real float32 values over the fabric; every rank's output of every
    iteration equals numpy's answer."""
    for collective, algorithm in VARIANTS:
        spec = CollectiveSpec(collective, sizes=(48 * 1024,), algorithm=algorithm, channels=2,
                              qps=2, chunk_bytes=16384, piece_bytes=8192, iterations=2, warmup=0,
                              verify=True)
        run = run_collective(lab, spec)
        (row,) = run.sizes
        assert row["verify"]["ok"], (collective, algorithm, row["verify"])
        assert row["verify"]["checked_outputs"] == 2 * 4
        assert row["iterations"] == 2 and row["time_s"]["mean"] > 0
        c = row["counters"]
        # Every byte the schedule moves was sent and acknowledged at least once.
        assert c["rx_bytes"] >= sum(row["bytes_sent_per_rank"]) * 2, (collective, c)
        assert row["busbw_mbps"] > 0 and row["bus_factor"] == schedules.bus_factor(collective, 4)


def test_every_collective_runs_in_place_too(lab):
    """In place each size runs a second time with the receive buffer aliasing the send buffer:
    the same bytes on the wire, the result checked where it lives; AlltoAll(v) and the bisection
    test have no defined in-place result, so nothing is checked (as nccl-tests)."""
    for collective, algorithm in VARIANTS:
        spec = CollectiveSpec(collective, sizes=(48 * 1024,), algorithm=algorithm, channels=2,
                              qps=2, chunk_bytes=16384, piece_bytes=8192, iterations=2, warmup=0,
                              verify=True, in_place=True)
        out, inp = run_collective(lab, spec).sizes
        assert (out["in_place"], inp["in_place"]) == (False, True)
        assert out["verify"]["ok"], (collective, algorithm, out["verify"])
        if collective in schedules.IN_PLACE_UNDEFINED:
            assert inp["verify"] is None
        else:
            assert inp["verify"]["ok"] and inp["verify"]["wrong_elements"] == 0, (collective, inp["verify"])
            assert inp["verify"]["checked_outputs"] == 2 * 4
        assert inp["bytes_sent_per_rank"] == out["bytes_sent_per_rank"]
        assert inp["counters"]["rx_bytes"] >= sum(inp["bytes_sent_per_rank"]) * 2, (collective, inp["counters"])


def test_ring_allreduce_busbw_approaches_the_link_rate(lab, figure):
    """On an idle fabric with one rank per host, ring AllReduce's busbw is most of the link."""
    run = run_collective(lab, CollectiveSpec("allreduce", sizes=(1 << 20,), iterations=2))
    (row,) = run.sizes
    assert figure("ring AllReduce busbw / NIC rate", row["busbw_fraction_of_nic"]) > 0.6, row
    assert figure("ring AllReduce mean CCT / ideal", row["time_s"]["mean"] / row["ideal_time_s"]) >= 0.95
    assert row["flows"]["qps_measured"] == 4 * 2


def test_single_path_has_no_out_of_sequence_packets_and_spraying_does(lab):
    """A QP's packets follow one ECMP path, so they arrive in order. Spraying them over two
    source ports (two spines) while one spine path is slowed down reorders them: the receiver
    counts out-of-sequence packets, NAKs, and go-back-N still delivers the right values."""
    pair = ("h1", "h3")           # different leaves
    base = dict(sizes=(256 * 1024,), hosts=pair, iterations=2, warmup=0, verify=True)
    run = run_collective(lab, CollectiveSpec("bisection", **base))
    c = run.sizes[0]["counters"]
    assert c["out_of_sequence"] == 0 and c["packet_seq_err"] == 0 and c["rx_packets"] > 0
    lab.set_rate("l1", "s1", 5)
    lab.set_rate("l2", "s1", 5)
    try:
        run = run_collective(lab, CollectiveSpec("bisection", spray=2, **base))
    finally:
        lab.set_rate("l1", "s1", None)
        lab.set_rate("l2", "s1", None)
    row = run.sizes[0]
    assert row["counters"]["out_of_sequence"] > 0, row["counters"]
    assert row["counters"]["packet_seq_err"] > 0 and row["counters"]["retransmitted_packets"] > 0
    assert row["verify"]["ok"]


def test_cts_admission_bounds_bytes_in_flight(lab):
    """3:1 incast (Gather) into a 64 KiB leaf buffer: without admission the senders overrun it
    and the transport retransmits; with one 8 KiB CTS buffer per sender (24 KiB in flight) the
    buffer never overflows."""
    spec = dict(sizes=(3 * 256 * 1024,), iterations=2, warmup=0, chunk_bytes=8192, verify=True)
    rx_port = lab.fabric.hosts["h1"].ports[0]
    leaf_port = f"{rx_port.leaf}-eth{rx_port.leaf_port}"

    def run_gather(**extra):
        from fabriclab.measure import telemetry
        before = telemetry.qdisc_drops([leaf_port]).get(leaf_port, 0)
        run = run_collective(lab, CollectiveSpec("gather", **spec, **extra))
        return run.sizes[0], telemetry.qdisc_drops([leaf_port]).get(leaf_port, 0) - before

    free, free_drops = run_gather()
    admitted, admitted_drops = run_gather(cts=True, cts_buffers=1)
    assert free_drops > 0 and free["counters"]["retransmitted_packets"] > 0, free["counters"]
    assert admitted_drops == 0 and admitted["counters"]["retransmitted_packets"] == 0
    assert admitted["verify"]["ok"] and free["verify"]["ok"]


def test_qp_scaling_and_shared_source_ports(lab):
    """QP scaling opens more QPs per connection; with shared source ports they all hash alike."""
    run = run_collective(lab, CollectiveSpec("allreduce", sizes=(64 * 1024,), qps=4,
                                             qp_method="split", iterations=1, warmup=0))
    qps = [q for final in run.finals.values() for q in final["qps"]]
    assert len(qps) == 4 * 2 * 4               # 4 ranks x 2 ring neighbours x 4 QPs
    sports = {q["sport"] for q in qps if q["peer"] == 1 and q["tx_packets"]}
    assert len(sports) > 1
    shared = run_collective(lab, CollectiveSpec("allreduce", sizes=(64 * 1024,), qps=4,
                                                sport_mode="shared", iterations=1, warmup=0))
    by_pair = {}
    for rank, final in shared.finals.items():
        for q in final["qps"]:
            by_pair.setdefault((min(rank, q["peer"]), max(rank, q["peer"])), set()).add(q["sport"])
    assert all(len(ports) == 1 for ports in by_pair.values())


def test_ce_marks_make_cnps_and_dcqcn_slows_the_sender(lab):
    """Packets that arrive CE-marked make the receiver send CNPs, and a DCQCN sender cuts its
    rate. (The lab's fabric does not mark yet; the sender marks its own packets CE here, so only
    the notification loop is under test.)"""
    run = run_collective(lab, CollectiveSpec("bisection", sizes=(512 * 1024,), hosts=("h1", "h3"),
                                             ecn=3, dcqcn={}, iterations=1, warmup=0))
    row = run.sizes[0]
    assert row["counters"]["ce_marked"] > 0 and row["counters"]["cnp_sent"] > 0
    assert row["counters"]["cnp_handled"] > 0
    qps = [q for final in run.finals.values() for q in final["qps"] if q["tx_packets"]]
    assert qps and all(q["dcqcn"]["rate_decreases"] > 0 for q in qps)
    # alpha starts near 1, so the first CNP about halves the rate
    assert all(q["dcqcn"]["min_rate_mbps"] < 0.6 * 20 for q in qps)


def _signal_agent_later(lab, sig, delay_s):
    """Send `sig` to the newest agent process started in host h2, `delay_s` after it exists."""
    def worker():
        deadline = time.monotonic() + 20
        seen = {p["pid"] for p in lab.run.data["processes"]}
        while time.monotonic() < deadline:
            fresh = [p for p in lab.run.data["processes"]
                     if p["role"] == "collective-agent" and p["pid"] not in seen]
            if len(fresh) >= 2:                    # rank 1 is the second agent started
                time.sleep(delay_s)
                os.kill(fresh[1]["pid"], sig)
                return
            time.sleep(0.05)
    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    return thread


def test_a_killed_agent_is_named_not_waited_for(lab):
    before = labutil.resources()
    thread = _signal_agent_later(lab, signal.SIGKILL, 1.5)
    t0 = time.monotonic()
    with pytest.raises(LabError, match=r"rank 1 \(h2 h2-n0\): agent died \(killed by signal 9\)"):
        run_collective(lab, CollectiveSpec("allreduce", sizes=(4 << 20,), iterations=3))
    thread.join()
    assert time.monotonic() - t0 < 15
    assert not labutil.leaked(before, labutil.resources())


def test_a_frozen_peer_exhausts_the_retry_counter(lab):
    """A peer that stops answering (SIGSTOP) makes its neighbour's QP time out 1 + retry_limit
    times; the error names both ranks, and nothing is left running."""
    before = labutil.resources()
    thread = _signal_agent_later(lab, signal.SIGSTOP, 1.0)
    with pytest.raises(LabError, match=r"retry counter exceeded.*towards rank 1 \(h2"):
        run_collective(lab, CollectiveSpec("allreduce", sizes=(4 << 20,), iterations=3,
                                           ack_timeout_s=0.2, retry_limit=2))
    thread.join()
    assert not labutil.leaked(before, labutil.resources())


def test_a_stalled_iteration_names_the_rank_that_holds_it_up(lab):
    """A peer frozen with its QPs' retries far from exhausted (1 s ACK timeout: 8 s to use up 7
    retries, against the iteration's 6.2 s bound): the iteration runs out of time, every rank is
    asked where it stands, and the error follows the waits from rank 0 to the frozen rank 1."""
    before = labutil.resources()
    thread = _signal_agent_later(lab, signal.SIGSTOP, 1.0)
    with pytest.raises(LabError) as caught:
        run_collective(lab, CollectiveSpec("allreduce", sizes=(256 << 10,), iterations=200,
                                           ack_timeout_s=1.0, timeout_factor=1.01))
    thread.join()
    text = str(caught.value)
    # The error names the frozen rank 1 as silent, by whichever way the freeze caught the ring:
    # rank 0 waiting for its bytes (a chain that reaches rank 1), rank 0 still sending to it
    # unacknowledged, or rank 0 done with the iteration and rank 1 the one stuck (2026-12-02)
    assert re.search(r"^rank [01] \(h[12] [^)]*\) did not finish within [\d.]+ s while [^:]*: (rank 0 \(h1 [^)]*\) "
                     r"waits for \d+ bytes from rank \d.*|still sends: to rank 1 \d+ bytes queued, [1-9]\d* packets "
                     r"unacknowledged.*; )?rank 1 \(h2 h2-n0\) did not answer$", text), text
    assert not labutil.leaked(before, labutil.resources())


def test_bad_requests_fail_before_anything_starts(lab):
    started = len(lab.run.data["processes"])
    with pytest.raises(LabError, match="host 'h9' is not in fabric"):
        run_collective(lab, CollectiveSpec(hosts=("h1", "h9")))
    with pytest.raises(LabError, match="even rank count"):
        run_collective(lab, CollectiveSpec("bisection", hosts=("h1", "h2", "h3")))
    with pytest.raises(LabError, match="qps must be"):
        run_collective(lab, CollectiveSpec(qps=0))
    assert len(lab.run.data["processes"]) == started      # no agent was started
