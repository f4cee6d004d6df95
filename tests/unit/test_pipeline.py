"""The one pipeline without a network: every entry point's input becomes a Plan, plans are checked
against a fabric before anything is built (a Lab object that is never started), a run's record is
assembled from sampled series into a schema-valid document, and exit codes are the same everywhere."""

import argparse
import io
import types

import numpy as np
import pytest

from fabriclab.cli import running
from fabriclab.cli.fabric import allpairs_plan
from fabriclab.errors import LabError
from fabriclab.lab import lab as lab_mod
from fabriclab.measure.portsampler import PortSeries, columns
from fabriclab.results import document
from fabriclab.topologies.spec import load_spec
from fabriclab.traffic.allpairs import AllPairsSpec
from fabriclab.traffic.collective import CollectiveSpec
from fabriclab import jobs
from fabriclab.workflows import faults, pipeline, scenario
from fabriclab.workflows.plan import Job, Metrics, Plan, RunPlan, single_run
from tests.unit import resultdocs as rd


@pytest.fixture(autouse=True)
def nothing_started(monkeypatch):
    """Fails the test if anything tries to bring a lab up or record a run."""
    def refuse(*args, **kwargs):
        raise AssertionError("a unit test tried to build a fabric")

    monkeypatch.setattr(lab_mod.Lab, "start", refuse)
    monkeypatch.setattr(lab_mod.RunState, "create", refuse)


def run_args(**kw):
    base = dict(spec="tiny", routing="ecmp", duration=4.0, load=0.5, flows_per_pair=1, sport_mode="qp",
                link_down=[], link_up=[], sample_ms=5.0, out=None, format="table", verbose=False, command="run")
    return argparse.Namespace(**{**base, **kw})


def lab_for(plan):
    return lab_mod.Lab(plan.spec, routing=plan.runs[0].routing)


# -- plans from every entry point ------------------------------------------------------------------
def test_run_becomes_one_run_with_an_all_pairs_job_and_its_link_events_on_the_timeline():
    plan = allpairs_plan(run_args(link_down=["l1-s1@1"], link_up=["l1-s1@2.5"]))
    assert (plan.kind, plan.name, plan.spec.name) == ("run", "tiny", "tiny")
    (run,) = plan.runs
    (job,) = run.jobs
    assert job.kind == "all-pairs" and job.workload == AllPairsSpec(duration_s=4.0, load=0.5)
    assert [(f.at, f.kind, f.target) for f in run.faults] == [(1.0, "link_down", "l1-s1"), (2.5, "link_up", "l1-s1")]
    assert plan.source["link_down"] == ["l1-s1@1"] and plan.metrics == Metrics(5.0, 50.0, 0.25)
    pipeline.check(plan, lab_for(plan))


@pytest.mark.parametrize("kw, words", [
    (dict(link_down=["l1-s9@1"]), "no node 's9'"),
    (dict(link_down=["l1-s1@4"]), "a fault at 4 s comes after the traffic ends (4 s)"),
    (dict(duration=0.0), "duration_s must be in [0.1, 3600]"),
    (dict(load=0.0), "load must be in [0.001, 1]"),
    (dict(flows_per_pair=100000), "flows_per_pair must be a whole number in 1..64"),
    (dict(routing="ospf"), "unknown routing app 'ospf'"),
    (dict(spec="no-such-spec"), "no-such-spec"),
    (dict(sample_ms=0.2), "metrics.sample_ms must be >= 1 ms"),
])
def test_bad_run_input_is_one_line_before_anything_is_built(kw, words):
    with pytest.raises(LabError) as err:
        plan = allpairs_plan(run_args(**kw))
        pipeline.check(plan, lab_for(plan))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_collective_plan_checks_ranks_against_the_fabric():
    from fabriclab.cli.collective import collective_plan

    spec = load_spec("tiny")
    plan = collective_plan(spec, "ecmp", CollectiveSpec(hosts=("h1", "h9")), argparse.Namespace(spec="tiny"))
    assert plan.kind == "collective" and plan.runs[0].jobs[0].kind == "collective"
    with pytest.raises(LabError, match="job allreduce: host 'h9' is not in fabric 'tiny'"):
        pipeline.check(plan, lab_for(plan))


def test_a_scenario_is_a_run_per_routing_and_repetition():
    sc = scenario.parse({"name": "s", "spec": "default", "routing": ["ecmp", "te"], "repetitions": 2,
                         "duration_s": 3, "jobs": [{"name": "a", "hosts": "h1,h2"},
                                                   {"name": "b", "kind": "all-pairs", "role": "noise",
                                                    "duration_s": 5}],
                         "faults": [{"at": 1, "link_down": "l1-s1", "for": 1}]})
    plan = scenario.to_plan(sc)
    assert [r.label for r in plan.runs] == ["ecmp r1", "ecmp r2", "te r1", "te r2"]
    assert all(r.duration_s == 3 and len(r.faults) == 1 for r in plan.runs)
    assert [j.kind for j in plan.runs[0].jobs] == ["collective", "all-pairs"]
    # the all-pairs noise job streams from every host: it cannot share the fabric with job a
    with pytest.raises(LabError, match="jobs a and b both use h1"):
        scenario.prepare(sc)


def test_a_switchml_job_is_checked_against_its_fabric():
    sc = scenario.parse({"name": "s", "spec": "switchml", "jobs": [
        {"name": "agg", "kind": "switchml", "elements": 1024, "workers": "h1,h2"}]})
    plan = scenario.to_plan(sc)
    assert plan.runs[0].jobs[0].kind == "switchml"
    pipeline.check(plan, lab_for(plan))
    bad = scenario.parse({"name": "s", "spec": "switchml", "jobs": [
        {"name": "agg", "kind": "switchml", "workers": "h1,h99"}]})
    with pytest.raises(LabError, match="switchml: host 'h99' is not in fabric"):
        scenario.prepare(bad)


def test_plan_checks_what_needs_no_fabric():
    spec = load_spec("tiny")
    job = Job("a", CollectiveSpec())
    with pytest.raises(LabError, match="every job is noise"):
        Plan("p", "run", spec, [RunPlan("r", jobs=[Job("a", CollectiveSpec(), "noise")])]).check()
    with pytest.raises(LabError, match="another run has the same name"):
        Plan("p", "run", spec, [RunPlan("r 1", jobs=[job]), RunPlan("R-1", jobs=[job])]).check()
    with pytest.raises(LabError, match="kind must be one of"):
        Plan("p", "sweep", spec, [RunPlan("r", jobs=[job])]).check()
    lasting = faults.Fault(0, "degrade", "l1-s1", 0.0, {"rate_mbps": 1.0, "for": 1.0})
    with pytest.raises(LabError, match="a condition lasts the whole run"):
        Plan("p", "run", spec, [RunPlan("r", jobs=[job], conditions=[lasting])]).check()
    restart = faults.Fault(0, "controller_restart", True, 0.0, {})
    with pytest.raises(LabError, match="a condition held for the run is one of"):
        Plan("p", "run", spec, [RunPlan("r", jobs=[job], conditions=[restart])]).check()
    with pytest.raises(LabError, match="is one of CollectiveSpec, AllPairsSpec, AggregationSpec, ReplaySpec, not dict"):
        Plan("p", "run", spec, [RunPlan("r", jobs=[Job("a", {"collective": "allreduce"})])]).check()


def test_ecn_settings_need_the_queue_model():
    spec = load_spec("tiny")
    plan = Plan("p", "experiment", spec, [RunPlan("r", jobs=[Job("a", CollectiveSpec())],
                                                  ecn={"leaf": {"mode": "red"}})])
    with pytest.raises(LabError, match="ECN settings need a spec with a queues: section"):
        pipeline.check(plan, lab_for(plan))


def test_a_plan_for_another_spec_is_refused_on_a_running_lab():
    plan = allpairs_plan(run_args())
    with pytest.raises(LabError, match="is for spec 'tiny', the lab runs 'default'"):
        pipeline.check(plan, lab_mod.Lab(load_spec("default")))


def test_a_duration_run_repeats_measured_collectives_only():
    spec = load_spec("default")
    run = RunPlan("r", jobs=[Job("m", CollectiveSpec(iterations=3, hosts=("h1", "h2"))),
                             Job("n", CollectiveSpec(iterations=3, hosts=("h3", "h4")), "noise")], duration_s=2.0)
    lab = lab_mod.Lab(spec)
    m, n = (jobs.runner(job, lab, run) for job in run.jobs)
    assert m.spec.iterations == jobs.DURATION_ITERATIONS and n.spec.iterations == 3
    m.cancel()
    n.cancel()


# -- the run record --------------------------------------------------------------------------------
def synthetic_series(fabric, seconds=4.0, dt=0.01, dip=None):
    """Cumulative byte counters at 10 Mbit/s on every direction, nothing while `dip` lasts."""
    cols = columns(fabric)
    times = np.arange(0.0, seconds, dt)
    rate = np.where((times >= dip[0]) & (times < dip[1]), 0.0, 10e6 / 8 * dt) if dip else np.full(len(times), 10e6 / 8 * dt)
    counts = np.cumsum(rate)
    rows = np.repeat(counts[:, None], len(cols), axis=1).astype(np.int64)
    return PortSeries(0.005, times, cols, rows, wall0=1000.0)


def test_a_run_record_is_assembled_from_the_series_and_follows_the_schema(tmp_path):
    lab = rd.fake_lab()
    lab.stage_stats = lambda: None
    lab.controller = None
    fabric = lab.fabric
    fault = faults.Fault(0, "link_down", "l1-s1", 1.0, {})
    plan = single_run("tiny", "collective", fabric.spec, Job("ring", CollectiveSpec()), faults=[fault])
    run = plan.runs[0]
    series = synthetic_series(fabric, dip=(1.5, 1.8))
    links = fabric.find_link("l1", "s1")
    step = faults.Step(1.0, 0, "link", (links, False))
    clock = pipeline._Clock(lab, ["ring"], None)
    clock.wall = 1000.5
    clock.timeline = types.SimpleNamespace(applied=[(step, 1001.5)], steps=[step])
    runner = types.SimpleNamespace(record=lambda raw: rd.collective_job())
    record = pipeline._record(lab, plan, run, tmp_path, {"ring": runner}, {"ring": object()},
                              {"ring": (1000.5, 1003.5)}, series, None, clock, [], [],
                              pipeline._RoutingWatch(lab, ["job-ring"]), None, [{}, {}])
    assert (record["origin_s"], record["end_s"]) == (0.5, 3.5)
    (row,) = record["faults"]
    assert row["at_s"] == 1.0 and row["until_s"] is None and row["impact"]["fell"] is True
    assert row["impact"]["recovery_s"] == pytest.approx(0.3, abs=0.11)
    assert row["uplinks_after"]["max_mean_ratio"] == pytest.approx(1.0)
    assert record["telemetry"]["mean_mbps"]["l1>s1"] == pytest.approx(10.0 * 2.7 / 3, rel=0.02)
    assert (tmp_path / record["files"]["links_csv"]).read_text().startswith("t_s,l1>s1")
    head = document.header(lab, 4096)
    doc = document.assemble(plan, head, [record], 5.0, tmp_path)
    assert document.first_problem(doc) is None, document.first_problem(doc)
    assert doc["valid"] and doc["routing"] == ["ecmp"]


def test_a_fault_the_run_never_reached_is_said_so(tmp_path):
    lab = rd.fake_lab()
    series = synthetic_series(lab.fabric)
    fault = faults.Fault(2, "switch_down", "s2", 9.0, {})
    row = pipeline._fault_row(series, fault, [], 0.5, 3.5, *series.delivered(0.05), [])
    assert row["note"] == "not reached: the measured jobs ended first" and row["impact"] is None


# -- exit codes and progress -------------------------------------------------------------------------
def test_exit_codes_say_valid_invalid_and_why():
    doc = rd.scenario_doc()
    assert running.exit_code(doc) == 0
    bad = rd.doc("run", [rd.run("r", {"j": rd.collective_job(valid=False)})])
    err = io.StringIO()
    assert running.exit_code(bad, err) == 1
    assert err.getvalue().startswith("fabriclab: results not valid: j: CPU saturated")
    assert (running.EXIT_ERROR, running.EXIT_INTERRUPTED) == (2, 130)


def test_main_maps_errors_and_interrupts_to_their_codes(monkeypatch, capsys):
    from fabriclab.cli import main as cli
    from fabriclab.errors import Terminated

    def fail(exc):
        def func(_args):
            raise exc
        return func

    for exc, code in ((LabError("bad"), 2), (KeyboardInterrupt(), 130), (Terminated("stop"), 130)):
        parser = argparse.ArgumentParser()
        parser.add_subparsers().add_parser("boom").set_defaults(func=fail(exc))
        monkeypatch.setattr(cli, "build_parser", lambda parser=parser: parser)
        assert cli.main(["boom"]) == code
        assert capsys.readouterr().err.count("\n") == 1


def test_progress_prints_a_line_per_run_in_a_log():
    out = io.StringIO()
    progress = running.Progress(out)
    progress({"event": "up", "spec": "tiny", "seconds": 1.25, "datapath": "user"})
    progress({"event": "run", "index": 0, "total": 2, "label": "ecmp r1"})
    progress({"event": "tick", "started": True, "elapsed_s": 1.0, "duration_s": 3.0, "fault_steps": 1,
              "fault_steps_total": 2})
    progress({"event": "tick", "started": True, "elapsed_s": 3.0, "duration_s": 3.0, "fault_steps": 2,
              "fault_steps_total": 2, "finished": True})
    assert out.getvalue().splitlines() == [
        "fabric tiny up in 1.2 s (datapath user)", "[1/2] ecmp r1: starting",
        "[1/2] ecmp r1:   3.0 of 3 s, fault steps 2/2 done"]


def test_link_loss_counts_what_was_dropped_during_the_run():
    assert pipeline._dropped([{}, {}]) is None
    before, after = {("l1", "l1-eth3"): 5}, {("l1", "l1-eth3"): 9, ("s1", "s1-eth1"): 2}
    assert pipeline._dropped([before, after]) == {"dropped_packets": 6}


def _drain_lab(rows):
    return types.SimpleNamespace(queues=types.SimpleNamespace(counters=lambda: rows))


def _row(port, peer, occ=0, paused=False, gate_closed=False):
    return {"port": port, "peer": peer, "class": "lossless", "occ": occ, "paused": paused,
            "gate_closed": gate_closed}


def test_a_pause_whose_upstream_gate_is_open_is_drained():
    """The agent opened the upstream's gate (nothing left to send the XON); the flag clears at
    the next arrival, which only the next run brings."""
    from fabriclab.workflows.pipeline import wait_drained

    wait_drained(_drain_lab([_row("l1-eth3", "s1-eth1", paused=True), _row("s1-eth1", "l1-eth3")]), 0.2)
    with pytest.raises(LabError, match=r"did not drain .*: l1-eth3 \(0 B, paused\)"):
        wait_drained(_drain_lab([_row("l1-eth3", "s1-eth1", paused=True),
                                 _row("s1-eth1", "l1-eth3", gate_closed=True)]), 0.2)
    with pytest.raises(LabError, match=r"s1-eth1 \(3000 B\)"):
        wait_drained(_drain_lab([_row("s1-eth1", "l1-eth3", occ=3000)]), 0.2)


def test_a_runs_phases_add_up_to_its_wall_time_and_split_at_the_traffics_origin(monkeypatch):
    from fabriclab.workflows import pipeline

    clock = {"mono": 100.0, "wall": 5000.0}
    monkeypatch.setattr(pipeline.time, "monotonic", lambda: clock["mono"])
    monkeypatch.setattr(pipeline.time, "time", lambda: clock["wall"])

    def advance(s):
        clock["mono"] += s
        clock["wall"] += s

    phases = pipeline._Phases()
    advance(1.5)
    phases.mark("routing_s")
    advance(2.0)                                     # agents start, then 3 s of traffic from the origin
    origin = clock["wall"]
    advance(3.0)
    phases.split_at("start_s", "traffic_s", origin)
    advance(0.25)
    phases.split_at("x_s", "y_s", None)              # no origin reached: all of it before
    assert phases.seconds() == {"routing_s": 1.5, "start_s": 2.0, "traffic_s": 3.0, "x_s": 0.25, "run_s": 6.75}
