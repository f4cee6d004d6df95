"""Results folders of every kind render into report.md and PNGs, and folders compare in one table,
from files alone."""

import argparse
import copy
import json
import re

import pytest

from fabriclab.cli import results as cli_results
from fabriclab.errors import LabError
from fabriclab.results import compare, plots, report
from tests.unit import resultdocs as rd

PNG = b"\x89PNG\r\n\x1a\n"


def _png(path):
    data = path.read_bytes()
    assert data.startswith(PNG) and len(data) > 5000
    return data


def _scenario(folder):
    return rd.write(folder, rd.scenario_doc(), dip=(1.5, 2.0))


def _experiment(folder):
    ring = rd.collective_job(64.125, sizes=((1 << 20, (0.018, 0.0195, 0.033)),))
    runs = [rd.run("te, l1-s1 fails", {"ring": ring}, [rd.fault("link_down", 0.6, None, 0.25)], routing="te")]
    runs[0]["telemetry"]["uplink_max_mean"] = 1.8
    runs[0]["telemetry"]["symmetry"] = None
    runs[0]["telemetry"]["symmetry"] = []
    experiment = {"name": "routing-schemes", "summary": "schemes", "reference": {"finding": "x"}}
    return rd.write(folder, rd.doc("experiment", runs, name="routing-schemes", experiment=experiment))


def _run_folder(folder):
    return rd.write(folder, rd.doc("run", [rd.run("ecmp", {"traffic": rd.allpairs_job(30.0)})], name="tiny"))


def _collective_folder(folder):
    return rd.write(folder, rd.doc("collective", [rd.run("ecmp", {"allreduce": rd.collective_job(50.0)})],
                                   name="tiny-allreduce"))


def test_column_kinds_and_rates():
    assert [report.column_kind(c) for c in ("l1>s1", "s1>l1", "l1>s2#2", "p2l1>p2s1", "p2s1>p2l1",
                                            "h1-n0>l1", "l1>h1-n0")] == \
        ["up", "down", "up", "up", "down", "nic_tx", "nic_rx"]
    scale = {"host_rate_mbps": 100, "fabric_rate_mbps": 400}
    assert report.link_rates(["l1>s1", "h1-n0>l1"], scale) == [400, 100]
    assert report.link_rates(["l1>s1"], {}) is None


def test_read_links_parses_the_wide_csv(tmp_path):
    rd.links_csv(tmp_path / "l.csv", dip=(1.0, 1.2))
    times, names, mbps = report.read_links(tmp_path / "l.csv")
    assert names == rd.COLUMNS and len(times) == 40 and mbps.shape == (40, len(rd.COLUMNS))
    assert mbps[10, 0] == 0.0 and mbps[12, 0] == 80.0
    assert report.read_links(tmp_path / "absent.csv") is None
    (tmp_path / "bad.csv").write_text("t_s,l1>s1\n0.0,abc\n")
    with pytest.raises(LabError, match="bad.csv"):
        report.read_links(tmp_path / "bad.csv")


def test_render_writes_report_and_plots(tmp_path):
    folder = tmp_path / "flap"
    _scenario(folder)
    path = report.render(folder)
    assert path == folder / "report.md"
    text = path.read_text()
    assert text.startswith("# flap under load (scenario)\n")
    assert "an uplink flaps during a ring AllReduce" in text
    assert "host links 10 Mbit/s, fabric links 10 Mbit/s; time scale x40000" in text
    assert "buffers host 64K" in text
    assert "Warning" not in text
    # the fault rows: until, events, baseline, min, recovery and retained; 'not back' reads as words
    assert "| link_down | l1-s1 | 1.00 | 1.50 | 1 | 160.00 | 0.00 | 0.60 | 94% |" in text
    assert "| degrade | l1-s1 | 2.50 | end | 1 | 160.00 | 0.00 | not back | 94% |" in text
    assert "| link_down | l2-s2 | - | - | 0 | - | - | - | - |" in text
    assert "- link down l2-s2: not reached: the measured jobs ended first" in text
    assert text.count("No faults injected.") == 1                     # the flowlet run
    # the jobs table and the summary (mean recovery over the faults that recovered: (0.6 + 0.2) / 2)
    assert ("| ring | measured | allreduce/ring | 1M | 2 | 71.50 | 72% | 12.0 | 30.0 | 7 | 3 | 1 | yes |"
            in text)
    assert "| ecmp r1 | ring | 4M | 76.50 | 44.0 | 90.0 | - | 1.45 | 0.40 | 1 |" in text
    assert "| flowlet r1 | ring | 1M | 88.25 |" in text
    assert "| bg |" not in text.split("## Run")[0]                    # noise jobs stay out of the summary
    assert "l1 uplinks: l1>s2 at 30.00 Mbit/s, -46% vs the median 55.00" in text
    assert "- Stragglers: h2-n0" in text
    assert "reached 5.20 ms median (p99 9.0 ms, largest gap 20.0 ms) over 800 samples" in text
    assert "skipped" not in text
    for name in ("heatmap-ecmp-r1", "throughput-ecmp-r1", "nics-ecmp-r1", "heatmap-flowlet-r1",
                 "throughput-flowlet-r1", "nics-flowlet-r1", "cct", "busbw"):
        assert f"({name}.png)" in text
        _png(folder / f"{name}.png")
    # the dip shows in the heatmap: the two runs' pictures differ
    assert (folder / "heatmap-ecmp-r1.png").read_bytes() != (folder / "heatmap-flowlet-r1.png").read_bytes()


def test_render_without_run_plots_draws_none_and_says_how(tmp_path):
    """`reproduce` runs dozens of runs a draw; each run's plots cost about a second, so it leaves
    them to `fabriclab report`, which draws them from the folder alone."""
    folder = tmp_path / "flap"
    _scenario(folder)
    text = report.render(folder, run_plots=False).read_text()
    assert text.count("not drawn here: `fabriclab report FOLDER` draws them") == 2      # one per run
    assert not list(folder.glob("heatmap-*.png")) and not list(folder.glob("nics-*.png"))
    assert "## Summary" in text and "(cct.png)" in text                 # the runs compared, still
    again = report.render(folder).read_text()
    assert "not drawn here" not in again and "(heatmap-ecmp-r1.png)" in again


def test_render_flags_an_invalid_scenario(tmp_path):
    folder = tmp_path / "bad"
    doc = rd.scenario_doc()
    doc["valid"] = False
    doc["runs"][0]["jobs"]["ring"] = rd.collective_job(71.5, valid=False)
    rd.write(folder, doc)
    text = report.render(folder).read_text()
    assert "**Warning: not valid.**" in text
    assert "| ecmp r1 | ring (invalid) |" in text


def test_render_without_optional_parts(tmp_path):
    """A run without faults, telemetry or CSV, and a second run whose CSV went missing."""
    folder = tmp_path / "bare"
    doc = rd.doc("scenario", [rd.run("ecmp r1", {"ring": rd.collective_job(50.0, sizes=((1 << 20, (0.01,)),))}),
                              rd.run("te r2", {"ring": rd.collective_job(40.0)}, routing="te", repetition=2)])
    bare = doc["runs"][0]
    bare["telemetry"] = {**bare["telemetry"], "symmetry": [], "outliers": [], "nics": {}, "stragglers": [],
                         "sampling": {"interval_s": 0.005, "samples": 1}}
    rd.write(folder, doc, csvs=False)
    text = report.render(folder).read_text()
    assert text.count("No faults injected.") == 2
    assert "links-ecmp-r1.csv missing or empty: heatmap and delivered rate skipped" in text
    assert "links-te-r2.csv missing or empty: heatmap and delivered rate skipped" in text
    assert "no NIC histograms recorded: NIC plot skipped" in text
    assert "## Run te r2" in text
    assert "reached interval not recorded" in text


@pytest.mark.parametrize("make, title, table", [
    (_run_folder, "# tiny (run)", "| traffic | measured | 2 | 30.00 | 1.00% | 2 |"),
    (_collective_folder, "# tiny-allreduce (collective)", "| allreduce | measured | allreduce/ring | 1M |"),
    (_experiment, "# routing-schemes (experiment)", "| ring | measured | allreduce/ring | 1M |"),
])
def test_render_reads_every_kind_of_folder(tmp_path, make, title, table):
    folder = tmp_path / "f"
    make(folder)
    text = report.render(folder).read_text()
    assert text.startswith(title + "\n") and table in text
    _png(folder / f"heatmap-{json.loads((folder / 'results.json').read_text())['runs'][0]['slug']}.png")


def test_report_refuses_an_old_or_broken_folder_in_one_line(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    (old / "results.json").write_text(json.dumps({"fabriclab": "0.1.0", "kind": "scenario", "runs": []}))
    with pytest.raises(LabError, match="before results documents had a schema_version") as err:
        report.render(old)
    assert "\n" not in str(err.value)
    broken = tmp_path / "broken"
    doc = rd.scenario_doc()
    del doc["runs"][0]["jobs"]["ring"]["sizes"][0]["cct_ms"]
    rd.write(broken, doc)
    with pytest.raises(LabError, match=r"not a valid results document at runs/0/jobs/ring"):
        report.render(broken)
    (broken / "results.json").write_text("[1, 2]")
    with pytest.raises(LabError, match="a JSON list, not an object"):
        report.render(broken)


def test_compare_puts_every_kind_side_by_side(tmp_path):
    _scenario(tmp_path / "flap")
    _experiment(tmp_path / "exp")
    _run_folder(tmp_path / "run")
    _collective_folder(tmp_path / "coll")
    folders = [tmp_path / n for n in ("flap", "exp", "run", "coll")]
    rows = compare.collect(folders)
    assert {(r["folder"], r["kind"]) for r in rows} == {("flap", "scenario"), ("exp", "experiment"),
                                                        ("run", "run"), ("coll", "collective")}
    assert len(rows) == 3 + 2 + 1 + 1 + 2
    text = compare.table(folders)
    cells = [re.split(r"\s{2,}", line.strip()) for line in text.splitlines()[1:]]
    assert cells[0] == list(compare.HEADER)
    assert ["flap", "scenario", "ecmp r1", "ring", "1M", "71.50", "12.0", "30.0", "-", "1.45", "7", "3", "1",
            "0.40", "1"] in cells
    assert ["flap", "scenario", "ecmp r1", "bg (noise)", "1M", "20.00", "50.0", "50.0", "-", "1.45", "7", "3",
            "1", "0.40", "1"] in cells
    assert ["exp", "experiment", "te, l1-s1 fails", "ring", "1M", "64.12", "19.5", "33.0", "-", "1.80", "7",
            "3", "1", "0.25", "0"] in cells
    # all-pairs: what it delivered and its OOS; no size, busbw or CCT
    assert ["run", "run", "ecmp", "traffic", "-", "-", "-", "-", "30.00", "1.45", "2", "-", "-", "-", "1"] in cells


def test_a_job_run_in_place_too_shows_the_mode_everywhere(tmp_path, monkeypatch):
    """Each size of a job that also ran in place has two rows; the verb's table, report.md, the
    busbw plot and compare say which is which, and a job without in-place rows shows no mode."""
    from fabriclab.results import tables

    folder = tmp_path / "both"
    job = rd.collective_job(50.0, in_place=True, verify=True)
    rd.write(folder, rd.doc("collective", [rd.run("ecmp", {"allreduce": job})], name="tiny-allreduce"))
    assert [(r["size"], r["in_place"]) for r in job["sizes"]] == [(1 << 20, False), (1 << 20, True),
                                                                  (4 << 20, False), (4 << 20, True)]
    doc = json.loads((folder / "results.json").read_text())
    table = tables.collective_table(doc).splitlines()
    assert re.split(r"\s{2,}", table[1].strip())[:2] == ["size", "mode"]
    assert [re.split(r"\s{2,}", line.strip())[:3] for line in table[3:]] == [
        ["1M", "out-of-place", "17.3"], ["1M", "in-place", "19.1"], ["4M", "out-of-place", "58.0"],
        ["4M", "in-place", "63.8"]]                        # CCT means, in place 10% slower
    assert "4M in-place" in tables.runs_table(doc) and "4M out-of-place" in tables.runs_table(doc)
    drawn = {}
    lines = plots.lines
    monkeypatch.setattr(plots, "lines", lambda path, title, xs, series, *a, **k:
                        drawn.setdefault(title, series) and lines(path, title, xs, series, *a, **k))
    text = report.render(folder).read_text()
    assert set(drawn["bus bandwidth per message size (repetitions averaged)"]) == \
        {"ecmp allreduce", "ecmp allreduce in-place"}                     # not averaged together
    assert "| job | role | collective | size | mode | ranks |" in text
    assert "| allreduce | measured | allreduce/ring | 1M | in-place | 2 | 45.45 |" in text
    assert "| ecmp | allreduce | 1M in-place | 45.45 | 13.2 |" in text
    rows = compare.collect([folder])
    assert [(r["size"], r["in_place"]) for r in rows] == [(r["size"], r["in_place"]) for r in job["sizes"]]
    cells = [re.split(r"\s{2,}", line.strip()) for line in compare.table([folder]).splitlines()[3:]]
    assert [c[4] for c in cells] == ["1M", "1M in-place", "4M", "4M in-place"]
    _collective_folder(tmp_path / "one")
    one = json.loads((tmp_path / "one" / "results.json").read_text())
    assert "mode" not in tables.collective_table(one) and "| mode |" not in report.render(tmp_path / "one").read_text()


def test_compare_counts_switchml_tat_as_its_completion_time(tmp_path):
    rd.write(tmp_path / "sml", rd.doc("experiment", [rd.run("n=2 256K switchml", {"switchml": rd.switchml_job()})]))
    (row,) = compare.collect([tmp_path / "sml"])
    assert (row["job_kind"], row["size"], row["cct_p50_ms"], row["cct_p99_ms"]) == ("switchml", 262144, 225.0, 250.0)
    assert row["retransmitted_packets"] == 2 and row["busbw_mbps"] is None


def test_compare_needs_results_json(tmp_path):
    (tmp_path / "empty").mkdir()
    _experiment(tmp_path / "exp")
    with pytest.raises(LabError) as err:
        compare.table([tmp_path / "exp", tmp_path / "empty"])
    assert "empty" in str(err.value) and "results.json" in str(err.value) and "\n" not in str(err.value)


def test_compare_plot_and_cli(tmp_path, capsys):
    _scenario(tmp_path / "flap")
    _experiment(tmp_path / "exp")
    _png(compare.plot([tmp_path / "flap", tmp_path / "exp"], tmp_path / "cmp.png"))
    parser = argparse.ArgumentParser()
    cli_results.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["compare", str(tmp_path / "flap"), str(tmp_path / "exp"), "--format", "json",
                              "--plot", str(tmp_path / "cli.png")])
    assert args.func(args) == 0
    out = capsys.readouterr()
    rows = json.loads(out.out)
    firsts = [r["busbw_mbps"] for r in rows if r["job"] == "ring" and r["size"] == 1 << 20]
    assert firsts == [71.5, 88.25, 64.125]
    assert "cli.png" in out.err
    _png(tmp_path / "cli.png")
    args = parser.parse_args(["report", str(tmp_path / "flap")])
    assert args.func(args) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "flap" / "report.md")


def test_report_of_an_experiment_shows_its_own_table(tmp_path, capsys):
    _experiment(tmp_path / "exp")
    parser = argparse.ArgumentParser()
    cli_results.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["report", str(tmp_path / "exp")])
    assert args.func(args) == 0
    text = (tmp_path / "exp" / "report.md").read_text()
    assert "## Experiment" in text and "routing schemes on tiny" in text


def test_heatmap_keeps_a_hundred_rows_readable(tmp_path):
    rows = [f"l{i}>s1" for i in range(100)]
    matrix = [[((r + c) % 10) / 10 for c in range(50)] for r in range(100)]
    a = _png(plots.heatmap(tmp_path / "a.png", "links", rows, [0.1 * c for c in range(50)], matrix,
                           "time (s)", "utilization", vmax=1.0, marks=[(2.0, "link_down l1-s1")]))
    flat = copy.deepcopy(matrix)
    flat[0] = [0.0] * 50
    b = _png(plots.heatmap(tmp_path / "b.png", "links", rows, [0.1 * c for c in range(50)], flat,
                           "time (s)", "utilization", vmax=1.0))
    assert a != b


def test_a_run_with_the_queue_model_reports_its_totals_and_the_pfc_reaction(tmp_path):
    folder = tmp_path / "incast"
    run = rd.run("ecmp", {"traffic": rd.allpairs_job(30.0)})
    run["queues"] = {"report": {"totals": {"marks": 12, "drops": 0, "lossless_drops": 0, "wd_drops": 0,
                                           "pause_tx": 10, "pause_ms": 594.874},
                                "alarms": [], "leak_repairs": [{"port": "l1-eth1"}],
                                "pfc_reaction": {"pauses": 10, "p50_ms": 0.155, "p99_ms": 0.713, "max_ms": 0.713,
                                                 "max_wait_ms": 0.7, "max_gate_change_ms": 0.013,
                                                 "scheduling": "SCHED_FIFO 10"}, "ports": []},
                     "hops": {}, "summary": [], "sampling": {}, "errors": []}
    quiet = rd.run("flowlet", {"traffic": rd.allpairs_job(30.0)})
    quiet["queues"] = {"report": {"totals": {"pause_tx": 0}, "ports": [], "pfc_reaction": {"pauses": 0}},
                       "hops": {}, "summary": [], "sampling": {}, "errors": []}
    older = rd.run("te", {"traffic": rd.allpairs_job(30.0)})       # written before reactions were split
    older["queues"] = {"report": {"totals": {"pause_tx": 3}, "ports": [],
                                  "pfc_reaction": {"pauses": 3, "p50_ms": 0.2, "p99_ms": 0.3, "max_ms": 0.3}},
                       "hops": {}, "summary": [], "sampling": {}, "errors": []}
    rd.write(folder, rd.doc("run", [run, quiet, older], name="tiny"))
    text = report.render(folder, run_plots=False).read_text()
    assert ("- Totals: ECN marks 12, drops 0, lossless drops 0, watchdog drops 0, pauses sent 10, "
            "paused ms 594.9") in text
    assert ("- PFC reaction (XOFF to gate closed, wall time) over 10 pauses: p50 0.155 ms, p99 0.713 ms, "
            "max 0.713 ms; the agent ran SCHED_FIFO 10 (longest wait for the agent 0.700 ms, longest gate "
            "change 0.013 ms)") in text
    assert "over 3 pauses: p50 0.200 ms, p99 0.300 ms, max 0.300 ms\n" in text
    assert "- Leaked accounts repaired: 1" in text and "Watchdog alarms" not in text
    assert text.count("### Queues and PFC") == 3 and "- PFC reaction: no pauses" in text
