"""A leaf-spine link fails under load and comes back: ECMP reroutes and then uses it again."""

import statistics

import pytest

from fabriclab.lab.lab import Lab
from fabriclab.topologies.spec import FabricSpec
from fabriclab.traffic.allpairs import all_pairs_plan
from fabriclab.traffic.launcher import run_traffic

pytestmark = pytest.mark.lab

SPEC = FabricSpec(name="t-failover", leaves=2, spines=2, hosts_per_leaf=2,
                  host_rate_mbps=10, fabric_rate_mbps=10)


@pytest.fixture(scope="module")
def lab():
    with Lab(SPEC, routing="ecmp") as running:
        yield running


def _mean(points, start, end):
    values = [mbps for t, mbps in points if start <= t <= end]
    assert values, f"no samples between {start} and {end} s"
    return statistics.fmean(values)


def test_paths_follow_link_state(lab):
    assert len(lab.paths("h1", "h3")) == 2
    lab.link_down("l1", "s1")
    try:
        paths = lab.paths("h1", "h3")
        assert [[link.label for link in p] for p in paths] == [["l1-s2", "l2-s2"]]
        # l1's ports 1-2 face hosts, port 3 is its uplink to s1 (s1's port 1)
        assert lab.down_links() == {("l1", 3, "s1", 1)}
    finally:
        lab.link_up("l1", "s1")
    assert len(lab.paths("h1", "h3")) == 2
    assert not lab.down_links()


def test_traffic_continues_over_the_other_spine_and_returns(lab):
    plan = all_pairs_plan(lab.fabric, load=0.5, flows_per_pair=4)
    up_l1_s1 = lab.fabric.find_link("l1", "s1")[0]
    up_l1_s2 = lab.fabric.find_link("l1", "s2")[0]
    actions = [(2.0, lambda: lab.link_down("l1", "s1")), (4.0, lambda: lab.link_up("l1", "s1"))]
    run = run_traffic(lab, plan, duration_s=6.0, actions=actions, sample_interval_s=0.2)
    via_s1 = run.series(up_l1_s1.a_intf)            # l1 -> s1
    via_s2 = run.series(up_l1_s2.a_intf)            # l1 -> s2
    s1_to_l1 = run.series(up_l1_s1.b_intf)          # s1 -> l1, fed by l2's choice of spine
    s2_to_l1 = run.series(up_l1_s2.b_intf)

    # 16 flows per direction hash over two spines: both carry traffic before the failure.
    assert _mean(via_s1, 0.4, 1.9) > 0.5 and _mean(via_s2, 0.4, 1.9) > 0.5
    assert _mean(s1_to_l1, 0.4, 1.9) > 0.5
    # While down (after the controller reprogrammed), nothing uses s1 to or from l1 ...
    assert _mean(via_s1, 2.6, 3.9) < 0.05
    assert _mean(s1_to_l1, 2.6, 3.9) < 0.05
    # ... and the cross-leaf load moved to s2 rather than vanishing.
    cross_leaf = sum(f["rate_mbps"] for f in plan["h1"] + plan["h2"] if f["dst"].startswith("10.1.2."))
    assert _mean(via_s2, 2.6, 3.9) == pytest.approx(cross_leaf, rel=0.25)
    assert _mean(s2_to_l1, 2.6, 3.9) == pytest.approx(cross_leaf, rel=0.25)
    # After it comes back, the same hash puts flows on s1 again.
    assert _mean(via_s1, 4.6, 6.0) > 0.5
    assert _mean(s1_to_l1, 4.6, 6.0) > 0.5
    # Only packets in flight at the failure are lost.
    assert run.totals()["loss"] < 0.05, run.totals()
    assert [a["at_s"] for a in run.actions] == [2.0, 4.0]
