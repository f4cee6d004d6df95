"""Routing apps without a network: option parsing, the E-ECMP hash, CSPF, TE's switch state and
demands, and the selection stage's member table."""

import pathlib
import types

import pytest
from os_ken.ofproto import ofproto_v1_5_parser as ofparser

from fabriclab.apps import APPS, RoutingError
from fabriclab.apps.control import AppConfig, Job, RunFiles
from fabriclab.apps.ecmp import EcmpRouting, FailoverGroup, SwitchState, diff, group_id
from fabriclab.apps.select_stage import eecmp_member, flow_hash, group_members, net_key
from fabriclab.apps.te import (PRIO_TE, TE_COOKIE, Demand, DemandKey, TeRouting, cspf, demand_keys,
                               job_demands, merge_demands)
from fabriclab.apps.te_engine import TeEngine
from fabriclab.lab.controller import check_app
from fabriclab.errors import LabError
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec
from tests.unit.fakeoftable import FakeDatapath
from tests.unit.routings import label_of, parsed


@pytest.fixture(scope="module")
def tiny():
    return Fabric(load_spec("tiny"))


@pytest.fixture(scope="module")
def wide():
    """2 leaves x 2 spines with 2 hosts per leaf: two elephants per leaf."""
    return Fabric(load_spec(str(pathlib.Path(__file__).parents[1] / "two_by_two.yaml")))


# -- options ----------------------------------------------------------------------------------------
def test_every_app_is_listed_with_its_parts_and_defaults():
    from fabriclab.apps.ecmp import EcmpRouting
    from fabriclab.apps.te import TeRouting
    from fabriclab.model.placement import SCHEMES

    assert set(APPS) == {"ecmp", "eecmp", "flowlet", "te", "ar", "pinning"}
    for name, info in APPS.items():
        assert issubclass(info.routing_class(), EcmpRouting) and info.stage in (None, "hash", "flowlet", "ar")
        assert parsed(name) == (name, info.defaults())
        assert name in SCHEMES                  # the flow model predicts every app, under its name
    assert [APPS[n].stage for n in ("ecmp", "eecmp", "flowlet", "te", "ar")] == [None, "hash", "flowlet", None, "ar"]
    assert [n for n, info in APPS.items() if info.te_engine] == ["te"] and APPS["te"].routing_class() is TeRouting


def test_options_parse_and_fill_defaults():
    name, options = parsed("flowlet:gap_us=500, qp=on")
    assert name == "flowlet"
    assert options["gap_us"] == 500.0 and options["qp"] is True
    assert options["load_window_us"] == APPS["flowlet"].defaults()["load_window_us"]
    assert parsed("te:period_s=2")[1]["period_s"] == 2.0
    assert label_of("te:period_s=2,max_utilization=1") == "te:period_s=2.0"


@pytest.mark.parametrize("text, words", [
    ("ospf", "unknown routing app 'ospf'"),
    ("te:period=2", "unknown option 'period'"),
    ("te:period_s", "needs a value"),
    ("te:period_s=0", "must be > 0"),
    ("te:period_s=fast", "must be a number"),
    ("flowlet:qp=maybe", "must be on or off"),
    ("ecmp:hash=1", "options: seed, shared_basis, weights"),
    ("ecmp:shared_basis=sometimes", "must be on or off"),
    ("ar:quantum_bytes=-2", "must be > -1"),
    ("ar:carrier=sometimes", "must be on or off"),
    ("pinning:slice=1", "unknown option 'slice' (options: seed, shared_basis)"),
    ("pinning:weights=on", "unknown option 'weights'"),
    ("pinning:seed=x", "must be a number"),
    ("", "must be an app name"),
])
def test_bad_routing_choices_are_one_line_errors(text, words):
    with pytest.raises(RoutingError) as err:
        parsed(text)
    assert words in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(LabError):
        check_app(text)


# -- the E-ECMP hash ---------------------------------------------------------------------------------
def test_the_qp_changes_the_choice_when_the_5_tuple_does_not():
    members = ["l1-eth5", "l1-eth6", "l1-eth7", "l1-eth8"]
    picks = {eecmp_member(members, "10.1.1.1", "10.1.2.1", 49152, qp) for qp in range(100, 132)}
    assert len(picks) == 4                       # 32 QPs over one shared 5-tuple reach every member
    no_qp = {flow_hash("10.1.1.1", "10.1.2.1", 17, 49152, 4791) for _ in range(3)}
    assert len(no_qp) == 1                       # ECMP's view: one flow


def test_the_hash_is_a_pure_function_of_its_fields_and_seed():
    a = flow_hash("10.1.1.1", "10.1.2.1", 17, 1000, 4791, qp=7)
    assert a == flow_hash("10.1.1.1", "10.1.2.1", 17, 1000, 4791, qp=7)
    assert a != flow_hash("10.1.1.1", "10.1.2.1", 17, 1000, 4791, qp=8)
    assert a != flow_hash("10.1.1.1", "10.1.2.1", 17, 1000, 4791, qp=7, seed=1)
    assert 0 <= a < 2 ** 32


def test_members_of_every_multi_member_group(tiny):
    table = group_members(tiny, EcmpRouting(tiny).desired())
    # each leaf has one group (the other leaf) over its two uplinks; spines have one link per leaf
    assert table[("l1-eth2", "10.1.2.0")] == [("l1-eth2", 1), ("l1-eth3", 1)]
    assert table[("l1-eth3", "10.1.2.0")] == [("l1-eth2", 1), ("l1-eth3", 1)]
    assert not any(intf.startswith("s") for intf, _net in table)
    down = {tiny.find_link("l1", "s1")[0].key}
    assert ("l1-eth2", "10.1.2.0") not in group_members(tiny, EcmpRouting(tiny).desired(down))


def test_net_key_is_the_24_bit_prefix_in_network_order():
    assert net_key("10.1.2.0").to_bytes(4, "little") == bytes([10, 1, 2, 0])


# -- CSPF ---------------------------------------------------------------------------------------------
def _demand(fabric, host, dst_leaf, mbps):
    port = fabric.hosts[host].ports[0]
    return Demand(DemandKey(port.leaf, port.leaf_port, dst_leaf), mbps, "test", port.intf)


def test_two_elephants_go_to_different_spines(wide):
    demands = [_demand(wide, "h1", "l2", 10.0), _demand(wide, "h2", "l2", 10.0)]
    placement = cspf(wide, demands)
    spines = {route.nodes[1] for route in placement.placed.values()}
    assert spines == {"s1", "s2"} and not placement.unplaced


def test_capacity_is_respected_and_the_rest_stays_on_ecmp(wide):
    demands = [_demand(wide, "h1", "l2", 6.0), _demand(wide, "h2", "l2", 6.0),
               Demand(DemandKey("l1", 99, "l2"), 5.0, "test")]     # 6 + 5 fits no 10 Mbit/s uplink
    placement = cspf(wide, demands)
    assert len(placement.placed) == 2
    assert [reason for _d, reason in placement.unplaced] == ["no path with 5.00 Mbit/s free"]
    for hop, mbps in placement.allocated.items():
        assert mbps <= 10.0 + 1e-9


def test_prefers_the_least_loaded_path_on_a_tie(wide):
    s1_up = next(link for link in wide.fabric_links if {link.a, link.b} == {"l1", "s1"})
    measured = {(s1_up.key, "l1"): 8.0}
    placement = cspf(wide, [_demand(wide, "h1", "l2", 1.0)], measured=measured)
    assert next(iter(placement.placed.values())).nodes[1] == "s2"


def test_failed_links_are_avoided_and_an_unreachable_demand_is_reported(wide):
    down = {wide.find_link("l1", "s1")[0].key}
    placement = cspf(wide, [_demand(wide, "h1", "l2", 4.0), _demand(wide, "h2", "l2", 4.0)], down)
    assert {route.nodes[1] for route in placement.placed.values()} == {"s2"}
    both = down | {wide.find_link("l1", "s2")[0].key}
    placement = cspf(wide, [_demand(wide, "h1", "l2", 4.0)], both)
    assert placement.unplaced[0][1] == "no path (failed links)"


# -- TE's switch state ---------------------------------------------------------------------------------
def test_placed_entries_point_at_a_failover_group_backed_by_ecmp(wide):
    routing = TeRouting(wide)
    routing.placement = cspf(wide, [_demand(wide, "h1", "l2", 10.0)])
    state = routing.desired()["l1"]
    te_flows = [f for f in state.flows if f.priority == PRIO_TE]
    assert len(te_flows) == len(demand_keys(wide)) // 2     # one per local host x remote leaf
    placed = [f for f in te_flows if dict(f.match)["in_port"] == wide.hosts["h1"].ports[0].leaf_port]
    gid = placed[0].action[1]
    group = state.groups[gid]
    assert isinstance(group, FailoverGroup) and group.backup == group_id(wide.switches["l2"])
    others = [f for f in te_flows if f is not placed[0]]
    assert all(f.action == ("group", group_id(wide.switches["l2"])) for f in others)


def test_an_entry_whose_path_failed_falls_back_to_ecmp_at_once(wide):
    routing = TeRouting(wide)
    routing.placement = cspf(wide, [_demand(wide, "h1", "l2", 10.0)])
    route = next(iter(routing.placement.placed.values()))
    spine = route.nodes[1]
    down = {wide.find_link(spine, "l2")[0].key}       # a remote link: the leaf's port stays up
    state = routing.desired(down)["l1"]
    assert not any(isinstance(g, FailoverGroup) for g in state.groups.values())


def test_failover_groups_are_deleted_before_the_groups_they_fall_back_to():
    old = SwitchState(groups={5: (1, 2), 0x40000105: FailoverGroup(1, 5)})
    ops = diff(old, SwitchState())
    deletes = [op[1] for op in ops if op[0] == "group_del"]
    assert deletes == [0x40000105, 5]


def test_job_demands_share_the_nic_rate_by_bytes(wide):
    ip = {h: wide.hosts[h].ports[0].ip for h in ("h1", "h2", "h3", "h4")}
    jobs = {"a": Job.of([(ip["h1"], ip["h3"], 300), (ip["h1"], ip["h2"], 100), (ip["h2"], ip["h4"], 50)])}
    demands = {(d.key.leaf, d.host_port): d for d in job_demands(wide, jobs)}
    rate = wide.spec.host_rate_mbps
    h1 = demands[("l1", wide.hosts["h1"].ports[0].intf)]
    assert h1.mbps == pytest.approx(rate * 0.75) and h1.source == "job:a"   # h1->h2 stays in l1
    assert demands[("l1", wide.hosts["h2"].ports[0].intf)].mbps == pytest.approx(rate)
    measured = {DemandKey("l2", wide.hosts["h3"].ports[0].leaf_port, "l1"): 3.0,
                DemandKey("l2", wide.hosts["h4"].ports[0].leaf_port, "l1"): 0.01}
    merged = merge_demands(wide, list(demands.values()), measured, min_mbps=0.1)
    assert [d.source for d in merged].count("measured") == 1


# -- TE's engine ------------------------------------------------------------------------------------
def _engine(fabric, tmp_path, clock, **options):
    config = AppConfig("te", {"period_s": 0.5, **options}, fabric, RunFiles(tmp_path))
    return TeEngine(config, TeRouting(fabric), clock=clock, wall=lambda: 1000.0)


def _flow_stat(fabric, host, dst_leaf, nbytes):
    port, leaf = fabric.hosts[host].ports[0], fabric.switches[dst_leaf]
    return types.SimpleNamespace(match={"in_port": port.leaf_port, "eth_type": 0x0800,
                                        "ipv4_dst": (f"10.{leaf.plane}.{leaf.index}.0", "255.255.255.0")},
                                 stats={"byte_count": nbytes})


def test_te_engine_asks_every_switch_and_waits_for_every_part_of_every_reply(wide, tmp_path):
    engine = _engine(wide, tmp_path, clock=lambda: 0.0)
    dps = {name: FakeDatapath(s.dpid) for name, s in wide.switches.items()}
    sends = engine.requests(dps)
    flows = [m for _dp, m in sends if isinstance(m, ofparser.OFPFlowDescStatsRequest)]
    assert len(flows) == len(dps) and {m.cookie for m in flows} == {TE_COOKIE}
    assert sum(isinstance(m, ofparser.OFPPortStatsRequest) for _dp, m in sends) == len(dps)
    for name in dps:
        engine.reply(name, "ports", [], more=False)
        engine.reply(name, "flows", [], more=name == "l1")     # l1's flows come in two parts
    assert engine.wait_replies(timeout=0) == [("l1", "flows")]
    engine.reply("l1", "flows", [], more=False)
    engine.reply("nosuch", "flows", [], more=False)            # not asked: ignored
    assert engine.wait_replies(timeout=0) == []


def test_te_engine_measures_unannounced_flows_and_places_announced_jobs(wide, tmp_path):
    now = [10.0]
    engine = _engine(wide, tmp_path, clock=lambda: now[0])
    dps = {name: FakeDatapath(s.dpid) for name, s in wide.switches.items()}

    def cycle(nbytes, reason="period"):
        engine.requests(dps)
        engine.reply("l1", "flows", [_flow_stat(wide, "h1", "l2", nbytes)], more=False)
        return engine.place(engine.counters(), frozenset(), reason, started=now[0])

    assert not cycle(0).placed                                 # a first sample: no rate yet
    now[0] += 1.0
    placement = cycle(1_250_000)                               # 10 Mbit/s over the second
    (key,) = placement.placed
    assert (key.leaf, key.in_port, key.dst_leaf) == ("l1", wide.hosts["h1"].ports[0].leaf_port, "l2")
    assert engine.routing.placement is placement
    doc = engine.doc
    assert doc["demands"][0]["source"] == "measured" and doc["demands"][0]["mbps"] == pytest.approx(10.0)
    assert doc["placed"][0]["host_port"] == "h1-n0" and doc["recomputes"] == 2
    # an announced job wakes the engine and becomes a demand of its own
    h2, h4 = (wide.hosts[h].ports[0].ip for h in ("h2", "h4"))
    assert not engine.wake.is_set()
    engine.jobs_changed({"ring": Job.of([(h2, h4, 1000)])})
    assert engine.wake.is_set()
    now[0] += 1.0
    placement = cycle(1_250_000, reason="jobs")                # h1's counter did not move: no rate
    assert [d["source"] for d in engine.doc["demands"]] == ["job:ring"] and len(placement.placed) == 1
    status = engine.status()
    assert (status.jobs, status.reason, status.recomputes, status.placed) == (("ring",), "jobs", 3, 1)
    assert status.placement_file == str(tmp_path / "te-placement.json")


def test_a_stuck_controllers_threads_are_summed_up_in_one_line():
    from fabriclab.lab.controller import summarize_stacks

    dump = ('Thread 0x00007f01 (most recent call first):\n'
            '  File "/usr/lib/python3.11/threading.py", line 327 in wait\n'
            '  File "/x/os_ken/lib/hub.py", line 90 in acquire\n'
            '  File "/x/os_ken/controller/controller.py", line 411 in send\n'
            '  File "/x/apps/osken_app.py", line 104 in _call\n\n'
            'Thread 0x00007f02 (most recent call first):\n'
            '  File "/usr/lib/python3.11/threading.py", line 327 in wait\n'
            '  File "/x/os_ken/lib/hub.py", line 90 in acquire\n'
            '  File "/x/os_ken/controller/controller.py", line 411 in send\n\n'
            'Current thread 0x00007f03 (most recent call first):\n'
            '  File "/x/os_ken/controller/controller.py", line 320 in _recv_loop\n')
    line = summarize_stacks(dump)
    assert "\n" not in line
    assert line == ("threading.py:327 wait < hub.py:90 acquire < controller.py:411 send (x2); "
                    "controller.py:320 _recv_loop")
    assert summarize_stacks("no stacks here") == ""


def test_an_app_whose_routing_class_is_not_one_is_refused_in_one_line():
    from fabriclab.apps import AppInfo, RoutingError

    with pytest.raises(RoutingError, match=r"routing class 'fabriclab.apps.ecmp:group_id' is not a class with desired"):
        AppInfo("x", routing="fabriclab.apps.ecmp:group_id").routing_class()
    with pytest.raises(RoutingError, match="is not a class"):
        AppInfo("x", routing="fabriclab.apps.ecmp:Nothing").routing_class()
