"""Scenario folders render into report.md and PNGs, and folders compare in one table, from files alone."""

import argparse
import copy
import json
import re

import pytest

from fabriclab.results import plots

from fabriclab.results import report
from fabriclab.cli import results as cli_results
from fabriclab.errors import LabError

PNG = b"\x89PNG\r\n\x1a\n"
COLUMNS = ["l1>s1", "s1>l1", "l1>s2", "s2>l1", "l2>s1", "s1>l2", "l2>s2#2", "s2>l2#2",
           "h1-n0>l1", "l1>h1-n0", "h2-n0>l2", "l2>h2-n0"]


def _png(path):
    data = path.read_bytes()
    assert data.startswith(PNG) and len(data) > 5000
    return data


def _links_csv(path, dip=None):
    """40 bins of 0.1 s: every direction at 80 Mbit/s, nothing while `dip` (series seconds) lasts."""
    lines = ["t_s," + ",".join(COLUMNS)]
    for i in range(40):
        t = 0.1 * i
        rate = 0.0 if dip and dip[0] <= t < dip[1] else 80.0
        lines.append(f"{t:.4f}," + ",".join(f"{rate:.3f}" for _ in COLUMNS))
    path.write_text("\n".join(lines) + "\n")


def _size(size, busbw, ccts):
    return {"collective": "allreduce", "algorithm": "ring", "size": size, "ranks": 2, "iterations": len(ccts),
            "cct_ms": {"mean": sum(ccts) / len(ccts), "p50": sorted(ccts)[len(ccts) // 2], "p99": max(ccts),
                       "min": min(ccts), "max": max(ccts), "all": ccts},
            "busbw_mbps": busbw, "algbw_mbps": busbw, "busbw_fraction_of_nic": busbw / 100,
            "counters": {"out_of_sequence": 7, "retransmitted_packets": 3, "local_ack_timeout_err": 1,
                         "ce_marked": 0, "cnp_sent": 0, "cnp_handled": 0}}


def _fault(kind, at, until, recovery, fell=True):
    return {"index": 0, "kind": kind, "target": "l1-s1", "at_s": at, "until_s": until,
            "events": [{"t_s": at, "event": kind, "target": "l1-s1"}],
            "impact": {"baseline_mbps": 160.0, "min_mbps": 0.0, "min_at_s": 0.1, "fell": fell,
                       "recovery_s": recovery, "after_mbps": 150.0, "retained": 0.94}}


def _unreached():
    return {"index": 3, "kind": "link_down", "target": ["l2", "s2"], "at_s": None, "until_s": None, "events": [],
            "impact": None, "note": "not reached: the measured jobs ended first"}


def _run(routing, busbw, faults=()):
    slug = f"{routing}-r1"
    return {
        "routing": routing, "repetition": 1, "slug": slug, "origin_s": 0.5, "end_s": 3.5, "bin_s": 0.1,
        "files": {"links_csv": f"links-{slug}.csv"},
        "jobs": {"ring": {"role": "measured", "hosts": ["h1", "h2"], "valid": True,
                          "sizes": [_size(1 << 20, busbw, [10.0, 12.0, 30.0]),
                                    _size(4 << 20, busbw + 5, [40.0, 44.0, 90.0])]},
                 "bg": {"role": "noise", "hosts": ["h3", "h4"], "valid": True,
                        "sizes": [_size(1 << 20, 20.0, [50.0])]}},
        "faults": list(faults),
        "telemetry": {
            "sampling": {"interval_s": 0.005, "samples": 800, "reached_median_s": 0.0052,
                         "reached_p99_s": 0.009, "largest_gap_s": 0.02},
            "symmetry": [{"group": "l1 uplinks", "members": {"l1>s1": 80.0, "l1>s2": 30.0},
                          "median_mbps": 55.0, "max_mean_ratio": 1.45,
                          "outliers": [{"member": "l1>s2", "mbps": 30.0, "deviation": -0.455}]}],
            "stragglers": ["h2-n0"],
            "nics": {"h1-n0": {"histogram": [0.4] + [0.0] * 8 + [0.6], "idle_share": 0.4,
                               "mean_utilization": 0.55, "busy_mean_utilization": 0.95},
                     "h2-n0": {"histogram": [0.2, 0, 0, 0, 0.8, 0, 0, 0, 0, 0], "idle_share": 0.2,
                               "mean_utilization": 0.36, "busy_mean_utilization": 0.45}},
            "uplink_max_mean": 1.45},
        "queues": None,
    }


def _scenario(folder):
    """Two runs; the first has three faults (one never recovered) and a dip in its links CSV."""
    folder.mkdir()
    doc = {"kind": "scenario",
           "scenario": {"name": "flap under load", "description": "an uplink flaps during a ring AllReduce"},
           "scale": {"host_rate_mbps": 100.0, "fabric_rate_mbps": 100.0, "time_scale": 1000.0,
                     "buffers_bytes": {"host": 65536, "leaf": 65536, "spine": 262144}},
           "fabric": {"name": "tiny", "switches": 4, "hosts": 4, "oversubscription": 1.0},
           "valid": True,
           "runs": [_run("ecmp", 71.5, [_fault("link_down", 1.0, 1.5, 0.6), _fault("flap", 2.0, 2.2, 0.2),
                                        _fault("degrade", 2.5, None, None), _unreached()]),
                    _run("flowlet", 88.25)],
           "future_key": {"ignored": True}}
    (folder / "results.json").write_text(json.dumps(doc))
    _links_csv(folder / "links-ecmp-r1.csv", dip=(1.5, 2.0))
    _links_csv(folder / "links-flowlet-r1.csv")
    return doc


def _experiment(folder):
    folder.mkdir()
    summary = {"collective": "allreduce", "algorithm": "ring", "size": 1 << 20, "ranks": 4, "iterations": 5,
               "cct_ms": {"mean": 20.0, "p50": 19.5, "p99": 33.0, "min": 18.0, "max": 33.0},
               "busbw_mbps": 64.125, "busbw_fraction_of_nic": 0.64, "valid": True,
               "counters": {"out_of_sequence": 11, "retransmitted_packets": 0, "local_ack_timeout_err": 0}}
    doc = {"kind": "experiment", "experiment": "routing-schemes",
           "cases": [{"case": "te, l1-s1 fails", "routing": "te", "jobs": {"ring": summary},
                      "uplinks": {"max_mean_ratio": 1.8}, "fault": {"recovery_s": 0.25}}]}
    (folder / "results.json").write_text(json.dumps(doc))
    return doc


def test_column_kinds_and_rates():
    assert [report.column_kind(c) for c in ("l1>s1", "s1>l1", "l1>s2#2", "p2l1>p2s1", "p2s1>p2l1",
                                            "h1-n0>l1", "l1>h1-n0")] == \
        ["up", "down", "up", "up", "down", "nic_tx", "nic_rx"]
    scale = {"host_rate_mbps": 100, "fabric_rate_mbps": 400}
    assert report.link_rates(["l1>s1", "h1-n0>l1"], scale) == [400, 100]
    assert report.link_rates(["l1>s1"], {}) is None


def test_read_links_parses_the_wide_csv(tmp_path):
    _links_csv(tmp_path / "l.csv", dip=(1.0, 1.2))
    times, names, mbps = report.read_links(tmp_path / "l.csv")
    assert names == COLUMNS and len(times) == 40 and mbps.shape == (40, len(COLUMNS))
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
    assert text.startswith("# flap under load\n")
    assert "an uplink flaps during a ring AllReduce" in text
    assert "host links 100 Mbit/s, fabric links 100 Mbit/s; time scale x1000" in text
    assert "buffers host 64K, leaf 64K, spine 256K" in text
    assert "Warning" not in text
    # the fault rows: until, events, baseline, min, recovery and retained; 'held'/'not back' read as words
    assert "| link_down | l1-s1 | 1.00 | 1.50 | 1 | 160.00 | 0.00 | 0.60 | 94% |" in text
    assert "| degrade | l1-s1 | 2.50 | end | 1 | 160.00 | 0.00 | not back | 94% |" in text
    assert "| link_down | l2-s2 | - | - | 0 | - | - | - | - |" in text
    assert "- link_down l2-s2: not reached: the measured jobs ended first" in text
    assert text.count("No faults injected.") == 1                     # the flowlet run
    # the jobs table and the summary (mean recovery over the faults that recovered: (0.6 + 0.2) / 2)
    assert ("| ring | measured | allreduce/ring | 1M | 2 | 71.50 | 72% | 12.0 | 30.0 | 7 | 3 | 1 | yes |"
            in text)
    assert "| ecmp r1 | ring | 4M | 76.50 | 44.0 | 90.0 | 1.45 | 0.40 | 1 |" in text
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


def test_render_flags_an_invalid_scenario(tmp_path):
    folder = tmp_path / "bad"
    doc = _scenario(folder)
    doc["valid"] = False
    doc["runs"][0]["jobs"]["ring"]["valid"] = False
    (folder / "results.json").write_text(json.dumps(doc))
    text = report.render(folder).read_text()
    assert "**Warning: not valid.**" in text
    assert "| ecmp r1 | ring (invalid) |" in text


def test_render_without_optional_parts(tmp_path):
    folder = tmp_path / "bare"
    folder.mkdir()
    bare = _run("ecmp", 50.0)
    for key in ("files", "faults", "end_s", "bin_s", "queues"):
        del bare[key]
    bare["telemetry"] = {}
    first = bare["jobs"]["ring"]["sizes"][0]
    bare["jobs"]["ring"]["sizes"] = [{k: v for k, v in first.items() if k != "cct_ms"}]
    del bare["jobs"]["bg"]
    lost = {"routing": "te", "repetition": 2, "files": {"links_csv": "links-te-r2.csv"}, "jobs": {}}
    doc = {"kind": "scenario", "scenario": {"name": "bare"}, "scale": {}, "runs": [bare, lost]}
    (folder / "results.json").write_text(json.dumps(doc))
    text = report.render(folder).read_text()
    assert "No faults injected." in text and "No telemetry recorded." in text and "No jobs recorded." in text
    assert "no links CSV recorded: heatmap and delivered rate skipped" in text
    assert "links-te-r2.csv missing or empty: heatmap and delivered rate skipped" in text
    assert "no per-iteration completion times recorded: CCT plot skipped" in text
    assert "host link rate not stated" in text
    assert "## Run te r2" in text
    assert not list(folder.glob("*.png"))


def test_render_refuses_other_folders(tmp_path):
    _experiment(tmp_path / "exp")
    with pytest.raises(LabError, match="experiment"):
        report.render(tmp_path / "exp")


def test_compare_lists_runs_and_experiment_cases(tmp_path):
    _scenario(tmp_path / "flap")
    _experiment(tmp_path / "exp")
    rows = report.collect([tmp_path / "flap", tmp_path / "exp"])
    assert len(rows) == 2 * 3 + 1
    assert {(r["folder"], r["run"]) for r in rows} == {("flap", "ecmp r1"), ("flap", "flowlet r1"),
                                                       ("exp", "te, l1-s1 fails")}
    text = report.compare([tmp_path / "flap", tmp_path / "exp"])
    cells = [re.split(r"\s{2,}", line.strip()) for line in text.splitlines()[1:]]
    assert cells[0] == list(report.COMPARE_HEADER)
    assert ["flap", "ecmp r1", "ring", "1M", "71.50", "12.0", "30.0", "1.45", "7", "3", "1", "0.40", "1"] in cells
    assert ["flap", "flowlet r1", "bg (noise)", "1M", "20.00", "50.0", "50.0", "1.45", "7", "3", "1", "-",
            "1"] in cells
    assert ["exp", "te, l1-s1 fails", "ring", "1M", "64.12", "19.5", "33.0", "1.80", "11", "0", "0", "0.25",
            "-"] in cells


def test_compare_needs_results_json(tmp_path):
    (tmp_path / "empty").mkdir()
    _experiment(tmp_path / "exp")
    with pytest.raises(LabError) as err:
        report.compare([tmp_path / "exp", tmp_path / "empty"])
    assert "empty" in str(err.value) and "results.json" in str(err.value) and "\n" not in str(err.value)
    other = {"kind": "all-pairs"}
    with pytest.raises(LabError, match="all-pairs"):
        report.compare_rows(other, "x")


def test_compare_plot_and_cli(tmp_path, capsys):
    _scenario(tmp_path / "flap")
    _experiment(tmp_path / "exp")
    _png(report.compare_plot([tmp_path / "flap", tmp_path / "exp"], tmp_path / "cmp.png"))
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
