"""A trace's collectives as a job of a plan: ranks mapped to hosts, sizes and gaps scaled.

    trace = traces.load("examples/traces/ddp4/kineto-rank0.json")
    job = Job("ddp4", ReplaySpec(trace, hosts=("h1", "h2", "h3", "h4"), max_gap_s=0.2))
    pipeline.run_plan(single_run("replay", "replay", spec, job))

Mapping: trace rank r runs on `hosts[r]` (NIC 0); a collective of a process group runs on its
members' hosts only, so a group smaller than the job runs where the placement put its ranks.
Consecutive collectives of one group form one segment: a collective program on one set of
agents (traffic.collective, CollectiveSpec.program), each collective once, in trace order, each
starting its (scaled) compute gap after the previous one ended. A new group starts new agents.

Scaling, recorded in the results: the lab's links run `time_scale` times slower than the real
ones they stand for, so a collective of the trace's size takes time_scale times longer.
`size_scale` divides every message (a replay of GB messages at Mbit/s would take hours); times
in the lab are then worth time_scale / size_scale real ones where bandwidth dominates, and a lab
CCT is converted to real time as cct x size_scale / time_scale. Compute gaps are stretched by
`gap_scale` (default time_scale / size_scale: the job's proportions of compute to communication
kept) and each capped at `max_gap_s`, so that a replay takes seconds; how many were capped is
recorded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fabriclab.errors import LabError
from fabriclab.loading import boolean, excerpt, number, whole
from fabriclab.traffic import schedules

MAX_GAP_S = 60.0


@dataclass
class ReplaySpec:
    """What to replay and how. `trace` is a traces.Trace."""

    trace: object
    hosts: tuple | None = None          # host of each trace rank (default: the fabric's first ones)
    size_scale: float = 1.0             # trace sizes are divided by this
    gap_scale: float | None = None      # trace gaps are multiplied by this (default time_scale / size_scale)
    max_gap_s: float = 1.0              # cap on one compute gap in the lab
    verify: bool = False
    qps: int = 1
    chunk_bytes: int = 65536
    backend: str = "udp"
    seed: int = 1

    def check(self):
        from fabriclab.workflows.traces import Trace

        if not isinstance(self.trace, Trace):
            raise LabError(f"replay: trace must be a loaded trace, got {excerpt(self.trace)}")
        number(self.size_scale, "replay: size_scale", 1, 1e9)
        if self.gap_scale is not None:
            number(self.gap_scale, "replay: gap_scale", 0, 1e9)
        number(self.max_gap_s, "replay: max_gap_s (s)", 0, MAX_GAP_S)
        boolean(self.verify, "replay: verify")
        whole(self.qps, "replay: qps", 1, 64)
        whole(self.chunk_bytes, "replay: chunk_bytes", 4, 16 << 20)
        whole(self.seed, "replay: seed", 0, (1 << 32) - 1)
        if self.hosts is not None:
            if not isinstance(self.hosts, (tuple, list)) or not all(isinstance(h, str) for h in self.hosts):
                raise LabError(f"replay: hosts must be a list of host names, got {excerpt(self.hosts)}")
            if len(self.hosts) != self.trace.world:
                raise LabError(f"replay: the trace has {self.trace.world} ranks but {len(self.hosts)} "
                               f"hosts were given")
            if len(set(self.hosts)) != len(self.hosts):
                raise LabError("replay: a host is listed twice")

    def placed_hosts(self, fabric):
        """The host of each trace rank on `fabric`; LabError when it has too few or unknown ones."""
        names = list(self.hosts) if self.hosts is not None else list(fabric.hosts)[:self.trace.world]
        unknown = [h for h in names if h not in fabric.hosts]
        if unknown:
            raise LabError(f"replay: host {excerpt(unknown[0])} is not in fabric {excerpt(fabric.spec.name)}")
        if len(names) < self.trace.world:
            raise LabError(f"replay: the trace has {self.trace.world} ranks; fabric "
                           f"{excerpt(fabric.spec.name)} has {len(fabric.hosts)} hosts")
        return names

    def scaling(self, fabric):
        """How trace sizes and times map onto this fabric (recorded in the results)."""
        time_scale = fabric.spec.time_scale
        gap_scale = self.gap_scale
        if gap_scale is None:
            gap_scale = (time_scale or 1.0) / self.size_scale
        return {"size_scale": self.size_scale, "gap_scale": gap_scale, "max_gap_s": self.max_gap_s,
                "time_scale": time_scale,
                # lab seconds -> real seconds on the hardware the spec stands for
                "lab_to_real": (self.size_scale / time_scale) if time_scale else None}


@dataclass(frozen=True)
class Step:
    """One collective of the trace as the lab runs it."""

    op: object                      # traces.Op
    size: int                       # bytes in the lab (scaled, rounded as the schedule rounds)
    gap_s: float                    # compute gap before it in the lab (scaled and capped)
    trace_gap_s: float
    clipped: bool                   # the gap was capped at max_gap_s


@dataclass
class Segment:
    """Consecutive collectives of one process group: one collective program on its hosts."""

    group: tuple                    # trace ranks
    hosts: tuple
    steps: list


def lab_size(collective, ranks, size, size_scale):
    """A trace size scaled down and rounded as the lab's schedule rounds it (at least one
    element per block)."""
    scaled = max(1, int(round(size / size_scale)))
    minimum = schedules.ELEMENT_BYTES * (ranks if collective in schedules.BLOCKED else 1)
    return max(minimum, schedules.effective_size(collective, ranks, scaled))


def plan_segments(spec, fabric):
    """The replay as segments of steps (pure: the tests check it without a network)."""
    spec.check()
    hosts = spec.placed_hosts(fabric)
    scale = spec.scaling(fabric)
    segments = []
    for op, trace_gap in zip(spec.trace.ops, spec.trace.gaps()):
        gap = trace_gap * scale["gap_scale"]
        step = Step(op, lab_size(op.collective, len(op.group), op.size, spec.size_scale),
                    min(gap, spec.max_gap_s), trace_gap, gap > spec.max_gap_s)
        if segments and segments[-1].group == op.group:
            segments[-1].steps.append(step)
        else:
            segments.append(Segment(op.group, tuple(hosts[r] for r in op.group), [step]))
    return segments


def collective_spec(spec, segment):
    """The CollectiveSpec of one segment: its steps as a program over its hosts, one NIC each."""
    from fabriclab.traffic.collective import CollectiveSpec

    program = tuple((s.op.collective, s.size, round(s.gap_s, 6)) for s in segment.steps)
    return CollectiveSpec(collective=program[0][0], sizes=(program[0][1],), hosts=segment.hosts, nics=1,
                          iterations=1, warmup=0, verify=spec.verify, qps=spec.qps,
                          chunk_bytes=spec.chunk_bytes, backend=spec.backend, seed=spec.seed,
                          program=program)


def workload_record(spec, fabric):
    """The replay's workload as the results document records it (the trace by its summary)."""
    record = {k: v for k, v in dataclasses.asdict(spec).items() if k != "trace"}
    record["trace"] = spec.trace.path
    record["hosts"] = spec.placed_hosts(fabric)
    return record


def op_rows(segments, runs, scale):
    """Per collective: the trace's numbers beside the lab's (and the lab's in real time)."""
    rows = []
    to_real = scale["lab_to_real"]
    previous_end = None
    for segment, run in zip(segments, runs):
        for k, (step, row) in enumerate(zip(segment.steps, run.sizes)):
            cct = row["time_s"]["mean"]
            ran_gap = row.get("gap_s")
            if k == 0 and previous_end is not None and run.traffic_window:
                ran_gap = run.traffic_window[0] - previous_end     # new agents started between
            op = step.op
            rows.append({
                "index": op.index, "name": op.name, "collective": op.collective,
                "group": list(op.group), "hosts": list(segment.hosts), "ranks": len(op.group),
                "trace_size": op.size, "size": row["size"],
                "trace_ms": round(op.duration_s * 1e3, 4),
                "trace_gap_ms": round(step.trace_gap_s * 1e3, 4),
                "gap_ms": round(step.gap_s * 1e3, 4), "gap_clipped": step.clipped,
                "gap_ran_ms": None if ran_gap is None else round(ran_gap * 1e3, 4),
                "cct_ms": round(cct * 1e3, 4), "ideal_ms": round(row["ideal_time_s"] * 1e3, 4),
                "cct_real_ms": None if to_real is None else round(cct * to_real * 1e3, 6),
                "real_vs_trace": (None if to_real is None or op.duration_s <= 0
                                  else round(cct * to_real / op.duration_s, 6)),
                "busbw_mbps": round(row["busbw_mbps"], 4),
                # what the trace's own fabric reached: its size and time as nccl-tests counts busbw
                "trace_busbw_mbps": (None if op.duration_s <= 0 else
                                     round(op.size * row["bus_factor"] * 8 / op.duration_s / 1e6, 4)),
                "busbw_fraction_of_nic": round(row["busbw_fraction_of_nic"], 5),
                "verify": None if row["verify"] is None else row["verify"]["ok"],
                "valid": bool(row["valid"]) and (row["verify"] is None or row["verify"]["ok"]),
            })
        if run.traffic_window:
            previous_end = run.traffic_window[1]
    return rows


def totals(rows, trace, scale):
    """The job's communication time: the trace's (its collectives' spans) against the lab's (the
    replayed collectives run one after another, so their CCTs add up)."""
    lab_ms = sum(r["cct_ms"] for r in rows)
    trace_ms = trace.comm_time_s() * 1e3
    real_ms = None if scale["lab_to_real"] is None else lab_ms * scale["lab_to_real"]
    return {"collectives": len(rows), "trace_comm_ms": round(trace_ms, 4), "lab_comm_ms": round(lab_ms, 4),
            "lab_ideal_ms": round(sum(r["ideal_ms"] for r in rows), 4),
            "lab_comm_real_ms": None if real_ms is None else round(real_ms, 6),
            "real_vs_trace": None if real_ms is None or trace_ms <= 0 else round(real_ms / trace_ms, 6),
            "gaps_ms": round(sum(r["gap_ms"] for r in rows), 4),
            "gaps_clipped": sum(1 for r in rows if r["gap_clipped"])}


def job_record(runs, spec, segments, fabric, role="measured"):
    """The record of a replayed trace from its segments' CollectiveRuns: per collective the
    trace's numbers beside the lab's, the job's communication time both ways, every scaling, and
    each segment's collective record."""
    from fabriclab.results.document import collective_job, hosts_record

    scale = spec.scaling(fabric)
    rows = op_rows(segments, runs, scale)
    parts = [collective_job(run, role) for run in runs]
    invalid = sorted({reason for part in parts for reason in part["invalid"]})
    return {
        "kind": "replay", "role": role, "hosts": hosts_record({h for part in parts for h in part["hosts"]}),
        "workload": workload_record(spec, fabric),
        "trace": spec.trace.summary(),
        "scaling": scale,
        "ranks": {str(rank): host for rank, host in enumerate(spec.placed_hosts(fabric))},
        "ops": rows,
        "totals": totals(rows, spec.trace, scale),
        "segments": parts,
        "valid": not invalid, "invalid": invalid,
    }
