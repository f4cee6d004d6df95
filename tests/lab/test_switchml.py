"""SwitchML on a real fabric: workers stream to an aggregator beside their ToR through OpenFlow
steering; int32 results equal numpy's, float32 stay within the quantization bound, random loss on
every link is recovered, and two levels (leaf aggregators under a spine's) give the single rack's
result bit for bit."""

import pytest

from fabriclab.lab import linkloss
from fabriclab.errors import LabError
from fabriclab.lab.lab import Lab
from fabriclab.switchml.launcher import AggregationSpec, run_aggregation
from fabriclab.topologies.spec import FabricSpec

pytestmark = pytest.mark.lab

# 2 leaves x 4 hosts: a rack is up to 3 workers and the aggregator on the leaf's last host.
SPEC = FabricSpec(name="t-sml", leaves=2, spines=2, hosts_per_leaf=4,
                  host_rate_mbps=10, fabric_rate_mbps=10, real_host_rate_mbps=400_000)


@pytest.fixture(scope="module")
def lab():
    with Lab(SPEC) as running:
        yield running


@pytest.mark.parametrize("elements, workers", [(1000, ("h1", "h2")), (30000, ("h1", "h2", "h3")),
                                               (257, ("h1", "h3"))])
def test_int32_aggregation_is_exact(lab, elements, workers):
    r = run_aggregation(lab, AggregationSpec(elements=elements, workers=workers, iterations=2))
    assert r["verify"]["ok"] and r["verify"]["exact"] and r["workers"] == len(workers)
    assert r["aggregators"] == {"l1": "h4"}
    assert len(r["tat_s"]["per_iteration"]) == 2 and r["tat_s"]["p50"] > 0
    counters = r["aggregator_counters"]["agg-l1"]
    chunks = -(-elements // r["k"])
    assert counters["completed"] >= 2 * chunks                 # every chunk of both iterations
    assert counters["multicast"] == counters["completed"]      # one copy each, the switch fans out


def test_float32_stays_within_the_quantization_bound(lab):
    r = run_aggregation(lab, AggregationSpec(elements=20000, dtype="float32", iterations=1))
    v = r["verify"]
    assert v["ok"] and not v["exact"] and 0 < v["max_error"] <= v["bound"]


def test_loss_on_every_link_is_recovered_with_the_right_result(lab, figure):
    clean = run_aggregation(lab, AggregationSpec(elements=20000, iterations=1, seed=7))
    linkloss.set_loss(lab, lab.fabric.links, 0.02)
    try:
        lossy = run_aggregation(lab, AggregationSpec(elements=20000, iterations=1, seed=7))
        dropped = sum(d for d, _ in linkloss.counters(lab).values())
    finally:
        linkloss.set_loss(lab, lab.fabric.links, 0)
    assert dropped > 0 and lossy["retransmissions"] > 0
    assert lossy["verify"]["result_sha256"] == clean["verify"]["result_sha256"]
    # rare early timers only
    assert figure("loss-free resends / packets sent", clean["retransmissions"] / clean["packets_sent"]) <= 0.05


@pytest.mark.parametrize("dtype", ["int32", "float32"])
def test_two_levels_give_the_single_racks_result(lab, dtype):
    single = run_aggregation(lab, AggregationSpec(elements=5000, dtype=dtype, workers=("h1", "h2", "h3"),
                                                  iterations=1, seed=3))
    tiered = run_aggregation(lab, AggregationSpec(elements=5000, dtype=dtype, workers=("h1", "h2", "h5"),
                                                  hierarchy=True, iterations=1, seed=3))
    assert tiered["aggregators"] == {"l1": "h4", "l2": "h8"} and "agg-root" in tiered["aggregator_counters"]
    assert tiered["aggregator_counters"]["agg-root"]["completed"] > 0
    assert tiered["verify"]["result_sha256"] == single["verify"]["result_sha256"]


@pytest.mark.parametrize("spec, message", [
    (AggregationSpec(dtype="int8"), "dtype must be one of int32, float32"),
    (AggregationSpec(workers=("h1",)), "needs at least two workers"),
    (AggregationSpec(workers=("h1", "h9")), "host 'h9' is not in fabric"),
    (AggregationSpec(workers=("h1", "h5")), "without hierarchy the workers must share a leaf"),
    (AggregationSpec(elements=0), "elements must be a positive integer"),
    (AggregationSpec(k=5000), "k must be 1..2238"),
])
def test_bad_specs_fail_in_one_line_before_anything_runs(lab, spec, message):
    before = lab.controller.status().get("steering", {}).get("generation")
    with pytest.raises(LabError, match=message):
        run_aggregation(lab, spec)
    assert lab.controller.status().get("steering", {}).get("generation") == before
