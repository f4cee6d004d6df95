"""16:1 incast with PFC only: pauses at each hop, streaming writes against receiver-driven
admission (seed 000 section 5.2.2, Table 3).

One receiver (the first host of the first leaf) gathers from 16 senders under the other leaves.
Three cases on one fabric:

1. streaming: every sender writes its whole block at once (what perftest's ib_write_bw does),
   ACKs in the data class;
2. receiver-driven: the same Gather with clear-to-send admission (one channel buffer of two
   packets per sender), CTS and ACKs in the strict-priority control class, as seed 000 did;
3. receiver-driven with the receiver's link at 25% of its rate, the paper's slow receiver.

Per case and hop: PFC pauses per second and the share of time a pause was held, from the queue
sampler; Table 3's rows are leaf->spine (the receiver's leaf pausing spines), spine->leaf (spines
pausing the senders' leaves) and leaf->NIC (leaves pausing sender NICs).
"""

from __future__ import annotations

from fabriclab.errors import LabError
from fabriclab.results import figures
from fabriclab.table import format_table
from fabriclab.units import human_size
from fabriclab.workflows import faults
from fabriclab.workflows.experiments import first_size, hops, label, queue_totals
from fabriclab.workflows.plan import Job, RunPlan

NAME = "pfc-incast"
SUMMARY = "16:1 incast with PFC only: pauses per hop, streaming vs receiver-driven admission (seed 000 Table 3)"
DEFAULT_SPEC = "incast"
SENDERS = 16
CONTROL_DSCP = 48
REFERENCE = {
    "source": "seed 000 (RoCE at Meta), section 5.2.2, Table 3: 16:1 incast at 400G, PFC only",
    "rows": {"leaf->spine pauses/s": {"perftest": 350_000, "gather (CTS)": 0},
             "spine->leaf pauses/s": {"perftest": 183_000, "gather (CTS)": 0},
             "sender NIC paused share": {"perftest": 0.10, "gather (CTS)": 0.0}},
    "slow receiver": "receiver at 25%: its NIC paused its leaf 75% of the time, the leaf absorbed "
                     "it and did not pause the spines",
}
HOPS = (("leaf->spine", "receiver's leaf pauses spines"), ("spine->leaf", "spines pause sender leaves"),
        ("leaf->NIC", "leaves pause sender NICs"))


def prepare(spec, options):
    if spec.queues is None:
        raise LabError(f"pfc-incast needs a spec with a queues: section; {spec.name!r} has none "
                       f"(try the shipped `incast` spec)")
    if not spec.queues.pfc.enabled:
        raise LabError(f"pfc-incast measures PFC pauses, but spec {spec.name!r} turns PFC off")
    return spec


def pick_hosts(fabric):
    """The receiver (first host of the first leaf) and 16 senders under other leaves."""
    hosts = sorted(fabric.hosts, key=lambda h: int(h[1:]))
    receiver = hosts[0]
    home = fabric.hosts[receiver].ports[0].leaf
    senders = [h for h in hosts if fabric.hosts[h].ports[0].leaf != home][:SENDERS]
    if len(senders) < SENDERS:
        raise LabError(f"pfc-incast needs {SENDERS} senders outside the receiver's leaf; fabric "
                       f"{fabric.spec.name!r} has {len(senders)}")
    return receiver, senders


def incast_ack_timeout(size, rate_mbps):
    """Twice the time the receiver's link needs for the whole transfer. Behind a 16:1 incast a
    lossless packet can wait that long for its turn (PFC pauses, not loss), and a shorter local
    ACK timeout only adds duplicates; an RNIC's real timeout (tens of ms) is hours at this time
    scale, but a lab timeout must stay short enough to recover a genuine loss."""
    return round(2 * size * 8 / (rate_mbps * 1e6) + 0.5, 3)


def runs(fabric, options):
    from fabriclab.traffic.collective import CollectiveSpec

    receiver, senders = pick_hosts(fabric)
    block = (64 if options.quick else 256) * 1024
    size = block * (SENDERS + 1)
    iterations, warmup = (1, 0) if options.quick else (2, 1)
    common = dict(collective="gather", sizes=(size,), hosts=(receiver, *senders), root=0,
                  iterations=iterations, warmup=warmup, seed=options.seed,
                  ack_timeout_s=incast_ack_timeout(size, fabric.spec.host_rate_mbps))
    streaming = CollectiveSpec(**common)
    admitted = CollectiveSpec(**common, cts=True, cts_buffers=1, chunk_bytes=8192, control_dscp=CONTROL_DSCP)
    slow = CollectiveSpec(**{**common, "iterations": 1, "warmup": 0}, cts=True, cts_buffers=1,
                          chunk_bytes=8192, control_dscp=CONTROL_DSCP)
    leaf = fabric.hosts[receiver].ports[0].leaf
    rate = fabric.spec.host_rate_mbps
    where = f"{len(senders)} senders -> {receiver}, {human_size(block)} each"
    # The slow receiver: the leaf's port towards it runs at a quarter of its rate for the run.
    slow_port = faults.Fault(0, "degrade", f"{leaf}-{receiver}", 0.0, {"rate_mbps": rate / 4})
    return [
        RunPlan("streaming", options.routing, [Job("incast", streaming)],
                note=f"{where}, no admission control (perftest-like)"),
        RunPlan("receiver-driven", options.routing, [Job("incast", admitted)],
                note=f"{where}, CTS admission: 1 buffer of 8 KiB per sender, CTS/ACK at DSCP {CONTROL_DSCP}"),
        RunPlan("receiver-driven, slow receiver", options.routing, [Job("incast", slow)],
                conditions=[slow_port],
                note=f"as receiver-driven, {leaf}->{receiver} shaped to 25% ({rate / 4:g} Mbit/s)"),
    ]


def table(doc):
    rows = []
    for run in doc["runs"]:
        job = first_size(run, "incast")
        cells = [label(run), f"{job['cct_ms']['p50']:.0f}", f"{job['busbw_mbps']:.2f}"]
        for hop, _what in HOPS:
            h = hops(run).get(hop, {})
            cells += [h.get("pauses_per_s") or 0, f"{100 * h.get('paused_share', 0):.1f}"]
        spine = hops(run).get("spine->leaf", {}).get("occ_max", 0)
        totals = queue_totals(run)
        cells += [f"{spine / 1024:.0f}", totals.get("lossless_drops", 0),
                  job["counters"].get("retransmitted_packets", 0)]
        rows.append(cells)
    scale = doc["scale"]
    title = (f"16:1 incast (Gather) on {doc['fabric']['name']}, PFC only, links {scale['host_rate_mbps']:g} "
             f"Mbit/s (time scale x{scale['time_scale'] or 1:.0f}); pauses sent per second and % of "
             f"time held, per hop")
    header = ("case", "CCT p50 ms", "busbw Mbit/s", "leaf->spine /s", "%", "spine->leaf /s", "%",
              "leaf->NIC /s", "% (sender NIC)", "spine q KiB", "lossless drops", "retrans")
    ref = doc["experiment"]["reference"]["rows"]
    note = ("seed 000 Table 3 (400G): perftest leaf->spine {0}/s, spine->leaf {1}/s, sender NICs paused "
            "{2:.0%} of the time; Gather with CTS: no pauses at any hop."
            .format(ref["leaf->spine pauses/s"]["perftest"], ref["spine->leaf pauses/s"]["perftest"],
                    ref["sender NIC paused share"]["perftest"]))
    return format_table(header, rows, title=title) + "\n" + note


def plot(doc, folder):
    runs_ = doc["runs"]
    panels = [(f"{hop} pauses/s", [hops(r).get(hop, {}).get("pauses_per_s") or 0 for r in runs_]) for hop, _ in HOPS]
    panels.append(("sender NICs paused %", [100 * hops(r).get("leaf->NIC", {}).get("paused_share", 0) for r in runs_]))
    panels.append(("CCT p50 ms", [first_size(r, "incast")["cct_ms"]["p50"] for r in runs_]))
    figures.compare(folder / "incast.png", "16:1 incast, PFC only: pauses per hop by case",
                    [r["label"] for r in runs_], panels)
