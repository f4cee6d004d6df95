"""Trim a Kineto trace to what a replay reads, and a sample of the rest, written gzip-compressed.

    python examples/traces/trim_trace.py IN.json[.gz] OUT.json.gz [--sample 25]

Kept: the communication records (`record_param_comms`, `c10d::*`, `gloo:*` on the CPU and the
GPU, the NCCL kernels that carry a "Collective name"), the profiler's step spans, the thread
names, the trace's `distributedInfo` and device properties; of every other event (CPU operators,
CUDA runtime calls, kernels, copies) one in `--sample`, so the reader is still tested against
them. Needs only the standard library (record_trace.py uses it for its own traces).
"""

from __future__ import annotations

import argparse
import gzip
import json
import pathlib

COMMS = ("record_param_comms", "c10d::", "gloo:", "ProfilerStep")
HEADER = ("schemaVersion", "deviceProperties", "distributedInfo", "baseTimeNanoseconds", "displayTimeUnit")


def read(path):
    data = pathlib.Path(path).read_bytes()
    return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def trim(trace, sample=0):
    """The trace with its communication events and every `sample`-th other one (0: none)."""
    keep = []
    others = 0
    for event in trace.get("traceEvents", []):
        args = event.get("args") if isinstance(event.get("args"), dict) else {}
        if (str(event.get("name", "")).startswith(COMMS) or event.get("name") == "thread_name"
                or "Collective name" in args):
            keep.append(event)
        elif event.get("ph") == "X":
            others += 1
            if sample and others % sample == 0:
                keep.append(event)
    slim = {k: trace[k] for k in HEADER if k in trace}
    slim["traceEvents"] = keep
    return slim


def write(trace, path):
    text = json.dumps(trace, separators=(",", ":")).encode()
    if str(path).endswith(".gz"):
        text = gzip.compress(text, mtime=0)           # mtime 0: the same trace, the same bytes
    pathlib.Path(path).write_bytes(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source")
    parser.add_argument("out")
    parser.add_argument("--sample", type=int, default=25, help="keep one in SAMPLE other events (0: none)")
    args = parser.parse_args()
    trace = read(args.source)
    slim = trim(trace, args.sample)
    write(slim, args.out)
    print(f"{args.out}: {len(slim['traceEvents'])} of {len(trace.get('traceEvents', []))} events")


if __name__ == "__main__":
    main()
