"""SwitchML on a live lab: place aggregators beside the switches, steer to them, run the workers,
check the result against numpy and report the tensor aggregation time (TAT).

Placement. Each leaf with workers gets an aggregator on one of its hosts (the last one, unless
`aggregators` names others): the server beside the ToR of seed 003 section 7. Its switch owns a
service address (10.<plane>.255.<leaf>) that OpenFlow rewrites to that server, and a group address
(10.<plane>.254.<leaf>) whose packets it copies to every worker under it. With `hierarchy`, the
leaf aggregators forward to a level-2 aggregator for spine 1: the spine owns the addresses, steers
them to a server (on leaf 1's aggregator host, listening on its own port: the fabrics have no
servers cabled to spines) and replicates its results to the leaf aggregators.

Workers sum seeded tensors (node.tensor_for), so the launcher recomputes the exact sum with numpy:
int32 must match exactly, float32 within the quantization bound the workers report.
"""

from __future__ import annotations

import hashlib
import io
import json
import statistics
import subprocess
import time
from dataclasses import dataclass, field

import numpy as np

from fabriclab.loading import excerpt
from fabriclab.system import patience

from fabriclab.lab import steering
from fabriclab.errors import LabError
from fabriclab.switchml.node import PORT, tensor_for
from fabriclab.switchml.packet import HEADER_LEN, max_elements
from fabriclab.traffic import agent_process

DEFAULT_K = 256
ROOT_PORT = PORT + 1            # the level-2 aggregator's port (it shares leaf 1's server)
READY_TIMEOUT_S = 10.0         # a node binds its socket (plus, elsewhere, its machine's start)
NODE_MODULE = "fabriclab.switchml.node"
NPY_HEADER_MAX = 4096
DTYPES = ("int32", "float32")
IP_UDP = 28


@dataclass
class AggregationSpec:
    """One SwitchML run. `elements`: tensor length; `slots` (s) and `k` (integers per packet,
    default what the MTU allows) size each pool; `timeout_ms` is the workers' retransmission
    timer in lab time."""

    elements: int = 65536
    dtype: str = "int32"
    workers: tuple | None = None          # host names (default: leaf 1's, or every leaf's with hierarchy)
    aggregators: tuple | None = None      # one host per leaf with workers (default: its last)
    slots: int | None = None              # default: what the leaf's buffer holds in flight
    k: int | None = None                  # default: 256 (the paper's 1 KiB payload), MTU allowing
    iterations: int = 3
    hierarchy: bool = False
    timeout_ms: float | None = None       # default: derived from the pool and the link rate
    seed: int = 1
    job_id: int = 1
    deadline_s: float = 120.0
    capacity: int = 512                   # slots each aggregator offers (its memory)

    def check(self, fabric):
        def bad(why):
            raise LabError(f"switchml: {why}")
        if self.dtype not in DTYPES:
            bad(f"dtype must be one of {', '.join(DTYPES)}, got {excerpt(self.dtype)}")
        for name in ("elements", "slots", "iterations"):
            value = getattr(self, name)
            if value is None and name == "slots":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                bad(f"{name} must be a positive integer, got {excerpt(value)}")
        if self.timeout_ms is not None and not self.timeout_ms > 0:
            bad(f"timeout_ms must be > 0, got {excerpt(self.timeout_ms)}")
        limit = max_elements(fabric.spec.mtu)
        if self.k is not None and not (isinstance(self.k, int) and 1 <= self.k <= limit):
            bad(f"k must be 1..{limit} at MTU {fabric.spec.mtu}, got {excerpt(self.k)}")
        if fabric.spec.nics_per_host != 1 or fabric.spec.planes != 1:
            bad("runs on single-plane fabrics with one NIC per host")


@dataclass
class Placement:
    aggregators: dict = field(default_factory=dict)     # leaf -> host
    workers: dict = field(default_factory=dict)         # leaf -> [hosts]


def place(fabric, spec):
    names = list(fabric.hosts)
    for group in (spec.workers or (), spec.aggregators or ()):
        unknown = [h for h in group if h not in fabric.hosts]
        if unknown:
            raise LabError(f"switchml: host {excerpt(unknown[0])} is not in fabric {excerpt(fabric.spec.name)} "
                           f"(hosts: {', '.join(names)})")
    by_leaf = {}
    for h in names:
        by_leaf.setdefault(fabric.hosts[h].ports[0].leaf, []).append(h)
    placement = Placement()
    chosen = {fabric.hosts[h].ports[0].leaf: h for h in (spec.aggregators or ())}
    if spec.workers is None and not spec.hierarchy:
        by_leaf = dict(list(by_leaf.items())[:1])           # one rack: the first leaf's hosts
    for leaf, hosts in by_leaf.items():
        agg = chosen.get(leaf, hosts[-1])
        workers = [h for h in hosts if h != agg and (spec.workers is None or h in spec.workers)]
        if workers:
            placement.aggregators[leaf], placement.workers[leaf] = agg, workers
    overlap = set(spec.workers or ()) & set(placement.aggregators.values())
    if overlap:
        raise LabError(f"switchml: {sorted(overlap)[0]} cannot be both a worker and its leaf's aggregator")
    total = sum(len(w) for w in placement.workers.values())
    if total < 2:
        raise LabError("switchml: needs at least two workers (a leaf needs a host besides its aggregator)")
    if spec.hierarchy and len(placement.workers) < 2:
        raise LabError("switchml: hierarchy needs workers under at least two leaves")
    if not spec.hierarchy and len(placement.workers) > 1:
        raise LabError(f"switchml: without hierarchy the workers must share a leaf (one rack), got "
                       f"workers under {', '.join(placement.workers)}; set hierarchy")
    return placement


def _target(fabric, host):
    p = fabric.hosts[host].ports[0]
    return {"ip": p.ip, "mac": p.mac, "via": p.leaf_port}


def _service(leaf):
    return f"10.{leaf.plane}.255.{leaf.index}", f"10.{leaf.plane}.254.{leaf.index}"


def steering_plan(fabric, placement, hierarchy):
    """Service and group addresses per leaf (and for spine 1 with `hierarchy`)."""
    plan = {"services": [], "groups": [], "routes": []}
    for leaf_name, agg in placement.aggregators.items():
        leaf = fabric.switches[leaf_name]
        service, group = _service(leaf)
        plan["services"].append({"switch": leaf_name, "address": service, "udp_dst": PORT,
                                 "to": _target(fabric, agg)})
        plan["groups"].append({"switch": leaf_name, "address": group,
                               "members": [_target(fabric, w) for w in placement.workers[leaf_name]]})
    if hierarchy:
        spine = next(s for s in fabric.switches.values() if s.role == "spine")
        service, group = f"10.{spine.plane}.255.{100 + spine.index}", f"10.{spine.plane}.254.{100 + spine.index}"
        root = next(iter(placement.aggregators.values()))
        root_leaf = fabric.hosts[root].ports[0].leaf
        down = {link.a: link.b_port for link in fabric.links if link.b == spine.name and link.member == 0}
        up = {link.a: link.a_port for link in fabric.links if link.b == spine.name and link.member == 0}
        root_port = fabric.hosts[root].ports[0]
        plan["services"].append({"switch": spine.name, "address": service, "udp_dst": ROOT_PORT,
                                 "to": {"ip": root_port.ip, "mac": root_port.mac, "via": down[root_leaf]}})
        plan["groups"].append({"switch": spine.name, "address": group, "members": [
            {**_target(fabric, agg), "via": down[leaf]} for leaf, agg in placement.aggregators.items()]})
        for leaf_name in placement.aggregators:
            plan["routes"].append({"switch": leaf_name, "address": service, "via": up[leaf_name]})
        plan["routes"].append({"switch": root_leaf, "address": group, "via": up[root_leaf]})
        plan["root"] = {"host": root, "service": service, "group": group}
    return plan


def default_slots(fabric, workers_here, k):
    """s: one packet per slot from every worker of a rack meets at the aggregator's port, so the
    pool in flight is s x n packets; half the leaf buffer holds it without tail drops, which a
    self-clocked pool cannot outrun (the paper sizes s to the bandwidth-delay product)."""
    wire = HEADER_LEN + 4 * k + IP_UDP + 14
    return max(1, min(64, fabric.spec.buffers.leaf // 2 // (workers_here * wire)))


def default_timeout_ms(fabric, slots, k):
    """A retransmission timer three times a healthy round trip: a worker's pool (a packet per
    slot) queues on its own cable on the way up and the results on the way down; the aggregator's
    cable is n times faster, so it adds no more (seed 003 uses 1 ms at 100 Gbit/s)."""
    wire_bits = (HEADER_LEN + 4 * k + IP_UDP + 14) * 8
    return max(10.0, 3 * 2 * slots * wire_bits / (fabric.spec.host_rate_mbps * 1e6) * 1e3)


def run_aggregation(lab, spec, tag="switchml", on_start=None, cancel=None):
    """Run `spec` on `lab`; returns a dict with TAT per iteration, rates, bytes, counters and the
    check against numpy. LabError on a bad spec, a failed process or a wrong result.
    `on_start(unix time)` is called once the workers are launched, with their start time; `cancel`,
    an Event set from another thread, ends the run at once with its processes stopped."""
    fabric = lab.fabric
    spec.check(fabric)
    placement = place(fabric, spec)
    k = spec.k or min(DEFAULT_K, max_elements(fabric.spec.mtu))
    plan = steering_plan(fabric, placement, spec.hierarchy)
    total = sum(len(w) for w in placement.workers.values())
    chunks = -(-spec.elements // k)
    most = max(len(w) for w in placement.workers.values())
    slots = min(spec.slots or default_slots(fabric, max(most, len(placement.workers)), k), chunks)
    timeout_ms = spec.timeout_ms or default_timeout_ms(fabric, slots, k)
    folder = lab.run.path(f"{tag}-{time.strftime('%H%M%S')}")
    folder.mkdir(parents=True, exist_ok=True)
    procs, outputs, ranks, workers_out = {}, {}, {}, {}
    hosts = {}                    # aggregator process name -> its host
    # A switch aggregates inside its pipeline, at line rate on every port at once; the server that
    # stands in for it has one cable, which n workers would share. Its link runs at n times the
    # host rate for the run, so the cable is not what the comparison measures.
    rate = fabric.spec.host_rate_mbps
    root_host = (plan.get("root") or {}).get("host")
    links = {}                    # aggregator host -> its cable's rate for the run (Mbit/s)
    for leaf, agg in placement.aggregators.items():
        senders = max(len(placement.workers[leaf]), len(placement.workers) if spec.hierarchy else 1)
        links[agg] = rate * senders * (2 if agg == root_host else 1)     # the root shares the host
    steering.apply(lab, plan)
    try:
        for leaf, agg in placement.aggregators.items():
            lab.set_rate(leaf, agg, links[agg])
        root = plan.get("root")
        for leaf_name, agg in placement.aggregators.items():
            leaf = fabric.switches[leaf_name]
            service, group = _service(leaf)
            job = {"job_id": spec.job_id, "slots": slots, "elements": k, "group": group,
                   "children": [fabric.hosts[w].ports[0].ip for w in placement.workers[leaf_name]]}
            if root:
                job.update(upstream=list(placement.aggregators).index(leaf_name), parent=root["service"],
                           parent_port=ROOT_PORT)
            hosts[f"agg-{leaf_name}"] = agg
            procs[f"agg-{leaf_name}"] = _start(lab, agg, folder, f"agg-{leaf_name}", {
                "role": "aggregator", "name": f"agg-{leaf_name}", "level": 1, "capacity": spec.capacity,
                "slot_elements": k, "jobs": [job], "bind": fabric.hosts[agg].ports[0].ip})
        if root:
            # The root shares leaf 1's aggregator host: what the two send each other comes back
            # through the spine addressed from and to the host itself, which Linux drops as a
            # martian unless the host accepts local source addresses.
            intf = fabric.hosts[root["host"]].ports[0].intf
            lab.net.get(root["host"]).cmd(f"sysctl -qw net.ipv4.conf.all.accept_local=1 "
                                          f"net.ipv4.conf.{intf}.accept_local=1")
            hosts["agg-root"] = root["host"]
            procs["agg-root"] = _start(lab, root["host"], folder, "agg-root", {
                "role": "aggregator", "name": "agg-root", "level": 2, "capacity": spec.capacity,
                "slot_elements": k, "port": ROOT_PORT, "bind": fabric.hosts[root["host"]].ports[0].ip,
                "jobs": [{"job_id": spec.job_id, "slots": slots, "elements": k, "group": root["group"],
                          "children": [fabric.hosts[a].ports[0].ip for a in placement.aggregators.values()]}]})
        ready_by = time.monotonic() + agent_process.ready_timeout_s(lab, hosts.values(), NODE_MODULE,
                                                                   patience.scaled(READY_TIMEOUT_S))
        for name, host in hosts.items():
            agent_process.wait_ready(procs[name], f"switchml: {name} on {host}", ready_by)
        # The workers' configs are in place (on their machines) before the start time is set;
        # each is given it on its command line, on its own clock.
        configs = {}
        for rank, (leaf_name, i, host) in enumerate((leaf_name, i, host) for leaf_name, workers
                                                    in placement.workers.items() for i, host in enumerate(workers)):
            service, _ = _service(fabric.switches[leaf_name])
            outputs[rank] = folder / f"out-{rank}.npy"
            stop = _stop_file(folder, f"w{rank}")
            ranks[rank] = host
            configs[rank] = _config(lab, host, folder, f"w{rank}", {
                "role": "worker", "rank": rank, "worker_id": i, "address": fabric.hosts[host].ports[0].ip,
                "service": service, "iterations": spec.iterations, "start_at": None,
                "timeout_s": timeout_ms / 1000, "deadline_s": spec.deadline_s,
                "output": str(outputs[rank]), "stop_file": str(stop),
                "job": {"job_id": spec.job_id, "workers_here": len(placement.workers[leaf_name]),
                        "workers": total, "slots": slots, "elements": k},
                "tensor": {"dtype": spec.dtype, "elements": spec.elements, "seed": spec.seed}},
                outputs=[outputs[rank], stop])
        # every worker says ready once its tensor and socket are, then all start at once (here
        # through stdin, on another machine through a start file)
        for rank, host in ranks.items():
            procs[f"w{rank}"] = _run(lab, host, configs[rank], f"w{rank}", gate=True)
        ready_by = time.monotonic() + agent_process.ready_timeout_s(lab, ranks.values(), NODE_MODULE,
                                                                    patience.scaled(READY_TIMEOUT_S))
        for rank, host in ranks.items():
            agent_process.wait_ready(procs[f"w{rank}"], f"switchml: worker {rank} on {host}", ready_by)
        start_at = agent_process.release([procs[f"w{rank}"] for rank in ranks])
        if on_start is not None:
            on_start(start_at)
        failure = None
        try:
            for r in ranks:
                workers_out[r] = _finish(procs[f"w{r}"], f"worker {r} on {ranks[r]}",
                                         spec.deadline_s * spec.iterations + patience.scaled(30), cancel=cancel)
        except LabError as exc:
            failure = exc
        # Each worker's result, read back from its machine while the run's folder is there.
        results = {} if failure else {r: _tensor(lab, ranks[r], outputs[r], spec.elements) for r in ranks}
    finally:
        # An aggregator ends when its stop file appears where it runs (here or on another machine),
        # and so does a worker that did not finish (killing its SSH session leaves it running there).
        for name, host in [*hosts.items(), *((f"w{r}", h) for r, h in ranks.items() if r not in workers_out)]:
            _stop(lab, host, folder, name)
        aggs_out = {name: _finish(proc, name, patience.scaled(10), fail=False) for name, proc in procs.items()
                    if name.startswith("agg")}
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
        steering.clear(lab)
        for leaf, agg in placement.aggregators.items():
            lab.set_rate(leaf, agg, rate)
    if failure is not None:
        seen = "; ".join(f"{name}: " + ", ".join(f"{k} {v}" for k, v in sorted(doc.get("counters", {}).items()))
                         for name, doc in aggs_out.items())
        raise LabError(f"{failure} ({seen})")
    report = _report(spec, fabric, placement, k, slots, total, workers_out, aggs_out, results)
    report["timeout_ms"] = timeout_ms
    report["aggregator_link_mbps"] = links
    return report


def _config(lab, host, folder, name, cfg, outputs=()):
    """Write a SwitchML process's config where `host` runs (removing an earlier `outputs`)."""
    cfg.setdefault("port", PORT)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(cfg))
    agent_process.prepare(lab, host, [path], outputs)
    return path


def _run(lab, host, path, name, gate=False):
    """A SwitchML process on `host` (on its own machine); its output is its report."""
    return agent_process.start(lab, host, NODE_MODULE, [path], f"switchml-{name}", keep_stdout=True, gate=gate)


def _stop_file(folder, name):
    return folder / f"{name}.stop"


def _start(lab, host, folder, name, cfg):
    """An aggregator, told to stop by _stop (no earlier stop file is left for it to see)."""
    stop = _stop_file(folder, name)
    cfg["stop_file"] = str(stop)
    return _run(lab, host, _config(lab, host, folder, name, cfg, outputs=[stop]), name)


def _stop(lab, host, folder, name):
    """Put the aggregator `name`'s stop file where it runs; a failure to is left to _finish's kill."""
    stop = _stop_file(folder, name)
    try:
        stop.write_text("")
        agent_process.prepare(lab, host, [stop])
    except (LabError, OSError):
        pass


def _tensor(lab, host, path, elements):
    """A worker's result (.npy), read where it ran."""
    data = agent_process.read_output(lab, host, path, elements * 8 + NPY_HEADER_MAX, binary=True)
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError):
        raise LabError(f"switchml: the result of {host} ({path.name}) is not a tensor") from None


def _finish(proc, what, timeout, fail=True, cancel=None):
    deadline = time.monotonic() + timeout
    while True:
        try:
            # In short steps, so that a cancel is seen; communicate() loses no output across retries.
            out, err = proc.communicate(timeout=min(0.2, max(0.0, deadline - time.monotonic())))
            break
        except subprocess.TimeoutExpired:
            cancelled = cancel is not None and cancel.is_set()
            if not cancelled and time.monotonic() < deadline:
                continue
            proc.kill()
            out, err = proc.communicate()
            if cancelled:
                raise LabError(f"switchml: {what} cancelled") from None
            if fail:
                raise LabError(f"switchml: {what} did not finish within {timeout:.0f} s") from None
            break
    lines = [line for line in out.decode().splitlines() if line.startswith("{")]
    doc = json.loads(lines[-1]) if lines else {}
    if fail and (proc.returncode != 0 or "error" in doc or not doc):
        why = doc.get("error") or (err.decode().strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise LabError(f"switchml: {what} failed: {why}")
    return doc


def _report(spec, fabric, placement, k, slots, total, workers, aggs, results):
    tensors = [tensor_for({"dtype": spec.dtype, "elements": spec.elements, "seed": spec.seed}, r)
               for r in sorted(workers)]
    if spec.dtype == "int32":
        exact = np.sum(np.stack(tensors).astype(np.int64), axis=0).astype(np.int32)
    else:
        exact = np.sum(np.stack(tensors).astype(np.float64), axis=0)
    worst, bound, digests = 0.0, 0.0, set()
    for r, got in results.items():
        digests.add(hashlib.sha256(got.tobytes()).hexdigest())
        if spec.dtype == "int32":
            if not np.array_equal(got, exact):
                bad = int(np.flatnonzero(got != exact)[0])
                raise LabError(f"switchml: worker {r}'s result differs from numpy at element {bad}: "
                               f"{int(got[bad])} != {int(exact[bad])}")
        else:
            err = float(np.max(np.abs(got.astype(np.float64) - exact)))
            worst, bound = max(worst, err), max(bound, workers[r]["error_bound"])
            if err > workers[r]["error_bound"]:
                raise LabError(f"switchml: worker {r}'s float result is off by {err:.3g}, "
                               f"above the quantization bound {workers[r]['error_bound']:.3g}")
    if len(digests) != 1:
        raise LabError("switchml: the workers' results differ from one another")
    # An iteration ends when its last worker has the whole result.
    per_iteration = [max(w["tat_s"][i] for w in workers.values()) for i in range(spec.iterations)]
    tensor_bytes = spec.elements * 4
    packets = sum(w["counters"].get("sent", 0) for w in workers.values())
    return {
        "mechanism": "switchml", "dtype": spec.dtype, "elements": spec.elements,
        "tensor_bytes": tensor_bytes, "workers": total, "k": k, "slots": slots,
        "hierarchy": spec.hierarchy, "aggregators": dict(placement.aggregators),
        "worker_hosts": {leaf: list(w) for leaf, w in placement.workers.items()},
        "tat_s": {"per_iteration": per_iteration, "mean": statistics.fmean(per_iteration),
                  "p50": statistics.median(per_iteration), "max": max(per_iteration)},
        "elements_per_s": spec.elements / statistics.median(per_iteration),
        "bytes_sent_per_worker": statistics.fmean(w["counters"].get("bytes_sent", 0) for w in workers.values())
        / spec.iterations,
        "wire_bytes_per_packet": HEADER_LEN + k * 4 + IP_UDP,
        "retransmissions": sum(w["counters"].get("retransmissions", 0) for w in workers.values()),
        "packets_sent": packets,
        "verify": {"ok": True, "exact": spec.dtype == "int32", "max_error": worst, "bound": bound,
                   "result_sha256": digests.pop()},
        "aggregator_counters": {name: doc.get("counters", {}) for name, doc in aggs.items()},
        # worker 0's first iteration: when each packet left (s), new and retransmitted (Figure 7)
        "timeline": {"sends": workers[min(workers)].get("sends", []),
                     "resends": workers[min(workers)].get("resends", [])},
    }
