"""Record a small training-like job's collectives with PyTorch's own profilers (CPU, gloo).

    python record_trace.py --ranks 4 --out examples/traces/ddp4

needs PyTorch (CPU is enough; it is not a fabriclab dependency: use a separate venv). It starts
`--ranks` processes on this machine, joins them in one gloo process group, and runs `--steps`
training-like steps: matmuls (the compute), gradient AllReduces of three bucket sizes, an
AllGather of sharded parameters, a ReduceScatter, an AlltoAll (expert routing) and a barrier.
Each rank writes

- `kineto-rank<R>.json`: torch.profiler's Kineto trace (`export_chrome_trace`), trimmed to what
  a replay reads (the c10d and gloo events, the thread names and the trace's `distributedInfo`)
  unless `--keep-all`: the untrimmed trace holds every aten operator as well;
- `et-rank<R>.json`: torch's ExecutionTraceObserver output (PyTorch ET), with `--et`;
- `chakra-rank<R>.json`, with `--et --chakra`: the collectives as Chakra ET nodes in the form
  Chakra's jsonizer prints (see `write_chakra`).

With gloo, torch (2.14 here) records no `record_param_comms` events (NCCL's backend does): a
collective is a `c10d::<op>` CPU op on the caller's thread (its tensors' shapes in the args)
and the `gloo:<op>` spans of the process group's worker threads that do the work.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import time

import sys

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except ImportError:
    sys.exit("record_trace.py needs PyTorch, which fabriclab does not install: run it with the Python "
             "of a separate venv that has it (python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip "
             "install torch)")

# Gradient buckets of a small model, in float32 elements: DDP reduces gradients in buckets.
BUCKETS = (65536, 16384, 131072)
HIDDEN = 128
# Chakra's CollectiveCommType values (schema/protobuf/et_def.proto).
CHAKRA_COMM_TYPES = {"allreduce": 0, "reduce": 1, "allgather": 2, "gather": 3, "scatter": 4,
                     "broadcast": 5, "alltoall": 6, "alltoall_base": 6, "reduce_scatter": 7,
                     "reduce_scatter_base": 7, "barrier": 9}


def compute(x, layers):
    """The forward and backward passes stand-in: matmuls on the CPU."""
    for _ in range(layers):
        x = torch.tanh(x @ x.T @ x) / HIDDEN
    return x


def step(rank, world, layers, refused=()):
    x = torch.randn(HIDDEN, HIDDEN)
    compute(x, layers)
    for elems in BUCKETS:                                      # the gradient buckets, one by one
        dist.all_reduce(torch.ones(elems))
        compute(x, 1)
    compute(x, layers)
    out = [torch.empty(4096) for _ in range(world)]            # sharded parameters gathered
    dist.all_gather(out, torch.ones(4096))
    compute(x, 1)
    if "reduce_scatter" not in refused:
        dist.reduce_scatter_tensor(torch.empty(8192), torch.ones(8192 * world))
        compute(x, 1)
    if "alltoall" not in refused:
        dist.all_to_all_single(torch.empty(4096 * world), torch.ones(4096 * world))   # expert routing
    dist.barrier()


def refused_by_backend(world):
    """The collectives this PyTorch's gloo refuses before sending anything (2.1's has no
    ReduceScatter): the job leaves them out, on every rank alike."""
    refused = []
    for name, call in (("reduce_scatter", lambda: dist.reduce_scatter_tensor(torch.empty(8), torch.ones(8 * world))),
                       ("alltoall", lambda: dist.all_to_all_single(torch.empty(world), torch.ones(world)))):
        try:
            call()
        except RuntimeError as exc:
            if "does not support" not in str(exc):
                raise
            refused.append(name)
    return tuple(refused)


def worker(rank, args):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    out = pathlib.Path(args.out)
    observer = None
    if args.et:
        from torch.profiler import ExecutionTraceObserver
        observer = ExecutionTraceObserver().register_callback(str(out / f"et-rank{rank}.json"))
    refused = refused_by_backend(args.ranks)
    if refused and rank == 0:
        print(f"torch {torch.__version__}: gloo refuses {', '.join(refused)}; the job leaves them out")
    step(rank, args.ranks, args.layers, refused)     # warm-up: connections, allocations
    dist.barrier()
    activities = [torch.profiler.ProfilerActivity.CPU]
    # the observer keyword came with 2.2: without --et, older versions record their Kineto trace too
    extra = {"execution_trace_observer": observer} if observer is not None else {}
    with torch.profiler.profile(activities=activities, record_shapes=True, **extra) as prof:
        for _ in range(args.steps):
            step(rank, args.ranks, args.layers, refused)
            prof.step()
    path = out / f"kineto-rank{rank}.json"
    prof.export_chrome_trace(str(path))
    if not args.keep_all:
        trim(path)
    if args.et and args.chakra:
        write_chakra(out / f"et-rank{rank}.json", path, out / f"chakra-rank{rank}.json")
    dist.barrier()
    dist.destroy_process_group()


def trim(path):
    """Keep what a replay reads: communication records, step spans, the distributed info
    (trim_trace.py, beside this file)."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import trim_trace

    trim_trace.write(trim_trace.trim(json.loads(path.read_text())), path)


def write_chakra(et_path, kineto_path, chakra_path):
    """The job's collectives as Chakra ET nodes, in the form Chakra's jsonizer prints (protobuf's
    JSON mapping of a GlobalMetadata message, then of each Node, one after another).

    Chakra's own converter makes COMM_COLL_NODE nodes only from GPU kernels (ncclKernel or
    ncclDevKernel under record_param_comms), so a CPU gloo job gives it none. Here each c10d
    collective of the PyTorch ET becomes one, with the attributes that converter sets (comm_type,
    comm_size: the input tensors' bytes) and timing linked from the Kineto trace by record
    function id, as Chakra's trace_link does: from the c10d call to the end of its gloo work."""
    et = json.loads(et_path.read_text())
    kineto = json.loads(kineto_path.read_text()).get("traceEvents", [])
    by_rf = {e["args"]["Record function id"]: e for e in kineto
             if isinstance(e.get("args"), dict) and "Record function id" in e["args"]}
    work = sorted((e["args"]["Record function id"], e) for e in kineto if str(e.get("name", "")).startswith("gloo:"))
    out = [{"attr": [{"name": "schema", "stringVal": str(et.get("schema", ""))},
                     {"name": "pid", "uint64Val": str(et.get("pid", 0))},
                     {"name": "time", "stringVal": str(et.get("time", ""))},
                     {"name": "start_ts", "uint64Val": str(et.get("start_ts", 0))},
                     {"name": "finish_ts", "uint64Val": str(et.get("finish_ts", 0))}]}]
    comms = [n for n in et.get("nodes", []) if str(n.get("name", "")).startswith("c10d::")]
    rfs = [next(a["value"] for a in n["attrs"] if a["name"] == "rf_id") for n in comms]
    for k, (node, rf) in enumerate(zip(comms, rfs)):
        op = node["name"][len("c10d::"):].strip("_")
        kind = CHAKRA_COMM_TYPES.get(op)
        call = by_rf.get(rf)
        if kind is None or call is None:
            continue
        following = rfs[k + 1] if k + 1 < len(rfs) else float("inf")
        ends = [e["ts"] + e["dur"] for r, e in work if rf < r < following]
        end = max(ends, default=call["ts"] + call["dur"])
        # comm_size: one rank's input, as Chakra's converter sums a kernel's input tensors. The
        # c10d ops list (output, input) but for allreduce (the buffer alone).
        values = node["inputs"]["values"]
        size = _tensor_bytes(values[0] if op == "allreduce" else values[1])
        out.append({"id": str(node["id"]), "name": node["name"], "type": "COMM_COLL_NODE",
                    "startTimeMicros": str(int(call["ts"])), "durationMicros": str(int(end - call["ts"])),
                    "attr": [{"name": "is_cpu_op", "boolVal": False},
                             {"name": "comm_type", "int64Val": str(kind)},
                             {"name": "comm_size", "int64Val": str(size)}]})
    chakra_path.write_text("".join(json.dumps(m, indent=2) + "\n" for m in out))


def _tensor_bytes(value):
    """Bytes of a PyTorch ET tensor value [id, storage, offset, elements, element bytes, device],
    or of a list of them."""
    if isinstance(value, list) and len(value) == 6 and isinstance(value[3], int) and isinstance(value[5], str):
        return value[3] * value[4]
    if isinstance(value, list):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4, help="matmuls per compute phase")
    parser.add_argument("--out", required=True)
    parser.add_argument("--port", type=int, default=29517)
    parser.add_argument("--et", action="store_true", help="also write the PyTorch ET (ExecutionTraceObserver)")
    parser.add_argument("--chakra", action="store_true", help="with --et: also the Chakra JSON form")
    parser.add_argument("--keep-all", action="store_true", help="do not trim the Kineto trace")
    args = parser.parse_args()
    pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    t0 = time.time()
    mp.spawn(worker, args=(args,), nprocs=args.ranks, join=True)
    print(f"{args.ranks} ranks, {args.steps} steps recorded in {time.time() - t0:.1f} s into {args.out}")


if __name__ == "__main__":
    main()
