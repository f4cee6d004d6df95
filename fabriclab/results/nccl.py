"""nccl-tests' text output, from a results document: what `fabriclab collective --format nccl`
prints, so that scripts that parse nccl-tests logs parse the lab's.

The layout is nccl-tests' own (src/common.cu): a header line, a line per rank, three column
headers, a row per size with the out-of-place and the in-place result side by side, then the
count of results with wrong values and the mean bus bandwidth. Units are nccl-tests': times in
microseconds, bandwidths in GB/s (1e9 bytes/s). The lab's links run at Mbit/s, where GB/s would
print 0.00: when the spec states a time scale, times and bandwidths are the real hardware's it
stands for (lab time / scale, lab bandwidth x scale), and an extra `#` line says which it is.

What the lab has no equivalent for gets an honest value: one thread and one "GPU" per rank
process, no CUDA graphs, no aggregated iterations; the rank agent's pid; the host's name; the NIC
index as the device and the plane count as its bus id; float32 elements; `sum` for reductions
and `none` otherwise; root -1 but for Gather and Scatter. The size column is the document's size (nccl-tests'
size per collective, `traffic/schedules.py`); the count is elements per rank's buffer as
nccl-tests counts them. This module reads only the results document.
"""

from __future__ import annotations

from fabriclab.results.realscale import real_scale
from fabriclab.results.tables import job_of

ELEMENT_TYPE = "float"
REDUCTIONS = ("allreduce", "reducescatter")
ROOTED = ("gather", "scatter")
PER_RANK_COUNT = ("allgather", "reducescatter", "alltoall", "alltoallv", "gather", "scatter")
"""Collectives whose count nccl-tests gives per rank (size / ranks elements)."""
NOT_RUN = "  %7s  %6s  %6s  %5s" % ("N/A", "N/A", "N/A", "N/A")


def render(doc):
    """The nccl-tests text of the document's (first measured) collective job."""
    _run, _name, job = job_of(doc, "collective")
    scale, note = real_scale(doc)
    rows = _pairs(job["sizes"])
    lines = [_header(job["workload"])] + note
    if any(None in pair for pair in rows):
        lines.append("# fabriclab: a mode that did not run (no --in-place) shows N/A")
    lines += ["#", "# Using devices"] + [_device(doc, job, rank) for rank in job["ranks"]] + ["#"]
    lines += _column_headers()
    busbws, failed = [], 0
    for pair in rows:
        first = next(row for row in pair if row is not None)
        text = _parameters(job, first)
        for row in pair:
            if row is None:
                text += NOT_RUN
                continue
            result, busbw, wrong = _result(row, scale)
            text += result
            busbws.append(busbw)
            failed += bool(wrong)
        lines.append(text)
    lines.append(f"# Out of bounds values : {failed} {'FAILED' if failed else 'OK'}")
    lines.append("# Avg bus bandwidth    : %g " % (sum(busbws) / len(busbws) if busbws else 0.0))
    lines.append("#")
    return "\n".join(lines)


def _header(workload):
    sizes = list(workload["sizes"])
    step, kind = size_step(sizes)
    return (f"# nThread 1 nGpus 1 minBytes {min(sizes)} maxBytes {max(sizes)} step: {step}({kind}) "
            f"warmup iters: {workload['warmup']} iters: {workload['iterations']} agg iters: 1 "
            f"validation: {int(bool(workload['verify']))} graph: 0")


def size_step(sizes):
    """nccl-tests' step: the factor between consecutive sizes when they form a geometric series
    (as -f gives), else the bytes between the first two (as -i gives); 0 bytes for one size."""
    if len(sizes) < 2:
        return 0, "bytes"
    factor, rest = divmod(sizes[1], sizes[0])
    if factor > 1 and not rest and all(b == a * factor for a, b in zip(sizes, sizes[1:])):
        return factor, "factor"
    return sizes[1] - sizes[0], "bytes"


def _device(doc, job, rank):
    intfs = rank.get("intfs") or [f"{rank['host']}-n{rank['nic']}"]
    rate = job["transport"]["link_rate_mbps"]
    rnic = "udp RNIC" if job["backend"] == "udp" else job["backend"]
    rates = f"{len(intfs)}x{rate:g}" if len(intfs) > 1 else f"{rate:g}"
    return ("#  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%02x] %s"
            % (rank["rank"], 0, rank.get("pid") or 0, rank["host"], rank["nic"],
               doc["fabric"].get("planes") or 0, f"fabriclab {rnic} {'+'.join(intfs)} {rates} Mbit/s"))


def _column_headers():
    return [
        "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          "
        % ("", "", "", "", ""),
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s"
        % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
           "time", "algbw", "busbw", "#wrong"),
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s"
        % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""),
    ]


def _pairs(rows):
    """[out-of-place row, in-place row] per size, in the order run; None for a mode not run."""
    pairs = []
    for row in rows:
        if not row.get("in_place", False):
            pairs.append([row, None])
        elif pairs and pairs[-1][1] is None and pairs[-1][0] is not None and pairs[-1][0]["size"] == row["size"]:
            pairs[-1][1] = row
        else:
            pairs.append([None, row])
    return pairs


def element_count(collective, size, ranks):
    """nccl-tests' count column: elements of the per-call count (per rank for the block
    collectives, the whole buffer for AllReduce and the bisection test)."""
    elements = size // 4
    return elements // ranks if collective in PER_RANK_COUNT else elements


def _parameters(job, row):
    collective = row["collective"]
    root = job["workload"]["root"] if collective in ROOTED else -1
    return "%12li  %12li  %8s  %6s  %6i" % (row["size"], element_count(collective, row["size"], row["ranks"]),
                                            ELEMENT_TYPE, "sum" if collective in REDUCTIONS else "none", root)


def _result(row, scale):
    """(the text of one mode's result, its busbw in GB/s, its wrong elements or None)."""
    us = row["cct_ms"]["mean"] * 1e3 / scale
    time = "%7.0f" % us if us >= 10000 else ("%7.1f" % us if us >= 100 else "%7.2f" % us)
    algbw = row["algbw_mbps"] * scale / 8e3
    busbw = row["busbw_mbps"] * scale / 8e3
    wrong = wrong_elements(row["verify"])
    shown = "%5s" % "N/A" if wrong is None else "%5g" % wrong
    return "  %7s  %6.2f  %6.2f  %s" % (time, algbw, busbw, shown), busbw, wrong


def wrong_elements(verify):
    """nccl-tests' #wrong of a size row's check; None when nothing was checked (N/A)."""
    if verify is None:
        return None
    # documents written before wrong_elements existed: the count of wrong outputs
    return verify.get("wrong_elements", 0 if verify["ok"] else verify["mismatched_outputs"])
