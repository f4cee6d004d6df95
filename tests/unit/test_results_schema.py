"""The one results document: schema.json is a valid JSON Schema, documents of every kind follow it,
and what breaks it is named in one line. (Lab tests validate documents real runs wrote.)"""

import copy
import json

import jsonschema
import pytest

from fabriclab.errors import LabError
from fabriclab.results import document
from tests.unit import resultdocs as rd


def test_the_schema_is_a_valid_draft_2020_12_schema():
    schema = json.loads(document.SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["properties"]["schema_version"] == {"const": document.SCHEMA_VERSION}


@pytest.mark.parametrize("kind, job", [("run", "all-pairs"), ("demo", "all-pairs"), ("collective", "collective"),
                                       ("calibration", "collective"), ("experiment", "switchml"),
                                       ("prompt", "collective")])
def test_documents_of_every_kind_and_job_follow_the_schema(kind, job):
    doc = rd.doc(kind, [rd.run("r1", {"j": rd.job(job)})])
    assert document.first_problem(doc) is None
    # and survive JSON (no NaN, no tuples)
    assert document.first_problem(json.loads(json.dumps(doc, allow_nan=False))) is None


def test_a_scenario_with_faults_noise_and_two_runs_follows_the_schema():
    assert document.first_problem(rd.scenario_doc()) is None


def _broken(change):
    doc = rd.scenario_doc()
    change(doc)
    return document.first_problem(doc)


@pytest.mark.parametrize("change, where", [
    (lambda d: d.pop("scale"), "the top level"),
    (lambda d: d.__setitem__("surprise", 1), "the top level"),
    (lambda d: d["scale"].pop("time_scale"), "scale"),
    (lambda d: d["scale"].__setitem__("host_rate_mbps", 0), "scale/host_rate_mbps"),
    (lambda d: d.__setitem__("kind", "sweep"), "kind"),
    (lambda d: d["runs"][0].pop("telemetry"), "runs/0"),
    (lambda d: d["runs"][0]["jobs"]["ring"].__setitem__("kind", "no such kind"), "runs/0/jobs/ring"),
    (lambda d: d["runs"][0]["jobs"]["ring"]["sizes"][0].__setitem__("busbw_mbps", "fast"), "runs/0/jobs/ring"),
    (lambda d: d["runs"][0]["jobs"]["ring"].__setitem__("traffic", {}), "runs/0/jobs/ring"),
    (lambda d: d["runs"][0]["jobs"]["ring"]["sizes"][0].__setitem__("in_place", "yes"), "runs/0/jobs/ring"),
    (lambda d: d["runs"][0]["jobs"]["ring"]["ranks"][0].__setitem__("pid", "1"), "runs/0/jobs/ring"),
    (lambda d: d["runs"][0]["faults"][0].pop("impact"), "runs/0/faults/0"),
    (lambda d: d["runs"][0].__setitem__("slug", "Not A Slug"), "runs/0/slug"),
    (lambda d: d.__setitem__("runs", []), "runs"),
])
def test_what_breaks_the_schema_is_named(change, where):
    problem = _broken(change)
    assert problem is not None and "\n" not in problem
    assert problem.startswith(f"not a valid results document at {where}")


def test_load_checks_version_and_schema_and_write_refuses_nan(tmp_path):
    doc = rd.scenario_doc()
    assert document.write(doc, tmp_path / "ok") == tmp_path / "ok" / "results.json"
    assert document.load(tmp_path / "ok") == json.loads(json.dumps(doc))
    future = copy.deepcopy(doc)
    future["schema_version"] = 2
    document.write(future, tmp_path / "future")
    with pytest.raises(LabError, match="schema_version 2; this fabriclab reads 1"):
        document.load(tmp_path / "future")
    doc["runs"][0]["bin_s"] = float("nan")
    with pytest.raises(ValueError):
        document.write(doc, tmp_path / "nan")


def test_load_names_a_missing_or_unreadable_file(tmp_path):
    with pytest.raises(LabError, match="no results.json here"):
        document.load(tmp_path)
    (tmp_path / "results.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(LabError, match="is not UTF-8 text") as err:
        document.load(tmp_path)
    assert "\n" not in str(err.value)


def test_collective_records_say_the_mode_and_the_agents():
    job = rd.collective_job(in_place=True, verify=True, wrong={(1 << 20, True): 3})
    assert [row["in_place"] for row in job["sizes"]] == [False, True, False, True]
    assert [row["verify"]["wrong_elements"] for row in job["sizes"]] == [0, 3, 0, 0]
    assert [(r["pid"], r["intfs"]) for r in job["ranks"]] == [(4242, ["h1-n0"]), (4243, ["h2-n0"])]
    # documents written before the mode existed were out of place, and still read
    doc = rd.doc("collective", [rd.run("r", {"j": job})])
    for row in job["sizes"]:
        del row["in_place"]
    assert document.first_problem(doc) is None


def test_plane_load_balancer_records_follow_the_schema_and_stay_optional():
    job = rd.collective_job(plb="per-plane", spec="spectrumx_fig16", hosts=("h1", "h5"))
    assert job["plb"]["mode"] == "per-plane" and set(job["plb"]["ranks"]) == {"0", "1"}
    assert job["sizes"][0]["planes"]["share"] == [0.25] * 4
    doc = rd.doc("collective", [rd.run("r", {"j": job})])
    assert document.first_problem(doc) is None
    # a bad event kind is named
    job["plb"]["ranks"]["0"]["events"][0]["event"] = "vanished"
    assert document.first_problem(doc) is not None
    # documents written before the plane load balancer existed still read
    old = rd.collective_job()
    assert "plb" not in old and "planes" not in old["sizes"][0]
    assert document.first_problem(rd.doc("collective", [rd.run("r", {"j": old})])) is None
