"""The queue model's "ar" ECN mode on a real fabric (seed 002 4.2: SPX's switches mark ECN only
when adaptive routing's capacity is exhausted). One flow through a leaf whose uplinks run at half
the host rate fills the uplink its hash picked while the other stays idle: the `step` profile
marks it, `ar` does not (the idle member could take the burst). With the idle uplink's cable
down the group is rewritten to the one member left, and `ar` marks the deep queue."""

import pytest

from fabriclab.lab.lab import Lab
from fabriclab.queues.config import EcnProfile, QueueSpec
from fabriclab.topologies.spec import FabricSpec
from fabriclab.traffic.collective import CollectiveSpec, run_collective

from .labutil import queue_delta, queue_snapshot

pytestmark = pytest.mark.lab

KMIN = 20 * 1024
# Uplinks at half the host rate: one flow fills its uplink; one host per leaf, two spines.
SPEC = FabricSpec(name="t-armark", leaves=2, spines=2, hosts_per_leaf=1, host_rate_mbps=20,
                  fabric_rate_mbps=10, queues=QueueSpec(ecn=EcnProfile("ar", kmin=KMIN)))


@pytest.fixture(scope="module")
def lab():
    with Lab(SPEC) as running:
        yield running


def one_flow(lab):
    """h1 -> h2 and back (a bisection of two ranks), one QP each way; the marks per port."""
    before = queue_snapshot(lab)
    run = run_collective(lab, CollectiveSpec("bisection", sizes=(512 * 1024,), hosts=("h1", "h2"),
                                             iterations=1, warmup=0))
    after = queue_snapshot(lab)
    return run, after, queue_delta(after, before, "marks"), queue_delta(after, before, "tx_bytes")


def uplinks(lab, leaf="l1"):
    return [p.name for p in lab.queues.ports if p.node == leaf and p.peer_node.startswith("s")]


def test_the_groups_are_written_from_the_routes(lab):
    table = lab.queues.datapath.ar_groups
    keys = table.keys()
    l1 = lab.queues.node_ids["l1"]
    mine = [k for k in keys if k.node == l1]
    assert len(mine) == 1                          # towards l2's /24: both uplinks
    group = table.lookup(mine[0])
    assert sorted(lab.queues.ports[i].name for i in group.idx[:group.n]) == sorted(uplinks(lab))


def test_one_deep_uplink_beside_an_idle_one_is_marked_by_step_not_by_ar(lab):
    run, after, marks, sent = one_flow(lab)
    busy = [p for p in uplinks(lab) if sent.get((p, "lossless"), 0) > 100_000]
    idle = [p for p in uplinks(lab) if sent.get((p, "lossless"), 0) < 10_000]
    assert len(busy) == 1 and len(idle) == 1, sent
    assert after[(busy[0], "lossless")]["occ_hwm"] >= KMIN         # it was deep past kmin...
    assert marks == {}, marks                                      # ...and nothing was marked
    assert run.sizes[0]["counters"].get("ce_marked", 0) == 0
    lab.queues.set_ecn("leaf", mode="step")
    try:
        _run, _after, marks, sent = one_flow(lab)
    finally:
        lab.queues.set_ecn("leaf", reset=True)
    hot = [p for p in uplinks(lab) if sent.get((p, "lossless"), 0) > 100_000]
    assert hot and marks.get((hot[0], "lossless"), 0) > 0, marks


def test_with_the_idle_members_cable_down_ar_marks_the_one_left(lab):
    _run, _after, _marks, sent = one_flow(lab)
    idle = next(p for p in uplinks(lab) if sent.get((p, "lossless"), 0) < 10_000)
    spine = lab.queues.by_name[idle].peer_node
    lab.set_link("l1", spine, up=False)
    try:
        l1 = lab.queues.node_ids["l1"]
        assert not [k for k in lab.queues.datapath.ar_groups.keys() if k.node == l1]
        run, _after, marks, sent = one_flow(lab)
        busy = next(p for p in uplinks(lab) if sent.get((p, "lossless"), 0) > 100_000)
        assert busy != idle
        assert marks.get((busy, "lossless"), 0) > 0, marks
        assert run.sizes[0]["counters"]["ce_marked"] > 0
    finally:
        lab.set_link("l1", spine, up=True)
    assert len([k for k in lab.queues.datapath.ar_groups.keys() if k.node == l1]) == 1
