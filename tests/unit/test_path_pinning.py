"""The path-pinning experiment's placements against the pinning app's own choices, and its two
claims judged on documents of known figures."""

import pytest

from fabriclab.apps.pinning import PinRouting
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec
from fabriclab.workflows.experiments import Options, build_plan
from fabriclab.workflows.experiments import path_pinning as pp
from fabriclab.workflows.reproduce import CLAIMS
from fabriclab.workflows.reproduce.claim import AGREES, FLIPPED, agreement
from fabriclab.workflows.reproduce.seed000 import pinning_failure, pinning_fragmented


@pytest.fixture(scope="module")
def fabric():
    return Fabric(load_spec(pp.DEFAULT_SPEC))


def uplink_flows(fabric, hosts, leaf=pp.LEAF):
    """{uplink port: AlltoAll flows} leaving `leaf` under pinning: each remote destination's pin."""
    pins = PinRouting(fabric).pins()[leaf]
    where = {h: fabric.hosts[h].ports[0] for h in hosts}
    counts = {}
    for src in hosts:
        for dst in hosts:
            if src != dst and where[src].leaf == leaf and where[dst].leaf != leaf:
                port = pins[where[dst].ip]
                counts[port] = counts.get(port, 0) + 1
    return sorted(counts.values(), reverse=True)


def test_full_racks_spread_evenly_and_a_fragmented_job_piles_onto_one_uplink(fabric):
    placed = pp.placements(fabric)
    assert all(len(hosts) == 8 for hosts in placed.values())
    assert uplink_flows(fabric, placed["full racks"]) == [4, 4, 4, 4]       # one slice per uplink
    assert uplink_flows(fabric, placed["fragmented"]) == [12, 4]            # slice 0 x 3 peers; two idle


def test_the_plan_runs_each_scheme_per_placement_and_the_failure(fabric):
    quick = build_plan("path-pinning", options=Options(quick=True, seed=3))
    full = build_plan("path-pinning", options=Options(quick=False, seed=3))
    assert [r.label for r in quick.runs] == ["pinning, full racks", "ECMP, full racks", "pinning, fragmented",
                                             "ECMP, fragmented", "pinning, l1-s1 fails"]
    assert len(full.runs) == 9 and {str(r.routing) for r in full.runs} == {"pinning:seed=3", "ecmp:seed=3",
                                                                          "eecmp:seed=3"}
    failing = [r for r in full.runs if r.faults]
    assert len(failing) == 3 and all(r.jobs[0].workload.hosts == pp.placements(fabric)["full racks"] for r in failing)


def run(scheme, placement, busbw, uplinks, fault=None):
    links = [{"link": f"l1-s{i + 1}", "from": "l1", "to": f"s{i + 1}", "direction": "up", "mbps": v}
             for i, v in enumerate(uplinks)]
    return {"label": f"{scheme}, {placement}" if not fault else f"{scheme}, l1-s1 fails", "invalid": [],
            "tags": {"scheme": scheme, "placement": placement},
            "faults": [fault] if fault else [],
            "jobs": {"alltoall": {"sizes": [{"busbw_mbps": busbw, "links": links}]}}}


def pinning_doc(frag_busbw=5.0, after=1.4):
    runs = [run("pinning", "full racks", 9.0, [5, 5, 5, 5]), run("pinning", "fragmented", frag_busbw, [9, 3, 0, 0]),
            run("ECMP", "full racks", 8.0, [7, 5, 4, 4]), run("ECMP", "fragmented", 7.6, [6, 4, 3, 3]),
            run("E-ECMP", "full racks", 8.2, [6, 5, 5, 4]), run("E-ECMP", "fragmented", 7.8, [5, 5, 3, 3]),
            run("pinning", "full racks", 8.0, [5, 5, 5, 5], {"uplinks_after": {"by_switch": {"l1": after}}})]
    return {"runs": runs}


def test_the_fragmentation_claim_reads_the_losses_and_the_balance():
    claim = next(c for c in CLAIMS if c.id == "000-pinning-fragmented")
    finding = pinning_fragmented({"path-pinning": pinning_doc()})
    assert finding.lab_value == pytest.approx(1 - 5 / 9, abs=1e-4)
    assert [round(e.value, 3) for e in finding.effects] == [0.444, 1.0, round(0.4444 - 0.05, 3)]
    assert agreement(claim, [pinning_fragmented({"path-pinning": pinning_doc(5.0 + i / 10)}) for i in range(3)]).status == AGREES
    even = [pinning_fragmented({"path-pinning": pinning_doc(8.9 + i / 100)}) for i in range(3)]   # no loss
    assert agreement(claim, even).status == FLIPPED


def test_the_failure_claim_reads_the_leafs_balance_after_the_failure():
    claim = next(c for c in CLAIMS if c.id == "000-pinning-failure")
    assert agreement(claim, [pinning_failure({"path-pinning": pinning_doc(after=1.4 + i / 20)})
                             for i in range(3)]).status == AGREES
    assert agreement(claim, [pinning_failure({"path-pinning": pinning_doc(after=0.95 + i / 100)})
                             for i in range(3)]).status == FLIPPED
