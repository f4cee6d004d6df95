"""The all-pairs plan, the RoCE path MTU, and the launcher's accounting of agent results.

All pure: plans are checked against the fabric graph, and TrafficRun is fed results dicts written
by hand in the shape the traffic agent reports (see traffic/generator.py's docstring).
"""

import itertools
from collections import Counter, defaultdict

import pytest

from fabriclab.errors import LabError
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import MAX_MTU, MIN_MTU, FabricSpec, load_spec
from fabriclab.traffic import roce
from fabriclab.traffic.allpairs import FIRST_QPN, all_pairs_plan, peers
from fabriclab.traffic.launcher import TrafficRun

FABRICS = {
    "leafspine": dict(leaves=2, spines=2, hosts_per_leaf=2),
    "dual_nic": dict(leaves=3, spines=2, hosts_per_leaf=1, nics_per_host=2),
    "multiplane": dict(kind="multiplane", planes=2, leaves=2, spines=2, hosts_per_leaf=2,
                       nics_per_host=2),
}


@pytest.fixture(params=sorted(FABRICS), ids=sorted(FABRICS))
def fabric(request):
    return Fabric(FabricSpec(name="t", host_rate_mbps=20.0, **FABRICS[request.param]))


def all_flows(plan):
    return [flow for flows in plan.values() for flow in flows]


# -- all_pairs_plan -------------------------------------------------------------------------------

@pytest.mark.parametrize("flows_per_pair", [1, 3])
def test_flow_count_is_ports_times_peers_times_flows_per_pair(fabric, flows_per_pair):
    plan = all_pairs_plan(fabric, flows_per_pair=flows_per_pair)
    assert set(plan) == set(fabric.hosts)
    hosts = len(fabric.hosts)
    ports = sum(len(h.ports) for h in fabric.hosts.values())
    assert len(all_flows(plan)) == ports * (hosts - 1) * flows_per_pair
    for name, flows in plan.items():
        assert len(flows) == len(fabric.hosts[name].ports) * (hosts - 1) * flows_per_pair


def test_flow_count_by_hand():
    fabric = Fabric(FabricSpec(name="t", leaves=2, spines=2, hosts_per_leaf=2))
    assert len(all_flows(all_pairs_plan(fabric, flows_per_pair=2))) == 4 * 3 * 2


@pytest.mark.parametrize("load, flows_per_pair", [(0.8, 1), (1.0, 3), (0.05, 2)])
def test_each_port_offers_load_times_its_rate(fabric, load, flows_per_pair):
    plan = all_pairs_plan(fabric, load=load, flows_per_pair=flows_per_pair)
    offered = defaultdict(float)
    for flow in all_flows(plan):
        offered[flow["src"]] += flow["rate_mbps"]
    assert set(offered) == set(fabric.ip_owner)          # every port sends
    for total in offered.values():
        assert total == pytest.approx(load * fabric.spec.host_rate_mbps, abs=1e-4)
    # and each port's flows share its rate equally
    for src, flows in itertools.groupby(sorted(all_flows(plan), key=lambda f: f["src"]),
                                        key=lambda f: f["src"]):
        assert len({f["rate_mbps"] for f in flows}) == 1


def test_peers_are_the_same_rail_on_every_other_host(fabric):
    plan = all_pairs_plan(fabric)
    for flow in all_flows(plan):
        src, dst = fabric.ip_owner[flow["src"]], fabric.ip_owner[flow["dst"]]
        assert src.host != dst.host
        assert (src.plane, src.nic) == (dst.plane, dst.nic)
    for host in fabric.hosts.values():
        for port in host.ports:
            dests = {f["dst"] for f in plan[host.name] if f["src"] == port.ip}
            assert {fabric.ip_owner[d].host for d in dests} == set(fabric.hosts) - {host.name}


def test_peers_function_on_a_multiplane_dual_nic_fabric():
    fabric = Fabric(FabricSpec(name="t", **FABRICS["multiplane"]))
    port = next(p for p in fabric.hosts["h1"].ports if (p.nic, p.plane) == (1, 2))
    found = peers(fabric, port)
    assert [p.host for p in found] == ["h2", "h3", "h4"]
    assert all((p.nic, p.plane) == (1, 2) for p in found)


def test_flow_ids_are_unique_and_name_both_ends(fabric):
    flows = all_flows(all_pairs_plan(fabric, flows_per_pair=2))
    ids = [f["id"] for f in flows]
    assert len(set(ids)) == len(ids)
    for f in flows:
        src = fabric.ip_owner[f["src"]].intf
        dst = fabric.ip_owner[f["dst"]].intf
        assert f["id"].startswith(f"{src}>{dst}#")


@pytest.mark.parametrize("flows_per_pair", [1, 4])
def test_receiver_key_is_unique_per_flow(fabric, flows_per_pair):
    """The launcher matches what a receiver counted to a flow on (src, dst, dst_qpn)."""
    flows = all_flows(all_pairs_plan(fabric, flows_per_pair=flows_per_pair))
    keys = Counter((f["src"], f["dst"], f["dst_qpn"]) for f in flows)
    assert max(keys.values()) == 1


def test_qpns_are_valid_and_each_connection_has_both_ends(fabric):
    flows = all_flows(all_pairs_plan(fabric, flows_per_pair=3))
    for f in flows:
        assert FIRST_QPN <= f["src_qpn"] <= roce.QPN_MASK
        assert FIRST_QPN <= f["dst_qpn"] <= roce.QPN_MASK
        assert f["sport"] is None            # derived from the QP pair by the agent
    # A QP at each end per connection: the reverse flow uses the same two QPs swapped.
    ends = {(f["src"], f["dst"], f["src_qpn"], f["dst_qpn"]) for f in flows}
    for src, dst, sq, dq in ends:
        assert (dst, src, dq, sq) in ends
    # A sender never uses one local QP for two connections.
    local = Counter((f["src"], f["src_qpn"]) for f in flows)
    assert max(local.values()) == 1


def test_first_qpn_skips_the_reserved_qps():
    assert FIRST_QPN == 0x11


@pytest.mark.parametrize("load", [0, 0.0, -0.5, 1.0001, 2, float("nan")])
def test_load_outside_zero_to_one_is_refused(load):
    fabric = Fabric(FabricSpec(name="t"))
    with pytest.raises(LabError, match="load must be in"):
        all_pairs_plan(fabric, load=load)


def test_more_flows_than_one_machine_runs_are_refused_before_any_is_made():
    spec = FabricSpec(name="wide", leaves=8, spines=2, hosts_per_leaf=8)     # 64 hosts, 4032 pairs
    assert len(sum(all_pairs_plan(Fabric(spec), flows_per_pair=16).values(), [])) == 64512
    with pytest.raises(LabError, match="is 258048 flows; one machine's agents run at most 65536"):
        all_pairs_plan(Fabric(spec), flows_per_pair=64)


def test_full_load_is_allowed():
    fabric = Fabric(FabricSpec(name="t"))
    assert all_pairs_plan(fabric, load=1.0)


@pytest.mark.parametrize("flows_per_pair", [0, -1, 1.5, "2", None])
def test_flows_per_pair_must_be_a_positive_whole_number(flows_per_pair):
    fabric = Fabric(FabricSpec(name="t"))
    with pytest.raises(LabError, match="flows per pair"):
        all_pairs_plan(fabric, flows_per_pair=flows_per_pair)


def test_one_host_fabric_is_refused_by_name():
    fabric = Fabric(FabricSpec(name="solo", leaves=1, spines=1, hosts_per_leaf=1))
    with pytest.raises(LabError, match="'solo' has one host"):
        all_pairs_plan(fabric)


def test_shipped_tiny_plan():
    fabric = Fabric(load_spec("tiny"))
    plan = all_pairs_plan(fabric)
    assert plan == {
        "h1": [{"id": "h1-n0>h2-n0#0", "src": "10.1.1.1", "dst": "10.1.2.1", "src_qpn": 0x13,
                "dst_qpn": 0x12, "sport": None, "rate_mbps": 8.0}],
        "h2": [{"id": "h2-n0>h1-n0#0", "src": "10.1.2.1", "dst": "10.1.1.1", "src_qpn": 0x12,
                "dst_qpn": 0x13, "sport": None, "rate_mbps": 8.0}],
    }


# -- path_mtu_for ---------------------------------------------------------------------------------

OVERHEAD = roce.ROCE_OVERHEAD + roce.RETH_LEN


def test_overhead_of_a_write_first_packet():
    assert OVERHEAD == 20 + 8 + 12 + 16 + 4      # IPv4, UDP, BTH, RETH, ICRC


@pytest.mark.parametrize("mtu, payload", [
    (9000, 4096),
    (1500, 1024),
    (4200, 4096),
    (4096 + OVERHEAD, 4096),
    (4096 + OVERHEAD - 1, 2048),
    (2048 + OVERHEAD, 2048),
    (2048 + OVERHEAD - 1, 1024),
    (1024 + OVERHEAD - 1, 512),
    (576, 512),
    (256 + OVERHEAD, 256),
])
def test_path_mtu_for(mtu, payload):
    assert roce.path_mtu_for(mtu) == payload


@pytest.mark.parametrize("mtu", [256 + OVERHEAD - 1, 256, 0])
def test_path_mtu_for_too_small_an_mtu(mtu):
    with pytest.raises(ValueError, match=str(mtu)):
        roce.path_mtu_for(mtu)


def test_every_mtu_a_spec_accepts_carries_roce():
    assert roce.path_mtu_for(MIN_MTU) == 1024
    assert roce.path_mtu_for(MAX_MTU) == 4096


# -- TrafficRun accounting ------------------------------------------------------------------------

A, B = "10.1.1.1", "10.1.2.1"


def flow(fid, src, dst, dst_qpn, rate=4.0):
    return {"id": fid, "src": src, "dst": dst, "src_qpn": 0x20, "dst_qpn": dst_qpn, "sport": None,
            "rate_mbps": rate}


def received(src, dst, dst_qpn, packets, oos=0, late=0, wire_bytes=None):
    return {"src": src, "sport": 50000, "dst": dst, "dst_qpn": dst_qpn, "packets": packets,
            "bytes": packets * 1024, "wire_bytes": packets * 1000 if wire_bytes is None else wire_bytes,
            "oos": oos, "late": late, "ce": 0, "first": 1.0, "last": 2.0}


def sent(packets):
    return {"packets": packets, "wire_bytes": packets * 1000}


def make_run():
    plan = {
        "h1": [flow("a", A, B, 0x12), flow("b", A, B, 0x13)],
        "h2": [flow("c", B, A, 0x12)],
    }
    results = {
        "h1": {"sent": {"a": sent(100), "b": sent(50)},
               "received": [received(B, A, 0x12, 40, oos=2, late=1)]},
        "h2": {"sent": {"c": sent(40)},
               # one record for flow a only: flow b (same addresses, other QP) got nothing
               "received": [received(A, B, 0x12, 90, oos=3, late=2, wire_bytes=250_000)]},
    }
    return TrafficRun(plan, duration_s=2.0, start_mono=1000.0, results=results)


def rows_by_id(run):
    return {r["id"]: r for r in run.flow_rows()}


def test_flow_rows_match_receivers_on_source_destination_and_qp():
    rows = rows_by_id(make_run())
    assert rows["a"]["sent_packets"] == 100 and rows["a"]["received_packets"] == 90
    assert rows["a"]["loss"] == 0.1
    assert (rows["a"]["oos"], rows["a"]["late"]) == (3, 2)
    assert rows["a"]["delivered_mbps"] == 1.0          # 250 kB in 2 s
    assert rows["c"]["received_packets"] == 40 and rows["c"]["loss"] == 0.0
    assert rows["c"]["rate_mbps"] == 4.0 and (rows["c"]["src"], rows["c"]["dst"]) == (B, A)


def test_a_flow_without_a_receiver_entry_received_nothing():
    b = rows_by_id(make_run())["b"]
    assert b["sent_packets"] == 50 and b["received_packets"] == 0
    assert b["loss"] == 1.0
    assert (b["oos"], b["late"], b["delivered_mbps"]) == (0, 0, 0.0)


def test_a_host_without_a_result_sent_nothing_and_has_no_loss():
    run = make_run()
    del run.results["h2"]
    c = rows_by_id(run)["c"]
    assert c["sent_packets"] == 0 and c["loss"] is None
    assert rows_by_id(run)["a"]["received_packets"] == 0     # h2 was a's receiver


def test_totals_add_up_the_flows():
    totals = make_run().totals()
    assert totals == {"flows": 3, "sent_packets": 190, "received_packets": 130,
                      "loss": round(1 - 130 / 190, 5), "oos": 5, "late": 3,
                      "delivered_mbps": round(1.0 + 40 * 1000 * 8 / 2.0 / 1e6, 3)}


def test_totals_of_a_run_that_sent_nothing():
    run = TrafficRun({"h1": [flow("a", A, B, 0x12)]}, duration_s=1.0, start_mono=0.0)
    totals = run.totals()
    assert totals["flows"] == 1 and totals["sent_packets"] == 0 and totals["loss"] is None


def test_cpu_is_the_load_over_the_window():
    run = TrafficRun({}, duration_s=1.0, start_mono=0.0)
    run.window = ({"cpu": {"time": 0.0, "total": 100, "idle": 80, "ovs": None}},
                  {"cpu": {"time": 1.0, "total": 200, "idle": 130, "ovs": None}})
    assert run.cpu() == {"machine": 0.5, "ovs_forwarding": None}
