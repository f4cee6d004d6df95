"""Sweeps without a network: a sweep file's expansion into checked cases, the folder's record and
its resume, the summary per parameter, the inventory read by ansible's own parser, and the
results archive brought back from a machine unpacked only inside its folder."""

import io
import json
import tarfile

import pytest

from fabriclab.errors import LabError
from fabriclab.system import inventory
from fabriclab.workflows import fanout, sweep

BASE = {"name": "s", "spec": "tiny", "routing": "ecmp",
        "jobs": [{"name": "ring", "collective": "allreduce", "sizes": ["256K"], "iterations": 2}],
        "faults": [{"at": 1.0, "link_down": "l1-s1", "for": 0.5}]}


def expand(params, base=None):
    return sweep.expand({**(base or BASE), "sweep": params})


def test_every_combination_in_the_files_order_with_its_values_put_in():
    sw = expand({"routing": ["ecmp", "flowlet"], "jobs.ring.qps": [1, 2, 4], "faults.0.at": [0.5, 1.5]})
    assert len(sw.cases) == 12
    first, last = sw.cases[0], sw.cases[-1]
    assert first.params == {"routing": "ecmp", "jobs.ring.qps": 1, "faults.0.at": 0.5}
    assert last.params == {"routing": "flowlet", "jobs.ring.qps": 4, "faults.0.at": 1.5}
    assert last.data["routing"] == "flowlet" and last.data["jobs"][0]["qps"] == 4
    assert last.data["faults"][0] == {"at": 1.5, "link_down": "l1-s1", "for": 0.5}
    assert BASE["jobs"][0].get("qps") is None and "sweep" not in last.data       # the base is untouched
    assert len({c.id for c in sw.cases}) == 12 and first.id.startswith("c000-")
    assert expand({"routing": ["ecmp", "flowlet"], "jobs.ring.qps": [1, 2, 4], "faults.0.at": [0.5, 1.5]}) \
        .fingerprint() == sw.fingerprint()
    # the same index with other values is another case
    assert expand({"routing": ["ecmp", "te"]}).cases[1].id != expand({"routing": ["ecmp", "flowlet"]}).cases[1].id


@pytest.mark.parametrize("params, problem", [
    (None, "must map parameters"),
    ({}, "must map parameters"),
    ({"routing": "ecmp"}, "must list its values"),
    ({"routing": []}, "must list its values"),
    ({"routing": ["ecmp", "ecmp"]}, "lists a value twice"),
    ({"colour": [1, 2]}, "no scenario field 'colour'"),
    ({"jobs.noise.qps": [1]}, "no entry named 'noise'"),
    ({"faults.3.at": [1]}, "there are only 1 entries"),
    ({"routing.x": [1]}, "inside a value"),
    ({"metrics.sample_ms": [1]}, "the scenario has no 'metrics'"),
    ({"jobs.ring.qps": [1, 0]}, "case jobs.ring.qps=0: "),
    ({"jobs.ring.qps": list(range(1, 65)), "routing": ["ecmp", "te", "flowlet", "eecmp", "x", "y"]},
     "384 combinations; at most 256"),
    ({"jobs.ring.qps": list(range(1, 66))}, "at most 64"),
])
def test_a_bad_sweep_is_one_line_before_anything_runs(params, problem):
    with pytest.raises(LabError) as err:
        sweep.expand({**BASE, "sweep": params})
    assert problem in str(err.value) and "\n" not in str(err.value)


def test_a_file_without_a_sweep_is_refused():
    with pytest.raises(LabError, match="a `sweep:` mapping"):
        sweep.expand(BASE)


def done(record, case, doc_valid=True):
    folder = record.case_folder(case.id)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text("{}")
    record.set(case, "done", machine="m1", seconds=1.0)


def test_the_record_resumes_what_is_done_and_refuses_another_sweep(tmp_path):
    sw = expand({"routing": ["ecmp", "flowlet"], "jobs.ring.qps": [1, 2]})
    record = sweep.Record(tmp_path, sw)
    assert [c.id for c in record.pending()] == [c.id for c in sw.cases]
    done(record, sw.cases[0])
    record.set(sw.cases[1], "failed", error="boom")
    record.set(sw.cases[2], "running", machine="m2")      # killed while running
    again = sweep.Record(tmp_path, sw)
    assert [c.id for c in again.pending()] == [c.id for c in sw.cases[1:]]
    assert again.states[sw.cases[0].id]["machine"] == "m1"
    # a case marked done whose results are gone runs again
    (record.case_folder(sw.cases[0].id) / "results.json").unlink()
    assert len(sweep.Record(tmp_path, sw).pending()) == 4
    with pytest.raises(LabError, match="holds another sweep"):
        sweep.Record(tmp_path, expand({"routing": ["ecmp", "te"]}))
    (tmp_path / "sweep.json").write_text("{not json")
    with pytest.raises(LabError, match="unreadable"):
        sweep.Record(tmp_path, sw)


def test_a_case_file_is_a_scenario_the_loader_reads_back_wherever_it_is(tmp_path):
    import pathlib

    from fabriclab.workflows import scenario

    shipped = pathlib.Path(__file__).resolve().parents[2] / "topologies" / "tiny.yaml"
    (tmp_path / "my.yaml").write_text(shipped.read_text())          # a spec beside the sweep file
    sw = sweep.expand({**BASE, "spec": "my.yaml", "sweep": {"jobs.ring.qps": [2]}}, tmp_path / "sweep.yaml")
    path = sweep.write_case_file(sw.cases[0], tmp_path / "elsewhere" / "case", sw.path)
    loaded = scenario.load(path)
    assert loaded.jobs[0].spec.qps == 2 and loaded.routings == ["ecmp"]
    assert loaded.spec == str((tmp_path / "my.yaml").resolve())      # found from the case's own folder


def test_the_summary_averages_each_value_over_the_other_parameters():
    rows = [{"params": {"r": "ecmp", "q": 1}, "state": "done", "busbw_mbps": 2.0, "cct_p99_ms": 10.0},
            {"params": {"r": "ecmp", "q": 4}, "state": "done", "busbw_mbps": 4.0, "cct_p99_ms": 30.0},
            {"params": {"r": "te", "q": 1}, "state": "failed", "busbw_mbps": None, "cct_p99_ms": None},
            {"params": {"r": "te", "q": 4}, "state": "done", "busbw_mbps": 8.0, "cct_p99_ms": 5.0}]
    assert sweep.by_parameter(rows, "r") == [("ecmp", 3.0, 20.0, 2), ("te", 8.0, 5.0, 1)]
    assert sweep.by_parameter(rows, "q") == [(1, 2.0, 10.0, 1), (4, 6.0, 17.5, 2)]


def test_the_inventory_is_read_by_ansible_and_its_lab_group_chosen(tmp_path):
    inv = tmp_path / "inventory.ini"
    inv.write_text("[other]\nweb1\n[lab]\nlocalhost ansible_connection=local\nlab2 ansible_host=192.0.2.7\n"
                   "[lab:vars]\nproject_dir=/vagrant\n")
    found = inventory.machines(inv)
    assert [name for name, _v in found] == ["localhost", "lab2"]
    assert found[1][1]["ansible_host"] == "192.0.2.7" and found[1][1]["project_dir"] == "/vagrant"
    inv.write_text("[lab]\nlab1 ansible_host=192.0.2.7\n")
    with pytest.raises(LabError, match="needs project_dir"):
        inventory.machines(inv)
    with pytest.raises(LabError, match="no inventory file"):
        inventory.machines(tmp_path / "missing.ini")


def archive(tmp_path, members):
    path = tmp_path / "out.tgz"
    with tarfile.open(path, "w:gz") as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.type, info.linkname = tarfile.SYMTYPE, data
                tar.addfile(info)
    return path


def test_results_come_back_inside_their_folder_only(tmp_path):
    good = archive(tmp_path, [(".", "dir", b""), ("./results.json", "file", b'{"a": 1}'),
                              ("./plots", "dir", b""), ("./plots/x.png", "file", b"png")])
    out = tmp_path / "case"
    fanout.unpack(good, out)
    assert json.loads((out / "results.json").read_text()) == {"a": 1} and (out / "plots" / "x.png").read_bytes() == b"png"
    for members, problem in [([("../escape", "file", b"x")], "leads outside"),
                             ([("/etc/evil", "file", b"x")], "leads outside"),
                             ([("link", "symlink", "/etc/passwd")], "not a file or folder")]:
        bad = archive(tmp_path, members)
        with pytest.raises(LabError, match=problem):
            fanout.unpack(bad, tmp_path / "other")
        assert not (tmp_path / "escape").exists() and not (tmp_path / "other").exists()
    (tmp_path / "junk.tgz").write_bytes(b"not an archive")
    with pytest.raises(LabError, match="unreadable"):
        fanout.unpack(tmp_path / "junk.tgz", tmp_path / "third")


def test_a_bad_inventory_is_refused_before_the_folder_is_written(tmp_path):
    sw = expand({"jobs.ring.qps": [1, 2]})
    with pytest.raises(LabError, match="no inventory file"):
        sweep.run(sw, tmp_path / "out", inventory=tmp_path / "missing.ini", log=lambda _line: None)
    assert not (tmp_path / "out").exists()


def test_a_case_runs_without_plots_and_they_are_drawn_where_the_sweep_is_controlled(tmp_path):
    """A lab machine's CPU is for its fabric (an emulated guest takes 10-15 s just to import
    matplotlib): sweep_case.yml runs the case with --no-plots, and the folder brought back gets its
    whole report here."""
    import yaml

    from fabriclab.cli.main import build_parser
    from fabriclab.results import report
    from tests.unit import resultdocs as rd

    tasks = yaml.safe_load(fanout.PLAYBOOK.read_text())[0]["tasks"]
    run = next(t for t in tasks if t["name"].startswith("Run the case"))
    argv = run["ansible.builtin.command"]["argv"]
    assert argv[1:3] == ["scenario", "run"] and "--no-plots" in argv
    assert build_parser().parse_args(["scenario", "run", "x.yaml", "--no-plots"]).plots is False
    folder = tmp_path / "case"
    rd.write(folder, rd.scenario_doc())
    report.render(folder, run_plots=False, plan_plots=False)     # as the lab machine left it
    assert not list(folder.glob("*.png")) and "not drawn here" in (folder / "report.md").read_text()
    fanout._draw_run_plots(folder)
    assert list(folder.glob("heatmap-*.png")) and "not drawn here" not in (folder / "report.md").read_text()
