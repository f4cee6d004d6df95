"""A leaf-spine link fails under load and comes back: ECMP reroutes and then uses it again."""

import pytest

from fabriclab.lab.lab import Lab
from fabriclab.topologies.spec import FabricSpec
from fabriclab.traffic.allpairs import AllPairsSpec, all_pairs_plan
from fabriclab.workflows import faults as faults_mod
from fabriclab.workflows.plan import Job, Metrics, link_events, single_run

pytestmark = pytest.mark.lab

SPEC = FabricSpec(name="t-failover", leaves=2, spines=2, hosts_per_leaf=2,
                  host_rate_mbps=10, fabric_rate_mbps=10)


@pytest.fixture(scope="module")
def lab():
    with Lab(SPEC, routing="ecmp") as running:
        yield running


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


def test_traffic_continues_over_the_other_spine_and_returns(lab, run_plan, figure):
    """`run --link-down l1-s1@2 --link-up l1-s1@4` as a plan: the faults are on the run's timeline,
    counted from the moment the traffic starts, and the port series says where the bytes went."""
    workload = AllPairsSpec(duration_s=6.0, load=0.5, flows_per_pair=4)
    plan = single_run(SPEC.name, "run", SPEC, Job("traffic", workload),
                      faults=link_events(down=["l1-s1@2"], up=["l1-s1@4"]), metrics=Metrics(sample_ms=20, bin_ms=100))
    result = run_plan(plan, lab=lab)
    (run,) = result.runs
    via_s1 = lambda a, b: run.mean_mbps("l1>s1", a, b)          # noqa: E731 - l1 -> s1
    via_s2 = lambda a, b: run.mean_mbps("l1>s2", a, b)          # noqa: E731
    s1_to_l1 = lambda a, b: run.mean_mbps("s1>l1", a, b)        # noqa: E731 - fed by l2's choice of spine
    s2_to_l1 = lambda a, b: run.mean_mbps("s2>l1", a, b)        # noqa: E731

    # 16 flows per direction hash over two spines: both carry traffic before the failure.
    assert figure("l1>s1 Mbit/s before the failure", via_s1(0.4, 1.9)) > 0.5
    assert figure("l1>s2 Mbit/s before the failure", via_s2(0.4, 1.9)) > 0.5
    assert figure("s1>l1 Mbit/s before the failure", s1_to_l1(0.4, 1.9)) > 0.5
    # While down (after the controller reprogrammed), nothing uses s1 to or from l1 ...
    assert figure("l1>s1 Mbit/s while down", via_s1(2.6, 3.9)) < 0.05
    assert figure("s1>l1 Mbit/s while down", s1_to_l1(2.6, 3.9)) < 0.05
    # ... and the cross-leaf load moved to s2 rather than vanishing.
    flows = all_pairs_plan(lab.fabric, load=workload.load, flows_per_pair=workload.flows_per_pair)
    cross_leaf = sum(f["rate_mbps"] for f in flows["h1"] + flows["h2"] if f["dst"].startswith("10.1.2."))
    assert figure("l1>s2 Mbit/s while l1-s1 is down", via_s2(2.6, 3.9)) == pytest.approx(cross_leaf, rel=0.25)
    assert figure("s2>l1 Mbit/s while l1-s1 is down", s2_to_l1(2.6, 3.9)) == pytest.approx(cross_leaf, rel=0.25)
    # After it comes back, the same hash puts flows on s1 again.
    assert figure("l1>s1 Mbit/s after the repair", via_s1(4.6, 6.0)) > 0.5
    assert figure("s1>l1 Mbit/s after the repair", s1_to_l1(4.6, 6.0)) > 0.5
    # Only packets in flight at the failure are lost.
    traffic = run.record["jobs"]["traffic"]["traffic"]
    assert figure("all-pairs loss across the failover", traffic["loss"]) < 0.05, traffic
    down, up = run.record["faults"]
    assert down["at_s"] == pytest.approx(2.0, abs=0.1) and up["at_s"] == pytest.approx(4.0, abs=0.1)
    assert not lab.injected()["links_down"]


def test_a_loss_lifted_during_the_run_is_still_counted_in_its_results(lab, run_plan, figure):
    """Loss on every link for 1 s of a 3 s run: the timeline lifts it before the run ends, and
    what it dropped is still in the run's results."""
    faults = faults_mod.parse([{"at": 0.5, "loss": "fabric", "fraction": 0.2, "for": 1.0}])
    plan = single_run(SPEC.name, "run", SPEC, Job("traffic", AllPairsSpec(duration_s=3.0, load=0.3)), faults=faults)
    (run,) = run_plan(plan, lab=lab).runs
    (fault,) = run.record["faults"]
    assert fault["until_s"] is not None and fault["until_s"] < 3.0, fault
    assert run.record["link_loss"]["dropped_packets"] > 0, run.record["link_loss"]
    assert figure("all-pairs loss, 1 s of 20% link loss", run.record["jobs"]["traffic"]["traffic"]["loss"]) > 0.05
    assert lab.injected()["lossy"] == []
