"""The adaptive routing app without a network: its options, AR's choice as its Python twin states
it (`ar_choices`, which the lab tier checks the eBPF stage against), and what the controller hands
the stage: members with capacity weights, port rates and queue model rows, on the fake flow table
where the app's OpenFlow half is weighted ECMP.
"""

import dataclasses

import pytest

from fabriclab.apps import APPS
from fabriclab.apps.control import AppConfig, RunFiles
from fabriclab.apps.core import ControllerCore
from fabriclab.apps.ecmp import EcmpRouting, WeightedGroup, group_id
from fabriclab.apps.hashing import switch_basis
from fabriclab.apps.select_stage import (SOURCE, StageSync, ar_choices, group_members,
                                         kernel_lets_stage_read_carrier, port_settings, stage_settings,
                                         stage_source)
from fabriclab.queues.datapath import NCLASS
from fabriclab.queues.model import port_table
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec
from tests.unit.fakeoftable import FakeFabric
from tests.unit.routings import parsed
from tests.unit.test_forwarding import host_ports, reached_over, shortest_hops


@pytest.fixture(scope="module")
def fab():
    return Fabric(load_spec("parallel_links"))


# -- the app --------------------------------------------------------------------------------------------
def test_ar_options_and_the_stage_settings_they_make():
    name, options = parsed("ar")
    assert options == {"quantum_bytes": 64, "weights": True, "carrier": True, "seed": 0, "shared_basis": False}
    assert stage_settings("ar", options) == {"seed": 0, "carrier": True, "quantum": 64}
    _name, options = parsed("ar:quantum_bytes=0,weights=off,carrier=off")
    assert stage_settings("ar", options) == {"seed": 0, "carrier": False, "quantum": 0}
    assert APPS["ar"].stage == "ar" and APPS["ar"].routing_class() is EcmpRouting and APPS["ar"].model == "ideal"
    assert parsed("ecmp:weights=on")[1] == {"weights": True, "seed": 0, "shared_basis": False}
    assert parsed("ecmp")[1] == {"weights": False, "seed": 0, "shared_basis": False}   # unweighted unless asked


# -- the choice -----------------------------------------------------------------------------------------
def test_ar_chooses_the_least_queued_member():
    assert ar_choices({"a": 3000, "b": 1500, "c": 9000}) == {"b": 1.0}
    assert ar_choices({"a": 0, "b": 0}) == {"a": 0.5, "b": 0.5}


def test_ar_compares_in_quanta():
    depths = {"a": 3000, "b": 1500, "c": 9000}
    assert ar_choices(depths, quantum=4096) == {"a": 0.5, "b": 0.5}
    assert ar_choices(depths, quantum=1024) == {"b": 1.0}


def test_ar_divides_depth_by_weight_and_draws_ties_by_weight():
    # b leads to half the capacity: its 2000 bytes weigh as 4000
    assert ar_choices({"a": 3000, "b": 2000}, {"a": 2, "b": 1}) == {"a": 1.0}
    assert ar_choices({"a": 0, "b": 0, "c": 0}, {"a": 1, "b": 2, "c": 1}) == {"a": 0.25, "b": 0.5, "c": 0.25}


def test_ar_leaves_out_members_that_are_down():
    assert ar_choices({"a": 0, "b": 5000}, down={"a"}) == {"b": 1.0}
    assert ar_choices({"a": 0}, down={"a"}) == {}


# -- what the controller gives the stage ---------------------------------------------------------------
def test_the_stage_gets_each_groups_members_with_their_capacity_weights(fab):
    cut = frozenset(link.key for link in fab.find_link("s1", "l1", 1))
    table = group_members(fab, EcmpRouting(fab, weighted=True).desired(cut))
    l2_to_l1 = table[("l2-eth5", "10.1.1.0")]
    assert l2_to_l1 == [("l2-eth5", 1), ("l2-eth6", 1), ("l2-eth7", 2), ("l2-eth8", 2)]
    assert all(table[(intf, "10.1.1.0")] == l2_to_l1 for intf, _w in l2_to_l1)
    # unweighted AR (weights=off) sees every member alike
    plain = group_members(fab, EcmpRouting(fab).desired(cut))
    assert {w for members in plain.values() for _m, w in members} == {1}
    # s1 has one cable left to l1: no group there for the stage
    assert not [key for key in table if key[0].startswith("s1-") and key[1] == "10.1.1.0"]


def test_port_settings_give_rates_and_the_queue_models_rows():
    plain = Fabric(dataclasses.replace(load_spec("routing"), queues=None))
    ports, rows = port_settings(plain)
    assert rows == 0 and ports["l1-eth5"] == (10.0, 0, switch_basis(plain.switches["l1"].dpid))
    # each port hashes from its switch's basis: l1's ports one, s1's another
    assert ports["l1-eth6"][2] == ports["l1-eth5"][2] != ports["s1-eth1"][2]
    assert set(ports) == {i for link in plain.fabric_links for i in (link.a_intf, link.b_intf)}
    lossless = Fabric(load_spec("incast"))
    ports, rows = port_settings(lossless)
    table = port_table(lossless)
    assert rows == len(table) * NCLASS
    assert ports["l1-eth5"][:2] == (10.0, next(p.idx for p in table if p.name == "l1-eth5") + 1)


class RecordingStage:
    """What StageSync asks of a SelectStage, recorded (no kernel)."""

    def __init__(self):
        self.calls = []
        self.written, self.attached, self.pins = {}, set(), "/nowhere"
        self.queues_linked = False

    def attach(self, intfs):
        self.attached.update(intfs)

    def set_ports(self, ports):
        self.calls.append(("ports", dict(ports)))

    def set_members(self, table):
        self.calls.append(("members", dict(table)))
        self.written = table

    def forget_down_ports_that_are_up(self):
        self.calls.append(("forget",))

    def link_queues(self, pin):
        self.calls.append(("link", str(pin)))
        return False

    def depth_source(self):
        return "virtual queue"

    def carrier_source(self):
        return "data path"


def test_the_core_hands_the_stage_the_weighted_state_before_any_openflow(fab):
    stage = RecordingStage()
    routing = EcmpRouting(fab, weighted=True)
    core = ControllerCore(AppConfig("ar", parsed("ar")[1], fab, RunFiles("/nonexistent"), "r1"), routing)
    core.stage = StageSync(stage, fab, "ar", "r1")
    fake = FakeFabric(fab)
    fake.connect(core)
    assert core.programmed
    cut = fab.find_link("s1", "l1", 1)[0]
    before = len(fake.sent)
    stage.calls.clear()
    sends = core.port_status(fake.datapaths["l1"], cut.a_port if cut.a == "l1" else cut.b_port, False)
    assert sends and len(fake.sent) == before          # the stage was written before any message
    members = [c for c in stage.calls if c[0] == "members"][-1][1]
    assert dict(members[("l2-eth7", "10.1.1.0")]) == {"l2-eth5": 1, "l2-eth6": 1, "l2-eth7": 2, "l2-eth8": 2}
    assert [c[0] for c in stage.calls] == ["ports", "members", "forget"]   # no queue model: no link
    fake.apply(sends)
    fake.port_event(core, cut, False)
    gid = group_id(fab.switches["l1"])
    assert isinstance(core.programmer.installed["l2"].groups[gid], WeightedGroup)
    assert fake.tables["l2"].methods[gid] == "dp_hash"
    status = core.status().stage
    assert (status.mode, status.depth, status.carrier) == ("ar", "virtual queue", "data path")
    # where the packets go in OpenFlow (OVS's entry choice, before the stage): ECMP's paths
    for src in host_ports(fab):
        for dst in host_ports(fab):
            if src.host != dst.host:
                assert reached_over(fake, src, dst) == shortest_hops(fab, src, dst, {cut.key})


def test_with_a_queue_model_the_stage_links_its_pinned_stats():
    fab = Fabric(load_spec("incast"))
    stage = RecordingStage()
    sync = StageSync(stage, fab, "ar", "r7")
    assert not sync.link_queues()
    assert stage.calls == [("link", "/sys/fs/bpf/fabriclab/r7/queues/stats")]
    assert StageSync(RecordingStage(), fab, "hash", "r7").link_queues()   # E-ECMP has no use for it


# -- building the stage -----------------------------------------------------------------------------------
def test_the_carrier_reading_variant_is_the_same_source_with_one_define(tmp_path, monkeypatch):
    from fabriclab.queues import datapath

    tmp_path.chmod(0o700)
    monkeypatch.setattr(datapath, "CACHE_DIR", tmp_path / "bpf")
    assert stage_source(False) == SOURCE
    text = stage_source(True).read_text()
    assert text.startswith("#define STAGE_READS_CARRIER 1\n") and text.endswith(SOURCE.read_text())
    btf = tmp_path / "vmlinux"
    btf.write_bytes(b"\0bpf_dynptr_slice\0bpf_cast_to_kern_ctx\0bpf_obj_new\0")
    assert kernel_lets_stage_read_carrier(btf)
    btf.write_bytes(b"\0bpf_dynptr_slice\0bpf_cast_to_kern_ctx_v2\0")
    assert not kernel_lets_stage_read_carrier(btf)
    assert not kernel_lets_stage_read_carrier(tmp_path / "missing")


def test_a_verifier_refusal_of_the_carrier_variant_is_remembered_per_kernel(tmp_path, monkeypatch):
    """This kernel's verifier gives up on the carrier variant after a million instructions (10 s,
    every load); a refusal of that kind is remembered beside the compiled objects and the next
    load goes straight to the other variant. A want of memory is not a verdict: not remembered."""
    import errno

    from fabriclab.apps import select_stage
    from fabriclab.queues import datapath

    tmp_path.chmod(0o700)
    monkeypatch.setattr(datapath, "CACHE_DIR", tmp_path / "bpf")
    monkeypatch.setattr(select_stage, "kernel_lets_stage_read_carrier", lambda: True)
    tried = []

    def fake_load(self, reads):
        tried.append(reads)
        if reads:
            raise select_stage.StageRefused(-code)

    monkeypatch.setattr(select_stage.SelectStage, "_load", fake_load)
    monkeypatch.setattr(select_stage.SelectStage, "_close_object", lambda self: None)
    monkeypatch.setattr(select_stage.SelectStage, "config", type("C", (), {"update": lambda *a: None})(),
                        raising=False)
    code = errno.ENOMEM
    for _ in range(2):
        assert not select_stage.SelectStage("/x", "ar").load().reads_carrier
    assert tried == [True, False, True, False] and not select_stage.carrier_refused()
    code, tried[:] = errno.E2BIG, []
    for _ in range(3):
        assert not select_stage.SelectStage("/x", "ar").load().reads_carrier
    assert tried == [True, False, False, False] and select_stage.carrier_refused()
    assert list((tmp_path / "bpf").glob("select_stage_carrier-*.refused-*"))
