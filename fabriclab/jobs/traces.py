"""A training job's collectives read from a trace: PyTorch profiler (Kineto) JSON or Chakra ET JSON.

    trace = traces.load("examples/traces/ddp4/kineto-rank0.json")
    trace.ops        # [Op(collective="allreduce", size=262144, group=(0, 1, 2, 3), start_s, duration_s)]

Both formats are one rank's view of the job (every rank runs the same collectives in the same
order); the trace names which rank it is. What is read:

- Kineto, NCCL's form (torch records it for NCCL jobs): `record_param_comms` events whose args
  give "Collective name", "dtype", "In msg nelems", "Out msg nelems", "Group size", "Process Group
  Name" and "Process Group Ranks" (a string, "[0, 1, 2, 3]"; torch shortens it past 30 ranks with
  "...", and then the group is looked up in `distributedInfo.pg_config` by name). Where the GPU's
  NCCL kernels (category "kernel") carry the same args, they are read instead: the CPU event of
  an asynchronous NCCL collective times only its launch, the kernel times the collective.
- Kineto, NCCL's older form (PyTorch before 2.1, whose record_param_comms carries no args): a
  `nccl:<op>` annotation per call with its input tensors' "Input Dims" and "Input type" (the
  profile must record shapes), timed by the NCCL kernels it launched (the launch and the kernel
  share a correlation id). It names no process group: every collective is the world's.
- Kineto, gloo's form (torch records no record_param_comms for gloo): `c10d::<op>` CPU ops on the
  caller's thread, sizes from their tensors' "Input Dims" and "Input type", timing from the call
  to the end of the `gloo:*` spans that carry it out. A CPU job's trace ties them by record
  function id (the gloo work of a call has ids after the call's and before the next call's); a
  GPU job's records 0 for every id, so there each call takes the first span not yet taken that
  starts after it and carries one of its tensors' bytes, and gloo's span on the GPU's stream
  with the same External id (the copy back) extends it. gloo names no process group per call:
  every collective is taken as the world group's (distributedInfo.world_size).
- A file may be gzip-compressed (found by its magic bytes), as profilers often write it.
- Chakra ET JSON (the jsonizer's form: protobuf's JSON of a GlobalMetadata message, then of each
  Node, back to back; a JSON list of them is read too): COMM_COLL_NODE nodes with `comm_type`
  (Chakra's CollectiveCommType number), `comm_size` (bytes), optionally `pg_name`, and
  `startTimeMicros`/`durationMicros`. `comm_size` is one rank's input (Chakra's converter sums
  the kernel's input tensors), so AllGather's size is it times the world. A Chakra trace names
  neither its world size nor its groups' ranks: the caller gives the world size, and a node's
  group is the world.

Sizes become nccl-tests semantics (the per-rank buffer of AllReduce, the total output of
AllGather, the total input of ReduceScatter, what each rank sends in AlltoAll). Collectives the
lab has no schedule for (broadcast, reduce, barrier, point-to-point, ...) are skipped and counted
by name; so are collectives over a group of one rank. Everything is bounded: the file's size,
the events read, the depth, finite non-negative times and sizes; an error is one line quoting a
short excerpt of what was wrong.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from dataclasses import dataclass, field

from fabriclab.errors import LabError
from fabriclab.loading import clip, excerpt, parse_json, read_text

FORMATS = ("kineto", "chakra")
MAX_TRACE_BYTES = 64 << 20          # a trimmed trace is KiBs; an untrimmed one of a long job, MiBs
MAX_EVENTS = 2_000_000
MAX_OPS = 4096                      # collectives replayed (traffic.collective.MAX_PROGRAM)
MAX_RANKS = 4096
MAX_BYTES = 1 << 40                 # one collective's message: a TiB is beyond any real one
MAX_SECONDS = 7 * 24 * 3600.0

DTYPE_BYTES = {"float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2,
               "bfloat16": 2, "int": 4, "int32": 4, "long": 8, "int64": 8, "short": 2, "int16": 2,
               "byte": 1, "uint8": 1, "char": 1, "int8": 1, "bool": 1, "unsigned char": 1,
               "signed char": 1, "c10::half": 2, "c10::bfloat16": 2, "float8_e4m3fn": 1,
               "float8_e5m2": 1}
# Collective names as torch calls them (record_param_comms, c10d ops; leading and trailing
# underscores dropped) -> the lab's.
KINETO_NAMES = {"allreduce": "allreduce", "all_reduce": "allreduce", "allreduce_coalesced": "allreduce",
                "allgather": "allgather", "all_gather": "allgather", "allgather_base": "allgather",
                "all_gather_base": "allgather", "allgather_into_tensor_coalesced": "allgather",
                "all_gather_into_tensor": "allgather",
                "reduce_scatter": "reducescatter", "reduce_scatter_base": "reducescatter",
                "reduce_scatter_tensor": "reducescatter", "reduce_scatter_tensor_coalesced": "reducescatter",
                "reducescatter": "reducescatter", "alltoall": "alltoall", "all_to_all": "alltoall",
                "alltoall_base": "alltoall", "all_to_all_single": "alltoall", "all_to_allv": "alltoallv",
                "alltoallv": "alltoallv", "gather": "gather", "scatter": "scatter"}
CHAKRA_TYPES = {0: "allreduce", 2: "allgather", 3: "gather", 4: "scatter", 6: "alltoall",
                7: "reducescatter", 8: "reducescatter"}
CHAKRA_NAMES = {0: "ALL_REDUCE", 1: "REDUCE", 2: "ALL_GATHER", 3: "GATHER", 4: "SCATTER", 5: "BROADCAST",
                6: "ALL_TO_ALL", 7: "REDUCE_SCATTER", 8: "REDUCE_SCATTER_BLOCK", 9: "BARRIER"}


@dataclass(frozen=True)
class Op:
    """One collective of the trace, as the rank that recorded it saw it."""

    index: int                      # its place among the trace's replayed collectives
    name: str                       # as the trace names it (record_param_comms' "allreduce", c10d::allreduce_)
    collective: str                 # the lab's name (traffic.schedules.COLLECTIVES)
    size: int                       # bytes, nccl-tests semantics
    group: tuple                    # the process group's global ranks
    group_name: str                 # the process group's name in the trace ("" where it has none)
    start_s: float                  # seconds from the trace's first replayed collective
    duration_s: float               # the collective's time on the recording rank


@dataclass
class Trace:
    path: str
    format: str                     # kineto | chakra
    form: str                       # kineto: nccl-kernels | record_param_comms | gloo; chakra: chakra-json
    rank: int | None                # the rank that recorded it (None: the trace does not say)
    world: int
    backend: str
    ops: list
    skipped: dict = field(default_factory=dict)     # name -> count, collectives not replayed

    def gaps(self):
        """Seconds each op started after the previous one ended on the recording rank (0 for the
        first, and for an op that overlapped its predecessor)."""
        out, end = [], None
        for op in self.ops:
            out.append(0.0 if end is None else max(0.0, op.start_s - end))
            end = op.start_s + op.duration_s if end is None else max(end, op.start_s + op.duration_s)
        return out

    def comm_time_s(self):
        """The job's communication time on the recording rank: the union of its collectives'
        spans (overlapping collectives count once)."""
        total, end = 0.0, None
        for op in sorted(self.ops, key=lambda o: o.start_s):
            stop = op.start_s + op.duration_s
            if end is None or op.start_s >= end:
                total += op.duration_s
                end = stop
            elif stop > end:
                total += stop - end
                end = stop
        return total

    def summary(self):
        return {"path": self.path, "format": self.format, "form": self.form, "rank": self.rank,
                "world": self.world, "backend": self.backend, "collectives": len(self.ops),
                "skipped": dict(sorted(self.skipped.items())),
                "comm_time_s": round(self.comm_time_s(), 9),
                "span_s": round(max((o.start_s + o.duration_s for o in self.ops), default=0.0), 9)}


def detect(text):
    """'kineto' or 'chakra' from the first non-blank character and the keys near the start."""
    head = text.lstrip()[:4096]
    if head.startswith("{") and ('"traceEvents"' in text[:1 << 20] or '"schemaVersion"' in head):
        return "kineto"
    if head.startswith(("{", "[")):
        return "chakra"
    raise LabError("trace: neither a Kineto nor a Chakra JSON trace (it does not start with { or [)")


def load(path, fmt=None, world=None):
    """The Trace in file `path`. `fmt`: kineto | chakra | None (detected). `world`: the job's rank
    count, needed for a Chakra trace (Kineto traces state theirs)."""
    where = f"trace {clip(path, 60)}"
    text = read_text(path, "trace", MAX_TRACE_BYTES, gzipped=True)
    fmt = fmt or detect(text)
    if fmt not in FORMATS:
        raise LabError(f"{where}: format must be one of {', '.join(FORMATS)}, got {excerpt(fmt)}")
    try:
        if fmt == "kineto":
            return parse_kineto(parse_json(text, where), str(path))
        return parse_chakra(chakra_messages(text, where), str(path), world)
    except LabError as exc:
        message = str(exc)
        raise LabError(message if message.startswith(where) else f"{where}: {message}") from None


# -- Kineto ---------------------------------------------------------------------------------------
def parse_kineto(data, path="trace"):
    if not isinstance(data, dict):
        raise LabError(f"a Kineto trace is a JSON object with traceEvents, got {excerpt(data)}")
    events = data.get("traceEvents")
    if not isinstance(events, list):
        raise LabError("a Kineto trace needs a traceEvents list")
    if len(events) > MAX_EVENTS:
        raise LabError(f"{len(events)} events, more than {MAX_EVENTS}")
    info = data.get("distributedInfo")
    if info is not None and not isinstance(info, dict):
        raise LabError(f"distributedInfo must be an object, got {excerpt(info)}")
    info = info or {}
    rank = _optional_whole(info.get("rank"), "distributedInfo.rank", MAX_RANKS - 1)
    world = _optional_whole(info.get("world_size"), "distributedInfo.world_size", MAX_RANKS, low=1)
    groups = _pg_config(info.get("pg_config"))
    backend = str(info.get("backend", "?"))[:40]
    events = [e for e in events if isinstance(e, dict)]
    # On a GPU the collective is the NCCL kernel, which carries the same args (record_param_comms
    # on the CPU only launches it, in microseconds); a CPU backend's record_param_comms is the call.
    kernels = [e for e in events if e.get("cat") == "kernel" and isinstance(e.get("args"), dict)
               and "Collective name" in e["args"]]
    comms = kernels or [e for e in events if e.get("name") == "record_param_comms"]
    # PyTorch before 2.1 records no args on record_param_comms: its nccl:<op> annotations name them
    annotations = [e for e in events if e.get("cat") == "user_annotation"
                   and str(e.get("name", "")).startswith("nccl:")]
    if comms and annotations and not any(isinstance(e.get("args"), dict) and "Collective name" in e["args"]
                                         for e in comms):
        if world is None:
            raise LabError("nccl:<op> annotations but no distributedInfo.world_size: "
                           "the job's rank count is unknown")
        ops, skipped, timed = _annotation_ops(events, annotations, world)
        form = "nccl-annotations" if timed else "nccl-annotations, launch times"
    elif comms:
        ops, skipped, world = _record_param_comms(comms, world, groups)
        form = "nccl-kernels" if kernels else "record_param_comms"
    else:
        if world is None:
            raise LabError("no record_param_comms events and no distributedInfo.world_size: "
                           "not a trace of a distributed job")
        ops, skipped = _gloo_ops(events, world)
        form = "gloo"
    if not ops:
        raise LabError("no collective the lab can replay" + _skipped_text(skipped))
    return Trace(path, "kineto", form, rank, world, backend, _from_zero(ops), skipped)


def _record_param_comms(comms, world, groups):
    raw, skipped = [], {}
    for k, event in enumerate(comms):
        where = f"record_param_comms event {k}"
        args = event.get("args")
        if not isinstance(args, dict):
            raise LabError(f"{where}: args must be an object, got {excerpt(args)}")
        name = args.get("Collective name")
        if not isinstance(name, str) or not name or len(name) > 80:
            raise LabError(f"{where}: \"Collective name\" must be a name, got {excerpt(name)}")
        collective = KINETO_NAMES.get(name.lower().strip("_"))
        if collective is None:
            skipped[name] = skipped.get(name, 0) + 1
            continue
        elem = _dtype_bytes(args.get("dtype"), where)
        n_in = _whole(args.get("In msg nelems"), f"{where}: \"In msg nelems\"", MAX_BYTES)
        n_out = _whole(args.get("Out msg nelems"), f"{where}: \"Out msg nelems\"", MAX_BYTES)
        group_name = str(args.get("Process Group Name", ""))[:80]
        group = _group(args.get("Process Group Ranks"), args.get("Group size"), group_name, groups, world, where)
        if len(group) < 2:
            skipped[f"{name} (group of 1)"] = skipped.get(f"{name} (group of 1)", 0) + 1
            continue
        size = _nccl_size(collective, n_in * elem, n_out * elem)
        start, duration = _span(event, where)
        raw.append((name, collective, size, group, group_name, start, duration))
        if len(raw) > MAX_OPS:
            raise LabError(f"more than {MAX_OPS} collectives to replay")
    if world is None:
        world = max((max(op[3]) + 1 for op in raw), default=0)
    for op in raw:
        if max(op[3]) >= world:
            raise LabError(f"{op[0]} names rank {max(op[3])}, outside the job's {world} ranks")
    return raw, skipped, world


def _gloo_ops(events, world):
    """c10d ops of the calling thread, each timed to the end of its gloo work."""
    calls = sorted((e for e in events if str(e.get("name", "")).startswith("c10d::")
                    and e.get("cat", "cpu_op") == "cpu_op"), key=lambda e: _start(e, "c10d op"))
    work = [e for e in events if str(e.get("name", "")).startswith("gloo:") and _has_span(e)]
    # gloo's spans on the GPU's stream (CUDA tensors: the copies back) share their CPU span's External id
    on_gpu = {}
    for e in work:
        if e.get("cat") == "gpu_user_annotation" and isinstance(e.get("args"), dict):
            key = e["args"].get("External id")
            on_gpu[key] = max(on_gpu.get(key, 0.0), e["ts"] + e["dur"])
    cpu_work = [e for e in work if e.get("cat") != "gpu_user_annotation"]
    ends = _work_by_id(calls, cpu_work) if _ids_usable(calls, cpu_work) else _work_in_order(calls, cpu_work)
    raw, skipped = [], {}
    everyone = tuple(range(world))
    for k, event in enumerate(calls):
        where = f"{clip(event['name'], 40)} (event {k})"
        op = event["name"][len("c10d::"):].strip("_")
        collective = KINETO_NAMES.get(op)
        if collective is None:
            skipped[event["name"]] = skipped.get(event["name"], 0) + 1
            continue
        args = event.get("args")
        if not isinstance(args, dict):
            raise LabError(f"{where}: args must be an object, got {excerpt(args)}")
        size = _c10d_size(collective, _tensor_bytes(args.get("Input Dims"), args.get("Input type"), where), world)
        spans = ends[k]
        if size <= 0:
            # PyTorch before 2.2 records no shapes of a TensorList argument: its gloo work carries them
            size = _work_size(collective, sum(_span_bytes(e, where) for e in spans[:1]), world)
        if size <= 0:
            raise LabError(f"{where}: no tensor bytes in its Input Dims, nor in gloo work matched to it")
        start, duration = _span(event, where)
        gpu_ends = [on_gpu[key] for key in (_external_id(e) for e in spans) if key in on_gpu]
        end = max([start * 1e6 + duration * 1e6] + [e["ts"] + e["dur"] for e in spans] + gpu_ends) / 1e6
        raw.append((event["name"], collective, size, everyone, "", start, end - start))
        if len(raw) > MAX_OPS:
            raise LabError(f"more than {MAX_OPS} collectives to replay")
    return raw, skipped


def _annotation_ops(events, annotations, world):
    """Ops from PyTorch's older NCCL form: a `nccl:<op>` annotation per call on the CPU, its input
    tensors' shapes in "Input Dims" (recorded with record_shapes=True), timed by the NCCL kernels
    it launched (the launch's correlation id names the kernel). No group is named: the world's.
    Returns (raw ops, skipped, whether every op was timed by its kernels)."""
    kernels = {_correlation(e): e for e in events if e.get("cat") == "kernel" and _has_span(e)}
    kernels.pop(None, None)
    launches = {}                               # tid -> ([ts], [correlation]) of launches of a known kernel
    for e in sorted((e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
                     and _correlation(e) in kernels and _has_span(e)), key=lambda e: e["ts"]):
        times, ids = launches.setdefault(str(e.get("tid"))[:40], ([], []))
        times.append(e["ts"])
        ids.append(_correlation(e))
    raw, skipped, timed = [], {}, True
    everyone = tuple(range(world))
    for k, event in enumerate(sorted(annotations, key=lambda e: _start(e, "nccl annotation"))):
        where = f"{clip(event['name'], 40)} (event {k})"
        collective = KINETO_NAMES.get(event["name"][len("nccl:"):].strip("_").lower())
        if collective is None or world < 2:
            name = event["name"] if world > 1 else f"{event['name']} (group of 1)"
            skipped[name] = skipped.get(name, 0) + 1
            continue
        args = event.get("args")
        if not isinstance(args, dict) or "Input Dims" not in args:
            raise LabError(f"{where}: no \"Input Dims\": the trace was recorded without shapes "
                           f"(profile with record_shapes=True)")
        size = _work_size(collective, sum(_tensor_bytes(args["Input Dims"], args.get("Input type"), where)), world)
        if size <= 0:                           # a rank with nothing to send in an AlltoAllv
            skipped[f"{event['name']} (empty)"] = skipped.get(f"{event['name']} (empty)", 0) + 1
            continue
        start, duration = _span(event, where)
        end = start + duration
        times, ids = launches.get(str(event.get("tid"))[:40], ([], []))
        spans = [kernels[corr] for corr in ids[bisect.bisect_left(times, event["ts"]):
                                               bisect.bisect_right(times, event["ts"] + event["dur"])]]
        if spans:
            start = min(e["ts"] for e in spans) / 1e6
            end = max(e["ts"] + e["dur"] for e in spans) / 1e6
        timed = timed and bool(spans)
        raw.append((event["name"], collective, size, everyone, "", start, end - start))
        if len(raw) > MAX_OPS:
            raise LabError(f"more than {MAX_OPS} collectives to replay")
    return raw, skipped, timed


def _correlation(event):
    """An event's CUDA correlation id (a launch's and its kernel's), or None."""
    args = event.get("args")
    corr = args.get("correlation") if isinstance(args, dict) else None
    return corr if isinstance(corr, int) and not isinstance(corr, bool) else None


def _c10d_size(collective, tensors, world):
    """nccl-tests' size from a c10d op's argument bytes."""
    if collective == "allgather":       # (output lists, input list): the output is every block
        return tensors[0] if tensors[0] else tensors[1] * world
    if collective == "reducescatter":   # (output, input): the input is the whole buffer
        return tensors[1] if len(tensors) > 1 and tensors[1] else tensors[0] * world
    # allreduce: the buffer; alltoall: (output, input)
    return tensors[1] if collective.startswith("alltoall") and len(tensors) > 1 else tensors[0]


def _work_size(collective, carried, world):
    """nccl-tests' size from the bytes of one gloo work span (its input: an AllGather's is one
    rank's block)."""
    return carried * world if collective == "allgather" else carried


def _span_bytes(span, where):
    args = span.get("args") if isinstance(span.get("args"), dict) else {}
    dims, types = args.get("Input Dims"), args.get("Input type")
    return sum(_tensor_bytes(dims, types, where)) if dims is not None else 0


def _ids_usable(calls, work):
    """Whether record function ids tie gloo's work to its calls: every one a distinct id above 0
    (a CPU job's trace). A GPU job's trace records 0 for all, or none."""
    ids = [_record_id(e) for e in calls + work]
    return all(i for i in ids) and len(set(ids)) == len(ids)


def _record_id(event):
    args = event.get("args")
    rf = args.get("Record function id") if isinstance(args, dict) else None
    return rf if isinstance(rf, int) and not isinstance(rf, bool) and rf > 0 else None


def _external_id(event):
    args = event.get("args")
    return args.get("External id") if isinstance(args, dict) else None


def _work_by_id(calls, work):
    """[gloo spans] per call: the work of a call has record function ids after the call's and
    before the next call's."""
    ids = [_record_id(e) for e in calls]
    return [[e for e in work if ids[k] < _record_id(e) < (ids[k + 1] if k + 1 < len(ids) else math.inf)]
            for k in range(len(calls))]


def _work_in_order(calls, work):
    """[gloo spans] per call, where no id ties them: gloo runs a process group's work in the order
    it was called, so each call takes the first span not yet taken that starts after it and
    carries as many bytes as one of its tensors (or, a span without tensors or a call whose
    tensors have no recorded shape, has its name)."""
    queue = sorted(work, key=lambda e: e["ts"])
    taken = [False] * len(queue)
    first = 0                                   # every span before it is taken
    out = []
    for k, call in enumerate(calls):
        args = call.get("args") if isinstance(call.get("args"), dict) else {}
        sizes = set(_tensor_bytes(args.get("Input Dims"), args.get("Input type"), f"c10d op {k}")) - {0}
        found = []
        for i in range(first, len(queue)):
            span = queue[i]
            if taken[i] or span["ts"] < call["ts"]:
                continue
            carried = _span_bytes(span, f"gloo span {i}")
            if carried in sizes if carried and sizes else _op_key(span["name"]) == _op_key(call["name"]):
                taken[i] = True
                found = [span]
                break
        while first < len(queue) and taken[first]:
            first += 1
        out.append(found)
    return out


def _op_key(name):
    """c10d::allreduce_ and gloo:all_reduce alike: `allreduce` (c10d::_reduce_scatter_base_ and
    gloo:reduce_scatter: `reducescatter`)."""
    key = name.split(":")[-1].replace("_", "").lower()
    return key[:-len("base")] if key.endswith("base") else key


def _start(event, where):
    ts = event.get("ts")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        raise LabError(f"{where}: ts must be a finite number of microseconds, got {excerpt(ts)}")
    return ts


def _has_span(event):
    return all(isinstance(event.get(k), (int, float)) and not isinstance(event.get(k), bool)
               and math.isfinite(event[k]) for k in ("ts", "dur")) and event["dur"] >= 0


def _tensor_bytes(dims, types, where):
    """Bytes of each argument of a c10d op: a tensor, a list of tensors, a list of lists (0 for
    scalars and objects)."""
    if not isinstance(dims, list) or not isinstance(types, list) or len(dims) != len(types) or len(dims) > 64:
        raise LabError(f"{where}: \"Input Dims\" and \"Input type\" must be lists of one length, "
                       f"got {excerpt(dims)} and {excerpt(types)}")
    out = []
    for shape, kind in zip(dims, types):
        elem = DTYPE_BYTES.get(_element_type(kind))
        out.append(0 if elem is None else _elements(shape, where) * elem)
    return out


def _element_type(kind):
    """'float' from 'float', 'TensorList' (element type unknown: float32 assumed) or a list."""
    if not isinstance(kind, str):
        return None
    kind = kind.lower()
    if kind == "tensorlist":
        return "float"
    return kind if kind in DTYPE_BYTES else None


def _elements(shape, where, depth=0):
    if depth > 4:
        raise LabError(f"{where}: tensor shapes nested too deeply")
    if isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        count = 1
        for d in shape:
            if d < 0:
                raise LabError(f"{where}: a negative dimension {d}")
            count *= d
            if count > MAX_BYTES:
                raise LabError(f"{where}: a tensor of more than {MAX_BYTES} elements")
        return count if shape else 0      # [] is a scalar argument here, not one element
    if isinstance(shape, list):
        return sum(_elements(s, where, depth + 1) for s in shape)
    raise LabError(f"{where}: a tensor shape must be a list of whole numbers, got {excerpt(shape)}")


def _group(ranks, size, name, groups, world, where):
    """The process group's global ranks, from "Process Group Ranks", else pg_config by name."""
    listed = None
    if isinstance(ranks, str) and len(ranks) <= 100_000:
        text = ranks.strip()
        if "..." not in text:
            if not re.fullmatch(r"\[\s*(\d+\s*(,\s*\d+\s*)*)?\]", text):
                raise LabError(f"{where}: \"Process Group Ranks\" must read like [0, 1, 2], got {excerpt(ranks)}")
            listed = tuple(int(x) for x in re.findall(r"\d+", text))
    elif isinstance(ranks, list):
        listed = tuple(_whole(r, f"{where}: a process group rank", MAX_RANKS - 1) for r in ranks)
    elif ranks is not None and not isinstance(ranks, str):
        raise LabError(f"{where}: \"Process Group Ranks\" must be a list, got {excerpt(ranks)}")
    if not listed and name in groups:
        listed = groups[name]
    if not listed and world is not None and size == world:
        listed = tuple(range(world))           # the world group, shortened
    if not listed:
        raise LabError(f"{where}: the process group's ranks are not in the trace "
                       f"(\"Process Group Ranks\" {excerpt(ranks)}, group {excerpt(name)})")
    if len(set(listed)) != len(listed) or any(r >= MAX_RANKS for r in listed):
        raise LabError(f"{where}: process group ranks must be distinct and below {MAX_RANKS}, "
                       f"got {excerpt(ranks)}")
    if size is not None and _whole(size, f"{where}: \"Group size\"", MAX_RANKS, low=1) != len(listed):
        raise LabError(f"{where}: \"Group size\" {size} but {len(listed)} ranks listed")
    return listed


def _pg_config(config):
    """{pg name: ranks} from distributedInfo.pg_config (list, or mapping by name)."""
    if config is None:
        return {}
    items = list(config.values()) if isinstance(config, dict) else config
    if not isinstance(items, list) or len(items) > MAX_RANKS:
        raise LabError(f"distributedInfo.pg_config must be a list, got {excerpt(config)}")
    out = {}
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("ranks"), list):
            continue
        ranks = tuple(_whole(r, "distributedInfo.pg_config ranks", MAX_RANKS - 1) for r in item["ranks"][:MAX_RANKS])
        out[str(item.get("pg_name", ""))[:80]] = ranks
    return out


def _dtype_bytes(dtype, where):
    if dtype is None:
        return 1                             # sizes counted in bytes
    elem = DTYPE_BYTES.get(str(dtype).lower()[:40])
    if elem is None:
        raise LabError(f"{where}: unknown dtype {excerpt(dtype)}")
    return elem


def _nccl_size(collective, in_bytes, out_bytes):
    """nccl-tests' size from a record's input and output bytes per rank."""
    if collective == "allgather":
        return out_bytes                     # the whole gathered output
    if collective == "reducescatter":
        return in_bytes                      # the whole input
    return max(in_bytes, out_bytes) if collective == "gather" else in_bytes


def _span(event, where):
    """(start s, duration s) of a complete ('X') event; Kineto times are microseconds."""
    ts, dur = event.get("ts"), event.get("dur")
    for name, value in (("ts", ts), ("dur", dur)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise LabError(f"{where}: {name} must be a finite number of microseconds, got {excerpt(value)}")
    if dur < 0 or dur / 1e6 > MAX_SECONDS:
        raise LabError(f"{where}: dur must be 0 to {MAX_SECONDS:g} s, got {excerpt(dur)} us")
    return ts / 1e6, dur / 1e6


# -- Chakra ---------------------------------------------------------------------------------------
def chakra_messages(text, where):
    """The JSON values of a Chakra JSON file: back-to-back objects (the jsonizer's output) or
    one list of them. Bounded in count and depth, duplicate keys and non-finite numbers refused."""
    stripped = text.strip()
    if stripped.startswith("["):
        data = parse_json(stripped, where)
        if not isinstance(data, list):
            raise LabError(f"{where}: a Chakra JSON list of nodes expected")
        return data
    decoder = json.JSONDecoder()
    out, pos = [], 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        if pos >= len(text):
            return out
        if len(out) >= MAX_EVENTS:
            raise LabError(f"{where}: more than {MAX_EVENTS} messages")
        try:
            _value, end = decoder.raw_decode(text, pos)
        except ValueError as exc:
            raise LabError(f"{where}: not valid JSON at character {pos} ({clip(exc, 60)})") from None
        except RecursionError:
            raise LabError(f"{where}: nested too deeply") from None
        # Re-read the one message strictly (duplicate keys, NaN, depth).
        out.append(parse_json(text[pos:end], f"{where}, message {len(out)}"))
        pos = end


def parse_chakra(messages, path="trace", world=None):
    if world is None:
        raise LabError("a Chakra trace does not name its ranks: give the job's rank count (--ranks N)")
    world = _whole(world, "ranks", MAX_RANKS, low=2)
    everyone = tuple(range(world))
    raw, skipped = [], {}
    for k, node in enumerate(messages):
        if not isinstance(node, dict):
            raise LabError(f"message {k}: a Chakra node is an object, got {excerpt(node)}")
        if "type" not in node:
            continue                         # the GlobalMetadata message
        kind = node.get("type")
        if kind not in ("COMM_COLL_NODE", 7):
            if kind in ("COMM_SEND_NODE", "COMM_RECV_NODE", 5, 6):
                skipped[str(kind)] = skipped.get(str(kind), 0) + 1
            continue
        where = f"node {excerpt(node.get('id'), 24)}"
        attrs = _chakra_attrs(node.get("attr"), where)
        comm = _whole(_int_value(attrs.get("comm_type"), f"{where}: comm_type"), f"{where}: comm_type", 64)
        collective = CHAKRA_TYPES.get(comm)
        if collective is None:
            label = CHAKRA_NAMES.get(comm, f"comm_type {comm}")
            skipped[label] = skipped.get(label, 0) + 1
            continue
        size = _whole(_int_value(attrs.get("comm_size"), f"{where}: comm_size"), f"{where}: comm_size", MAX_BYTES)
        start = _whole(_int_value(node.get("startTimeMicros", 0), f"{where}: startTimeMicros"),
                       f"{where}: startTimeMicros", MAX_SECONDS * 1e6 * 1e3)
        duration = _whole(_int_value(node.get("durationMicros", 0), f"{where}: durationMicros"),
                          f"{where}: durationMicros", MAX_SECONDS * 1e6)
        name = str(node.get("name", CHAKRA_NAMES[comm]))[:80]
        group_name = attrs.get("pg_name")
        # comm_size is one rank's input (Chakra's converter sums the kernel's input tensors):
        # AllGather's nccl-tests size is every rank's block.
        size = size * world if collective == "allgather" else size
        raw.append((name, collective, size, everyone, "" if group_name is None else str(group_name)[:80],
                    start / 1e6, duration / 1e6))
        if len(raw) > MAX_OPS:
            raise LabError(f"more than {MAX_OPS} collectives to replay")
    if not raw:
        raise LabError("no COMM_COLL_NODE the lab can replay" + _skipped_text(skipped))
    return Trace(path, "chakra", "chakra-json", None, world, "?", _from_zero(raw), skipped)


def _chakra_attrs(attrs, where):
    if not isinstance(attrs, list) or len(attrs) > 256:
        raise LabError(f"{where}: attr must be a list of attributes, got {excerpt(attrs)}")
    out = {}
    for attr in attrs:
        if not isinstance(attr, dict) or not isinstance(attr.get("name"), str):
            raise LabError(f"{where}: an attribute must have a name, got {excerpt(attr)}")
        values = [v for k, v in attr.items() if k.endswith("Val") or k.endswith("_val")]
        out[attr["name"]] = values[0] if values else None
    return out


def _int_value(value, where):
    """protobuf's JSON writes 64-bit integers as strings."""
    if isinstance(value, str) and re.fullmatch(r"-?\d{1,20}", value):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if value is None:
        raise LabError(f"{where} is missing")
    return value


# -- shared ---------------------------------------------------------------------------------------
def _whole(value, where, high, low=0):
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise LabError(f"{where} must be a whole number {low}..{high:g}, got {excerpt(value)}")
    return value


def _optional_whole(value, where, high, low=0):
    return None if value is None else _whole(value, where, high, low)


def _from_zero(raw):
    """Ops in start order, times from the first one's start."""
    raw = sorted(raw, key=lambda op: op[5])
    t0 = raw[0][5] if raw else 0.0
    return [Op(i, name, collective, size, group, group_name, round(start - t0, 9), round(duration, 9))
            for i, (name, collective, size, group, group_name, start, duration) in enumerate(raw)]


def _skipped_text(skipped):
    if not skipped:
        return ""
    return " (skipped: " + ", ".join(f"{n} x{c}" for n, c in sorted(skipped.items())[:6]) + ")"

