"""`fabriclab collective --format nccl` prints what nccl-tests prints.

The parser below is written from nccl-tests' documented output (src/common.cu), the way scripts
that read its logs parse them: skip `#` lines, split a row on whitespace into 13 fields (size,
count, type, redop, root, then time, algbw, busbw and #wrong out of place and in place; #wrong
may be N/A), read the summary lines by regex. It is checked first on an nccl-tests log written
from that format, then applied to what the lab prints for results documents built like real ones.
"""

import re
import types

import pytest

from fabriclab.cli import collective as collective_cmd
from fabriclab.cli import running
from fabriclab.cli.main import build_parser
from fabriclab.results import nccl
from tests.unit import resultdocs as rd

# -- a parser of nccl-tests logs ---------------------------------------------------------------------

HEADER = re.compile(r"^# nThread (\d+) nGpus (\d+) minBytes (\d+) maxBytes (\d+) step: (\d+)\((factor|bytes)\) "
                    r"warmup iters: (\d+) iters: (\d+) agg iters: (\d+) validation: (\d+) graph: (\d+)$")
RANK = re.compile(r"^#\s+Rank\s+(\d+) Group\s+(\d+) Pid\s+(\d+) on\s+(\S+) device\s+(\d+) \[0x([0-9a-f]{2})\] (.+)$")
OUT_OF_BOUNDS = re.compile(r"^# Out of bounds values : (\d+) (OK|FAILED)$")
AVG_BUSBW = re.compile(r"^# Avg bus bandwidth\s+: ([0-9.eE+-]+)")
MODES = ("out_of_place", "in_place")

# Field widths of a row as nccl-tests prints it ("%12li  %12li  %8s  %6s  %6i" then, per mode,
# "  %7s  %6.2f  %6.2f  %5s"): every field right-aligned, so each ends at a fixed column.
WIDTHS = [12, 12, 8, 6, 6] + [7, 6, 6, 5] * 2
FIELD_ENDS = [sum(WIDTHS[:i + 1]) + 2 * i for i in range(len(WIDTHS))]


def parse(text):
    """{header, ranks, rows, out_of_bounds, avg_busbw} of an nccl-tests log."""
    log = {"header": None, "ranks": [], "rows": [], "out_of_bounds": None, "avg_busbw": None}
    for line in text.splitlines():
        if m := HEADER.match(line):
            keys = ("nthread", "ngpus", "min_bytes", "max_bytes", "step", "step_kind", "warmup", "iters",
                    "agg_iters", "validation", "graph")
            log["header"] = {k: v if k == "step_kind" else int(v) for k, v in zip(keys, m.groups())}
        elif m := RANK.match(line):
            log["ranks"].append({"rank": int(m[1]), "group": int(m[2]), "pid": int(m[3]), "host": m[4],
                                 "device": int(m[5]), "bus_id": int(m[6], 16), "name": m[7]})
        elif m := OUT_OF_BOUNDS.match(line):
            log["out_of_bounds"] = (int(m[1]), m[2])
        elif m := AVG_BUSBW.match(line):
            log["avg_busbw"] = float(m[1])
        if line.startswith("#") or not line.strip():
            continue
        fields = line.split()
        assert len(fields) == 13, line
        row = {"size": int(fields[0]), "count": int(fields[1]), "type": fields[2], "redop": fields[3],
               "root": int(fields[4]), "line": line}
        for i, mode in enumerate(MODES):
            time, algbw, busbw, wrong = fields[5 + 4 * i:9 + 4 * i]
            row[mode] = {"time": float(time), "algbw": float(algbw), "busbw": float(busbw),
                         "wrong": None if wrong == "N/A" else int(wrong)}
        log["rows"].append(row)
    return log


def field_ends(line):
    return [m.end() for m in re.finditer(r"\S+", line)]


# -- the parser on nccl-tests' own output -------------------------------------------------------------

# all_reduce_perf -b 1M -e 32M -f 2 -g 1 over 4 ranks on 2 nodes, written from the documented format.
NCCL_TESTS_ALLREDUCE = """\
# nThread 1 nGpus 1 minBytes 1048576 maxBytes 33554432 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  51200 on   node-a01 device  0 [0x07] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  51201 on   node-a01 device  1 [0x0f] NVIDIA H100 80GB HBM3
#  Rank  2 Group  0 Pid  51202 on   node-a02 device  0 [0x07] NVIDIA H100 80GB HBM3
#  Rank  3 Group  0 Pid  51203 on   node-a02 device  1 [0x0f] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
     1048576        262144     float     sum      -1    63.41   16.54   24.80      0    62.87   16.68   25.02      0
     2097152        524288     float     sum      -1    98.52   21.29   31.93      0    97.90   21.42   32.13      0
     4194304       1048576     float     sum      -1    165.3   25.37   38.06      0    164.8   25.45   38.18      0
     8388608       2097152     float     sum      -1    291.7   28.76   43.14      0    290.2   28.91   43.36      0
    16777216       4194304     float     sum      -1    540.6   31.03   46.55      0    541.2   31.00   46.50      0
    33554432       8388608     float     sum      -1   1234.5   27.18   40.77      0   1230.1   27.28   40.92      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 37.6131 
#
"""

# alltoall_perf -b 64K -e 64K: nccl-tests checks no in-place AlltoAll, its #wrong is N/A.
NCCL_TESTS_ALLTOALL_ROW = \
    "       65536          4096     float    none      -1    40.12    1.63    1.23      0    39.80    1.65    1.24    N/A"

COLUMN_HEADERS = NCCL_TESTS_ALLREDUCE.splitlines()[8:11]


def test_the_parser_reads_an_nccl_tests_log():
    log = parse(NCCL_TESTS_ALLREDUCE)
    assert log["header"] == {"nthread": 1, "ngpus": 1, "min_bytes": 1 << 20, "max_bytes": 32 << 20, "step": 2,
                             "step_kind": "factor", "warmup": 5, "iters": 20, "agg_iters": 1, "validation": 1,
                             "graph": 0}
    assert [r["pid"] for r in log["ranks"]] == [51200, 51201, 51202, 51203]
    assert log["ranks"][1] == {"rank": 1, "group": 0, "pid": 51201, "host": "node-a01", "device": 1, "bus_id": 15,
                               "name": "NVIDIA H100 80GB HBM3"}
    assert [r["size"] for r in log["rows"]] == [1 << k for k in range(20, 26)]
    last = log["rows"][-1]
    assert (last["count"], last["type"], last["redop"], last["root"]) == (8388608, "float", "sum", -1)
    assert last["out_of_place"] == {"time": 1234.5, "algbw": 27.18, "busbw": 40.77, "wrong": 0}
    assert last["in_place"] == {"time": 1230.1, "algbw": 27.28, "busbw": 40.92, "wrong": 0}
    assert log["out_of_bounds"] == (0, "OK")
    busbws = [r[m]["busbw"] for r in log["rows"] for m in MODES]
    assert log["avg_busbw"] == pytest.approx(sum(busbws) / len(busbws), abs=0.01)
    assert all(field_ends(r["line"]) == FIELD_ENDS for r in log["rows"])
    row = parse(NCCL_TESTS_ALLTOALL_ROW)["rows"][0]
    assert row["out_of_place"]["wrong"] == 0 and row["in_place"]["wrong"] is None
    assert field_ends(NCCL_TESTS_ALLTOALL_ROW) == FIELD_ENDS


def test_the_parser_refuses_a_row_that_is_not_nccl_tests():
    with pytest.raises(AssertionError):
        parse("     1048576        262144     float     sum      -1    63.41   16.54   24.80      0")


# -- the parser on the lab's output ------------------------------------------------------------------

SIZES = ((65536, (0.30, 0.31, 0.33)), (131072, (0.61, 0.62, 0.60)), (262144, (1.21, 1.25, 1.30)))


def lab_doc(time_scale=True, **job):
    """A collective document of the kind `collective --format nccl` writes (both modes)."""
    kind = job.get("collective", "allreduce")
    doc = rd.doc("collective", [rd.run("r", {kind: rd.collective_job(9.3, sizes=SIZES, in_place=True, **job)})])
    if not time_scale:
        doc["scale"]["time_scale"] = doc["scale"]["real_host_rate_mbps"] = None
    return doc


def expected_rows(doc):
    """Per size, per mode: (time us, algbw GB/s, busbw GB/s, #wrong) from the document's numbers."""
    job = next(iter(doc["runs"][0]["jobs"].values()))
    scale = doc["scale"]["time_scale"] or 1.0
    rows = {}
    for row in job["sizes"]:
        verify = row["verify"]
        rows.setdefault(row["size"], {})["in_place" if row["in_place"] else "out_of_place"] = (
            row["cct_ms"]["mean"] * 1e3 / scale, row["algbw_mbps"] * scale / 8e3, row["busbw_mbps"] * scale / 8e3,
            None if verify is None else verify["wrong_elements"])
    return job, rows


def time_tolerance(us):
    """Half the last printed digit: %7.0f from 10000 us, %7.1f from 100 us, else %7.2f."""
    return 0.5 if us >= 10000 else (0.05 if us >= 100 else 0.005)


def check_against_document(text, doc):
    log = parse(text)
    job, expected = expected_rows(doc)
    w = job["workload"]
    assert log["header"] == {"nthread": 1, "ngpus": 1, "min_bytes": 65536, "max_bytes": 262144, "step": 2,
                             "step_kind": "factor", "warmup": w["warmup"], "iters": w["iterations"], "agg_iters": 1,
                             "validation": int(w["verify"]), "graph": 0}
    assert [(r["rank"], r["group"], r["pid"], r["host"], r["device"], r["bus_id"]) for r in log["ranks"]] == \
        [(r["rank"], 0, r["pid"], r["host"], r["nic"], doc["fabric"]["planes"]) for r in job["ranks"]]
    assert all(r["name"].startswith("fabriclab udp RNIC ") for r in log["ranks"])
    lines = text.splitlines()
    assert lines[lines.index("# Using devices") + len(job["ranks"]) + 2:][:3] == COLUMN_HEADERS
    assert [r["size"] for r in log["rows"]] == [s for s, _ in SIZES]
    failed, busbws = 0, []
    for row in log["rows"]:
        assert field_ends(row["line"]) == FIELD_ENDS, row["line"]
        assert row["type"] == "float"
        for mode in MODES:
            time, algbw, busbw, wrong = expected[row["size"]][mode]
            got = row[mode]
            assert got["time"] == pytest.approx(time, abs=time_tolerance(time))
            assert got["algbw"] == pytest.approx(algbw, abs=0.005) and got["busbw"] == pytest.approx(busbw, abs=0.005)
            assert got["wrong"] == wrong
            failed += bool(wrong)
            busbws.append(busbw)
    assert log["out_of_bounds"] == (failed, "FAILED" if failed else "OK")
    assert log["avg_busbw"] == pytest.approx(sum(busbws) / len(busbws), rel=1e-5)
    return log


def test_verified_allreduce_at_the_real_hardwares_scale():
    doc = lab_doc(verify=True, wrong={(131072, True): 12})
    text = nccl.render(doc)
    log = check_against_document(text, doc)
    assert [(r["count"], r["redop"], r["root"]) for r in log["rows"]] == [(s // 4, "sum", -1) for s, _ in SIZES]
    assert log["rows"][1]["in_place"]["wrong"] == 12 and log["out_of_bounds"] == (1, "FAILED")
    assert log["rows"][0]["out_of_place"]["busbw"] > 1      # GB/s of the 400 Gbit/s hardware, not 0.00
    assert ("# fabriclab: lab links 10 Mbit/s at time scale x40000: times and bandwidths below are the real "
            "400 Gbit/s hardware's") in text.splitlines()[1]


def test_without_a_time_scale_the_numbers_are_the_labs():
    doc = lab_doc(time_scale=False, verify=True)
    text = nccl.render(doc)
    log = check_against_document(text, doc)
    assert log["rows"][0]["out_of_place"]["time"] > 10000          # 0.3 s of the lab: printed %7.0f
    assert "times and bandwidths below are the lab's own" in text.splitlines()[1]


def test_without_validation_wrong_is_not_available():
    doc = lab_doc(verify=False)
    log = check_against_document(nccl.render(doc), doc)
    assert log["header"]["validation"] == 0
    assert all(r[m]["wrong"] is None for r in log["rows"] for m in MODES)
    assert log["out_of_bounds"] == (0, "OK")


def test_a_rooted_collective_names_its_root():
    doc = lab_doc(collective="gather", root=1, verify=True)
    log = check_against_document(nccl.render(doc), doc)
    assert [(r["count"], r["redop"], r["root"]) for r in log["rows"]] == [(s // 4 // 2, "none", 1) for s, _ in SIZES]


def test_an_undefined_in_place_result_is_not_available_like_nccl_tests():
    doc = lab_doc(collective="alltoall", verify=True)
    log = check_against_document(nccl.render(doc), doc)
    assert all(r["out_of_place"]["wrong"] == 0 and r["in_place"]["wrong"] is None for r in log["rows"])


def test_a_job_without_in_place_rows_says_so():
    doc = rd.doc("collective", [rd.run("r", {"ring": rd.collective_job(9.3, sizes=SIZES[:1], verify=True)})])
    text = nccl.render(doc)
    assert "# fabriclab: a mode that did not run (no --in-place) shows N/A" in text
    row = [line for line in text.splitlines() if not line.startswith("#")][0]
    assert row.split()[-4:] == ["N/A"] * 4 and field_ends(row) == FIELD_ENDS


@pytest.mark.parametrize("sizes, step", [([65536, 131072, 262144], (2, "factor")),
                                         ([1000, 3000, 9000], (3, "factor")),
                                         ([4096, 8192, 12288], (4096, "bytes")),
                                         ([65536], (0, "bytes"))])
def test_step_is_the_factor_of_a_geometric_series_else_bytes(sizes, step):
    assert nccl.size_step(sizes) == step


# -- the command line -----------------------------------------------------------------------------------

def test_collective_takes_format_nccl_and_in_place():
    args = build_parser().parse_args(["collective", "tiny", "--format", "nccl", "--sizes", "64K"])
    assert args.format == "nccl" and args.in_place is False      # cmd_collective turns it on
    args = collective_cmd.prompt_parser().parse_args(["--in-place"])
    assert collective_cmd.spec_from_args(args).in_place is True


def test_a_script_format_prints_its_text_alone(monkeypatch, capsys):
    """No heading, no progress on stdout: only what the renderer prints; the folder on stderr."""
    from fabriclab.workflows import pipeline

    doc = lab_doc(verify=True)
    seen = {}

    def run_plan(plan, out, progress=None, verbose=False, run_plots=True, plots=True):
        seen["progress"] = progress
        return types.SimpleNamespace(doc=doc, folder="results/x")

    monkeypatch.setattr(pipeline, "run_plan", run_plan)
    args = types.SimpleNamespace(format="nccl", out=None, verbose=False)
    code = running.execute(None, args, "bringing up tiny ...", {"table": str, "nccl": nccl.render}, bar=True)
    out, err = capsys.readouterr()
    assert code == running.EXIT_VALID and seen["progress"] is None
    assert out == nccl.render(doc) + "\n" and parse(out)["rows"]
    assert err == "results: results/x/results.json\n"


# -- the launcher runs both modes -----------------------------------------------------------------------

def test_the_launcher_runs_each_size_out_of_place_then_in_place():
    from fabriclab.errors import LabError
    from fabriclab.traffic.collective import CollectiveSpec, Launcher

    lab = rd.fake_lab()
    both = Launcher(lab, CollectiveSpec("allgather", sizes=(4096, 8192), in_place=True))
    assert [(index, s.size, s.in_place) for index, s in both.cases] == [(0, 4096, False), (0, 4096, True),
                                                                         (1, 8192, False), (1, 8192, True)]
    one = Launcher(lab, CollectiveSpec("allgather", sizes=(4096, 8192)))
    assert [(index, s.in_place) for index, s in one.cases] == [(0, False), (1, False)]
    # what a scheduler is told the job moves does not double: the wire is the same in both modes
    assert both.placement_pairs() == one.placement_pairs()
    with pytest.raises(LabError, match="^collective: in_place must be true or false, got 'yes'$"):
        CollectiveSpec(in_place="yes").check()
