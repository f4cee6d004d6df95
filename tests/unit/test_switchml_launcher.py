"""SwitchML's placement, steering plan and defaults on a fabric, without a network."""

import pytest

from fabriclab.lab import portloss
from fabriclab.apps.steering import steering_state
from fabriclab.errors import LabError
from fabriclab.switchml import launcher
from fabriclab.switchml.launcher import AggregationSpec
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import FabricSpec

FABRIC = Fabric(FabricSpec(name="t-sml", leaves=2, spines=2, hosts_per_leaf=4,
                           host_rate_mbps=10, fabric_rate_mbps=10))


def test_one_rack_by_default_and_every_leaf_with_hierarchy():
    p = launcher.place(FABRIC, AggregationSpec())
    assert p.aggregators == {"l1": "h4"} and p.workers == {"l1": ["h1", "h2", "h3"]}
    p = launcher.place(FABRIC, AggregationSpec(hierarchy=True))
    assert p.aggregators == {"l1": "h4", "l2": "h8"} and p.workers["l2"] == ["h5", "h6", "h7"]
    p = launcher.place(FABRIC, AggregationSpec(workers=("h2", "h3"), aggregators=("h1",)))
    assert p.aggregators == {"l1": "h1"} and p.workers == {"l1": ["h2", "h3"]}
    with pytest.raises(LabError, match="h4 cannot be both a worker and its leaf's aggregator"):
        launcher.place(FABRIC, AggregationSpec(workers=("h1", "h4")))
    with pytest.raises(LabError, match="hierarchy needs workers under at least two leaves"):
        launcher.place(FABRIC, AggregationSpec(workers=("h1", "h2"), hierarchy=True))


def test_the_plan_steers_each_leaf_and_with_hierarchy_the_spine():
    p = launcher.place(FABRIC, AggregationSpec(hierarchy=True))
    plan = launcher.steering_plan(FABRIC, p, hierarchy=True)
    services = {(e["switch"], e["address"], e["udp_dst"]) for e in plan["services"]}
    assert services == {("l1", "10.1.255.1", launcher.PORT), ("l2", "10.1.255.2", launcher.PORT),
                        ("s1", "10.1.255.101", launcher.ROOT_PORT)}
    spine_group = next(g for g in plan["groups"] if g["switch"] == "s1")
    assert [m["ip"] for m in spine_group["members"]] == [FABRIC.hosts[h].ports[0].ip for h in ("h4", "h8")]
    assert {(r["switch"], r["address"]) for r in plan["routes"]} == {
        ("l1", "10.1.255.101"), ("l2", "10.1.255.101"), ("l1", "10.1.254.101")}
    assert plan["root"]["host"] == "h4"
    steering_state(FABRIC, plan)              # the controller would take it


def test_defaults_follow_the_buffer_and_the_link_rate():
    wire = 20 + 4 * 256 + 28 + 14
    assert launcher.default_slots(FABRIC, 3, 256) == FABRIC.spec.buffers.leaf // 2 // (3 * wire)
    assert launcher.default_slots(FABRIC, 1000, 256) == 1
    ms = launcher.default_timeout_ms(FABRIC, 10, 256)
    assert ms == pytest.approx(3 * 2 * 10 * wire * 8 / 10e6 * 1e3)
    assert launcher.default_timeout_ms(FABRIC, 1, 1) == 10.0            # a floor for tiny pools


def test_loss_threshold_is_the_fraction_of_32_bits():
    assert portloss.threshold(0) == 0 and portloss.threshold(0.5) == 2**31
    assert portloss.threshold(1) == 2**32 - 1
    with pytest.raises(LabError, match="loss must be a fraction in 0..1"):
        portloss.threshold(1.5)
