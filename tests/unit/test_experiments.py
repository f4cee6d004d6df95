"""The packaged experiments' plans: hosts, runs and settings, checked without a fabric."""

import dataclasses

import pytest

from fabriclab.errors import LabError
from fabriclab.lab.lab import Lab
from fabriclab.queues.config import queues_from_dict
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec
from fabriclab.workflows import pipeline
from fabriclab.workflows.experiments import EXPERIMENTS, Options, build_plan, ecn_dcqcn, incast, module, victim


def fabric(name):
    return Fabric(load_spec(name))


def test_unknown_experiment_names_the_known_ones():
    with pytest.raises(LabError, match="unknown experiment 'nope': choose one of pfc-incast"):
        module("nope")


def test_every_experiment_implements_the_protocol_and_a_module_that_does_not_is_named():
    import types

    from fabriclab.workflows.experiments import check_protocol

    assert all(module(name).NAME == name for name in EXPERIMENTS)
    half = types.ModuleType("mine")
    half.NAME, half.SUMMARY, half.DEFAULT_SPEC, half.REFERENCE = "mine", "mine", "tiny", {}
    half.prepare = lambda spec, options: spec
    half.runs = lambda fabric: []
    half.table = lambda doc: ""
    with pytest.raises(LabError, match=r"experiment mine: module mine lacks runs\(\) taking 2 arguments, "
                                       r"plot\(\) \(the Experiment protocol"):
        check_protocol(half, "mine")
    half.runs, half.plot = (lambda fabric, options: []), (lambda doc, folder: None)
    assert check_protocol(half, "mine") is half
    with pytest.raises(LabError, match="calls itself 'mine'"):
        check_protocol(half, "yours")


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_every_run_plans_and_checks_on_the_default_spec(name):
    """An experiment is a plan: every run's jobs, hosts, faults and conditions pass the pipeline's
    checks against the experiment's fabric (a Lab object that is never started)."""
    for quick in (True, False):
        plan = build_plan(name, options=Options(quick=quick))
        assert plan.kind == "experiment" and plan.experiment is module(name)
        assert len({run.slug for run in plan.runs}) == len(plan.runs) >= 2      # a comparison
        pipeline.check(plan, Lab(plan.spec, routing=plan.runs[0].routing))


def test_incast_is_sixteen_to_one_across_leaves():
    fab = fabric("incast")
    receiver, senders = incast.pick_hosts(fab)
    assert receiver == "h1" and len(senders) == 16
    assert all(fab.hosts[h].ports[0].leaf != "l1" for h in senders)
    streaming, admitted, slow = incast.runs(fab, Options(routing="ecmp"))
    assert not streaming.jobs[0].workload.cts and admitted.jobs[0].workload.cts
    # Receiver-driven: 16 senders x one 8 KiB buffer in flight, below a leaf ingress port's XOFF
    # even if it all came in by one spine.
    assert admitted.jobs[0].workload.cts_buffers * admitted.jobs[0].workload.chunk_bytes * 16 <= 128 * 1024
    (condition,) = slow.conditions
    assert (condition.kind, condition.target, condition.params) == (
        "degrade", "l1-h1", {"rate_mbps": fab.spec.host_rate_mbps / 4})


def test_incast_needs_sixteen_senders_and_pfc():
    with pytest.raises(LabError, match="needs 16 senders outside the receiver's leaf; fabric 'tiny' has 1"):
        incast.pick_hosts(fabric("tiny"))
    with pytest.raises(LabError, match="needs a spec with a queues: section; 'tiny' has none"):
        incast.prepare(load_spec("tiny"), Options())
    spec = load_spec("incast")
    no_pfc = dataclasses.replace(spec, queues=dataclasses.replace(
        spec.queues, pfc=dataclasses.replace(spec.queues.pfc, enabled=False)))
    with pytest.raises(LabError, match="turns PFC off"):
        incast.prepare(no_pfc, Options())


def test_ecn_profiles_change_the_spines_thresholds_only():
    spec = ecn_dcqcn.prepare(load_spec(ecn_dcqcn.DEFAULT_SPEC), Options())
    assert spec.name == "routing" and spec.queues.pfc.enabled
    assert spec.queues.ecn.mode == "red"             # the spec's is off: each run sets thresholds
    assert spec.queues.pfc.watchdog_ms == 0          # added by the experiment: see prepare
    assert ecn_dcqcn.prepare(load_spec("oversubscribed"), Options()).queues.pfc.watchdog_ms == 0
    fab = Fabric(spec)
    tight, relaxed = ecn_dcqcn.thresholds(fab, "tight"), ecn_dcqcn.thresholds(fab, "relaxed")
    # the paper changed the CTSWs' thresholds (spines, 256 KiB); the RTSWs (leaves, 64 KiB) stay relaxed
    assert tight["leaf"] == relaxed["leaf"] == {"mode": "red", "kmin": 32 * 1024, "kmax": 64 * 1024, "pmax": 0.2}
    assert tight["spine"] == {"mode": "red", "kmin": 16 * 1024, "kmax": 64 * 1024, "pmax": 0.2}
    assert relaxed["spine"]["kmin"] == 128 * 1024 and relaxed["spine"]["kmax"] == 256 * 1024
    runs = ecn_dcqcn.runs(fab, Options(routing="ecmp"))
    # every host of two leaves: 8 ranks, four of them behind each leaf's four uplinks
    ranks = runs[0].jobs[0].workload.hosts
    assert ranks == ("h1", "h2", "h3", "h4", "h5", "h6", "h7", "h8")
    assert all(r.jobs[0].workload.hosts == ranks for r in runs)
    assert [r.jobs[0].workload.dcqcn is not None for r in runs] == [False, False, True, True]
    assert [r.ecn == tight for r in runs] == [False, True, False, True]


def test_victim_shares_no_host_with_the_noise():
    fab = fabric("incast")
    victims, receiver, senders = victim.pick_hosts(fab)
    assert victims == ["h2", "h6", "h10", "h14", "h18"] and receiver == "h1"
    assert len(senders) == 12 and not set(senders) & {*victims, receiver}
    assert all(fab.hosts[h].ports[0].leaf != "l1" for h in senders)
    alone, spreading, cts, lossy = victim.runs(fab, Options(routing="ecmp"))
    assert [j.name for j in alone.jobs] == ["victim"]
    assert [j.noise for j in spreading.jobs] == [False, True]
    assert cts.jobs[1].workload.cts and lossy.jobs[1].workload.dscp == 0


def test_yaml_off_is_the_off_mode():
    # YAML 1.1 reads a bare `off` as false.
    assert queues_from_dict({"ecn": {"mode": False}}).ecn.mode == "off"


def test_cli_lists_and_refuses_bad_input_in_one_line(capsys, tmp_path):
    from fabriclab.cli.main import main

    assert main(["experiment", "list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in EXPERIMENTS) and "seed 000 Table 3" in out
    # Refused before anything is built: no results folder appears.
    assert main(["experiment", "pfc-incast", "--spec", "tiny", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fabriclab: error: pfc-incast needs a spec with a queues: section")
    assert len(err.splitlines()) == 1 and not (tmp_path / "r").exists()
    assert main(["experiment", "victim-noise", "--sample-ms", "0.1"]) == 2
    assert "--sample-ms must be >= 1 ms" in capsys.readouterr().err
    assert main(["experiment", "ecn-dcqcn", "--routing", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


# -- derating: a saturated experiment runs again at lower link rates ------------------------------------
def test_a_derated_spec_is_the_same_fabric_at_a_larger_time_scale():
    from fabriclab.topologies.spec import load_spec

    spec = load_spec("meta_dc")
    slow = spec.derated(2)
    assert (slow.host_rate_mbps, slow.fabric_rate_mbps, slow.super_spine_rate_mbps) == (10, 10, 5)
    assert slow.time_scale == 2 * spec.time_scale and slow.buffers == spec.buffers
    assert slow.lab_delay_ms("fabric") == 2 * spec.lab_delay_ms("fabric")
    with pytest.raises(Exception, match="derating factor is >= 1"):
        spec.derated(0.5)


def test_a_saturated_experiment_runs_again_slower_at_most_twice_and_keeps_every_attempt(tmp_path, monkeypatch):
    """A fake pipeline: every run saturates the CPU until the rates are quartered; the document
    judged is the last attempt's, the earlier ones stay beside it, and the document lists all."""
    from fabriclab.results import document
    from fabriclab.workflows import pipeline
    from fabriclab.workflows.experiments import MAX_DERATE, run_experiment, saturated_runs
    from tests.unit import resultdocs as rd

    seen = []
    monkeypatch.setattr(pipeline, "run_plan", rd.saturating_run_plan(seen))
    out = tmp_path / "pfc"
    doc = run_experiment("pfc-incast", out=out, options=Options(quick=True))
    assert seen == [10, 5, 2.5] and MAX_DERATE == 2
    assert [a["derate"] for a in doc["attempts"]] == [0, 1, 2]
    assert [a["host_rate_mbps"] for a in doc["attempts"]] == [10, 5, 2.5]
    assert doc["attempts"][0]["saturated"] == [doc["runs"][0]["label"]] and not doc["attempts"][2]["saturated"]
    assert (tmp_path / "pfc.attempt-1" / "results.json").is_file() and (tmp_path / "pfc.attempt-2").is_dir()
    assert document.load(out)["attempts"] == doc["attempts"]                  # of the one schema
    seen.clear()
    assert "attempts" not in run_experiment("pfc-incast", out=tmp_path / "kept", options=Options(quick=True),
                                            derate=False) and seen == [10]
    lossless = {"runs": [{"label": "a", "invalid": ["lossless drop: l1-eth3 ...", "CPU saturated: ..."]},
                         {"label": "b", "invalid": []}, {"label": "c", "invalid": ["x: CPU saturated: ..."]}]}
    assert saturated_runs(lossless) == ["c"]                                   # no slower rate mends a drop
    with pytest.raises(LabError, match="derate must be 0-2"):
        build_plan("pfc-incast", options=Options(derate=3))


# -- --cc spx: SPX CC in the NICs, ar ECN marking in the switches ----------------------------------------
@pytest.mark.parametrize("name", ["multiplane-asymmetry", "plane-convergence"])
def test_cc_spx_runs_every_nic_with_spx_and_the_switches_with_ar_marking(name):
    plan = build_plan(name, options=Options(quick=True, cc="spx"))
    queues = plan.spec.queues
    assert queues.ecn.mode == "ar" and all(p.mode == "ar" for _r, p in queues.ecn_by_role)
    assert plan.source["cc"] == "spx"
    for run in plan.runs:
        assert run.tags["cc"] == "spx"
        assert all(job.workload.cc == "spx" for job in run.jobs)
    default = build_plan(name, options=Options(quick=True))
    assert default.spec.queues.ecn.mode != "ar" and default.source["cc"] == "dcqcn"
    assert all(job.workload.cc == "dcqcn" for run in default.runs for job in run.jobs)


def test_cc_is_refused_where_the_experiment_does_not_take_it():
    with pytest.raises(LabError, match="experiment pfc-incast takes no --cc"):
        build_plan("pfc-incast", options=Options(cc="spx"))
    with pytest.raises(LabError, match="--cc must be one of dcqcn, spx"):
        build_plan("multiplane-asymmetry", options=Options(cc="reno"))
