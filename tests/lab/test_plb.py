"""The plane load balancer on a lossless multiplane fabric (seed 002 sections 4.3, 4.4.1, 6.5):
one QP spread over the four planes packet by packet and placed out of order, and a host link of
one plane failing under a stream, per-plane against NCCL-style software load balancing in the
same test, then coming back."""

import threading
import time

import pytest

from fabriclab.lab.lab import Lab
from fabriclab.topologies.spec import load_spec
from fabriclab.traffic import plb
from fabriclab.traffic.collective import CollectiveSpec, Launcher, run_collective

pytestmark = pytest.mark.lab

# 4 planes x (2 leaves, 2 spines), 10 Mbit/s per plane port, PFC and ECN (queues: true).
SPEC = "multiplane_pfc"


@pytest.fixture(scope="module")
def lab():
    with Lab(load_spec(SPEC), routing="ecmp") as running:
        yield running


def test_per_plane_spreads_each_qp_over_every_plane_and_places_out_of_order(lab, figure):
    run = run_collective(lab, CollectiveSpec("allreduce", sizes=(512 * 1024,), plb="per-plane",
                                             iterations=2, warmup=1, verify=True))
    (row,) = run.sizes
    assert row["verify"]["ok"] and row["ranks"] == 4
    shares = row["planes"]["share"]
    assert len(shares) == 4, shares
    for plane, share in enumerate(shares, 1):
        assert 0.2 < figure(f"plane {plane} share of the AllReduce bytes", share) < 0.3, shares
    c = row["counters"]
    # one QP's packets overtook each other across planes and were placed where they arrived:
    # no NAK, no go-back-N, nothing sent twice (PFC keeps the fabric lossless)
    assert c["out_of_sequence"] > 0 and c["reorder_depth_sum"] >= c["out_of_sequence"]
    assert c["packet_seq_err"] == c["retransmitted_packets"] == c["local_ack_timeout_err"] == 0
    assert {q["plane"] for f in run.finals.values() for q in f["qps"]} == {None}
    for rank, final in run.finals.items():
        record = final["plb"]
        assert record["mode"] == "per-plane" and record["events"] == [], (rank, record["events"])
        assert all(p["data_tx_packets"] > 0 for p in record["planes"]), rank


def stream(lab, mode, down_at, up_at, sender_bytes, **options):
    """h3 streams to h1 (a 2-rank gather) while h3's plane-2 host link goes down `down_at` s
    after the agents are up and back at `up_at`. CTS with 8 buffers per connection is NCCL's
    window (NCCL_STEPS): the sender writes only into buffers its receiver posted."""
    marks, errors = {}, []

    def faults():
        try:
            time.sleep(down_at)
            marks["down"] = time.time()
            lab.link_down("h3", "p2l2", wait=False)
            time.sleep(up_at - down_at)
            marks["up"] = time.time()
            lab.link_up("h3", "p2l2", wait=False)
        except Exception as exc:                    # re-raised by the test
            errors.append(exc)

    thread = threading.Thread(target=faults, daemon=True)
    spec = CollectiveSpec("gather", sizes=(2 * sender_bytes,), hosts=("h1", "h3"), root=0,
                          plb=mode, iterations=1, warmup=0, cts=True, cts_buffers=8, **options)
    try:
        run = Launcher(lab, spec, on_ready=lambda _t: thread.start()).run()
    finally:
        if thread.is_alive():
            thread.join(up_at + 5)
        lab.link_up("h3", "p2l2", wait=False)       # whatever happened, the cable is back
    assert not errors, errors
    assert "up" in marks, "the stream ended before the link came back: make it longer"
    return run, marks


def test_a_host_link_failure_costs_per_plane_milliseconds_and_software_its_timeout(lab, figure):
    """Seed 002 Fig. 12: PLB reaches 75% of the original rate in a few ms, software load
    balancing only after its timeout. The lab's software timeout here is 0.8 s (the spec's ACK
    timeout, its default, is 1.7 s); the plane comes back in both once the link does."""
    took, removed = {}, {}
    for mode in ("per-plane", "software"):
        run, marks = stream(lab, mode, down_at=1.0, up_at=3.0, sender_bytes=15_000_000,
                            sw_timeout_s=0.8)
        receiver, sender = run.finals[0]["plb"], run.finals[1]["plb"]
        got = plb.failover_time(receiver["timeline"], marks["down"], until=marks["up"])
        assert figure(f"receiver Mbit/s before the failure, {mode}", got["baseline_mbps"]) > 0.9 * 40, (mode, got)
        took[mode] = got["recovery_s"]
        events = [(e["plane"], e["event"], e["by"]) for e in sender["events"]]
        # the plane went and came back, in that order, on the sender that lost it
        assert events[0][:2] == (2, "removed") and (2, "returned") == events[-1][:2], (mode, events)
        removed[mode] = (events[0][2], sender["events"][0]["t"] - marks["down"])
        back = sender["events"][-1]["t"]
        assert back >= marks["up"], (mode, back - marks["up"])
        # ... and carried data again after it returned
        tl = sender["timeline"]
        after = [s for t, s in zip(tl["t_s"], tl["sent_bytes"][1]) if tl["start"] + t > back]
        assert after and after[-1] > after[0], mode
    print(f"failover to 75% of the rate: per-plane {took['per-plane']} s, software {took['software']} s")
    assert took["per-plane"] is not None and took["software"] is not None, took
    # The mechanism: per-plane drops the plane when its own port fails, software only when its
    # timeout fires. So per-plane is back before the software timeout could even fire, and
    # software not before it. (This asserted software / per-plane >= 20, seed 002's 400x at real
    # scale; one CI run of 2026-11-28 measured per-plane 0.18 s against software 1.16 s, 6.4x,
    # with the CPU busy: the ratio is the reproduce claim 002-plb-failover's, judged over draws.)
    assert removed["per-plane"][0] != "timeout" and removed["software"][0] == "timeout", removed
    # (the software timeout counts from the oldest unacknowledged send, which may precede the
    # failure by a round trip: 0.1 s of slack)
    assert removed["software"][1] >= 0.7 and removed["per-plane"][1] < 0.7, removed
    assert took["per-plane"] < 0.8 <= took["software"], took
    # per-plane's goodput seldom falls below 75%: it reads 0 s, and counts as one bin of the timeline
    figure("time back to 75%, software / per-plane", took["software"] / max(took["per-plane"], plb.FAILOVER_BIN_S))
