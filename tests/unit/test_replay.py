"""Replaying traces without a network: both trace formats (the shipped traces recorded with
PyTorch, and NCCL's record_param_comms form), hostile traces refused in one line, ranks and
process groups mapped to hosts, sizes and gaps scaled, the collective program the engine runs,
the results record and its schema, and the verb's plan."""

import argparse
import json
import pathlib
import types

import jsonschema
import pytest

from fabriclab.cli import replay as replay_cli
from fabriclab.errors import LabError
from fabriclab.results import tables
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec
from fabriclab.traffic import schedules
from fabriclab.traffic.collective import CollectiveSpec, Launcher
from fabriclab import jobs
from fabriclab.jobs import replay, traces
from fabriclab.workflows.plan import Job

ROOT = pathlib.Path(__file__).resolve().parents[2]
DDP4 = ROOT / "examples" / "traces" / "ddp4"
KINETO = DDP4 / "kineto-rank0.json"
CHAKRA = DDP4 / "chakra-rank0.json"
SCHEMA = json.loads((ROOT / "fabriclab" / "results" / "schema.json").read_text())


def nccl_trace(tmp_path, events=None, info=None, name="nccl.json"):
    """A Kineto trace in NCCL's form: record_param_comms events as torch writes them."""
    if events is None:
        events = [comm("allreduce", 262144, 262144, "[0, 1, 2, 3]", 4, "0", 0, 500),
                  comm("allreduce", 4096, 4096, "[0, 1]", 2, "1", 2000, 100),
                  comm("allgather", 1024, 4096, "[0, 1, 2, 3]", 4, "0", 2200, 300),
                  comm("broadcast", 16, 16, "[0, 1, 2, 3]", 4, "0", 2600, 10),
                  comm("reduce_scatter", 8192, 2048, "[0, 1, 2, 3]", 4, "0", 3000, 200)]
    data = {"schemaVersion": 1, "traceEvents": events,
            "distributedInfo": info if info is not None else
            {"backend": "nccl", "rank": 0, "world_size": 4,
             "pg_config": [{"pg_name": "0", "ranks": [0, 1, 2, 3]}, {"pg_name": "1", "ranks": [0, 1]}]}}
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def comm(name, n_in, n_out, ranks, size, pg, ts, dur, dtype="Float"):
    return {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": ts, "dur": dur,
            "args": {"Collective name": name, "dtype": dtype, "In msg nelems": n_in, "Out msg nelems": n_out,
                     "Group size": size, "Process Group Name": pg, "Process Group Ranks": ranks}}


# -- the shipped traces ------------------------------------------------------------------------------
def test_the_shipped_kineto_trace_reads_as_pytorch_wrote_it():
    trace = traces.load(KINETO)
    assert (trace.format, trace.form, trace.rank, trace.world, trace.backend) == ("kineto", "gloo", 0, 4, "gloo")
    # the recorder's step, twice: three gradient buckets, an AllGather, a ReduceScatter, an AlltoAll
    step = [("allreduce", 65536 * 4), ("allreduce", 16384 * 4), ("allreduce", 131072 * 4),
            ("allgather", 4096 * 4 * 4), ("reducescatter", 8192 * 4 * 4), ("alltoall", 4096 * 4 * 4)]
    assert [(o.collective, o.size) for o in trace.ops] == step * 2
    assert all(o.group == (0, 1, 2, 3) for o in trace.ops)
    assert trace.skipped == {"c10d::barrier": 2}
    assert trace.ops[0].start_s == 0 and all(o.duration_s > 0 for o in trace.ops)
    starts = [o.start_s for o in trace.ops]
    assert starts == sorted(starts)
    assert 0 < trace.comm_time_s() < max(o.start_s + o.duration_s for o in trace.ops)


def test_the_chakra_trace_agrees_with_the_kineto_trace_it_was_linked_from():
    kineto, chakra = traces.load(KINETO), traces.load(CHAKRA, world=4)
    assert chakra.format == "chakra" and chakra.skipped == {"BARRIER": 2}
    assert [(o.collective, o.size, o.group) for o in chakra.ops] == \
        [(o.collective, o.size, o.group) for o in kineto.ops]
    for a, b in zip(kineto.ops, chakra.ops):      # Chakra keeps whole microseconds
        assert abs(a.start_s - b.start_s) < 2e-6 and abs(a.duration_s - b.duration_s) < 2e-6


def test_every_rank_of_the_shipped_job_saw_the_same_collectives():
    ops = [[(o.collective, o.size) for o in traces.load(DDP4 / f"kineto-rank{r}.json").ops] for r in range(4)]
    assert all(o == ops[0] for o in ops)
    assert [traces.load(DDP4 / f"kineto-rank{r}.json").rank for r in range(4)] == [0, 1, 2, 3]


# -- the recorder's job as other PyTorch versions wrote it --------------------------------------------
RECORDER_STEP = [("allreduce", 65536 * 4), ("allreduce", 16384 * 4), ("allreduce", 131072 * 4),
                 ("allgather", 4096 * 4 * 2), ("reducescatter", 8192 * 4 * 2), ("alltoall", 4096 * 4 * 2)]


@pytest.mark.parametrize("version, left_out", [
    # 2.1 records no shapes of a TensorList argument (its sizes are on gloo's work spans), no record
    # function ids, and its gloo has no ReduceScatter; 2.5 and 2.14 record both
    ("2.1", {"reducescatter"}), ("2.5", set()),
])
def test_each_pytorch_versions_trace_of_the_recorder_reads_as_its_job(version, left_out):
    folder = ROOT / "examples" / "traces" / f"torch{version}-ddp2"
    step = [op for op in RECORDER_STEP if op[0] not in left_out]
    for rank in (0, 1):
        trace = traces.load(folder / f"kineto-rank{rank}.json")
        assert (trace.form, trace.world, trace.rank, trace.backend) == ("gloo", 2, rank, "gloo")
        assert [(o.collective, o.size) for o in trace.ops] == step * 2 and trace.skipped == {"c10d::barrier": 2}
        assert all(o.duration_s > 0 for o in trace.ops)
        if (folder / f"chakra-rank{rank}.json").exists():
            chakra = traces.load(folder / f"chakra-rank{rank}.json", world=2)
            assert [(o.collective, o.size) for o in chakra.ops] == step * 2


def test_a_call_without_shapes_takes_its_size_from_the_gloo_work_of_its_name(tmp_path):
    """PyTorch 2.1's form: TensorList arguments with empty dims and no record function ids."""
    def call(op, ts):
        return {"ph": "X", "cat": "cpu_op", "name": f"c10d::{op}", "ts": ts, "dur": 50, "tid": 1,
                "args": {"Input Dims": [[], []], "Input type": ["TensorList", "Scalar"]}}

    def work(op, n, ts):
        return {"ph": "X", "cat": "user_annotation", "name": f"gloo:{op}", "ts": ts, "dur": 300, "tid": 2,
                "args": {"Input Dims": [[n]], "Input type": ["float"]}}

    events = [call("allreduce_", 0), call("allgather_", 100), call("allreduce_", 200),
              work("all_gather", 256, 150), work("all_reduce", 1024, 10), work("all_reduce", 64, 400)]
    path = tmp_path / "t21.json"
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0, "world_size": 2}}))
    trace = traces.load(path)
    assert [(o.collective, o.size) for o in trace.ops] == [("allreduce", 4096), ("allgather", 2048), ("allreduce", 256)]
    assert trace.ops[1].duration_s == pytest.approx(350e-6)          # to the end of its gloo work
    events.pop()                                                        # the last call's work is missing
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0, "world_size": 2}}))
    with pytest.raises(LabError, match=r"c10d::allreduce_ \(event 2\): no tensor bytes .* nor in gloo work"):
        traces.load(path)


# -- a GPU job's trace: PyTorch 2.11, DDP over gloo carrying CUDA tensors (not the lab's recording) ----
GPU = ROOT / "examples" / "traces" / "gpu-ddp2"


def test_a_gpu_jobs_gzipped_trace_reads_as_its_steps_ran():
    """Two profiled steps of a transformer under DDP: 8 gradient buckets (the first and last
    bigger), then a 4 MiB-per-rank AllGather. Record function ids are all 0, the buckets are
    called from the autograd thread and queue behind each other, and gloo's work is on two
    threads plus the GPU's stream: each call is matched to its work by order and size."""
    ranks = [traces.load(GPU / f"kineto-rank{r}.json.gz") for r in (0, 1)]
    for rank, trace in enumerate(ranks):
        assert (trace.form, trace.world, trace.rank, trace.backend, trace.skipped) == ("gloo", 2, rank, "gloo", {})
        step = [("allreduce", 12599296 * 4), ("allreduce", 7086336 * 4)] + [("allreduce", 7087872 * 4)] * 5 \
            + [("allreduce", 12781056 * 4), ("allgather", 2 * 1048576 * 4)]
        assert [(o.collective, o.size) for o in trace.ops] == step * 2
        # a bucket's work ends long after its call returns (tens of ms, not the call's 0.1 ms)
        assert all(o.duration_s > 0.02 for o in trace.ops if o.collective == "allreduce")
        gaps = trace.gaps()
        assert gaps[8] > 0 and gaps[9] > 0.005          # the AllGather, then the next step's first bucket
        assert gaps[1:8] == [0.0] * 7                    # queued buckets overlap: no compute between
    assert [o.start_s for o in ranks[0].ops] == sorted(o.start_s for o in ranks[0].ops)


def gloo_trace(tmp_path, calls, spans, name="gpu.json"):
    """A gloo trace as a GPU job writes it: c10d calls and gloo spans, record function ids all 0."""
    events = [{"ph": "X", "cat": "cpu_op", "name": f"c10d::{op}", "ts": ts, "dur": 100, "tid": 1,
               "args": {"Record function id": 0, "Input type": ["TensorList"], "Input Dims": [[[n]]]}}
              for op, n, ts in calls]
    events += [{"ph": "X", "cat": cat, "name": f"gloo:{op}", "ts": ts, "dur": dur, "tid": 2,
                "args": {"External id": ext, **({"Record function id": 0, "Input type": ["float"],
                                                 "Input Dims": [[n]]} if n else {})}}
               for op, n, ts, dur, cat, ext in spans]
    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0, "world_size": 2}}))
    return path


def test_without_record_ids_each_call_takes_the_next_work_of_its_size(tmp_path):
    calls = [("allreduce_", 1000, 0), ("allreduce_", 500, 10), ("barrier", 0, 20), ("allreduce_", 1000, 30)]
    spans = [("all_reduce", 1000, 5, 100, "user_annotation", 7),      # the first call's
             ("all_reduce", 500, 105, 50, "user_annotation", 8),      # queued behind it
             ("barrier", 0, 160, 5, "user_annotation", 9),            # no tensors: matched by name
             ("all_reduce", 1000, 170, 40, "user_annotation", 10),
             ("all_reduce", 500, 140, 30, "gpu_user_annotation", 8)]  # the copy back of span 8, on the GPU
    trace = traces.load(gloo_trace(tmp_path, calls, spans))
    assert trace.skipped == {"c10d::barrier": 1}
    assert [(o.size, round(o.start_s * 1e6), round(o.duration_s * 1e6)) for o in trace.ops] == [
        (4000, 0, 105), (2000, 10, 160), (4000, 30, 180)]


def test_a_gzip_trace_is_bounded_when_unpacked_and_a_broken_one_is_named(tmp_path, monkeypatch):
    import gzip

    text = KINETO.read_text()
    packed = tmp_path / "t.json.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    assert [o.size for o in traces.load(packed).ops] == [o.size for o in traces.load(KINETO).ops]
    two = tmp_path / "two.json.gz"                       # two gzip members read as one text
    two.write_bytes(gzip.compress(text[:100].encode()) + gzip.compress(text[100:].encode()))
    assert len(traces.load(two).ops) == 12
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(packed.read_bytes()[:200])
    with pytest.raises(LabError, match=r"cut.json.gz is a truncated gzip file"):
        traces.load(cut)
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"\x1f\x8b" + b"\x00" * 64)
    with pytest.raises(LabError, match=r"bad.json.gz is not a valid gzip file"):
        traces.load(bad)
    bomb = tmp_path / "bomb.json.gz"                     # 64 KiB packed, 64 MiB + 1 unpacked
    bomb.write_bytes(gzip.compress(b" " * ((64 << 20) + 1)))
    with pytest.raises(LabError, match=r"bomb.json.gz unpacks to more than 64 MiB"):
        traces.load(bomb)
    latin = tmp_path / "latin.json.gz"
    latin.write_bytes(gzip.compress(b"{\xff}"))
    with pytest.raises(LabError, match=r"latin.json.gz is not UTF-8 text \(byte 1\)"):
        traces.load(latin)


def test_a_gzipped_traces_job_is_named_without_its_suffixes():
    assert replay_cli.job_names(["gpu-ddp2/kineto-rank0.json.gz"]) == ["gpu-ddp2-kineto-rank0"]


def test_a_chakra_trace_needs_its_rank_count():
    with pytest.raises(LabError, match="--ranks N"):
        traces.load(CHAKRA)


def test_the_format_is_detected_or_can_be_named():
    assert traces.detect(KINETO.read_text()) == "kineto"
    assert traces.detect(CHAKRA.read_text()) == "chakra"
    with pytest.raises(LabError, match="neither a Kineto nor a Chakra"):
        traces.detect("hello")
    with pytest.raises(LabError, match="format must be one of"):
        traces.load(KINETO, fmt="nsys")


# -- NCCL's record_param_comms form ------------------------------------------------------------------
def test_record_param_comms_sizes_groups_and_skips(tmp_path):
    trace = traces.load(nccl_trace(tmp_path))
    assert trace.form == "record_param_comms" and trace.world == 4
    assert [(o.collective, o.size, o.group) for o in trace.ops] == [
        ("allreduce", 262144 * 4, (0, 1, 2, 3)),       # the per-rank buffer
        ("allreduce", 4096 * 4, (0, 1)),               # a subgroup keeps its ranks
        ("allgather", 4096 * 4, (0, 1, 2, 3)),         # the whole output
        ("reducescatter", 8192 * 4, (0, 1, 2, 3))]     # the whole input
    assert trace.skipped == {"broadcast": 1}
    assert trace.gaps() == pytest.approx([0, 1500e-6, 100e-6, 500e-6])


def test_nccl_kernels_time_the_collectives_where_the_trace_has_them(tmp_path):
    """record_param_comms on the CPU launches an NCCL collective; its GPU kernel, with the same
    args, is the collective's time."""
    launch = comm("allreduce", 1024, 1024, "[0, 1]", 2, "0", 100, 5)
    kernel = {**comm("allreduce", 1024, 1024, "[0, 1]", 2, "0", 180, 400), "cat": "kernel",
              "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"}
    trace = traces.load(nccl_trace(tmp_path, [launch, kernel], {"world_size": 2}))
    assert trace.form == "nccl-kernels" and len(trace.ops) == 1 and trace.ops[0].duration_s == 400e-6


# PyTorch before 2.1 (seen in public traces of 2022-23 NCCL jobs on V100s and A100s): an argless
# record_param_comms beside a `nccl:<op>` annotation with the input shapes, whose launch names
# its GPU kernel by correlation id.
def older_nccl(op, dims, kind, ts, dur, corr, kernel_ts=None, kernel_dur=None, tid=7):
    events = [{"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "tid": tid, "ts": ts, "dur": dur + 20,
               "args": {"External id": corr - 1, "Ev Idx": corr}},
              {"ph": "X", "cat": "user_annotation", "name": f"nccl:{op}", "tid": tid, "ts": ts + 5, "dur": dur,
               "args": {"External id": corr, "Input Dims": dims, "Input type": kind}}]
    if kernel_ts is not None:
        events += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": tid, "ts": ts + 8,
                    "dur": 4, "args": {"External id": corr, "cbid": 211, "correlation": corr}},
                   {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",
                    "tid": 14, "ts": kernel_ts, "dur": kernel_dur,
                    "args": {"External id": corr, "correlation": corr, "stream": 14}}]
    return events


def test_the_older_nccl_form_reads_its_annotations_timed_by_their_kernels(tmp_path):
    events = (older_nccl("all_reduce", [[366336]], ["float"], 0, 60, 100, 400, 900)
              + older_nccl("_all_gather_base", [[8192, 64]], ["float"], 2000, 60, 200, 2100, 300)
              + older_nccl("_reduce_scatter_base", [[65536, 64]], ["float"], 3000, 60, 300, 3100, 500)
              + older_nccl("all_to_all", [[360448]], ["int"], 4000, 60, 400, 4100, 200)
              + older_nccl("all_to_all", [[0]], ["int"], 5000, 60, 500, 5100, 10)
              + older_nccl("broadcast", [[16]], ["float"], 6000, 60, 600, 6100, 10))
    trace = traces.load(nccl_trace(tmp_path, events, {"backend": "nccl", "rank": 0, "world_size": 4}))
    assert trace.form == "nccl-annotations" and trace.world == 4
    assert [(o.collective, o.size, o.group) for o in trace.ops] == [
        ("allreduce", 366336 * 4, (0, 1, 2, 3)),        # the buffer
        ("allgather", 8192 * 64 * 4 * 4, (0, 1, 2, 3)), # the input is one rank's block
        ("reducescatter", 65536 * 64 * 4, (0, 1, 2, 3)),  # the input is the whole buffer
        ("alltoall", 360448 * 4, (0, 1, 2, 3))]         # what the rank sends
    assert [(o.start_s, o.duration_s) for o in trace.ops][:2] == [(0.0, 900e-6), (1700e-6, 300e-6)]
    assert trace.skipped == {"nccl:all_to_all (empty)": 1, "nccl:broadcast": 1}


def test_the_older_nccl_form_without_kernels_says_its_times_are_launches(tmp_path):
    events = (older_nccl("all_reduce", [[1024]], ["float"], 0, 60, 100)
              + older_nccl("all_reduce", [[1024]], ["float"], 500, 60, 200, 600, 80))
    trace = traces.load(nccl_trace(tmp_path, events, {"world_size": 2}))
    assert trace.form == "nccl-annotations, launch times"
    assert [o.duration_s for o in trace.ops] == [60e-6, 80e-6]


@pytest.mark.parametrize("info, dims, message", [
    ({"world_size": 2}, None, r'nccl:all_reduce \(event 0\): no "Input Dims": .*record_shapes=True'),
    ({"rank": 0}, [[16]], "no distributedInfo.world_size"),
    ({"world_size": 2}, [[-1]], "a negative dimension")])
def test_the_older_nccl_form_refuses_what_it_cannot_size(tmp_path, info, dims, message):
    events = older_nccl("all_reduce", dims, ["float"], 0, 60, 100, 100, 50)
    if dims is None:
        del events[1]["args"]["Input Dims"]
    with pytest.raises(LabError, match=message):
        traces.load(nccl_trace(tmp_path, events, info))


def test_the_older_nccl_forms_correlation_ids_are_whole_numbers_or_ignored(tmp_path):
    events = older_nccl("all_reduce", [[16]], ["float"], 0, 60, 100, 100, 50)
    events[2]["args"]["correlation"] = [100]               # the launch: unhashable, so no kernel
    trace = traces.load(nccl_trace(tmp_path, events, {"world_size": 2}))
    assert trace.form == "nccl-annotations, launch times" and trace.ops[0].duration_s == 60e-6


def test_the_older_nccl_form_of_a_single_rank_replays_nothing(tmp_path):
    events = older_nccl("all_reduce", [[16]], ["float"], 0, 60, 100, 100, 50)
    with pytest.raises(LabError, match=r"no collective the lab can replay "
                                       r"\(skipped: nccl:all_reduce \(group of 1\) x1"):
        traces.load(nccl_trace(tmp_path, events, {"world_size": 1}))


def test_shortened_group_ranks_are_looked_up_by_group_name(tmp_path):
    events = [comm("allreduce", 16, 16, "[0, 1, ..., 3]", 2, "1", 0, 10)]
    trace = traces.load(nccl_trace(tmp_path, events, {"world_size": 4, "pg_config": [{"pg_name": "1", "ranks": [1, 3]}]}))
    assert trace.ops[0].group == (1, 3)


def test_a_group_of_one_is_not_replayed(tmp_path):
    events = [comm("allreduce", 16, 16, "[2]", 1, "5", 0, 10), comm("allreduce", 16, 16, "[0, 1]", 2, "1", 20, 10)]
    trace = traces.load(nccl_trace(tmp_path, events))
    assert len(trace.ops) == 1 and trace.skipped == {"allreduce (group of 1)": 1}


def test_overlapping_collectives_count_once_in_the_trace_comm_time(tmp_path):
    events = [comm("allreduce", 16, 16, "[0, 1]", 2, "1", 0, 100), comm("allreduce", 16, 16, "[0, 1]", 2, "1", 50, 100),
              comm("allreduce", 16, 16, "[0, 1]", 2, "1", 300, 10)]
    trace = traces.load(nccl_trace(tmp_path, events))
    assert trace.comm_time_s() == pytest.approx(160e-6)
    assert trace.gaps() == pytest.approx([0, 0, 150e-6])


@pytest.mark.parametrize("mutate, message", [
    (lambda e: e["args"].update({"In msg nelems": -1}), "In msg nelems"),
    (lambda e: e["args"].update({"In msg nelems": 1.5}), "In msg nelems"),
    (lambda e: e["args"].update({"dtype": "Quaternion"}), "unknown dtype"),
    (lambda e: e["args"].update({"Process Group Ranks": "[0, one]"}), "must read like"),
    (lambda e: e["args"].update({"Process Group Ranks": "[0, 0]", "Group size": 2}), "distinct"),
    (lambda e: e["args"].update({"Group size": 3}), "Group size"),
    (lambda e: e["args"].update({"Process Group Ranks": "[0, 9]", "Group size": 2}), "outside the job"),
    (lambda e: e["args"].update({"Collective name": ["allreduce"]}), "Collective name"),
    (lambda e: e.update({"dur": -5}), "dur must be"),
    (lambda e: e.update({"ts": "soon"}), "ts must be"),
    (lambda e: e.update({"args": "x" * 5000}), "args must be an object"),
])
def test_hostile_records_are_refused_in_one_short_line(tmp_path, mutate, message):
    event = comm("allreduce", 16, 16, "[0, 1, 2, 3]", 4, "0", 0, 10)
    mutate(event)
    with pytest.raises(LabError, match=message) as err:
        traces.load(nccl_trace(tmp_path, [event]))
    text = str(err.value)
    assert "\n" not in text and len(text) < 300


@pytest.mark.parametrize("text, message", [
    ("[1, 2", "not valid JSON"),
    ('{"traceEvents": [], "traceEvents": []}', "appears twice"),
    ('{"traceEvents": [{"ts": NaN}]}', "finite"),
    ('{"traceEvents": 5}', "traceEvents list"),
    ('{"traceEvents": []}', "not a trace of a distributed job"),
    ('{"traceEvents": [], "distributedInfo": {"world_size": 4}}', "no collective the lab can replay"),
    ('{"traceEvents": [], "distributedInfo": {"world_size": true}}', "world_size"),
    ('{"traceEvents": [], "distributedInfo": ' + "[" * 40 + "]" * 40 + "}", "nested"),
])
def test_hostile_kineto_files_are_refused(tmp_path, text, message):
    path = tmp_path / "t.json"
    path.write_text(text)
    with pytest.raises(LabError, match=message):
        traces.load(path, fmt="kineto")


def test_a_trace_file_is_bounded_and_regular(tmp_path, monkeypatch):
    monkeypatch.setattr(traces, "MAX_TRACE_BYTES", 1000)
    big = tmp_path / "big.json"
    big.write_text('{"traceEvents": [' + ",".join(["{}"] * 1000) + "]}")
    with pytest.raises(LabError, match="larger than"):
        traces.load(big)
    with pytest.raises(LabError, match="not a regular file"):
        traces.load(tmp_path)


@pytest.mark.parametrize("node, message", [
    ({"id": "1", "type": "COMM_COLL_NODE", "attr": [{"name": "comm_type", "int64Val": "0"}]}, "comm_size is missing"),
    ({"id": "1", "type": "COMM_COLL_NODE", "attr": [{"name": "comm_type", "int64Val": "0"},
                                                    {"name": "comm_size", "int64Val": "-4"}]}, "comm_size"),
    ({"id": "1", "type": "COMM_COLL_NODE", "attr": "all"}, "attr must be a list"),
    ({"id": "1", "type": "COMM_COLL_NODE", "attr": [{"name": "comm_type", "int64Val": "0"},
                                                    {"name": "comm_size", "int64Val": "64"}],
      "durationMicros": "x"}, "durationMicros"),
])
def test_hostile_chakra_nodes_are_refused(tmp_path, node, message):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"attr": []}) + json.dumps(node))
    with pytest.raises(LabError, match=message):
        traces.load(path, fmt="chakra", world=2)


def test_chakra_skips_what_the_lab_cannot_replay_and_reads_a_list(tmp_path):
    nodes = [{"id": "1", "type": "COMM_COLL_NODE", "attr": [{"name": "comm_type", "int64Val": "5"},
                                                            {"name": "comm_size", "int64Val": "64"}]},
             {"id": "2", "type": "COMM_SEND_NODE", "attr": []},
             {"id": "3", "type": "COMP_NODE", "attr": []},
             {"id": "4", "type": "COMM_COLL_NODE", "startTimeMicros": "10", "durationMicros": "7",
              "attr": [{"name": "comm_type", "int64Val": "2"}, {"name": "comm_size", "int64Val": "64"},
                       {"name": "pg_name", "stringVal": "0"}]}]
    path = tmp_path / "c.json"
    path.write_text(json.dumps(nodes))
    trace = traces.load(path, world=4)
    assert trace.skipped == {"BROADCAST": 1, "COMM_SEND_NODE": 1}
    (op,) = trace.ops
    assert (op.collective, op.size, op.group, op.group_name, op.duration_s) == ("allgather", 256, (0, 1, 2, 3), "0", 7e-6)


# -- mapping and scaling -----------------------------------------------------------------------------
def default_fabric():
    return Fabric(load_spec("default"))


def test_ranks_and_groups_land_on_the_placed_hosts(tmp_path):
    fabric = default_fabric()
    spec = replay.ReplaySpec(traces.load(nccl_trace(tmp_path)), hosts=("h8", "h3", "h5", "h1"))
    segments = replay.plan_segments(spec, fabric)
    # the subgroup's collective runs on ranks 0 and 1's hosts only, as its own segment
    assert [(s.group, s.hosts, len(s.steps)) for s in segments] == [
        ((0, 1, 2, 3), ("h8", "h3", "h5", "h1"), 1), ((0, 1), ("h8", "h3"), 1),
        ((0, 1, 2, 3), ("h8", "h3", "h5", "h1"), 2)]
    cspec = replay.collective_spec(spec, segments[1])
    launcher = Launcher(types.SimpleNamespace(fabric=fabric), cspec)
    assert [(r.host, r.nic) for r in launcher.ranks] == [("h8", 0), ("h3", 0)]


def test_default_hosts_are_the_fabrics_first_and_too_few_is_an_error(tmp_path):
    trace = traces.load(KINETO)
    assert replay.ReplaySpec(trace).placed_hosts(default_fabric()) == ["h1", "h2", "h3", "h4"]
    with pytest.raises(LabError, match="fabric 'tiny' has 2 hosts"):
        replay.ReplaySpec(trace).placed_hosts(Fabric(load_spec("tiny")))
    with pytest.raises(LabError, match="4 ranks but 2 hosts"):
        replay.ReplaySpec(trace, hosts=("h1", "h2")).check()
    with pytest.raises(LabError, match="not in fabric"):
        replay.ReplaySpec(trace, hosts=("h1", "h2", "h3", "h99")).placed_hosts(default_fabric())


def test_sizes_are_scaled_down_and_rounded_as_the_schedule_rounds():
    assert replay.lab_size("allreduce", 4, 1 << 20, 1) == 1 << 20
    assert replay.lab_size("allreduce", 4, 1 << 20, 1000) == 1048           # 1048.576 -> whole elements
    assert replay.lab_size("allgather", 3, 1000, 1) == 996                  # a block per rank
    assert replay.lab_size("allgather", 4, 64, 1000) == 16                   # at least one element per block
    for collective in ("allreduce", "allgather", "reducescatter", "alltoall"):
        size = replay.lab_size(collective, 4, 123457, 7)
        assert schedules.effective_size(collective, 4, size) == size


def test_gaps_are_stretched_by_the_time_scale_and_capped():
    fabric = default_fabric()                      # time scale x20000
    trace = traces.load(KINETO)
    spec = replay.ReplaySpec(trace, size_scale=10, max_gap_s=0.5)
    scale = spec.scaling(fabric)
    assert scale == {"size_scale": 10, "gap_scale": 2000.0, "max_gap_s": 0.5, "time_scale": 20000.0,
                     "lab_to_real": 10 / 20000}
    (segment,) = replay.plan_segments(spec, fabric)
    for step, gap in zip(segment.steps, trace.gaps()):
        assert step.trace_gap_s == gap
        assert step.gap_s == pytest.approx(min(gap * 2000, 0.5))
        assert step.clipped == (gap * 2000 > 0.5)
    small = replay.ReplaySpec(trace, gap_scale=0.5, max_gap_s=10)
    (segment,) = replay.plan_segments(small, fabric)
    assert [s.gap_s for s in segment.steps] == pytest.approx([g * 0.5 for g in trace.gaps()])


@pytest.mark.parametrize("field, value, message", [
    ("size_scale", 0.5, "size_scale"), ("size_scale", float("nan"), "size_scale"),
    ("gap_scale", -1, "gap_scale"), ("max_gap_s", 1e6, "max_gap_s"), ("qps", 0, "qps"),
    ("verify", "yes", "verify"), ("trace", "a.json", "loaded trace"),
])
def test_bad_replay_options_are_refused(field, value, message):
    spec = replay.ReplaySpec(traces.load(KINETO))
    setattr(spec, field, value)
    with pytest.raises(LabError, match=message):
        spec.check()


# -- the collective program --------------------------------------------------------------------------
def test_a_segment_becomes_a_program_the_launcher_and_the_agents_build_alike():
    fabric = default_fabric()
    spec = replay.ReplaySpec(traces.load(KINETO), max_gap_s=0.25)
    (segment,) = replay.plan_segments(spec, fabric)
    cspec = replay.collective_spec(spec, segment)
    cspec.check()
    assert (cspec.iterations, cspec.warmup, cspec.nics, cspec.hosts) == (1, 0, 1, ("h1", "h2", "h3", "h4"))
    assert [s[:2] for s in cspec.program] == [(s.op.collective, s.size) for s in segment.steps]
    launcher = Launcher(types.SimpleNamespace(fabric=fabric), cspec)
    assert [s.collective for _i, s in launcher.cases] == [s.op.collective for s in segment.steps]
    assert launcher.gaps == [s[2] for s in cspec.program]
    # what each agent is told: per step its collective and algorithm, and the sizes
    launcher.folder = pathlib.Path("/nonexistent")
    launcher.lab.link_delay_ms = lambda kind: 0.0
    _rank, config = next(launcher._configs())
    assert config["sizes"] == [s.size for s in segment.steps]
    assert config["collective"]["program"] == [[s.op.collective, "ring"] for s in segment.steps]


@pytest.mark.parametrize("change, message", [
    (dict(iterations=5), "runs once"), (dict(warmup=1), "runs once"), (dict(in_place=True), "runs once"),
    (dict(program=()), "1 to 4096"), (dict(program=(("broadcast", 64, 0),)), "must be one of"),
    (dict(program=(("allreduce", 2, 0),)), "size"), (dict(program=(("allreduce", 64, -1),)), "gap_s"),
    (dict(program=(("allreduce", 64),)), "must be \\(collective, size, gap_s\\)"),
])
def test_a_bad_program_is_refused(change, message):
    spec = CollectiveSpec(iterations=1, warmup=0, program=(("allreduce", 64, 0.0),))
    spec.check()
    for key, value in change.items():
        setattr(spec, key, value)
    with pytest.raises(LabError, match=message):
        spec.check()


def test_a_sweep_without_program_runs_as_before():
    spec = CollectiveSpec(collective="allgather", sizes=(64, 128))
    assert spec.steps() == [("allgather", 64, None), ("allgather", 128, None)]


# -- the record --------------------------------------------------------------------------------------
def fake_run(cspec, segment, start=1000.0):
    """A CollectiveRun as the launcher returns it (times made up: 10 ms per 64 KiB)."""
    rows, t = [], start
    for k, step in enumerate(segment.steps):
        cct = step.size / 65536 * 0.01
        n = len(segment.hosts)
        factor = schedules.bus_factor(step.op.collective, n)
        row = {"collective": step.op.collective, "algorithm": "ring", "size": step.size, "in_place": False,
               "ranks": n, "iterations": 1,
               "time_s": {"mean": cct, "p50": cct, "p99": cct, "min": cct, "max": cct, "all": [cct]},
               "rank_time_s_mean": cct, "ideal_time_s": cct * 0.95, "algbw_mbps": step.size * 8 / cct / 1e6,
               "busbw_mbps": step.size * 8 / cct / 1e6 * factor, "bus_factor": factor, "nic_rate_mbps": 20.0,
               "busbw_fraction_of_nic": step.size * 8 / cct / 1e6 * factor / 20, "bytes_sent_per_rank": [0] * n,
               "counters": {}, "agent_cpu_s": [0.1] * n, "flows": None, "verify": {"ok": True, "checked_outputs": n,
                                                                                    "mismatched_outputs": 0,
                                                                                    "wrong_elements": 0},
               "window_s": cct, "window_error_ms": 0.0, "links": [], "buffer_drops": {"fabric": 0, "host_ports": 0, "total": 0},
               "balance": {"up": {"max_mean_ratio": None}, "down": {"max_mean_ratio": None}},
               "cpu": {"machine": 0.5}, "valid": True, "gap_s": None if k == 0 else step.gap_s}
        rows.append(row)
        t += step.gap_s + cct
    ranks = [types.SimpleNamespace(rank=i, host=h, nic=0, ports=[types.SimpleNamespace(ip=f"10.0.0.{i}", intf=f"{h}-n0")])
             for i, h in enumerate(segment.hosts)]
    return types.SimpleNamespace(spec=cspec, ranks=ranks, sizes=rows, finals={}, pids={}, backend="udp",
                                 payload_bytes=1024, ack_timeout_s=0.1, link_rate_mbps=20.0, reorder="go-back-n",
                                 reorder_timeout_s=None, elapsed_s=1.0, plb=None, traffic_window=(start, t))


def test_the_record_puts_the_trace_beside_the_lab_and_fits_the_schema(tmp_path):
    fabric = default_fabric()
    spec = replay.ReplaySpec(traces.load(nccl_trace(tmp_path)), size_scale=4, max_gap_s=0.3)
    segments = replay.plan_segments(spec, fabric)
    runs = [fake_run(replay.collective_spec(spec, s), s, 1000.0 + 10 * k) for k, s in enumerate(segments)]
    record = replay.record(runs, spec, segments, fabric)
    # as written to results.json (tuples become lists)
    jsonschema.validate(json.loads(json.dumps(record)), {"$ref": "#/$defs/job", "$defs": SCHEMA["$defs"]})
    ops = record["ops"]
    assert [o["collective"] for o in ops] == ["allreduce", "allreduce", "allgather", "reducescatter"]
    assert ops[1]["hosts"] == ["h1", "h2"] and ops[1]["group"] == [0, 1]
    assert [o["trace_size"] // o["size"] for o in ops] == [4, 4, 4, 4]
    first = ops[0]
    assert first["cct_real_ms"] == pytest.approx(first["cct_ms"] * 4 / 20000, rel=1e-3)
    assert first["real_vs_trace"] == pytest.approx(first["cct_real_ms"] / first["trace_ms"], rel=1e-3)
    # the trace's own busbw: 1 MiB AllReduce over 4 ranks in 500 us
    assert first["trace_busbw_mbps"] == pytest.approx(262144 * 4 * 1.5 * 8 / 500e-6 / 1e6, rel=1e-3)
    assert ops[1]["gap_ran_ms"] == pytest.approx((1010.0 - runs[0].traffic_window[1]) * 1e3)   # a new segment
    t = record["totals"]
    assert t["lab_comm_ms"] == pytest.approx(sum(o["cct_ms"] for o in ops))
    assert t["trace_comm_ms"] == pytest.approx(1.1)
    assert t["real_vs_trace"] == pytest.approx(t["lab_comm_real_ms"] / t["trace_comm_ms"], rel=1e-3)
    assert record["trace"]["skipped"] == {"broadcast": 1}
    assert record["scaling"]["size_scale"] == 4 and record["ranks"] == {"0": "h1", "1": "h2", "2": "h3", "3": "h4"}
    assert record["valid"] and len(record["segments"]) == 3
    doc = {"fabric": {"name": "default"}, "scale": {"host_rate_mbps": 20.0, "time_scale": 20000.0},
           "runs": [{"routing": "ecmp", "jobs": {"nccl": record}}]}
    text = tables.replay_table(doc)
    assert "reducescatter" in text and "not replayed: broadcast x1" in text
    assert [line.split()[2] for line in text.splitlines() if line.split()[:1] in (["0"], ["1"])] == ["0-3", "0-1"]


def test_compare_shows_a_replay_a_row_per_collective(tmp_path):
    from fabriclab.results import compare

    fabric = default_fabric()
    spec = replay.ReplaySpec(traces.load(nccl_trace(tmp_path)))
    segments = replay.plan_segments(spec, fabric)
    runs = [fake_run(replay.collective_spec(spec, s), s) for s in segments]
    doc = {"kind": "replay", "runs": [{"label": "ecmp", "jobs": {"nccl": replay.record(runs, spec, segments, fabric)}}]}
    rows = compare.rows(doc, "a")
    assert [(r["collective"], r["size"]) for r in rows] == [(s.op.collective, s.size) for g in segments for s in g.steps]
    assert all(r["busbw_mbps"] > 0 for r in rows)


def test_a_replay_is_a_job_kind_of_the_pipeline(tmp_path):
    spec = replay.ReplaySpec(traces.load(KINETO))
    assert Job("r", spec).kind == "replay" and "replay" in jobs.KINDS
    lab = types.SimpleNamespace(fabric=default_fabric())
    runner = jobs.runner(Job("r", spec), lab)
    assert runner.hosts == {"h1", "h2", "h3", "h4"} and len(runner.launchers) == 1
    runner.cancel()


# -- the verb --------------------------------------------------------------------------------------
def replay_args(traces_, **kw):
    base = dict(traces=[str(t) for t in traces_], spec="default", routing="ecmp", trace_format=None, ranks=None,
                hosts=None, placement="order", size_scale=1.0, gap_scale=None, max_gap=1.0, verify=False, qps=1, chunk="64K",
                backend="udp", seed=1, sample_ms=5.0, check=False, out=None, format="table", verbose=False,
                command="replay")
    return argparse.Namespace(**{**base, **kw})


def test_two_traces_are_two_jobs_on_their_own_hosts():
    fabric = default_fabric()
    args = replay_args([KINETO, CHAKRA], ranks=4)
    specs = replay_cli.replay_specs(args, fabric.hosts)
    names = replay_cli.job_names(args.traces)
    assert names == ["ddp4-kineto-rank0", "ddp4-chakra-rank0"]
    assert [s.hosts for s in specs] == [("h1", "h2", "h3", "h4"), ("h5", "h6", "h7", "h8")]
    plan = replay_cli.replay_plan(fabric.spec, "ecmp", specs, names, args)
    assert plan.kind == "replay" and [j.kind for j in plan.runs[0].jobs] == ["replay", "replay"]
    assert replay_cli.job_names(["a/t.json", "a/t.json"]) == ["a-t", "a-t-2"]


def test_the_verb_refuses_more_ranks_than_hosts():
    with pytest.raises(LabError, match="8 ranks in all; the fabric has 2 hosts"):
        replay_cli.replay_specs(replay_args([KINETO, KINETO]), Fabric(load_spec("tiny")).hosts)
    with pytest.raises(LabError, match="lists 3 hosts"):
        replay_cli.replay_specs(replay_args([KINETO], hosts="h1,h2,h3"), default_fabric().hosts)


# -- scenario files ----------------------------------------------------------------------------------
def test_a_scenario_job_can_be_a_replay_with_its_trace_beside_the_file():
    from fabriclab.workflows import scenario

    sc = scenario.load(ROOT / "examples" / "scenarios" / "replay_two_jobs.yaml")
    ddp4, ddp2 = sc.jobs
    assert isinstance(ddp4.spec, replay.ReplaySpec) and ddp4.spec.trace.world == 4
    assert ddp2.spec.trace.format == "chakra" and ddp2.spec.hosts == ("h5", "h7")
    plan = scenario.to_plan(sc)
    assert [j.kind for j in plan.runs[0].jobs] == ["replay", "replay"]


@pytest.mark.parametrize("entry, message", [
    ({"kind": "replay"}, "trace must be the path"),
    ({"kind": "replay", "trace": "../traces/ddp4/kineto-rank0.json", "iterations": 3}, "unknown field 'iterations'"),
    ({"kind": "replay", "trace": "../traces/ddp4/chakra-rank0.json"}, "--ranks N"),
    ({"kind": "replay", "trace": "../traces/ddp4/kineto-rank0.json", "size_scale": 0}, "size_scale"),
    ({"kind": "replay", "trace": "../traces/nowhere.json"}, "cannot read trace"),
])
def test_a_bad_replay_job_in_a_scenario_is_refused(entry, message):
    from fabriclab.workflows import scenario

    data = {"name": "r", "spec": "default", "jobs": [{"name": "r", **entry}]}
    with pytest.raises(LabError, match=message):
        scenario.parse(data, ROOT / "examples" / "scenarios")


def test_random_placement_hands_out_every_host_once_in_a_seeded_order():
    fabric = default_fabric()
    order = replay_cli.placed_hosts(fabric, "order", 1)
    shuffled = replay_cli.placed_hosts(fabric, "random", 1)
    assert order == [f"h{i}" for i in range(1, 9)]
    assert sorted(shuffled) == sorted(order) and shuffled != order
    assert shuffled == replay_cli.placed_hosts(fabric, "random", 1)
    specs = replay_cli.replay_specs(replay_args([KINETO, DDP4.parent / "ddp2" / "kineto-rank0.json"]), shuffled)
    assert [list(s.hosts) for s in specs] == [shuffled[:4], shuffled[4:6]]
