"""Collectives on rail-optimized fabrics: the rail placement, PXN's relay through the sender's
host, and the count of where an iteration's bytes go. Pure: schedules run on the rank engine
in memory (test_schedules.simulate), fabrics are graphs."""

import dataclasses

import numpy as np
import pytest

from fabriclab.errors import LabError
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import FabricSpec, load_spec
from fabriclab.traffic import schedules as S
from fabriclab.traffic import softroce
from fabriclab.traffic.collective import CollectiveSpec, place_ranks, pxn_enabled, rail_traffic
from fabriclab.traffic.rank_driver import pxn_locality

from tests.unit.test_schedules import assert_outputs_match_reference, received, simulate

RAIL = Fabric(load_spec("rail_optimized"))          # 2 groups x 2 rails, 8 hosts x 2 NICs
RACK = Fabric(load_spec("meta_ai_zone"))            # the same counts cabled by rack
# rail-optimized AI zones joined by a super-spine tier: 2 pods x 2 rail groups x 2 rails
ZONES = Fabric(FabricSpec(name="rail-zones", kind="threetier", pods=2, leaves=4, spines=2, super_spines=2,
                          hosts_per_leaf=2, nics_per_host=2, cabling="rail"))


def ranks_of(fabric, **fields):
    return place_ranks(fabric, CollectiveSpec(**fields))


def locality(ranks):
    return [(r.host, r.nic) for r in ranks]


def crossing(schedule, where):
    """Transfers between two hosts on different NIC indexes."""
    return [t for t in schedule.transfers
            if where[t.src][0] != where[t.dst][0] and where[t.src][1] != where[t.dst][1]]


# -- placement ---------------------------------------------------------------------------------------

def test_rail_placement_runs_rail_by_rail_as_a_snake():
    ranks = ranks_of(RAIL, placement="rail")
    assert [(r.host, r.nic) for r in ranks] == (
        [(f"h{i}", 0) for i in range(1, 9)] + [(f"h{i}", 1) for i in range(8, 0, -1)])
    # every ring neighbour on another host shares the NIC index; rails change inside a host
    for a, b in zip(ranks, ranks[1:] + ranks[:1]):
        assert a.host == b.host or a.nic == b.nic


def test_rail_placement_groups_hosts_given_out_of_order():
    ranks = ranks_of(RAIL, placement="rail", hosts=("h5", "h1", "h6", "h2"))
    assert [r.host for r in ranks[:4]] == ["h1", "h2", "h5", "h6"]


def test_each_rank_keeps_its_nic_on_its_rail_leaf():
    for r in ranks_of(RAIL, placement="rail"):
        group = RAIL.hosts[r.host].group
        assert [p.leaf for p in r.ports] == [f"l{(group - 1) * 2 + r.nic + 1}"]


# -- PXN ---------------------------------------------------------------------------------------------

PXN_CASES = [(c, a) for c in S.COLLECTIVES for a in S.ALGORITHMS.get(c, ("ring",))]
# 3 hosts x 2 NICs in `order` (the ring changes rail between hosts) and 2 hosts x 3 NICs
LAYOUTS = {"3x2": [(f"h{h}", n) for h in range(3) for n in range(2)],
           "2x3": [(f"h{h}", n) for h in range(2) for n in range(3)]}


@pytest.mark.parametrize("collective,algorithm", PXN_CASES)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_pxn_relays_every_cross_rail_transfer_and_the_result_is_right(collective, algorithm, layout):
    where = LAYOUTS[layout]
    plain = S.build(collective, len(where), 12_000, algorithm=algorithm, piece_bytes=1024, seed=3,
                    channels=2)
    relayed = S.build(collective, len(where), 12_000, algorithm=algorithm, piece_bytes=1024, seed=3,
                      channels=2, pxn=where)
    assert not crossing(relayed, where)
    assert len(relayed.relays) == len(crossing(plain, where))
    for first, second in relayed.relays.items():
        a, b = relayed.transfers[first], relayed.transfers[second]
        assert where[a.src][0] == where[a.dst][0] == where[b.src][0]      # first hop in the host
        assert where[b.src][1] == where[b.dst][1]                          # second on one rail
        assert a.nbytes == b.nbytes and a.dst == b.src
    for seed in range(3):
        assert_outputs_match_reference(relayed, seed)


def test_pxn_in_place_keeps_the_result():
    where = LAYOUTS["3x2"]
    schedule = S.build("allreduce", 6, 6_000, in_place=True, pxn=where)
    memories, inputs, _ = simulate(schedule, seed=1)
    for got, want in zip(received(schedule, memories), S.reference_outputs(schedule, inputs)):
        np.testing.assert_array_equal(got, want)


def test_pxn_leaves_a_transfer_with_no_local_rank_on_the_peers_rail():
    where = [("a", 0), ("b", 1)]             # host a has no rank on NIC 1
    schedule = S.build("alltoall", 2, 64, pxn=where)
    assert not schedule.relays and len(crossing(schedule, where)) == 2


def test_pxn_needs_every_ranks_place():
    with pytest.raises(ValueError, match="host and NIC of each of the 4 ranks"):
        S.build("alltoall", 4, 64, pxn=[("a", 0)])


def test_rail_placement_needs_no_relay_on_an_even_rail_count():
    ranks = ranks_of(RAIL, placement="rail")
    schedule = S.build("allreduce", len(ranks), 1 << 16, pxn=locality(ranks))
    assert not schedule.relays


def test_agents_relay_by_the_launchers_rank_table():
    ranks = ranks_of(RAIL)
    table = [{"rank": r.rank, "host": r.host, "nic": r.nic} for r in ranks]
    assert pxn_locality(table) == locality(ranks)


# -- where the bytes go -------------------------------------------------------------------------------

def test_a_rail_ring_stays_on_its_rails():
    ranks = ranks_of(RAIL, placement="rail")
    n, size = len(ranks), 16 * 4096
    counts = rail_traffic(S.build("allreduce", n, size, pxn=locality(ranks)), ranks, RAIL)
    edge = 2 * (n - 1) * size // n              # what each ring edge carries per iteration
    # 16 ring edges: 12 inside a group on one rail leaf, 2 between the groups through the
    # spines (h4-h5 on each rail), 2 rail changes inside h8 and h1
    assert counts == {"scale_up_bytes": 2 * edge, "pxn_bytes": 0, "pxn_hops": 0,
                      "rail_local_bytes": 12 * edge, "cross_group_bytes": 2 * edge,
                      "cross_rail_bytes": 0}


def test_host_order_crosses_rails_unless_pxn_relays():
    ranks = ranks_of(RAIL)                      # h1n0 h1n1 h2n0 ...: h1n1 -> h2n0 changes rail
    n, size = len(ranks), 16 * 4096
    edge = 2 * (n - 1) * size // n
    plain = rail_traffic(S.build("allreduce", n, size), ranks, RAIL)
    assert plain["cross_rail_bytes"] == 8 * edge and plain["pxn_bytes"] == 0
    relayed = rail_traffic(S.build("allreduce", n, size, pxn=locality(ranks)), ranks, RAIL)
    assert relayed["cross_rail_bytes"] == 0
    assert relayed["pxn_bytes"] == 8 * edge and relayed["pxn_hops"] == 8 * 2 * (n - 1)
    # the relayed bytes reach the fabric on the receiver's rail: 6 hops inside a group, 2 across
    assert (relayed["rail_local_bytes"], relayed["cross_group_bytes"]) == (6 * edge, 2 * edge)
    assert relayed["scale_up_bytes"] == 8 * edge + 8 * edge      # h_n0 -> h_n1, and the relays


def test_rank_per_nic_alltoall_sends_nothing_across_rails_with_pxn():
    ranks = ranks_of(RAIL)
    n = len(ranks)
    size = n * 4096                             # 4 KiB to every rank
    counts = rail_traffic(S.build("alltoall", n, size, pxn=locality(ranks)), ranks, RAIL)
    # each rank sends to the 7 other hosts' rank on the other rail: relayed in its host
    assert counts["cross_rail_bytes"] == 0 and counts["pxn_hops"] == n * 7
    assert counts["pxn_bytes"] == n * 7 * 4096
    # between hosts every rank sends 14 blocks on the rail: 3 hosts per rail leaf, 4 across
    assert counts["rail_local_bytes"] == n * 2 * 3 * 4096
    assert counts["cross_group_bytes"] == n * 2 * 4 * 4096


def test_on_a_rack_fabric_a_nics_peers_share_its_leaf():
    ranks = ranks_of(RACK, placement="rail")
    counts = rail_traffic(S.build("allreduce", len(ranks), 1 << 16), ranks, RACK)
    assert counts["cross_rail_bytes"] == 0 and counts["rail_local_bytes"] > 0


# -- when PXN runs ------------------------------------------------------------------------------------

@pytest.mark.parametrize("fabric, pxn, backend, expected", [
    (RAIL, None, softroce.UDP, True),
    (RAIL, None, softroce.RXE, False),          # rxe devices reach each other through the fabric
    (RAIL, False, softroce.UDP, False),
    (RACK, None, softroce.UDP, False),
])
def test_pxn_is_on_where_the_fabric_has_rails_and_the_host_carries_the_hop(fabric, pxn, backend,
                                                                           expected):
    assert pxn_enabled(fabric, CollectiveSpec(pxn=pxn), backend) is expected


def test_pxn_asked_for_on_a_rack_fabric_is_refused():
    with pytest.raises(LabError, match="cabled by rack"):
        pxn_enabled(RACK, CollectiveSpec(pxn=True), softroce.UDP)


def test_pxn_asked_for_with_rxe_is_refused():
    with pytest.raises(LabError, match="pxn needs the udp backend"):
        pxn_enabled(RAIL, CollectiveSpec(pxn=True), softroce.RXE)
    assert ("pxn" in dict(softroce.udp_only_features(CollectiveSpec(pxn=True))))


@pytest.mark.parametrize("value", ["yes", 1, "true"])
def test_pxn_must_be_a_boolean(value):
    with pytest.raises(LabError, match="pxn"):
        dataclasses.replace(CollectiveSpec(), pxn=value).check()


def test_rail_is_a_placement():
    CollectiveSpec(placement="rail").check()


def test_qps_between_ranks_of_one_host_are_marked_local():
    import random

    from fabriclab.traffic.collective import plan_qps

    ranks = ranks_of(RAIL, placement="rail")
    spec = CollectiveSpec("allreduce")
    qps = plan_qps(ranks, [S.build("allreduce", len(ranks), 1 << 16)], spec, random.Random(1))
    for rank, specs in enumerate(qps):
        for q in specs:
            assert q["local"] == (ranks[rank].host == ranks[q["peer"]].host)
    # the ring changes rail inside h8 and h1: two local connections, each seen from both ends
    assert sum(q["local"] for specs in qps for q in specs) == 4


# -- the flow model's graph -------------------------------------------------------------------------

def test_rail_groups_sit_inside_the_zones_of_a_threetier_fabric():
    assert len(ZONES.hosts) == 8 and ZONES.spec.hosts == 8
    for host in ZONES.hosts.values():
        pods = {ZONES.pod_of(port.leaf) for port in host.ports}
        assert len(pods) == 1 and [ZONES.switches[p.leaf].index for p in host.ports] == \
            [(host.group - 1) * 2 + 1, (host.group - 1) * 2 + 2]
    ranks = place_ranks(ZONES, CollectiveSpec(placement="rail"))
    zones = [ZONES.pod_of(r.host) for r in ranks]
    # the snake crosses between the zones once on rail 0 and once back on rail 1: the minimum cut
    assert sum(a != b for a, b in zip(zones, zones[1:] + zones[:1])) == 2


@pytest.mark.parametrize("fabric", [RAIL, RACK, ZONES], ids=["rail", "rack", "rail-threetier"])
def test_the_flow_models_graph_cables_every_port_as_the_lab_does(fabric):
    from fabriclab.model.graph import ClosGraph

    graph = ClosGraph.from_spec(fabric.spec)
    ports = [p for host in fabric.hosts.values() for p in host.ports]
    assert graph.params.hosts == len(fabric.hosts) and graph.n_ports == len(ports)
    for i, port in enumerate(ports):
        assert graph.ip_text(graph.n_switches + i) == port.ip
        assert graph.sw_name[graph.port_leaf[i]] == port.leaf


def test_the_flow_model_refuses_rails_it_cannot_group():
    from fabriclab.model.graph import ClosParams

    with pytest.raises(LabError, match="multiple of nics_per_host"):
        ClosParams(leaves=3, nics_per_host=2, cabling="rail")
    with pytest.raises(LabError, match="cabling must be rack or rail"):
        ClosParams(cabling="tor")


@pytest.mark.parametrize("flags, expected", [([], None), (["--pxn"], True), (["--no-pxn"], False)])
def test_the_command_line_passes_pxn_and_the_rail_placement(flags, expected):
    import argparse

    from fabriclab.cli.collective import add_collective_args, spec_from_args

    parser = argparse.ArgumentParser()
    add_collective_args(parser)
    spec = spec_from_args(parser.parse_args(["--placement", "rail", "--backend", "udp", *flags]))
    assert (spec.placement, spec.pxn) == ("rail", expected)


def test_reports_show_where_the_bytes_went_on_rail_fabrics_only():
    from fabriclab.results import report, tables

    rails = {"scale_up_bytes": 3 << 20, "pxn_bytes": 3 << 20, "pxn_hops": 24,
             "rail_local_bytes": 2 << 20, "cross_group_bytes": 4 << 20, "cross_rail_bytes": 0}
    assert tables.rail_split(rails) == "2M/4M/0/3M"
    size = {"collective": "alltoall", "algorithm": "ring", "size": 1 << 20, "ranks": 8, "rails": rails}
    rail_job = {"kind": "collective", "transport": {"scale_up_rate_mbps": 96.0}, "sizes": [size]}
    rack_job = {"kind": "collective", "transport": {"scale_up_rate_mbps": None}, "sizes": [size]}
    assert "| 2M/4M/0/3M |" in "\n".join(report._jobs_table({"a2a": rail_job}))
    assert "rail-local" not in "\n".join(report._jobs_table({"a2a": rack_job}))
