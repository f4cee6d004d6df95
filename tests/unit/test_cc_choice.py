"""Choosing the senders' congestion control (`cc`: dcqcn or spx, traffic/cc.py): the collective
spec's checks, the CLI's flags, scenario jobs, the results' record and its schema."""

import json
import math
from pathlib import Path

import pytest

from fabriclab.errors import LabError
from fabriclab.results import document
from fabriclab.traffic import cc
from fabriclab.traffic.collective import CollectiveSpec
from fabriclab.traffic.spxcc import SpxParams
from tests.unit import resultdocs as rd


def test_the_default_is_dcqcn_off_and_spx_is_always_on():
    assert CollectiveSpec().cc == "dcqcn" and CollectiveSpec().cc_params() is None
    assert CollectiveSpec(dcqcn={"rpg_ai_rate": 10}).cc_params() == {"rpg_ai_rate": 10}
    spx = CollectiveSpec(cc="spx")
    spx.check()
    assert spx.cc_params() == {}
    assert CollectiveSpec(cc="spx", spx={"cnp_cut": 0.5}).cc_params() == {"cnp_cut": 0.5}


@pytest.mark.parametrize("fields, message", [
    (dict(cc="swift"), "collective: cc must be one of dcqcn, spx, got 'swift'"),
    (dict(cc=None), "collective: cc must be one of dcqcn, spx, got None"),
    (dict(cc="spx", dcqcn={}), "collective: dcqcn is for cc dcqcn, not spx"),
    (dict(spx={"cnp_cut": 0.5}), "collective: spx is for cc spx, not dcqcn"),
    (dict(cc="spx", spx=[1]), "collective: spx must be null or a mapping of spx parameters"),
    (dict(cc="spx", spx={"cnp_cutt": 0.5}), "collective: spx: unknown SPX parameter 'cnp_cutt'"),
    (dict(cc="spx", spx={"cnp_cut": math.nan}), "collective: spx: SPX parameter cnp_cut must be"),
    (dict(cc="spx", spx={"rtt_tolerance": -2}), "collective: spx: SPX parameter rtt_tolerance must be"),
    (dict(cc="spx", spx={"ai_rate": "fast"}), "collective: spx: SPX parameter ai_rate must be"),
])
def test_bad_cc_choices_are_one_line_errors(fields, message):
    with pytest.raises(LabError) as err:
        CollectiveSpec(**fields).check()
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def _cli(argv):
    from fabriclab.cli import collective as collective_cmd

    return collective_cmd.spec_from_args(collective_cmd.prompt_parser().parse_args(argv))


def test_the_cli_takes_cc_and_spx_params():
    spec = _cli(["--cc", "spx", "--spx-param", "cnp_cut=0.4", "--spx-param", "ai_rate=2000",
                 "--spx-param", "rtt_tolerance=1e0"])
    assert spec.cc == "spx" and spec.spx == {"cnp_cut": 0.4, "ai_rate": 2000, "rtt_tolerance": 1.0}
    assert _cli([]).cc == "dcqcn" and _cli([]).spx is None


@pytest.mark.parametrize("argv, message", [
    (["--spx-param", "cnp_cut=0.4"], "--spx-param needs --cc spx"),
    (["--cc", "spx", "--spx-param", "cnp_cut"], "--spx-param 'cnp_cut': expected NAME=VALUE"),
    (["--cc", "spx", "--spx-param", "cnp_cut=lots"], "--spx-param 'cnp_cut=lots': 'lots' is not a number"),
    (["--cc", "spx", "--spx-param", "cnp_cut=nan"], "--spx-param 'cnp_cut=nan': 'nan' is not a number"),
    (["--cc", "spx", "--spx-param", "cnp_cut=1.5"], "collective: spx: SPX parameter cnp_cut must be"),
    (["--cc", "spx", "--dcqcn"], "collective: dcqcn is for cc dcqcn, not spx"),
])
def test_the_cli_refuses_bad_spx_input_in_one_line(argv, message):
    with pytest.raises(LabError) as err:
        _cli(argv)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_the_cli_choices_come_from_the_registry():
    from fabriclab.cli import collective as collective_cmd

    action = next(a for a in collective_cmd.prompt_parser()._actions if "--cc" in a.option_strings)
    assert tuple(action.choices) == tuple(cc.KINDS)


def test_a_scenario_job_takes_cc_and_spx():
    from fabriclab.jobs import collective as collective_kind

    spec = collective_kind.parse({"collective": "allreduce", "sizes": "1M", "cc": "spx",
                                  "spx": {"cnp_cut": 0.2}}, None)
    assert spec.cc == "spx" and spec.spx == {"cnp_cut": 0.2}
    with pytest.raises(LabError, match="collective: cc must be one of dcqcn, spx"):
        collective_kind.parse({"collective": "allreduce", "cc": "bbr"}, None)
    with pytest.raises(LabError, match="collective: spx: unknown SPX parameter"):
        collective_kind.parse({"collective": "allreduce", "cc": "spx", "spx": {"gain": 1}}, None)


def _with_cc(job, kind, params):
    job["cc"] = {"kind": kind, "where": "plb contexts", "time_scale": 66667.0, "overrides": {},
                 "params": params}
    return rd.doc("collective", [rd.run("r", {"j": job})])


def test_results_record_the_kind_and_every_parameter_and_the_schema_checks_them():
    params = SpxParams.scaled(6.0, 66667.0).to_dict()
    job = rd.collective_job(plb="per-plane", spec="spectrumx_fig16", hosts=("h1", "h5"))
    doc = _with_cc(job, "spx", params)
    assert document.first_problem(doc) is None
    assert json.loads(json.dumps(doc))["runs"][0]["jobs"]["j"]["cc"]["params"]["cnp_cut"] == 0.3
    assert document.first_problem(_with_cc(job, "swift", params)) is not None
    job["cc"]["where"] = "everywhere"
    assert document.first_problem(doc) is not None
    # a workload that names its kind, and one written before cc existed
    assert rd.collective_job()["workload"]["cc"] == "dcqcn"
    old = rd.collective_job()
    del old["workload"]["cc"], old["workload"]["spx"]
    assert document.first_problem(rd.doc("collective", [rd.run("r", {"j": old})])) is None


def test_the_schema_enums_are_the_registry():
    schema = json.loads((Path(document.__file__).parent / "schema.json").read_text())
    defs = schema["$defs"]
    assert defs["collective_workload"]["properties"]["cc"]["enum"] == list(cc.KINDS)
    job = next(o for o in defs["job"]["oneOf"] if o["properties"]["kind"] == {"const": "collective"})
    assert job["properties"]["cc"]["properties"]["kind"]["enum"] == list(cc.KINDS)


def test_the_launcher_records_the_scaled_parameters_where_they_run():
    from fabriclab.traffic.collective import Launcher

    lab = rd.fake_lab("spectrumx_fig16")
    scale = lab.fabric.spec.time_scale
    record = Launcher(lab, CollectiveSpec(cc="spx", spx={"cnp_cut": 0.25}, plb="per-plane",
                                          hosts=("h1", "h5"))).cc_record()
    assert record["kind"] == "spx" and record["where"] == "plb contexts"
    assert record["overrides"] == {"cnp_cut": 0.25} and record["time_scale"] == scale
    params = record["params"]
    assert params["cnp_cut"] == 0.25
    assert params["rtt_tolerance_s"] == pytest.approx(2e-6 * scale)
    assert params["ai_rate_mbps"] == pytest.approx(4000 / scale)
    assert set(params) == {f for f in SpxParams().to_dict()}
    # per QP on a plane-bound mode; nothing where no CC runs
    qp = Launcher(lab, CollectiveSpec(cc="spx", hosts=("h1", "h5"))).cc_record()
    assert qp["where"] == "qp"
    assert Launcher(lab, CollectiveSpec(hosts=("h1", "h5"))).cc_record() is None
    dcqcn = Launcher(lab, CollectiveSpec(plb="global", hosts=("h1", "h5"))).cc_record()
    assert dcqcn["kind"] == "dcqcn" and dcqcn["params"]["rpg_time_reset_s"] == pytest.approx(300e-6 * scale)
