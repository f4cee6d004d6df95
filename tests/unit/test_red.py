"""Native ECN marking and link delay as the lab chooses and sets them up, without a kernel: RED's
parameters from an ECN profile, its netlink messages and statistics, the data path's settings for
the classes RED marks, and which mechanisms a lab takes on a full and on a minimal kernel."""

import dataclasses
import struct

import pytest

from fabriclab.system import doctor

from fabriclab.results import document
from fabriclab.errors import LabError
from fabriclab.lab.lab import Lab
from fabriclab.queues import config, red
from fabriclab.queues.config import EcnProfile, QueueSpec, queues_from_dict
from fabriclab.queues.model import QueueModel
from fabriclab.queues.red import (MAX_P_ONE, OFF_BYTES, PLACES, RedParams, class_limit, dump_message,
                                  parse_red_stats, plog, red_message, red_params)
from fabriclab.system.shaping import GATE_LIMIT_BYTES
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import Buffers, FabricSpec, LinkDelay

from .test_doctor import FULL, MINIMAL

BUFFER = 65_536


# -- RED's parameters from a port's ECN profile ----------------------------------------------------
def test_red_profile_sets_min_max_and_the_probability_at_max():
    p = red_params(EcnProfile(mode="red", kmin=10_000, kmax=30_000, pmax=0.2), BUFFER, 1 << 20)
    assert (p.limit, p.qth_min, p.qth_max) == (1 << 20, 10_000, 30_000)
    assert p.max_p == int(0.2 * 2**32) and p.probability == pytest.approx(0.2)


def test_default_thresholds_are_the_models_a_fifth_and_three_fifths_of_the_buffer():
    p = red_params(EcnProfile(), BUFFER, GATE_LIMIT_BYTES)
    assert (p.qth_min, p.qth_max) == config.ecn_thresholds(BUFFER, EcnProfile()) == (13_107, 39_321)


def test_step_is_a_vertical_red_at_kmin_marking_every_packet():
    p = red_params(EcnProfile(mode="step", kmin=20_480, kmax=50_000), BUFFER, GATE_LIMIT_BYTES)
    assert (p.qth_min, p.qth_max, p.max_p) == (20_480, 20_480, MAX_P_ONE)
    # A red profile whose thresholds meet is the same step.
    assert red_params(EcnProfile(kmin=9_000, kmax=9_000), BUFFER, 1).qth_max == 9_000


def test_off_puts_both_thresholds_out_of_reach():
    p = red_params(EcnProfile(mode="off"), BUFFER, GATE_LIMIT_BYTES)
    assert p.qth_min == p.qth_max == OFF_BYTES > GATE_LIMIT_BYTES


def test_a_probability_of_one_fits_red_s_32_bits():
    assert red_params(EcnProfile(pmax=1.0), BUFFER, 1).max_p == MAX_P_ONE == 2**32 - 1


def test_red_never_drops_what_the_model_admitted():
    # lossless: the pause gate's backstop; lossy: the backstop the lossy fifo had (2 frames over).
    assert class_limit("lossless", BUFFER, 9000) == GATE_LIMIT_BYTES
    assert class_limit("lossy", BUFFER, 9000) == BUFFER + 2 * 9014
    with pytest.raises(ValueError, match="not 'control'"):
        class_limit("control", BUFFER, 9000)


def test_plog_is_tc_s_log2_of_span_over_probability():
    # 0.2 / 20000 = 1e-5; doubled 17 times it first exceeds 1.
    assert plog(10_000, 30_000, 0.2) == 17
    assert plog(5_000, 5_000, 1.0) == 0


def test_describe_is_what_results_record():
    p = red_params(EcnProfile(mode="step", kmin=20_480), BUFFER, GATE_LIMIT_BYTES)
    assert p.describe() == {"min": 20_480, "max": 20_480, "probability": 1.0, "limit": GATE_LIMIT_BYTES,
                            "ewma_log": 0, "flags": "ecn nodrop"}


# -- netlink -----------------------------------------------------------------------------------
def _options(msg):
    """{attr type: payload} of the TCA_OPTIONS nest of an RTM_NEWQDISC."""
    attrs = red._attrs(msg, 36, len(msg))
    assert attrs[1] == b"red\0"
    return red._attrs(attrs[2], 0, len(attrs[2]))


@pytest.mark.parametrize("cls, handle, parent", [("lossless", 0x110000, 0x100001), ("lossy", 0x310000, 0x10030)])
def test_creating_red_grafts_it_with_its_limit(cls, handle, parent):
    params = RedParams(limit=1 << 20, qth_min=10_000, qth_max=30_000, max_p=int(0.2 * 2**32), plog=17)
    msg = red_message(9, 4, cls, params, create=True)
    length, kind, flags, seq, _ = struct.unpack_from("=IHHII", msg)
    assert (length, kind, flags, seq) == (len(msg), 36, 0x1 | 0x4 | 0x100 | 0x400, 9)
    assert struct.unpack_from("=iII", msg, 20) == (4, handle, parent) == (4, *PLACES[cls])
    opts = _options(msg)
    # limit, min, max, Wlog 0 (the average is the instantaneous queue), Plog, Scell_log, no old flags
    assert struct.unpack("=IIIBBBB", opts[1]) == (1 << 20, 10_000, 30_000, 0, 17, 0, 0)
    assert opts[2] == bytes([31]) * 256            # after any idle time the average restarts at 0
    assert struct.unpack("=I", opts[3]) == (int(0.2 * 2**32),)
    assert struct.unpack("=II", opts[4]) == (1 | 8, 15)     # ecn + nodrop, every flag selected


def test_a_change_passes_limit_zero_so_the_kernel_keeps_red_s_queue():
    params = red_params(EcnProfile(mode="step", kmin=20_480), BUFFER, GATE_LIMIT_BYTES)
    msg = red_message(3, 7, "lossless", params)
    assert struct.unpack_from("=H", msg, 6)[0] == 0x1 | 0x4            # no create, no replace
    limit, qmin, qmax = struct.unpack_from("=III", _options(msg)[1])
    assert (limit, qmin, qmax) == (0, 20_480, 20_480)


def _qdisc(seq, ifindex, handle, kind, xstats=None):
    attrs = red.nlattr(1, kind + b"\0")
    if xstats is not None:
        attrs += red.nlattr(4, struct.pack("=IIII", *xstats))
    body = struct.pack("=BxHiIII", 0, 0, ifindex, handle, 0x10001, 0) + attrs
    return struct.pack("=IHHII", 16 + len(body), 36, 2, seq, 0) + body


def test_statistics_are_read_from_red_qdiscs_only():
    assert struct.unpack_from("=HH", dump_message(5), 4) == (38, 0x301)
    reply = (_qdisc(5, 4, 0x110000, b"red", (1, 2, 3, 40)) + _qdisc(5, 4, 0x200000, b"bfifo", (9, 9, 9, 9))
             + _qdisc(5, 6, 0x310000, b"red", (0, 0, 0, 7)) + _qdisc(4, 8, 0x110000, b"red", (0, 0, 0, 99)))
    stats, done = parse_red_stats(reply, 5)
    assert not done
    assert stats == {(4, 0x110000): {"marked": 40, "early": 1, "pdrop": 2},
                     (6, 0x310000): {"marked": 0 + 7, "early": 0, "pdrop": 0}}
    end = struct.pack("=IHHII", 20, 3, 2, 5, 0) + bytes(4)
    assert parse_red_stats(end, 5) == ({}, True)
    error = struct.pack("=IHHII", 36, 2, 0, 5, 0) + struct.pack("=i", -95) + bytes(16)
    with pytest.raises(LabError, match="statistics failed: Operation not supported"):
        parse_red_stats(error, 5)


# -- the queue model: who marks in which class -----------------------------------------------------
class _Table:
    def __init__(self):
        self.rows = {}

    def update(self, key, value):
        self.rows[key] = value


class _Red:
    def __init__(self):
        self.calls = []

    def set(self, ifindex, cls, params, create=False, what=""):
        self.calls.append((what, cls, params, create))


def _model(mechanism, ecn=None):
    spec = FabricSpec(name="r", leaves=2, spines=1, hosts_per_leaf=1,
                      queues=QueueSpec(ecn=ecn or EcnProfile(mode="red", kmin=10_000, kmax=30_000)))
    model = QueueModel(Fabric(spec), net=None, run_id="r", ecn_mechanism=mechanism)
    model.datapath = type("DataPath", (), {"qcfg": _Table()})()
    return model


def _modes(model, port):
    p = model.by_name[port]
    model._write_thresholds(p)
    return [model.datapath.qcfg.rows[p.idx * 3 + cls].ecn_mode for cls in range(3)]


def test_where_red_marks_the_program_only_counts_in_lossless_and_lossy():
    model = _model("red")
    leaf_port = next(p.name for p in model.ports if p.role == "leaf")
    # classes in index order: lossless, control, lossy
    assert _modes(model, leaf_port) == [config.ECN_QDISC, 0, config.ECN_QDISC]
    assert _modes(model, "h1-n0") == [0, 0, 0]                      # NICs never mark
    assert _modes(_model("bpf-clsact"), leaf_port) == [1, 0, 1]      # the program marks by the profile


def test_a_live_ecn_change_changes_the_red_qdiscs():
    model = _model("red")
    model.red = _Red()
    changed = model.set_ecn("spine", mode="step", kmin=20_480)
    assert changed and {c[0] for c in model.red.calls} == set(changed)
    assert {c[1] for c in model.red.calls} == {"lossless", "lossy"}
    assert all(not c[3] and (c[2].qth_min, c[2].qth_max) == (20_480, 20_480) for c in model.red.calls)
    model.red.calls.clear()
    model.set_ecn("spine", reset=True)                               # back to the spec's profile
    assert {(c[2].qth_min, c[2].qth_max) for c in model.red.calls} == {(10_000, 30_000)}


def test_an_unknown_ecn_mechanism_is_refused():
    with pytest.raises(LabError, match="ECN mechanism must be one of bpf-clsact, red"):
        _model("ecn-ish")


# -- the spec's marker and what a lab chooses ------------------------------------------------------
def test_the_marker_is_a_spec_setting():
    assert queues_from_dict({"ecn": {"marker": "bpf", "mode": "step"}}).ecn_marker == "bpf"
    assert queues_from_dict({"ecn": {"mode": "step"}}).ecn_marker == "auto"
    with pytest.raises(Exception, match=r"queues.ecn.marker: must be one of auto, red, bpf, got 'asic'"):
        queues_from_dict({"ecn": {"marker": "asic"}})
    spec = QueueSpec(ecn_marker="bpf")
    assert QueueSpec.from_dict(spec.to_dict()) == spec


def _lab(marker="auto", delay=True, queues=True):
    # 10 ms of lab delay each way needs 50 KB of headroom at 20 Mbit/s: buffers to hold it
    spec = FabricSpec(name="c", leaves=2, spines=1, hosts_per_leaf=1, real_host_rate_mbps=400_000,
                      buffers=Buffers(leaf=256 * 1024, spine=256 * 1024),
                      queues=QueueSpec(ecn_marker=marker) if queues else None,
                      delay=LinkDelay(fabric_us=0.25) if delay else LinkDelay())
    return Lab(spec)


def test_a_full_kernel_runs_red_and_netem():
    lab = _lab()
    lab._choose_kernel_mechanisms(doctor.mechanisms(FULL))
    assert (lab.ecn_mechanism, lab.delay_mechanism, lab.warnings) == ("red", "netem", [])
    assert lab.link_delay_ms("fabric") == pytest.approx(10.0) and lab.link_delay_ms("host") == 0.0


def test_a_minimal_kernel_marks_in_bpf_and_runs_without_delay_saying_so_once(capsys):
    lab = _lab()
    lab._choose_kernel_mechanisms(doctor.mechanisms(MINIMAL))
    assert (lab.ecn_mechanism, lab.delay_mechanism) == ("bpf-clsact", "none")
    assert lab.link_delay_ms("fabric") == 0.0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fabriclab: warning: this kernel cannot delay links")
    assert "fabric 0.25 us real = 10 ms lab" in err[0] and "results record delay: none" in err[0]
    assert lab.warnings == [err[0].removeprefix("fabriclab: warning: ")]


def test_the_bpf_marker_can_be_forced_on_a_full_kernel_and_red_is_refused_without_it():
    lab = _lab("bpf")
    lab._choose_kernel_mechanisms(doctor.mechanisms(FULL))
    assert lab.ecn_mechanism == "bpf-clsact"
    with pytest.raises(LabError, match="queues.ecn.marker is red, but this kernel cannot mark with RED"):
        _lab("red")._choose_kernel_mechanisms(doctor.mechanisms(MINIMAL))


def test_without_queues_nothing_marks_and_without_delay_nothing_warns(capsys):
    lab = _lab(queues=False, delay=False)
    lab._choose_kernel_mechanisms(doctor.mechanisms(MINIMAL))
    assert (lab.ecn_mechanism, lab.delay_mechanism, lab.warnings) == ("none", "none", [])
    assert capsys.readouterr().err == ""


def test_results_record_the_real_and_the_lab_delay_and_whether_it_ran():
    lab = _lab()
    lab._choose_kernel_mechanisms(doctor.mechanisms(FULL))
    assert document.link_delay(lab) == {"real_us": {"host": 0.0, "fabric": 0.25},
                                       "lab_ms": {"host": 0.0, "fabric": pytest.approx(10.0)},
                                       "applied": True}
    lab.delay_mechanism = "none"
    assert document.link_delay(lab)["applied"] is False


def test_a_marker_override_survives_dataclass_replace():
    spec = FabricSpec(name="c", queues=QueueSpec())
    forced = dataclasses.replace(spec, queues=dataclasses.replace(spec.queues, ecn_marker="bpf"))
    assert forced.queues.ecn_marker == "bpf" and spec.queues.ecn_marker == "auto"
