"""Link utilization and balance from counter snapshots made by hand: no root, no network.

A snapshot is what `telemetry.snapshot` returns; here the counters are written out so that every
Mbit/s, utilization and drop count below can be checked with a pencil. Reading them from the
kernel is test_counters.py's.
"""

import math

import pytest

from fabriclab.measure.telemetry import COUNTERS, balance, buffer_drops, link_utilization, max_mean_ratio
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import FabricSpec


def small_fabric(**fields):
    """2 leaves x 2 spines, one host per leaf: four fabric links, eight directions."""
    base = dict(name="t", leaves=2, spines=2, hosts_per_leaf=1, host_rate_mbps=10.0,
                fabric_rate_mbps=20.0)
    return Fabric(FabricSpec(**{**base, **fields}))


def counters(tx_bytes):
    """One interface's counters; rx is deliberately different so a mixed-up counter shows."""
    values = dict.fromkeys(COUNTERS, 0)
    values["tx_bytes"] = tx_bytes
    values["rx_bytes"] = 3 * tx_bytes + 12345
    return values


def snap(time, tx, drops=None):
    return {"time": time, "counters": {intf: counters(n) for intf, n in tx.items()},
            "drops": drops or {}, "cpu": {"time": time, "total": 0, "idle": 0, "ovs": None}}


def fabric_intfs(fabric):
    return [intf for link in fabric.fabric_links for intf in (link.a_intf, link.b_intf)]


def bytes_for(mbps, seconds):
    return int(mbps * 1e6 * seconds / 8)


def by_key(rows):
    return {(r["link"], r["direction"]): r for r in rows}


# -- link_utilization -----------------------------------------------------------------------------

def test_every_fabric_link_gives_one_row_per_direction():
    fabric = small_fabric(parallel_links=2)
    intfs = fabric_intfs(fabric)
    rows = link_utilization(fabric, snap(0.0, dict.fromkeys(intfs, 0)),
                            snap(1.0, dict.fromkeys(intfs, 1000)))
    assert len(rows) == 2 * len(fabric.fabric_links) == 16
    keys = by_key(rows)
    assert len(keys) == len(rows)
    for link in fabric.fabric_links:
        up, down = keys[(link.label, "up")], keys[(link.label, "down")]
        assert (up["from"], up["to"], up["intf"]) == (link.a, link.b, link.a_intf)
        assert (down["from"], down["to"], down["intf"]) == (link.b, link.a, link.b_intf)
    # parallel members are separate rows with their own labels
    assert {"l1-s1", "l1-s1#2"} <= {r["link"] for r in rows}


def test_up_is_the_leaf_transmitting_and_down_the_spine():
    fabric = small_fabric()
    rows = by_key(link_utilization(fabric, snap(0.0, dict.fromkeys(fabric_intfs(fabric), 0)),
                                   snap(1.0, dict.fromkeys(fabric_intfs(fabric), 0))))
    assert rows[("l1-s1", "up")]["from"] == "l1" and rows[("l1-s1", "up")]["intf"].startswith("l1-")
    assert rows[("l1-s1", "down")]["from"] == "s1" and rows[("l1-s1", "down")]["intf"].startswith("s1-")


def test_mbps_and_utilization_from_tx_bytes_over_the_interval():
    fabric = small_fabric()
    link = fabric.find_link("l1", "s1")[0]
    intfs = fabric_intfs(fabric)
    before = snap(100.0, {intf: 1_000_000 for intf in intfs})
    after_tx = {intf: 1_000_000 for intf in intfs}
    after_tx[link.a_intf] += bytes_for(5.0, 2.0)     # 5 Mbit/s up for 2 s
    after_tx[link.b_intf] += bytes_for(15.0, 2.0)    # 15 Mbit/s down
    rows = by_key(link_utilization(fabric, before, snap(102.0, after_tx)))
    up, down = rows[("l1-s1", "up")], rows[("l1-s1", "down")]
    assert up["mbps"] == pytest.approx(5.0)
    assert down["mbps"] == pytest.approx(15.0)
    # utilization is against the fabric link rate (20), not the host rate (10)
    assert up["utilization"] == pytest.approx(0.25)
    assert down["utilization"] == pytest.approx(0.75)
    idle = [r for key, r in rows.items() if key[0] != "l1-s1"]
    assert len(idle) == 6 and all(r["mbps"] == 0 and r["utilization"] == 0 for r in idle)


def test_drops_are_the_increase_of_the_buffer_counter():
    fabric = small_fabric()
    link = fabric.find_link("l1", "s1")[0]
    intfs = fabric_intfs(fabric)
    before = snap(0.0, dict.fromkeys(intfs, 0), drops={link.a_intf: 3})
    after = snap(1.0, dict.fromkeys(intfs, 0), drops={link.a_intf: 10, link.b_intf: 4})
    rows = by_key(link_utilization(fabric, before, after))
    assert rows[("l1-s1", "up")]["drops"] == 7
    assert rows[("l1-s1", "down")]["drops"] == 4       # no reading before counts as 0
    assert sum(r["drops"] for r in rows.values()) == 11


def test_buffer_drops_split_fabric_links_from_host_facing_ports():
    fabric = small_fabric()
    link = fabric.find_link("l1", "s1")[0]
    host_port = next(p for p in fabric.switch_ports("l1").values() if p not in fabric_intfs(fabric))
    before = snap(0.0, {}, drops={link.a_intf: 2, host_port: 5})
    after = snap(1.0, {}, drops={link.a_intf: 3, link.b_intf: 1, host_port: 9})
    assert buffer_drops(fabric, before, after) == {"fabric": 2, "host_ports": 4, "total": 6}
    assert buffer_drops(fabric, after, after)["total"] == 0


def test_interfaces_missing_from_either_snapshot_are_skipped():
    fabric = small_fabric()
    l1s1 = fabric.find_link("l1", "s1")[0]
    l2s2 = fabric.find_link("l2", "s2")[0]
    before_tx = dict.fromkeys(fabric_intfs(fabric), 0)
    after_tx = dict(before_tx)
    del after_tx[l1s1.a_intf]           # gone by the second reading
    del before_tx[l2s2.b_intf]          # not there at the first
    rows = by_key(link_utilization(fabric, snap(0.0, before_tx), snap(1.0, after_tx)))
    assert len(rows) == 6
    assert ("l1-s1", "up") not in rows and ("l2-s2", "down") not in rows
    assert ("l1-s1", "down") in rows and ("l2-s2", "up") in rows


@pytest.mark.parametrize("later", [100.0, 99.5])
def test_snapshots_out_of_order_raise(later):
    fabric = small_fabric()
    tx = dict.fromkeys(fabric_intfs(fabric), 0)
    with pytest.raises(ValueError):
        link_utilization(fabric, snap(100.0, tx), snap(later, tx))


# -- max_mean_ratio and balance -------------------------------------------------------------------

@pytest.mark.parametrize("values, expected", [
    ([5.0, 5.0, 5.0, 5.0], 1.0),
    ([1.0, 3.0], 1.5),
    ([0.0, 0.0, 6.0], 3.0),
    ((v for v in [2.0, 4.0]), 1.333),       # any iterable, read once
])
def test_max_mean_ratio(values, expected):
    assert max_mean_ratio(values) == expected


@pytest.mark.parametrize("values", [[], [0.0], [0, 0, 0]])
def test_max_mean_ratio_is_none_without_load(values):
    assert max_mean_ratio(values) is None


def rows_of(up, down):
    return ([{"link": f"u{i}", "direction": "up", "mbps": v} for i, v in enumerate(up)]
            + [{"link": f"d{i}", "direction": "down", "mbps": v} for i, v in enumerate(down)])


def test_balance_takes_one_direction_only():
    rows = rows_of([1.0, 2.0, 3.0], [4.0, 4.0])
    up = balance(rows)
    assert up == {"direction": "up", "links": 3, "mean_mbps": 2.0, "max_mbps": 3.0, "min_mbps": 1.0,
                  "stdev_mbps": round(math.sqrt(2 / 3), 3), "max_mean_ratio": 1.5}
    down = balance(rows, "down")
    assert down["links"] == 2 and down["max_mean_ratio"] == 1.0 and down["stdev_mbps"] == 0.0


def test_balance_of_a_direction_without_rows_is_empty():
    assert balance(rows_of([1.0], []), "down") == {}
    assert balance([]) == {}


def test_balance_of_measured_rows():
    fabric = small_fabric()
    intfs = fabric_intfs(fabric)
    after = {intf: 0 for intf in intfs}
    for link, mbps in zip(fabric.fabric_links, [2.0, 2.0, 2.0, 6.0]):
        after[link.a_intf] = bytes_for(mbps, 1.0)
    rows = link_utilization(fabric, snap(0.0, dict.fromkeys(intfs, 0)), snap(1.0, after))
    up = balance(rows, "up")
    assert up["links"] == 4 and up["max_mbps"] == 6.0 and up["max_mean_ratio"] == 2.0
    assert balance(rows, "down")["max_mean_ratio"] is None      # nothing sent downwards

