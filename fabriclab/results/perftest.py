"""perftest's text output, from an all-pairs results document: what `fabriclab run --format
perftest` prints, so that scripts that parse ib_write_bw logs parse the lab's.

Every flow of the all-pairs job is one RC QP streaming RDMA WRITEs of `message_bytes` (64 KiB,
ib_write_bw's default size) for the run's duration, as `ib_write_bw -D SECONDS` does. Each flow
gets perftest's block (src/perftest_parameters.h: RESULT_LINE, RESULT_FMT, REPORT_FMT): the test's
name and the parameters the lab has, the local and remote address, the column headers and one row.
Units are perftest's: MB/sec of 2^20 bytes, MsgRate in millions of messages a second. At a time
scale, bandwidths and rates are the real hardware's the spec stands for (lab rate x scale), and a
`#` line above says so.

What the lab does not measure is not made up: `#iterations` counts the messages that arrived
whole, the peak is 0.00 (no per-message completion times are kept; perftest prints the same with
--noPeak), and the address lines carry the interface and its GID but no LID, PSN, RKey or VAddr.
This module reads only the results document.
"""

from __future__ import annotations

import ipaddress

from fabriclab.errors import LabError
from fabriclab.results.realscale import real_scale
from fabriclab.results.tables import job_of

RESULT_LINE = "-" * 87
RESULT_FMT = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
MB = 1 << 20                    # perftest's MB/sec: its format factor is 0x100000


def render(doc):
    """The ib_write_bw text of the document's (first measured) all-pairs job, a block per flow."""
    _run, _name, job = job_of(doc, "all-pairs")
    if "message_bytes" not in job:
        raise LabError("this all-pairs job was recorded before its message size was "
                       "(run it again for --format perftest)")
    scale, note = real_scale(doc)
    duration = job["workload"]["duration_s"]
    message, payload = job["message_bytes"], job["payload_bytes"]
    lines = note + [f"# fabriclab: {len(job['flows'])} flows, each an RC QP writing {message}-byte messages "
                    f"for {duration:g} s of lab time (ib_write_bw -D); #iterations: messages that arrived whole; "
                    f"BW peak: not measured"]
    for flow in job["flows"]:
        lines += block(flow, message, payload, duration, scale)
    return "\n".join(lines)


def block(flow, message, payload, duration_s, scale):
    """One flow's ib_write_bw output."""
    local, _, rest = flow["id"].partition(">")
    remote = rest.partition("#")[0]
    iterations, bw, rate = figures(flow["received_packets"], message, payload, duration_s, scale)
    return [RESULT_LINE,
            "                    RDMA_Write BW Test",
            f" Dual-port       : OFF\t\tDevice         : {local}",
            " Number of qps   : 1\t\tTransport type : IB",
            " Connection type : RC\t\tUsing SRQ      : OFF",
            f" Mtu             : {payload}[B]",
            " Link type       : Ethernet",
            RESULT_LINE,
            f" local address: {local}",
            f" GID: {gid(flow['src'])}",
            f" remote address: {remote}",
            f" GID: {gid(flow['dst'])}",
            RESULT_LINE,
            RESULT_FMT,
            # REPORT_FMT: " %-7lu    %-10lu       %-7.2lf            %-7.2lf\t\t   %-7.6lf"
            " %-7d    %-10d       %-7.2f            %-7.2f\t\t   %-7.6f" % (message, iterations, 0.0, bw, rate),
            RESULT_LINE]


def figures(received_packets, message, payload, duration_s, scale):
    """(whole messages delivered, average MB/sec, Mpps) of one flow, at the printed time scale."""
    per_message = -(-message // payload)
    iterations = received_packets // per_message
    seconds = duration_s / scale
    return iterations, iterations * message / seconds / MB, iterations / seconds / 1e6


def gid(address):
    """An IPv4 address as the IPv4-mapped GID perftest prints: sixteen bytes in decimal, two digits each."""
    return ":".join("%02d" % byte for byte in ipaddress.IPv6Address(f"::ffff:{address}").packed)
