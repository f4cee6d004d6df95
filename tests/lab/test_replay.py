"""Traces replayed on a real fabric: the shipped PyTorch traces' collectives run in order with
their compute gaps and verified values, a subgroup runs on its members' hosts only, two traces
share the fabric as two jobs, and the record's numbers agree with one another."""

import json
import pathlib
import subprocess
import sys

import jsonschema
import pytest

from fabriclab.system.shaping import burst_bytes
from fabriclab.jobs import traces
from fabriclab.workflows.plan import Job, Plan, RunPlan
from fabriclab.jobs.replay import ReplaySpec

pytestmark = pytest.mark.lab

ROOT = pathlib.Path(__file__).resolve().parents[2]
DDP4 = ROOT / "examples" / "traces" / "ddp4"
DDP2 = ROOT / "examples" / "traces" / "ddp2"
GPU = ROOT / "examples" / "traces" / "gpu-ddp2"
SCHEMA = json.loads((ROOT / "fabriclab" / "results" / "schema.json").read_text())
MAX_GAP_S = 0.1


def only_cpu_may_invalidate(doc):
    """The run is valid, or the only reason it is not is a saturated CPU."""
    reasons = doc["runs"][0]["invalid"]
    assert doc["valid"] == (not reasons)
    assert all("CPU saturated" in r for r in reasons), reasons


def replay_plan(lab, jobs):
    return Plan(name="replay-test", kind="replay", spec=lab.fabric.spec,
                runs=[RunPlan("ecmp", jobs=[Job(name, spec) for name, spec in jobs])])


def check_job(job, trace, lab, figure, size_scale=1):
    """Every collective of the trace ran once, in order, at its size, verified; the numbers of
    the record agree with one another."""
    ops = job["ops"]
    assert [(o["collective"], o["trace_size"], o["group"]) for o in ops] == \
        [(o.collective, o.size, list(o.group)) for o in trace.ops]
    assert all(o["verify"] is not False for o in ops), [o for o in ops if o["verify"] is False]
    # an op is valid exactly when its collective's row is (a CPU-saturated machine is reported
    # as such: the tests share two cores with everything else the machine runs)
    rows = [row for segment in job["segments"] for row in segment["sizes"]]
    assert [o["valid"] for o in ops] == [row["valid"] for row in rows]
    scale = job["scaling"]
    spec = lab.fabric.spec
    # The shapers' htb lets a burst of at least two frames through at once (system/shaping.py),
    # and the bucket refills while a rank waits between steps: each step can beat its share of
    # the ideal time by one burst's time at the slower link rate, and no collective here takes
    # more than a ring AllReduce's 2(n-1) steps. (The bound was 0.7 x ideal: over 10 runs
    # (2026-11-27) a 2-rank ReduceScatter whose ideal, 3.3 ms, is under one burst's 7.2 ms
    # measured 0.66-1.67 x ideal and failed 3 runs in 10.)
    burst_ms = max(burst_bytes(rate, spec.mtu) * 8 / (rate * 1e3)
                   for rate in (spec.host_rate_mbps, spec.fabric_rate_mbps))
    for op in ops:
        assert op["size"] == pytest.approx(op["trace_size"] / size_scale, abs=4 * op["ranks"])
        name = f"{op['collective']} {op['index']} on {','.join(op['hosts'])}: CCT / ideal"
        floor = op["ideal_ms"] - 2 * (op["ranks"] - 1) * burst_ms
        assert figure(name, op["cct_ms"] / op["ideal_ms"]) > floor / op["ideal_ms"], (op, burst_ms)
        assert op["cct_real_ms"] == pytest.approx(op["cct_ms"] * scale["lab_to_real"], rel=1e-3, abs=1e-6)
        if op["gap_ran_ms"] is not None and op["index"] and op["hosts"] == ops[op["index"] - 1]["hosts"]:
            # within a segment a step starts no sooner than its gap after the previous one's end
            assert op["gap_ran_ms"] >= op["gap_ms"] - 1, op
    t = job["totals"]
    assert t["collectives"] == len(trace.ops)
    assert t["lab_comm_ms"] == pytest.approx(sum(o["cct_ms"] for o in ops), abs=0.01)
    assert t["trace_comm_ms"] == pytest.approx(trace.comm_time_s() * 1e3, abs=0.01)
    assert t["lab_comm_real_ms"] == pytest.approx(t["lab_comm_ms"] * scale["lab_to_real"], rel=1e-3)
    assert scale["time_scale"] == lab.fabric.spec.time_scale
    assert all(o["gap_ms"] <= MAX_GAP_S * 1e3 + 1e-6 for o in ops)


def test_the_verb_replays_a_gpu_jobs_trace_and_prints_its_table(tmp_path):
    """`fabriclab replay` end to end on a trace nobody on the team recorded: two steps of a GPU
    job under DDP (PyTorch 2.11, gzip as the profiler wrote it), sizes / 1024, on tiny. It builds
    its own fabric, so it runs first, before the module's shared fabric is up."""
    out = tmp_path / "r"
    trace = GPU / "kineto-rank0.json.gz"
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli.main", "replay", str(trace), "--size-scale", "1024",
                           "--spec", "tiny", "--max-gap", str(MAX_GAP_S), "--verify", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]       # 1: a CPU-saturated run
    assert "communication: trace" in proc.stdout and "allgather" in proc.stdout
    doc = json.loads((out / "results.json").read_text())
    only_cpu_may_invalidate(doc)
    assert (proc.returncode == 0) == doc["valid"]
    job = doc["runs"][0]["jobs"]["gpu-ddp2-kineto-rank0"]
    assert job["hosts"] == ["h1", "h2"] and all(o["verify"] for o in job["ops"])
    # per step: DDP's 8 gradient buckets, then the AllGather
    assert [o["collective"] for o in job["ops"]] == (["allreduce"] * 8 + ["allgather"]) * 2
    assert [o["trace_size"] for o in job["ops"]] == [o.size for o in traces.load(trace).ops]
    assert (out / "report.md").read_text().count("replayed job") == 1


def test_the_shipped_trace_replays_on_the_default_fabric(lab_for, run_plan, figure):
    lab = lab_for("default")
    trace = traces.load(DDP4 / "kineto-rank0.json")
    result = run_plan(replay_plan(lab, [("ddp4", ReplaySpec(trace, max_gap_s=MAX_GAP_S, verify=True))]), lab=lab)
    jsonschema.validate(result.doc, SCHEMA)
    only_cpu_may_invalidate(result.doc)
    job = result.doc["runs"][0]["jobs"]["ddp4"]
    check_job(job, trace, lab, figure)
    assert job["hosts"] == ["h1", "h2", "h3", "h4"] and len(job["segments"]) == 1
    assert job["trace"]["skipped"] == {"c10d::barrier": 2}
    # one program on one set of agents: within it, each gap ran as planned (to a few ms)
    gaps = [(o["gap_ms"], o["gap_ran_ms"]) for o in job["ops"][1:]]
    assert all(planned - 1 <= ran <= planned + 60 for planned, ran in gaps), gaps


def test_a_subgroup_runs_on_its_members_hosts_and_two_traces_share_the_fabric(lab_for, run_plan, tmp_path, figure):
    """A trace in NCCL's form whose second collective is on ranks 1 and 3 (placed on h4 and h8),
    beside the shipped 2-rank Chakra trace on h1 and h5: two jobs of one run, at once. Values are
    checked only in the first: eight agents copying every byte into numpy saturate two cores."""
    lab = lab_for("default")
    def comm(name, n_in, n_out, ranks, ts, dur):
        return {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": ts, "dur": dur,
                "args": {"Collective name": name, "dtype": "Float", "In msg nelems": n_in, "Out msg nelems": n_out,
                         "Group size": len(ranks), "Process Group Name": "0" if len(ranks) == 4 else "1",
                         "Process Group Ranks": str(ranks)}}
    events = [comm("allreduce", 16384, 16384, [0, 1, 2, 3], 0, 900),
              comm("allreduce", 8192, 8192, [1, 3], 1000, 300),
              comm("allgather", 2048, 8192, [0, 1, 2, 3], 2000, 400)]
    path = tmp_path / "nccl.json"
    path.write_text(json.dumps({"traceEvents": events,
                                "distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 4}}))
    nccl = traces.load(path)
    chakra = traces.load(DDP2 / "chakra-rank0.json", world=2)
    plan = replay_plan(lab, [
        ("nccl", ReplaySpec(nccl, hosts=("h2", "h4", "h6", "h8"), max_gap_s=MAX_GAP_S, verify=True)),
        ("ddp2", ReplaySpec(chakra, hosts=("h1", "h5"), size_scale=4, max_gap_s=MAX_GAP_S))])
    result = run_plan(plan, lab=lab)
    jsonschema.validate(result.doc, SCHEMA)
    only_cpu_may_invalidate(result.doc)
    jobs = result.doc["runs"][0]["jobs"]
    check_job(jobs["nccl"], nccl, lab, figure)
    check_job(jobs["ddp2"], chakra, lab, figure, size_scale=4)
    segments = jobs["nccl"]["segments"]
    assert [[r["host"] for r in s["ranks"]] for s in segments] == [["h2", "h4", "h6", "h8"], ["h4", "h8"],
                                                                    ["h2", "h4", "h6", "h8"]]
    assert jobs["ddp2"]["hosts"] == ["h1", "h5"]


def test_the_example_scenario_replays_two_jobs_through_a_link_flap(run_scenario, lab_for):
    """examples/scenarios/replay_two_jobs.yaml: both traces complete while l1-s1 flaps under the
    4-rank job (h1 and h2 sit on l1), the fault is on the record, and both jobs kept their hosts."""
    lab = lab_for("default")
    doc = run_scenario(ROOT / "examples" / "scenarios" / "replay_two_jobs.yaml", lab=lab)
    only_cpu_may_invalidate(doc)
    run = doc["runs"][0]
    assert set(run["jobs"]) == {"ddp4", "ddp2"}
    assert run["jobs"]["ddp4"]["hosts"] == ["h1", "h2", "h3", "h4"] and run["jobs"]["ddp2"]["hosts"] == ["h5", "h7"]
    assert [f["kind"] for f in run["faults"]] == ["flap"] and run["faults"][0]["at_s"] is not None
    for name, trace in (("ddp4", traces.load(DDP4 / "kineto-rank0.json")),
                        ("ddp2", traces.load(DDP2 / "chakra-rank0.json", world=2))):
        assert [o["collective"] for o in run["jobs"][name]["ops"]] == [o.collective for o in trace.ops]
