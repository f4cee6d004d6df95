"""`fabriclab run --format perftest` prints what ib_write_bw prints.

The parser below is written from perftest's format strings (src/perftest_parameters.h: the dashed
RESULT_LINE, the RESULT_FMT column headers, REPORT_FMT's five fields), the way scripts that read
ib_write_bw logs parse them: find the column headers, split the next line on whitespace, and read
the address lines by regex. It is checked first on a log written with perftest's own format, then
applied to what the lab prints for an all-pairs document built like a real one.
"""

import re

import pytest

from fabriclab.cli.main import build_parser
from fabriclab.errors import LabError
from fabriclab.results import perftest
from tests.unit import resultdocs as rd

HEADERS = re.compile(r"^ #bytes\s+#iterations\s+BW peak\[MB/sec\]\s+BW average\[MB/sec\]\s+MsgRate\[Mpps\]$")
ADDRESS = re.compile(r"^ (local|remote) address: (.*)$")
GID = re.compile(r"^ GID: ((?:\d{2,3}:){15}\d{2,3})$")


def parse(text):
    """[{bytes, iterations, bw_peak, bw_average, msg_rate, local, remote, gids}] of ib_write_bw output."""
    tests, current, header_seen = [], {"gids": []}, False
    for line in text.splitlines():
        if m := ADDRESS.match(line):
            current[m[1]] = m[2]
        elif m := GID.match(line):
            current["gids"].append(m[1])
        elif HEADERS.match(line):
            header_seen = True
        elif header_seen:
            fields = line.split()
            assert len(fields) == 5, line
            current.update(bytes=int(fields[0]), iterations=int(fields[1]), bw_peak=float(fields[2]),
                           bw_average=float(fields[3]), msg_rate=float(fields[4]))
            tests.append(current)
            current, header_seen = {"gids": []}, False
    return tests


def test_the_parser_reads_a_perftest_log():
    # A block as ib_write_bw writes it, the row through perftest's own REPORT_FMT
    row = " %-7lu    %-10lu       %-7.2lf            %-7.2lf\t\t   %-7.6lf".replace("l", "") % (
        65536, 5000, 11030.52, 11029.13, 0.176466)
    log = "\n".join([
        "-" * 87, "                    RDMA_Write BW Test",
        " local address: LID 0000 QPN 0x0108 PSN 0x2f4cfe RKey 0x1fffbd VAddr 0x007f8b4a9e7000",
        " GID: 00:00:00:00:00:00:00:00:00:00:255:255:192:168:01:01",
        " remote address: LID 0000 QPN 0x0109 PSN 0x4c2a08 RKey 0x1fffbe VAddr 0x007f3c2d1e1000",
        " GID: 00:00:00:00:00:00:00:00:00:00:255:255:192:168:01:02",
        "-" * 87, perftest.RESULT_FMT, row, "-" * 87])
    (test,) = parse(log)
    assert (test["bytes"], test["iterations"], test["bw_average"], test["msg_rate"]) == (65536, 5000, 11029.13, 0.176466)
    assert test["gids"][1].endswith("192:168:01:02")


def test_every_flow_is_a_block_with_the_documents_numbers_at_the_real_scale():
    doc = rd.doc("run", [rd.run("r", {"traffic": rd.allpairs_job()})])
    job = doc["runs"][0]["jobs"]["traffic"]
    text = perftest.render(doc)
    tests = parse(text)
    assert len(tests) == len(job["flows"]) == 2
    scale = doc["scale"]["time_scale"]
    assert text.splitlines()[0] == ("# fabriclab: lab links 10 Mbit/s at time scale x40000: times and bandwidths "
                                    "below are the real 400 Gbit/s hardware's")
    for flow, test in zip(job["flows"], tests):
        # 99 packets of 4096 bytes arrived: 6 whole 64 KiB messages in 2 s of the lab
        assert (test["bytes"], test["iterations"], test["bw_peak"]) == (65536, 6, 0.0)
        assert test["bw_average"] == pytest.approx(6 * 65536 / (2.0 / scale) / 2 ** 20, abs=0.01)
        assert test["msg_rate"] == pytest.approx(6 / (2.0 / scale) / 1e6, abs=1e-6)
        assert (test["local"], test["remote"]) == tuple(flow["id"].split("#")[0].split(">"))
        assert [g.split(":")[-4:] for g in test["gids"]] == [
            ["%02d" % int(b) for b in address.split(".")] for address in (flow["src"], flow["dst"])]


def test_without_a_time_scale_the_numbers_are_the_labs():
    doc = rd.doc("run", [rd.run("r", {"traffic": rd.allpairs_job()})])
    doc["scale"]["time_scale"] = doc["scale"]["real_host_rate_mbps"] = None
    (test, _) = parse(perftest.render(doc))
    assert test["bw_average"] == pytest.approx(6 * 65536 / 2.0 / 2 ** 20, abs=0.01)


def test_a_job_recorded_before_its_message_size_is_refused_in_one_line():
    doc = rd.doc("run", [rd.run("r", {"traffic": rd.allpairs_job()})])
    del doc["runs"][0]["jobs"]["traffic"]["message_bytes"]
    with pytest.raises(LabError, match=r"^this all-pairs job was recorded before its message size was") as err:
        perftest.render(doc)
    assert "\n" not in str(err.value)


def test_run_and_demo_take_format_perftest_and_collective_does_not():
    assert build_parser().parse_args(["run", "tiny", "--format", "perftest"]).format == "perftest"
    assert build_parser().parse_args(["demo", "--format", "perftest"]).format == "perftest"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["collective", "tiny", "--format", "perftest"])
