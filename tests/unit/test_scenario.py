"""Scenario files without a network: parsing and validation (one-line errors naming the field),
loading from disk, and prepare()'s checks against the fabric, which build a Lab object but never
start it (Lab.__init__ only builds the Fabric data)."""

import pathlib
import shutil

import pytest

from fabriclab.lab import lab as lab_mod
from fabriclab.workflows import scenario
from fabriclab.errors import LabError
from fabriclab import jobs
from fabriclab.workflows import pipeline
from fabriclab.jobs import DURATION_ITERATIONS
from fabriclab.workflows.scenario import METRIC_DEFAULTS, load, parse, prepare, to_plan

ROOT = pathlib.Path(__file__).parents[2]
EXAMPLES = sorted((ROOT / "examples" / "scenarios").glob("*.yaml"))


def minimal(**fields):
    """The smallest valid scenario, with top-level fields replaced or added."""
    return {"name": "t", "spec": "tiny", "jobs": [{"collective": "allreduce"}], **fields}


def with_job(**fields):
    return minimal(jobs=[{"name": "a", "collective": "allreduce", **fields}])


def error_of(data):
    with pytest.raises(LabError) as err:
        parse(data)
    message = str(err.value)
    assert "\n" not in message and message.startswith("scenario:")
    return message


@pytest.fixture
def nothing_started(monkeypatch):
    """Fails the test if anything tries to bring a lab up or record a run."""
    def refuse(*args, **kwargs):
        raise AssertionError("prepare() must not build anything")

    monkeypatch.setattr(lab_mod.Lab, "start", refuse)
    monkeypatch.setattr(lab_mod.RunState, "create", refuse)
    monkeypatch.setattr(lab_mod.mininet_net, "new_network", refuse)


# -- parsing --------------------------------------------------------------------------------------
def test_a_minimal_scenario_gets_the_defaults():
    s = parse(minimal(), pathlib.Path("/somewhere"))
    assert (s.name, s.description, s.spec) == ("t", "", "tiny")
    assert s.routings == ["ecmp"] and s.repetitions == 1 and s.duration_s is None
    assert s.metrics == METRIC_DEFAULTS and s.metrics is not METRIC_DEFAULTS
    assert s.faults == [] and s.base == pathlib.Path("/somewhere")
    (job,) = s.jobs
    assert (job.name, job.role, job.noise) == ("job1", "measured", False)
    assert job.spec.collective == "allreduce" and job.spec.iterations == 5 and job.spec.hosts is None


def test_fields_are_kept():
    s = parse(minimal(name="  flap test ", description="why", routing=["ecmp", "te:period_s=2"],
                      repetitions=3, metrics={"sample_ms": 2, "bin_ms": 20, "tolerance": 0.1}))
    assert s.name == "flap test" and s.description == "why"
    assert s.routings == ["ecmp", "te:period_s=2"] and s.repetitions == 3
    assert s.metrics == {"sample_ms": 2.0, "bin_ms": 20.0, "tolerance": 0.1, "pingmesh_ms": 0.0, "pingmesh_pairs": ()}
    s = parse(minimal(metrics={"pingmesh_ms": 50, "pingmesh_pairs": [["h1", "h3"]]}))
    assert s.metrics["pingmesh_ms"] == 50.0 and s.metrics["pingmesh_pairs"] == (("h1", "h3"),)
    with pytest.raises(LabError, match="scenario: metrics.pingmesh_ms is 0 \\(off\\)"):
        parse(minimal(metrics={"pingmesh_ms": -1}))


def test_partial_metrics_keep_the_other_defaults():
    assert parse(minimal(metrics={"bin_ms": 100})).metrics == {**METRIC_DEFAULTS, "bin_ms": 100.0}


@pytest.mark.parametrize("sizes, expected", [
    ("64K,1M", (65536, 1048576)),
    (["64K", 1048576], (65536, 1048576)),
    (4096, (4096,)),
    ("1M", (1048576,)),
])
def test_sizes_in_every_spelling(sizes, expected):
    assert parse(with_job(sizes=sizes)).jobs[0].spec.sizes == expected


def test_hosts_and_byte_fields_as_text():
    spec = parse(with_job(hosts="h1, h2,,h3", chunk_bytes="16K", piece_bytes="4K")).jobs[0].spec
    assert spec.hosts == ("h1", "h2", "h3")
    assert (spec.chunk_bytes, spec.piece_bytes) == (16384, 4096)
    assert parse(with_job(hosts=["h1", "h2"])).jobs[0].spec.hosts == ("h1", "h2")


def test_duration_repeats_measured_jobs_only(nothing_started):
    """With duration_s, measured collectives run DURATION_ITERATIONS (the clock stops them); noise
    keeps its own count. The scenario keeps the counts as written."""
    s = parse(minimal(spec="default", duration_s=4, jobs=[{"name": "m", "iterations": 3, "hosts": "h1,h2"},
                                                          {"name": "n", "role": "noise", "iterations": 3,
                                                           "hosts": "h3,h4"}]))
    assert s.duration_s == 4.0 and isinstance(s.duration_s, float)
    assert [(j.name, j.spec.iterations) for j in s.jobs] == [("m", 3), ("n", 3)]
    plan = to_plan(s)
    (run,) = plan.runs
    assert run.duration_s == 4.0
    lab = prepare(s)
    runners = {job.name: jobs.runner(job, lab, run) for job in run.jobs}
    assert runners["m"].spec.iterations == DURATION_ITERATIONS and runners["n"].spec.iterations == 3
    for runner in runners.values():
        runner.cancel()


def test_faults_are_parsed_into_the_scenario():
    s = parse(minimal(duration_s=5, faults=[{"at": 1, "flap": "l1-s1", "count": 2}]))
    assert [(f.kind, f.target, f.at, f.params) for f in s.faults] == [("flap", "l1-s1", 1.0, {"count": 2})]


@pytest.mark.parametrize("data, words", [
    ([{"name": "t"}], "the file must be a mapping"),
    (None, "the file must be a mapping"),
    (minimal(nmae="t"), "unknown field 'nmae'"),
    ({"spec": "tiny", "jobs": [{}]}, "missing name"),
    ({"name": "t", "jobs": [{}]}, "missing spec"),
    ({"name": "t", "spec": "tiny"}, "missing jobs"),
    (minimal(name=" "), "name must be a non-empty string"),
    (minimal(spec=3), "spec must be a spec name or a path"),
    (minimal(routing=[]), "routing must be an app name or a list"),
    (minimal(routing=["ecmp", 3]), "routing must be an app name or a list"),
    (minimal(jobs=[]), "jobs must be a non-empty list"),
    (minimal(jobs={"name": "a"}), "jobs must be a non-empty list"),
    (minimal(jobs=["allreduce"]), "jobs[0] must be a mapping"),
    (minimal(jobs=[{"name": "a"}, {"name": "a"}]), "jobs[1]: job name 'a' is used twice"),
    (minimal(jobs=[{"name": "a b"}]), "jobs[0].name must be letters, digits, - or _"),
    (with_job(role="victim"), "jobs[0].role must be measured or noise, got 'victim'"),
    (with_job(size="1M"), "jobs[0] (a): unknown field 'size'"),
    (with_job(qps=0), "jobs[0] (a): collective: qps must be in [1, 64], got 0"),
    (with_job(sizes="64Q"), "jobs[0] (a): bad size '64Q'"),
    (with_job(collective="allgatherv"), "jobs[0] (a): collective: collective must be one of"),
    (minimal(jobs=[{"role": "noise"}, {"role": "noise"}]), "every job is noise"),
    (minimal(repetitions=0), "repetitions must be a whole number >= 1, got 0"),
    (minimal(repetitions=2.0), "repetitions must be a whole number >= 1"),
    (minimal(duration_s=0), "duration_s must be > 0 seconds, got 0"),
    (minimal(duration_s=-1), "duration_s must be > 0 seconds"),
    (minimal(duration_s=True), "duration_s must be > 0 seconds"),
    (minimal(duration_s=2, faults=[{"at": 2, "link_down": "l1-s1"}]),
     "a fault at 2 s comes after duration_s (2 s)"),
    (minimal(faults=[{"at": -1, "link_down": "l1-s1"}]), "faults[0].at must be in [0, 86400]"),
    (minimal(metrics=[5]), "metrics must be a mapping"),
    (minimal(metrics={"bins_ms": 50}), "metrics.bins_ms is unknown"),
    (minimal(metrics={"bin_ms": 0}), "metrics.bin_ms must be a number > 0"),
    (minimal(metrics={"sample_ms": 0.5}), "metrics.sample_ms must be >= 1 ms, got 0.5"),
    (minimal(metrics={"sample_ms": 10, "bin_ms": 5}), "metrics.bin_ms must be >= sample_ms"),
    (minimal(metrics={"tolerance": 1}), "metrics.tolerance is a fraction below 1, got 1"),
])
def test_bad_scenarios_are_one_line_errors_naming_the_field(data, words):
    assert words in error_of(data)


@pytest.mark.parametrize("field, value", [("timeout_factor", "fast"), ("imbalance", "x"),
                                          ("ack_timeout_s", "1s")])
def test_a_job_field_of_the_wrong_type_is_a_lab_error(field, value):
    """A string where the collective wants a number should be a one-line LabError naming the field."""
    assert field in error_of(with_job(**{field: value}))


def test_an_empty_description_stays_empty():
    assert parse(minimal(description=None)).description == ""


# -- load -----------------------------------------------------------------------------------------
def test_load_reads_a_file_and_resolves_the_spec_next_to_it(tmp_path, nothing_started):
    shutil.copy(ROOT / "tests" / "two_by_two.yaml", tmp_path / "fab.yaml")
    path = tmp_path / "s.yaml"
    path.write_text("name: local\nspec: fab.yaml\njobs:\n  - name: a\n    hosts: h1,h3\n")
    s = load(path)
    assert s.base == tmp_path and s.spec_path() == str(tmp_path / "fab.yaml")
    assert s.jobs[0].spec.hosts == ("h1", "h3")
    assert prepare(s).fabric.spec.name == "rt2x2"            # the file's own spec, not a shipped one


def test_spec_path_keeps_a_shipped_name(tmp_path):
    """A bare name not found next to the file is a shipped spec name; a .yaml is always a path."""
    assert parse(minimal(), tmp_path).spec_path() == "tiny"
    assert parse(minimal(spec="sub/x.yaml"), tmp_path).spec_path() == str(tmp_path / "sub" / "x.yaml")


def test_load_of_invalid_yaml_names_the_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nspec: tiny\njobs: [a, b\nfaults: []\n")
    with pytest.raises(LabError) as err:
        load(path)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: line 4 is not valid YAML:")


def test_load_prefixes_validation_errors_with_the_file(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: x\nspec: tiny\njobs: [{collective: allreduce, qps: 0}]\n")
    with pytest.raises(LabError) as err:
        load(path)
    assert str(err.value).startswith(f"{path}: scenario: jobs[0] (job1): collective: qps")


def test_load_of_a_missing_file(tmp_path):
    with pytest.raises(LabError, match="cannot read scenario .*nope.yaml"):
        load(tmp_path / "nope.yaml")


# -- prepare: checks against the fabric ------------------------------------------------------------
def test_prepare_gives_an_unstarted_lab(nothing_started):
    lab = prepare(parse(minimal(spec="default", routing=["te", "ecmp"],
                                jobs=[{"name": "a", "hosts": "h1,h2"},
                                      {"name": "b", "role": "noise", "hosts": "h3,h4"}],
                                faults=[{"at": 1, "link_down": "l1-s1", "for": 1}])))
    assert isinstance(lab, lab_mod.Lab)
    assert lab.fabric.spec.name == "default" and lab.routing == "te"
    assert lab.net is None and lab.controller is None and lab.run is None


@pytest.mark.parametrize("data, words", [
    (minimal(routing="ospf"), "unknown routing app 'ospf'"),
    (minimal(routing=["ecmp", "ospf"]), "unknown routing app 'ospf'"),
    (with_job(hosts=["h1", "h9"]), "scenario: run 'ecmp r1', job a: host 'h9' is not in fabric 'tiny'"),
    (with_job(hosts=["h1"]), "scenario: run 'ecmp r1', job a: collective: 1 rank"),
    (minimal(spec="default", jobs=[{"name": "a", "hosts": "h1,h2,h3"},
                                   {"name": "b", "role": "noise", "hosts": "h4,h3"}]),
     "scenario: run 'ecmp r1': jobs a and b both use h3"),
    (minimal(jobs=[{"name": "a"}, {"name": "b", "role": "noise", "hosts": "h1,h2"}]), "jobs a and b both use h"),
    (minimal(faults=[{"at": 0, "controller_restart": True}, {"at": 1, "link_down": "l1-l2"}]),
     "scenario: faults[1] (link_down): no link between l1 and l2"),
    (minimal(faults=[{"at": 1, "switch_down": "s3"}]), "scenario: faults[0] (switch_down): no switch 's3'"),
])
def test_prepare_errors_come_before_anything_is_built(nothing_started, data, words):
    s = parse(data)
    with pytest.raises(LabError) as err:
        prepare(s)
    assert words in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).count("scenario: ") <= 1, err.value        # said once, not once a layer


def test_hosts_of_the_wrong_type_are_a_lab_error(nothing_started):
    with pytest.raises(LabError, match="hosts"):
        prepare(parse(with_job(hosts=5)))


def test_run_refuses_a_lab_that_is_not_running(nothing_started, tmp_path):
    """A lab passed in must be up; the refusal comes before the results folder is made."""
    s = parse(minimal())
    with pytest.raises(LabError, match="the lab passed in is not running"):
        pipeline.run_plan(to_plan(s), out=tmp_path / "out", lab=prepare(s))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_shipped_examples_load_and_prepare(nothing_started, path, monkeypatch):
    s = load(path)
    if any(f.kind == "latency" for f in s.faults):
        # a latency fault changes netem delays: refused without netem, prepared with it
        from fabriclab.system import doctor

        def kernel(delay):
            monkeypatch.setattr(doctor, "probe", lambda refresh=False: None)
            monkeypatch.setattr(doctor, "mechanisms", lambda caps: {
                "delay": doctor.Mechanism("link delay", delay == "netem", delay, "")})
        kernel("none")
        with pytest.raises(LabError, match="this kernel has no netem"):
            prepare(s)
        kernel("netem")
    lab = prepare(s)
    assert lab.net is None and lab.fabric.spec.name == s.spec
    assert s.duration_s is not None and all(f.at < s.duration_s for f in s.faults)
    assert any(not job.noise for job in s.jobs)
    assert scenario.faults_mod.steps(s.faults, lab)


def test_there_are_shipped_examples():
    assert {p.stem for p in EXAMPLES} >= {"degraded_uplink", "flap_recovery", "victim_noise_faults"}


def test_several_measured_jobs_are_accepted_and_all_noise_is_refused():
    s = scenario.parse({"name": "x", "spec": "tiny", "jobs": [{"name": "a", "hosts": ["h1", "h2"]},
                                                               {"name": "b", "hosts": ["h3", "h4"]}]})
    assert [j.noise for j in s.jobs] == [False, False]
    with pytest.raises(LabError, match="every job is noise"):
        scenario.parse({"name": "x", "spec": "tiny", "jobs": [{"name": "a", "role": "noise"}]})


