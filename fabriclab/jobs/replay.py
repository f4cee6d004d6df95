"""Job kind `replay`: a trace's collectives as a job of a plan, ranks mapped to hosts, sizes and
gaps scaled.

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
from fabriclab.jobs import collective
from fabriclab.jobs.common import hosts_record, host_list, refuse_unknown, size_cell, yes_no
from fabriclab.loading import boolean, excerpt, is_file, number, whole
from fabriclab.table import fixed, format_table, markdown_table
from fabriclab.traffic import schedules
from fabriclab.units import human_size, parse_size

NAME = "replay"
SUMMARY = "a PyTorch or Chakra trace's collectives, in order, with their compute gaps scaled"
MAX_GAP_S = 60.0
# a scenario's replay job names its trace file and how to read it, then ReplaySpec's fields
TRACE_FIELDS = ("trace", "format", "ranks")


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
        from fabriclab.jobs.traces import Trace

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


def record(runs, spec, segments, fabric, role="measured"):
    """The record of a replayed trace from its segments' CollectiveRuns: per collective the
    trace's numbers beside the lab's, the job's communication time both ways, every scaling, and
    each segment's collective record."""
    scale = spec.scaling(fabric)
    rows = op_rows(segments, runs, scale)
    parts = [collective.record(run, role) for run in runs]
    invalid = sorted({reason for part in parts for reason in part["invalid"]})
    return {
        "kind": NAME, "role": role, "hosts": hosts_record({h for part in parts for h in part["hosts"]}),
        "workload": workload_record(spec, fabric),
        "trace": spec.trace.summary(),
        "scaling": scale,
        "ranks": {str(rank): host for rank, host in enumerate(spec.placed_hosts(fabric))},
        "ops": rows,
        "totals": totals(rows, spec.trace, scale),
        "segments": parts,
        "valid": not invalid, "invalid": invalid,
    }


# -- the kind: spec, scenario entry, runner ---------------------------------------------------------
def spec_class():
    return ReplaySpec


def check(spec):
    spec.check()


def parse(entry, base):
    """A replay job: {trace: path, format, ranks} and ReplaySpec's fields but the trace."""
    from fabriclab.jobs import traces

    entry = dict(entry)
    refuse_unknown(entry, ({f.name for f in dataclasses.fields(ReplaySpec)} - {"trace"}) | set(TRACE_FIELDS), NAME)
    path = entry.pop("trace", None)
    if not isinstance(path, str) or not path:
        raise LabError(f"trace must be the path of a trace file, got {excerpt(path)}")
    candidate = base / path
    trace = traces.load(candidate if is_file(candidate) else path, entry.pop("format", None), entry.pop("ranks", None))
    if isinstance(entry.get("chunk_bytes"), str):
        entry["chunk_bytes"] = parse_size(entry["chunk_bytes"])
    if "hosts" in entry:
        entry["hosts"] = host_list(entry["hosts"], "hosts")
    spec = ReplaySpec(trace, **entry)
    spec.check()
    return spec


class Runner:
    """A trace replayed: its segments one after another, each a collective program on its own
    agents (a Launcher). The job's traffic begins with the first segment's; it runs to the end of
    the trace (a replay is not repeated or cut short by duration_s, but a failed run stops it
    after the current segment)."""

    def __init__(self, job, lab, run_plan):
        from fabriclab.traffic.collective import Launcher

        self.job, self.lab = job, lab
        spec = job.workload
        self.segments = plan_segments(spec, lab.fabric)
        self.specs = [collective_spec(spec, segment) for segment in self.segments]
        # Every segment's ranks, hosts and schedules are checked here, before anything is built.
        self.launchers = [Launcher(lab, cspec, name=f"job-{job.name}-{k}") for k, cspec in enumerate(self.specs)]
        self.hosts = {r.host for launcher in self.launchers for r in launcher.ranks}
        self.current = None

    def run(self, stop, on_start, progress=None):
        from fabriclab.traffic.collective import queue_report

        runs = []
        total = sum(len(s.steps) for s in self.segments)
        done = 0
        for k, launcher in enumerate(self.launchers):
            if k and stop is not None and stop.is_set():
                raise LabError(f"stopped after {k} of {len(self.launchers)} segments")
            self.current = launcher
            launcher.on_ready = on_start if k == 0 else None
            if progress:
                base, share = done / total, len(self.segments[k].steps) / total
                launcher.progress = lambda fraction, label, b=base, s=share: progress(b + fraction * s, label)
            before = queue_report(self.lab)
            runs.append(queue_report(self.lab, launcher.run(), before))
            done += len(self.segments[k].steps)
        self.current = None
        return runs

    def cancel(self):
        for launcher in self.launchers:
            launcher.cleanup()

    def record(self, raw):
        return record(raw, self.job.workload, self.segments, self.lab.fabric, self.job.role)


# -- how the tables show a record ------------------------------------------------------------------
def report_lines(jobs):
    rows = []
    for name, job in jobs:
        for op in job.get("ops") or []:
            rows.append((name, op.get("index"), op.get("collective"), ",".join(map(str, op.get("group") or [])),
                         size_cell(op.get("trace_size")), size_cell(op.get("size")), fixed(op.get("trace_ms"), 3),
                         fixed(op.get("gap_ms"), 0), fixed(op.get("cct_ms"), 1), fixed(op.get("cct_real_ms"), 4),
                         fixed(op.get("busbw_mbps")), yes_no(op.get("valid", True))))
        t = job.get("totals") or {}
        rows.append((name, "all", f"{t.get('collectives')} collectives", "", "", "",
                     fixed(t.get("trace_comm_ms"), 3), fixed(t.get("gaps_ms"), 0), fixed(t.get("lab_comm_ms"), 1),
                     fixed(t.get("lab_comm_real_ms"), 4), "", yes_no(job.get("valid", True))))
    return markdown_table(("replayed job", "#", "collective", "group", "trace size", "lab size", "trace ms",
                           "gap ms", "CCT ms", "real ms", "busbw Mbit/s", "valid"), rows) if rows else []


def compare_rows(job):
    """A row per collective in trace order, each named (`allreduce 256K`): a trace mixes them."""
    return [{**collective.size_measures(size, job.get("valid")), "collective": size.get("collective")}
            for part in job.get("segments") or [] for size in part.get("sizes") or []] or [{}]


def runs_rows(job):
    t = job["totals"]
    counters = [size["counters"] for part in job["segments"] for size in part["sizes"]]
    return [(f"replay {t['collectives']} collectives", f"({t['lab_comm_ms']:.0f} ms)", "-", "-",
             sum(c.get("out_of_sequence", 0) for c in counters),
             sum(c.get("retransmitted_packets", 0) for c in counters),
             sum(c.get("local_ack_timeout_err", 0) for c in counters))]


def table(doc, run, name, job, scale_line):
    """`fabriclab replay`'s table of one replayed job: a row per collective (the trace's size and
    time beside the lab's CCT and that CCT in real time), then its communication time both ways.
    `scale_line` is the document's link rates and time scale as text."""
    rows = []
    for op in job["ops"]:
        verify = "-" if op["verify"] is None else ("ok" if op["verify"] else "FAILED")
        rows.append((op["index"], op["collective"], _group(op["group"]), human_size(op["trace_size"]),
                     human_size(op["size"]), f"{op['trace_ms']:.3f}", f"{op['gap_ms']:.0f}" + "*" * op["gap_clipped"],
                     f"{op['cct_ms']:.1f}", _num(op["cct_real_ms"]), _num(op["real_vs_trace"]),
                     f"{op['busbw_mbps']:.2f}", f"{100 * op['busbw_fraction_of_nic']:.0f}", _num(op["trace_busbw_mbps"]),
                     verify))
    trace, scale, t = job["trace"], job["scaling"], job["totals"]
    title = (f"{name}: {trace['format']} trace {trace['path']} ({trace['form']}, {trace['world']} ranks) on "
             f"{doc['fabric']['name']} ({run['routing']}), hosts {' '.join(job['ranks'].values())}; sizes / "
             f"{scale['size_scale']:g}, gaps x{scale['gap_scale']:g} capped at {scale['max_gap_s']:g} s; "
             f"{scale_line}")
    text = format_table(("#", "collective", "group", "trace size", "lab size", "trace ms", "gap ms",
                         "CCT ms", "real ms", "real/trace", "busbw Mbit/s", "busbw % NIC", "trace busbw", "verify"),
                        rows, title=title)
    skipped = ", ".join(f"{k} x{v}" for k, v in trace["skipped"].items()) or "none"
    summary = (f"communication: trace {t['trace_comm_ms']:.3f} ms; lab {t['lab_comm_ms']:.1f} ms "
               f"(ideal {t['lab_ideal_ms']:.1f} ms)"
               + (f" = {t['lab_comm_real_ms']:.3f} ms real, {t['real_vs_trace']:.3g}x the trace's"
                  if t["lab_comm_real_ms"] is not None and t["real_vs_trace"] is not None else "")
               + f"; gaps {t['gaps_ms']:.0f} ms ({t['gaps_clipped']} capped: *); not replayed: {skipped}")
    return text + "\n" + summary


def _group(ranks):
    """[0, 1, 2, 3] as 0-3, others as 0,2,5."""
    if ranks == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def _num(value):
    return "-" if value is None else f"{value:.3g}"
