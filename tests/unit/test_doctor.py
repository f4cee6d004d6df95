"""Mechanism selection and rendering from made-up capabilities: no root, no network."""

import argparse
import dataclasses
import json

import pytest

from fabriclab.cli import machine
from fabriclab.system import doctor
from fabriclab.system.doctor import Capabilities
from fabriclab.errors import EnvironmentProblem

# This project's machines: no modules, userspace OVS, htb/tbf/bfifo, clsact + bpf, no RED/netem.
MINIMAL = Capabilities(
    root=True, kernel="6.1-minimal", loadable_modules=False, ovs_kernel_module=False,
    ovs_running=True, ovs_version="3.1.0", htb=True, tbf=True, bfifo=True, red=False,
    netem=False, prio=False, clsact=True, bpf_classifier=True, clang=True, rdma_rxe=False,
    rdma_tool=True, ethtool=True, iperf3=True, mininet_system=True, mininet_here=True,
    notes=(("ovs_kernel_module", "kernel has no loadable modules"),
           ("red", "Specified qdisc kind is unknown."),
           ("netem", "Specified qdisc kind is unknown."),
           ("rdma_rxe", "kernel has no loadable modules")),
)

# The Vagrant VM: a distribution kernel with every module.
FULL = dataclasses.replace(
    MINIMAL, kernel="6.8-generic", loadable_modules=True, ovs_kernel_module=True, red=True,
    netem=True, prio=True, rdma_rxe=True, pyverbs=True, notes=())


def chosen(caps):
    return {key: m.mechanism for key, m in doctor.mechanisms(caps).items()}


def test_minimal_kernel_uses_userspace_and_bpf():
    mech = chosen(MINIMAL)
    assert mech["ovs_datapath"] == "userspace"
    assert mech["shaping"] == "htb"
    assert mech["ecn"] == "bpf-clsact"
    assert mech["delay"] == "none"
    assert mech["queue_model"] == "bpf-clsact"
    assert mech["roce"] == "udp"
    assert doctor.ovs_datapath_type(MINIMAL) == "netdev"
    assert doctor.missing_required(doctor.mechanisms(MINIMAL)) == []


def test_full_kernel_uses_kernel_mechanisms():
    mech = chosen(FULL)
    assert mech["ovs_datapath"] == "kernel"
    assert mech["ecn"] == "red"
    assert mech["delay"] == "netem"
    assert mech["queue_model"] == "bpf-clsact"
    assert mech["roce"] == "rdma_rxe"
    assert doctor.ovs_datapath_type(FULL) == "system"


def test_userspace_datapath_note_says_why():
    m = doctor.mechanisms(MINIMAL)["ovs_datapath"]
    assert "no loadable modules" in m.note and "netdev" in m.note


def test_shaping_falls_back_to_tbf_then_fails():
    no_htb = dataclasses.replace(MINIMAL, htb=False)
    assert chosen(no_htb)["shaping"] == "tbf"
    assert doctor.missing_required(doctor.mechanisms(no_htb)) == []

    neither = dataclasses.replace(MINIMAL, htb=False, tbf=False)
    mechs = doctor.mechanisms(neither)
    assert not mechs["shaping"].available
    assert [m.feature for m in doctor.missing_required(mechs)] == ["link shaping"]


def test_ecn_marks_with_red_where_the_kernel_has_it_and_the_queue_model_runs():
    with_red = doctor.mechanisms(dataclasses.replace(MINIMAL, red=True))
    assert with_red["ecn"].mechanism == "red" and not with_red["ecn"].planned
    assert with_red["queue_model"].mechanism == "bpf-clsact"     # accounting and PFC stay in BPF
    without = doctor.mechanisms(MINIMAL)["ecn"]
    assert without.mechanism == "bpf-clsact" and "Specified qdisc kind is unknown." in without.note


def test_without_bpf_there_is_no_queue_model_and_no_marking_even_with_red():
    for caps in (dataclasses.replace(MINIMAL, bpf_classifier=False),
                 dataclasses.replace(MINIMAL, red=True, clsact=False)):
        mechs = doctor.mechanisms(caps)
        assert mechs["ecn"].mechanism == "unavailable" and not mechs["ecn"].available
        assert mechs["queue_model"].mechanism == "unavailable"
    assert "RED qdisc present" in doctor.mechanisms(dataclasses.replace(MINIMAL, red=True, clsact=False))["ecn"].note


def test_delay_is_netem_or_none_and_neither_is_planned():
    full, minimal = doctor.mechanisms(FULL)["delay"], doctor.mechanisms(MINIMAL)["delay"]
    assert (full.mechanism, full.available, full.planned) == ("netem", True, False)
    assert (minimal.mechanism, minimal.available, minimal.planned) == ("none", False, False)
    assert "no netem" in minimal.note
    assert not doctor.PLANNED


def test_missing_clang_is_named_as_the_reason():
    no_clang = dataclasses.replace(MINIMAL, clang=False, bpf_classifier=None)
    mechs = doctor.mechanisms(no_clang)
    assert mechs["queue_model"].mechanism == "unavailable"
    assert "clang" in mechs["queue_model"].note
    assert "lab.sh bootstrap" in mechs["queue_model"].note


def test_rxe_without_rdma_tool_falls_back_to_udp():
    caps = dataclasses.replace(FULL, rdma_tool=False)
    m = doctor.mechanisms(caps)["roce"]
    assert m.mechanism == "udp" and "rdma" in m.note


def test_the_pfc_agent_row_says_when_the_kernel_can_hold_a_real_time_process_back():
    def agent(**kw):
        return doctor.mechanisms(dataclasses.replace(MINIMAL, **kw))["pfc_agent"]

    assert agent(realtime=True, preemption="full").note.endswith("a pause waits for no other program")
    for model in ("none", "voluntary"):
        row = agent(realtime=True, preemption=model)
        assert row.mechanism == "SCHED_FIFO" and f"preempt={model}" in row.note and "preempt=full" in row.note
    assert agent(realtime=False, preemption="none").mechanism == "SCHED_OTHER"


@pytest.mark.parametrize("version, cmdline, config, debugfs, model", [
    ("#1 SMP PREEMPT_DYNAMIC", "quiet", "CONFIG_PREEMPTION=y\nCONFIG_PREEMPT_NONE=y\n", "", "none"),
    ("#1 SMP PREEMPT_DYNAMIC", "quiet preempt=full", "CONFIG_PREEMPT_NONE=y\n", "", "full"),
    ("#1 SMP PREEMPT_DYNAMIC", "", "CONFIG_PREEMPT_NONE=y\n", "none voluntary (full) lazy\n", "full"),
    ("#1 SMP PREEMPT_DYNAMIC", "", "CONFIG_PREEMPT_VOLUNTARY=y\n", "", "voluntary"),
    ("#1 SMP PREEMPT_RT", "", "", "", "rt"),
    ("#1 SMP PREEMPT", "", "", "", "full"),
    ("#1 SMP preempt=full", "preempt=full", "", "", ""),     # not a dynamic kernel: the command line is moot
])
def test_the_kernel_preemption_model_is_read_from_what_the_kernel_shows(version, cmdline, config, debugfs, model):
    assert doctor.kernel_preemption(version, cmdline, config, debugfs) == model


def test_kernel_datapath_chosen_only_with_the_module():
    assert doctor.ovs_datapath_type(dataclasses.replace(FULL, ovs_kernel_module=False)) == "netdev"


def test_missing_ovs_and_mininet_are_required_and_say_what_to_run():
    caps = dataclasses.replace(MINIMAL, ovs_running=False, ovs_version=None, mininet_here=False,
                               mininet_system=False, notes=(("ovs", "openvswitch-switch not installed"),))
    missing = doctor.missing_required(doctor.mechanisms(caps))
    assert [m.feature for m in missing] == ["Open vSwitch", "Mininet"]
    assert all("lab.sh bootstrap" in m.note for m in missing)
    with pytest.raises(EnvironmentProblem, match="Open vSwitch, Mininet.*lab.sh bootstrap"):
        doctor.check_required(caps)


def test_not_root_message_asks_for_root_first():
    caps = dataclasses.replace(MINIMAL, root=False, htb=None, tbf=None,
                               notes=(("htb", "not probed: needs root"),))
    mechs = doctor.mechanisms(caps)
    message = doctor.missing_message(doctor.missing_required(mechs))
    assert message.startswith("not running as root")
    assert "link shaping" in message
    assert "needs root" in mechs["shaping"].note


def test_unprobed_features_are_unknown_not_false():
    caps = Capabilities()
    assert caps.htb is None and caps.bpf_classifier is None
    mechs = doctor.mechanisms(caps)
    assert {m.feature for m in doctor.missing_required(mechs)} == {
        "root privileges", "Open vSwitch", "Mininet", "link shaping"}


def test_table_has_a_row_per_feature():
    mechs = doctor.mechanisms(MINIMAL)
    lines = doctor.render_table(mechs).splitlines()
    assert lines[0].split(" | ")[:3] == ["feature        ", "available", "mechanism the lab uses"]
    assert len(lines) == 2 + len(mechs)
    row = next(line for line in lines if line.startswith("ECN marking"))
    # The queueing model is chosen but not built yet: the table says so.
    assert [c.strip() for c in row.split(" | ")][:3] == ["ECN marking", "yes", "bpf-clsact"]


def test_json_is_machine_readable():
    doc = json.loads(doctor.render_json(MINIMAL, doctor.mechanisms(MINIMAL)))
    assert doc["ok"] is True and doc["missing"] == []
    assert doc["ovs_datapath_type"] == "netdev"
    assert doc["features"]["ecn"]["mechanism"] == "bpf-clsact"
    assert doc["features"]["ecn"]["planned"] is False and doc["features"]["shaping"]["planned"] is False
    assert doc["capabilities"]["htb"] is True
    assert doc["capabilities"]["notes"]["red"] == "Specified qdisc kind is unknown."


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_doctor_exit_codes(monkeypatch, capsys, fmt):
    monkeypatch.setattr(doctor, "probe", lambda refresh=False: MINIMAL)
    assert machine.run_doctor(argparse.Namespace(format=fmt)) == 0
    out = capsys.readouterr().out
    assert "bpf-clsact" in out

    broken = dataclasses.replace(MINIMAL, ovs_running=False)
    monkeypatch.setattr(doctor, "probe", lambda refresh=False: broken)
    assert machine.run_doctor(argparse.Namespace(format=fmt)) == 1
    err = capsys.readouterr().err
    assert "missing required: Open vSwitch" in err and "lab.sh bootstrap" in err


def test_optional_features_missing_still_exit_zero(monkeypatch, capsys):
    bare = dataclasses.replace(MINIMAL, clsact=False, bpf_classifier=None, clang=False,
                               iperf3=False, ethtool=False)
    monkeypatch.setattr(doctor, "probe", lambda refresh=False: bare)
    assert machine.run_doctor(argparse.Namespace(format="table")) == 0
    assert "unavailable" in capsys.readouterr().out


def test_probe_is_cached_per_process(monkeypatch):
    calls = []
    monkeypatch.setattr(doctor, "_cache", None)
    monkeypatch.setattr(doctor, "_probe_now", lambda: calls.append(1) or MINIMAL)
    assert doctor.probe() is MINIMAL
    assert doctor.probe() is MINIMAL
    assert len(calls) == 1
    doctor.probe(refresh=True)
    assert len(calls) == 2


def test_register_adds_doctor_command():
    parser = argparse.ArgumentParser()
    machine.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["doctor", "--format", "json"])
    assert args.func is machine.run_doctor and args.format == "json"
