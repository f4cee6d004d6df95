"""`fabriclab benchmark`: rerunnable speed and scale figures, printed as tables.

1. Bring-up (Mininet + OVS built), programmed (controller finished) and teardown times for
   leaf/spine fabrics of growing size.
2. Throughput of one host pair across leaf-spine-leaf (three userspace switches): the lab's RoCEv2
   agent and the collective agent (an RC sender with ACKs) next to iperf3 (TCP and UDP) on the
   same path, with links shaped far above what the CPU can forward, so the number is the software
   data path's ceiling on this machine.
3. Ring AllReduce bus bandwidth on the idle default fabric, as a fraction of the link rate.
4. The queue model's overhead: the same host pair with the model off and on.
5. Forwarding cost: packets the software switches forwarded (one per switch a packet crossed)
   per CPU-second of Open vSwitch's forwarding thread, on leaf-spine-leaf and on the default
   fabric's shape under load: the figure the data path's speed-ups are judged by.
6. With an inventory (`--inventory`): what crossing machines costs. One fabric on this machine,
   then the same fabric split over the inventory's machines (Mininet's cluster edition): bring-up,
   the round trip of a pair that stays on one machine and of a pair that crosses, and a ring
   AllReduce's busbw over every host.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time

from fabriclab.apps import DEFAULT_ROUTING
from fabriclab.measure.cpuload import CpuMeter
from fabriclab.errors import EnvironmentProblem, LabError
from fabriclab.topologies.spec import FabricSpec

DEFAULT_SIZES = "2x2x1,4x2x2,4x4x4,8x4x4,12x8x4"
PAIR_RATE_MBPS = 10000.0


def parse_fabric_sizes(text):
    sizes = []
    for item in text.split(","):
        m = re.fullmatch(r"\s*(\d+)x(\d+)x(\d+)\s*", item)
        if not m or 0 in (values := tuple(int(v) for v in m.groups())):
            raise LabError(f"bad size {item!r}: expected LEAVESxSPINESxHOSTS_PER_LEAF, e.g. 4x2x2")
        sizes.append(values)
    return sizes


def size_specs(sizes):
    """A plain leaf/spine spec per (leaves, spines, hosts per leaf)."""
    return [FabricSpec(name=f"bench-{leaves}x{spines}x{hosts}", leaves=leaves, spines=spines,
                       hosts_per_leaf=hosts, host_rate_mbps=10, fabric_rate_mbps=10)
            for leaves, spines, hosts in sizes]


def bench_bringup(specs, routing=DEFAULT_ROUTING, machines=None):
    """Bring-up, programming and teardown times of each FabricSpec (`size_specs`, or any spec
    as written, queue model and all: `--specs meta_dc`); with `machines`, each split by leaf over
    them."""
    from fabriclab.cluster.cluster import Cluster
    from fabriclab.lab.lab import Lab
    from fabriclab.topologies.split import SplitSpec

    rows = []
    for spec in specs:
        spread = {"split": SplitSpec("leaf", len(machines)), "cluster": Cluster(machines)} if machines else {}
        lab = Lab(spec, routing=routing, **spread)
        with lab:
            summary = lab.fabric.summary()
        rows.append({"fabric": spec.name, "switches": summary["switches"], "hosts": summary["hosts"],
                     "links": summary["links"], "build_s": round(lab.timings["build_s"], 2),
                     # switches connect while the rest is built: this is the wait left after it
                     "controller_wait_s": round(lab.timings["up_s"] - lab.timings["build_s"], 3),
                     "teardown_s": round(lab.timings["down_s"], 2)})
    return rows


def bench_pair(seconds=5.0):
    """One host pair through l1-spine-l2: the RoCEv2 agent, then iperf3 TCP and UDP."""
    from fabriclab.lab.lab import Lab

    if shutil.which("iperf3") is None:
        raise EnvironmentProblem("iperf3 is not installed: run `sudo ./lab.sh bootstrap`")
    spec = FabricSpec(name="bench-pair", leaves=2, spines=1, hosts_per_leaf=1,
                      host_rate_mbps=PAIR_RATE_MBPS, fabric_rate_mbps=PAIR_RATE_MBPS)
    with Lab(spec) as lab:
        src, dst = lab.fabric.hosts["h1"].ports[0], lab.fabric.hosts["h2"].ports[0]
        h1, h2 = lab.host("h1"), lab.host("h2")
        rows = _agent_pair_rows(lab, seconds)
        server = h2.popen(["iperf3", "-s", "-1", "-B", dst.ip], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
        lab.run.add_process(server.pid, "iperf3", "iperf3")
        try:
            time.sleep(0.5)
            for proto, extra in (("TCP", []), ("UDP", ["-u", "-b", "800M", "-l", "1400"])):
                if proto == "UDP":
                    server.wait(5)
                    server = h2.popen(["iperf3", "-s", "-1", "-B", dst.ip], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
                    lab.run.add_process(server.pid, "iperf3", "iperf3")
                    time.sleep(0.5)
                meter = CpuMeter()
                out = h1.cmd(f"iperf3 -J -c {dst.ip} -B {src.ip} -t {seconds:g} {' '.join(extra)}")
                rows.append({**_iperf_row(proto, out), **_cpu_columns(meter.read())})
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
    return rows


def one_qp(lab, src, dst, rate_mbps, flow_id="bench"):
    """An all-pairs agent flow of one QP from host `src`'s first port to host `dst`'s."""
    a, b = lab.fabric.hosts[src].ports[0], lab.fabric.hosts[dst].ports[0]
    return {"id": flow_id, "src": a.ip, "dst": b.ip, "src_qpn": 0x11, "dst_qpn": 0x12, "sport": None,
            "rate_mbps": rate_mbps}


def _agent_pair_rows(lab, seconds, offered=(200.0, 400.0, 800.0)):
    """h1 -> h2 with the RoCEv2 agent (one QP) at each offered rate: delivered, loss, CPU."""
    from fabriclab.traffic.launcher import run_traffic

    rows = []
    for rate in offered:
        run = run_traffic(lab, {"h1": [one_qp(lab, "h1", "h2", rate)]}, duration_s=seconds)
        t = run.totals()
        rows.append({"tool": f"fabriclab RoCEv2 agent (1 QP, {run.payload_bytes} B)",
                     "offered_mbps": rate, "delivered_mbps": t["delivered_mbps"],
                     "loss": t["loss"], **_cpu_columns(run.cpu())})
    return rows


# Below the software switches' ceiling: past it OVS drops frames on receive that the model has
# already counted into their switch, and until the leak repair takes them off a port may stay
# paused for bytes that are gone (docs/queues.md, Limits).
QUEUE_OFFERED_MBPS = (100.0, 200.0, 300.0)


def bench_queue_overhead(seconds=5.0):
    """The queue model's cost on the data path: the same host pair and offered rates with the
    model off (htb + fifo per port) and on (classes, pause gate, eBPF on every port's egress and
    ingress). Buffers are deep and the links far faster than the offered load, so nothing queues
    or pauses: what differs is the per-packet work, visible as delivered rate and CPU."""
    from fabriclab.lab.lab import Lab
    from fabriclab.queues.config import PfcSettings, QueueSpec
    from fabriclab.topologies.spec import Buffers

    rows = []
    buffers = Buffers(host=4 << 20, leaf=4 << 20, spine=4 << 20)
    for model, queues in (("off", None), ("on", QueueSpec(pfc=PfcSettings(reaction_ms=0.1, watchdog_ms=0)))):
        spec = FabricSpec(name="bench-queues", leaves=2, spines=1, hosts_per_leaf=1, buffers=buffers,
                          host_rate_mbps=PAIR_RATE_MBPS, fabric_rate_mbps=PAIR_RATE_MBPS, queues=queues)
        with Lab(spec) as lab:
            for row in _agent_pair_rows(lab, seconds, QUEUE_OFFERED_MBPS):
                rows.append({"model": model, **row})
    return rows


COLLECTIVE_PAIR_RATE_MBPS = 300.0


def bench_collective_pair():
    """h2 writes to h1 (a 2-rank Gather) over links at 300 Mbit/s, below this machine's software
    switch ceiling: an RC sender with ACKs and go-back-N has no congestion control (RoCE relies
    on PFC), so it is measured where the path keeps up, and its CPU cost is per core."""
    from fabriclab.lab.lab import Lab
    from fabriclab.traffic.collective import CollectiveSpec, run_collective

    spec = FabricSpec(name="bench-rc-pair", leaves=2, spines=1, hosts_per_leaf=1,
                      host_rate_mbps=COLLECTIVE_PAIR_RATE_MBPS,
                      fabric_rate_mbps=COLLECTIVE_PAIR_RATE_MBPS)
    with Lab(spec) as lab:
        meter = CpuMeter()
        run = run_collective(lab, CollectiveSpec("gather", sizes=(32 << 20,), hosts=("h1", "h2"),
                                                 iterations=1, warmup=0, chunk_bytes=1 << 20))
        load = meter.read()
    row = run.sizes[0]
    seconds = row["time_s"]["mean"]
    busy = row["agent_cpu_s"][1] / seconds        # the sending agent's share of one core
    mbps = row["counters"]["tx_bytes"] * 8 / seconds / 1e6
    return {"tool": f"collective agent, RC WRITE ({run.payload_bytes} B)",
            "line_mbps": COLLECTIVE_PAIR_RATE_MBPS, "delivered_mbps": round(mbps, 1),
            "packets_per_s": round(row["counters"]["tx_packets"] / seconds),
            "retransmitted": row["counters"]["retransmitted_packets"],
            "sender_core_busy": round(busy, 3),
            "mbps_per_sender_core": round(mbps / busy, 1) if busy else None,
            **_cpu_columns(load)}


def bench_collective(sizes=(256 << 10, 1 << 20, 4 << 20)):
    """Ring AllReduce on the shipped default fabric, idle: busbw against the link rate."""
    from fabriclab.lab.lab import Lab
    from fabriclab.topologies.spec import load_spec
    from fabriclab.traffic.collective import CollectiveSpec, run_collective

    with Lab(load_spec("default")) as lab:
        run = run_collective(lab, CollectiveSpec("allreduce", sizes=tuple(sizes), iterations=3))
    return [{"size": r["size"], "ranks": r["ranks"], "cct_ms": round(r["time_s"]["mean"] * 1e3, 1),
             "ideal_ms": round(r["ideal_time_s"] * 1e3, 1), "busbw_mbps": round(r["busbw_mbps"], 2),
             "busbw_fraction": round(r["busbw_fraction_of_nic"], 3),
             "machine_busy": r["cpu"]["machine"]} for r in run.sizes]


FORWARDING_PAIR_MBPS = 800.0           # one QP offered past the pair's measured ceiling
FORWARDING_HOST_MBPS = 200.0           # all-pairs on `default`: 8 hosts offer 1.6 Gbit/s in all


def datapath_packets():
    """Packets Open vSwitch's datapaths have looked up since they started (`dpctl/show`'s hit +
    missed, over every datapath): one per packet per switch it entered, forwarded or dropped."""
    out = subprocess.run(["ovs-appctl", "dpctl/show"], capture_output=True, text=True, timeout=30)
    count = lookups(out.stdout) if out.returncode == 0 else None
    if count is None:
        raise EnvironmentProblem("`ovs-appctl dpctl/show` gave no datapath lookups: is ovs-vswitchd running?")
    return count


def lookups(text):
    """hit + missed over every datapath of `dpctl/show`'s text; None if it lists none."""
    counts = re.findall(r"lookups: hit:(\d+) missed:(\d+)", text)
    return sum(int(hit) + int(missed) for hit, missed in counts) if counts else None


def _forwarding_row(fabric, load, plan, lab, seconds):
    """Run `plan` (all-pairs agent flows) for `seconds`; the switch hops it cost the forwarding thread."""
    from fabriclab.measure import cpuload
    from fabriclab.traffic.launcher import run_traffic

    before, start = datapath_packets(), cpuload.sample()
    run = run_traffic(lab, plan, duration_s=seconds)
    after, end = datapath_packets(), cpuload.sample()
    load_now = cpuload.between(start, end)
    window = end["time"] - start["time"]
    ovs_s = (end["ovs"] - start["ovs"]) / os.sysconf("SC_CLK_TCK") if start["ovs"] is not None else None
    hops = after - before
    return {"fabric": fabric, "load": load, "delivered_mbps": run.totals()["delivered_mbps"],
            "switch_hops_per_s": round(hops / window), "machine_busy": load_now["machine"],
            "ovs_thread_busy": load_now["ovs_forwarding"],
            "hops_per_ovs_cpu_s": round(hops / ovs_s) if ovs_s else None}


def bench_forwarding(seconds=5.0):
    """Packets forwarded per forwarding-thread CPU-second: one QP across leaf-spine-leaf, then four
    QPs and all-pairs on the default fabric's shape (hosts at 200 Mbit/s, its cables far above)."""
    import dataclasses

    from fabriclab.lab.lab import Lab
    from fabriclab.topologies.spec import load_spec
    from fabriclab.traffic.allpairs import all_pairs_plan

    rows = []
    pair = FabricSpec(name="bench-pair", leaves=2, spines=1, hosts_per_leaf=1,
                      host_rate_mbps=PAIR_RATE_MBPS, fabric_rate_mbps=PAIR_RATE_MBPS)
    with Lab(pair) as lab:
        rows.append(_forwarding_row("leaf-spine-leaf", f"1 QP, {FORWARDING_PAIR_MBPS:g} Mbit/s",
                                    {"h1": [one_qp(lab, "h1", "h2", FORWARDING_PAIR_MBPS)]}, lab, seconds))
    shape = dataclasses.replace(load_spec("default"), name="bench-default", host_rate_mbps=FORWARDING_HOST_MBPS,
                                fabric_rate_mbps=PAIR_RATE_MBPS)
    with Lab(shape) as lab:
        # half the hosts each send one QP to a host two leaves on: four 3-hop streams (their
        # agents cost about 4x the pair's CPU per packet: docs/benchmark.md)
        hosts = sorted(lab.fabric.hosts, key=lambda h: int(h[1:]))
        half = len(hosts) // 2
        plan = {a: [one_qp(lab, a, b, FORWARDING_HOST_MBPS, f"bench{k}")]
                for k, (a, b) in enumerate(zip(hosts[:half], hosts[half:]))}
        rows.append(_forwarding_row("default (4x4x2)", f"{half} QPs across, {FORWARDING_HOST_MBPS:g} Mbit/s each",
                                    plan, lab, seconds))
        rows.append(_forwarding_row("default (4x4x2)", f"all-pairs, {FORWARDING_HOST_MBPS:g} Mbit/s a host",
                                    all_pairs_plan(lab.fabric, load=1.0), lab, seconds))
    return rows


def _cpu_columns(load):
    return {"machine_busy": load["machine"], "ovs_thread_busy": load["ovs_forwarding"]}


def _iperf_row(proto, out):
    try:
        end = json.loads(out[out.index("{"):])["end"]
    except (ValueError, KeyError):
        raise LabError(f"iperf3 {proto} gave no result: {out.strip().splitlines()[-1:] or out!r}") from None
    if proto == "TCP":
        mbps = end["sum_received"]["bits_per_second"] / 1e6
        return {"tool": "iperf3 TCP", "offered_mbps": None, "delivered_mbps": round(mbps, 1),
                "loss": None}
    s = end["sum"]
    return {"tool": "iperf3 UDP (1400 B)", "offered_mbps": 800.0,
            "delivered_mbps": round(s["bits_per_second"] / 1e6 * (1 - s["lost_percent"] / 100), 1),
            "loss": round(s["lost_percent"] / 100, 4)}


CROSSING_RATE_MBPS = 10.0
CROSSING_PINGS = 20
CROSSING_SIZE = 256 << 10


def crossing_spec(machines):
    """The fabric the crossing benchmark spreads: a leaf per machine (at least 2), 2 spines and 2
    hosts per leaf, so a split by leaf keeps one pair of hosts on a machine and sends another
    pair across."""
    leaves = max(2, machines)
    return FabricSpec(name=f"bench-crossing-{leaves}x2x2", leaves=leaves, spines=2, hosts_per_leaf=2,
                      host_rate_mbps=CROSSING_RATE_MBPS, fabric_rate_mbps=CROSSING_RATE_MBPS)


def crossing_pairs(fabric, split):
    """(a pair of hosts the split keeps on one machine, a pair it puts on two): the first of each
    in host order. LabError when the split leaves no such pair."""
    from fabriclab.topologies.split import Split

    place = Split(fabric, split).machine_of
    hosts = sorted(fabric.hosts, key=lambda h: fabric.hosts[h].index)
    pairs = [(a, b) for i, a in enumerate(hosts) for b in hosts[i + 1:]]
    local = [p for p in pairs if place[p[0]] == place[p[1]]]
    across = [p for p in pairs if place[p[0]] != place[p[1]]]
    if not local or not across:
        raise LabError(f"split by {split.by} over {split.machines} machines leaves no "
                       f"{'pair of hosts on one machine' if not local else 'pair of hosts across machines'}")
    return local[0], across[0]


_RTT = re.compile(r"rtt min/avg/max/mdev = ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) ms")
_RECEIVED = re.compile(r"(\d+) packets transmitted, (\d+) received")


def parse_ping(out):
    """{"sent", "received", "min_ms", "avg_ms", "max_ms"} from ping's summary; LabError without one."""
    counts, rtt = _RECEIVED.search(out), _RTT.search(out)
    if counts is None:
        tail = out.strip().splitlines()[-1:] or ["no output"]
        raise LabError(f"ping gave no summary: {tail[0][:120]}")
    row = {"sent": int(counts.group(1)), "received": int(counts.group(2)), "min_ms": None,
           "avg_ms": None, "max_ms": None}
    if rtt is not None:
        row.update(min_ms=float(rtt.group(1)), avg_ms=float(rtt.group(2)), max_ms=float(rtt.group(3)))
    return row


def _ping(lab, pair, count):
    src, dst = (lab.fabric.hosts[h].ports[0] for h in pair)
    out = lab.host(src.host).cmd(f"ping -n -q -c {count} -i 0.2 -W 2 -I {src.ip} {dst.ip}")
    return parse_ping(out)


def bench_crossing(machines, split=None, pings=CROSSING_PINGS, size=CROSSING_SIZE):
    """The same fabric on this machine alone, then split over `machines` (fabriclab.cluster.machine
    Machines, this one first; `split` a SplitSpec, default by leaf over all of them): a row per
    placement with bring-up and teardown, both pairs' round trips and a ring AllReduce's busbw
    (verified). Nothing is built when the inventory has fewer than 2 machines."""
    if len(machines) < 2:
        raise LabError(f"crossing machines needs an inventory of at least 2 machines; it has {len(machines)}")
    from fabriclab.cluster.cluster import Cluster
    from fabriclab.lab.lab import Lab
    from fabriclab.topologies.fabric import Fabric
    from fabriclab.topologies.split import SplitSpec
    from fabriclab.traffic.collective import CollectiveSpec, run_collective

    split = split or SplitSpec(by="leaf", machines=len(machines))
    spec = crossing_spec(split.machines)
    local, across = crossing_pairs(Fabric(spec), split)
    rows = []
    for where, kw in (("one machine", {}),
                      (f"split by {split.by} over {split.machines} machines",
                       {"split": split, "cluster": Cluster(machines)})):
        lab = Lab(spec, **kw)
        with lab:
            pair_rows = {"local": _ping(lab, local, pings), "across": _ping(lab, across, pings)}
            run = run_collective(lab, CollectiveSpec("allreduce", sizes=(size,), algorithm="ring",
                                                     iterations=3, warmup=1, verify=True))
        coll = run.sizes[0]
        rows.append({"placement": where, "bringup_s": round(lab.timings["up_s"], 2),
                     "teardown_s": round(lab.timings["down_s"], 2),
                     **{f"{name}_{key}": value for name, ping in pair_rows.items() for key, value in ping.items()
                        if key.endswith("_ms") or key == "received"},
                     "busbw_mbps": round(coll["busbw_mbps"], 2)})
    return {"spec": spec.name, "rate_mbps": CROSSING_RATE_MBPS, "pings": pings, "allreduce_bytes": size,
            "local_pair": list(local), "across_pair": list(across), "rows": rows}
