"""The flake finder (tests/repeat.py): what it reads from pytest's JUnit XML, its table, and its
command line."""

import pytest

from tests import repeat

RUN_XML = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3">
 <testcase classname="tests.lab.test_x" name="test_ok" time="1.0">
  <properties><property name="figure:mmr" value="1.02"/><property name="mechanism" value="red"/></properties>
 </testcase>
 <testcase classname="tests.lab.test_x" name="test_bad" time="1.0">
  <properties><property name="figure:ratio" value="0.4"/><property name="figure:nan" value="nan"/>
   <property name="figure:word" value="many"/></properties>
  <failure message="assert 0.4 &gt; 0.5">...</failure>
 </testcase>
 <testcase classname="tests.lab.test_x" name="test_skip" time="0"><skipped message="no root"/></testcase>
</testsuite></testsuites>
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_run_gives_each_tests_outcome_and_its_numeric_figures(tmp_path):
    run = repeat.read_run(write(tmp_path, "run.xml", RUN_XML))
    assert run["tests.lab.test_x::test_ok"] == ("passed", {"mmr": 1.02})
    outcome, figures = run["tests.lab.test_x::test_bad"]
    assert outcome == "failed" and figures["ratio"] == 0.4 and "word" not in figures
    assert run["tests.lab.test_x::test_skip"][0] == "skipped"


def test_a_run_that_wrote_no_xml_gives_nothing(tmp_path):
    assert repeat.read_run(tmp_path / "missing.xml") == {}
    assert repeat.read_run(write(tmp_path, "cut.xml", RUN_XML[:200])) == {}


def test_the_summary_gives_pass_rates_and_each_figures_spread():
    runs = [{"t::a": ("passed", {"mmr": 1.0})}, {"t::a": ("failed", {"mmr": 1.2})},
            {"t::a": ("passed", {"mmr": 1.1})}, {"t::a": ("skipped", {})}]
    (test_row, figure_row) = repeat.summarize(runs)
    assert test_row[:4] == ("t::a", "", 2, 3)                   # a skipped run is not a run
    test, name, _passed, n, lo, mid, hi, sd = figure_row
    assert (test, name, n, lo, mid, hi) == ("t::a", "mmr", 3, 1.0, 1.1, 1.2)
    assert sd == pytest.approx(0.1)
    assert "2/3 (67%)" in repeat.table(repeat.summarize(runs))


def test_catalogues_mode_runs_once_per_stored_catalogue(tmp_path):
    folders = []
    for name in ("ci-1", "ci-2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "catalogue.json").write_text("{}")
        folders.append(str(tmp_path / name))
    envs, args = repeat.parse(["--catalogues", *folders, "--", "tests/lab/test_ecmp_tiers.py"])
    assert [e["FABRICLAB_QUICK_CATALOGUE"] for e in envs] == folders and args == ["tests/lab/test_ecmp_tiers.py"]


@pytest.mark.parametrize("argv", [[], ["0"], ["1001"], ["ten"], ["--catalogues", "x", "--"],
                                  ["--catalogues", "--", "tests"], ["--catalogues", "."]])
def test_a_command_line_that_is_not_one_is_refused(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert repeat.parse(argv) is None
    assert repeat.main(argv) == 2 and "usage" in capsys.readouterr().err


def test_n_repeats_run_in_the_callers_environment():
    envs, args = repeat.parse(["3", "tests/unit/test_table.py", "-k", "width"])
    assert envs == [None, None, None] and args == ["tests/unit/test_table.py", "-k", "width"]
