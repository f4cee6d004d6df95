"""A victim collective beside a noise job that shares its uplinks: the victim's bus bandwidth with
and without congestion spreading (seed 000 section 5.2; seed 002 section 3.2 on noisy neighbours).

The victim is a ring AllReduce over one host under each leaf. The noise is a Gather from the other
hosts of every other leaf into the first host of the first leaf: an incast whose PFC pauses climb
from the receiver's leaf to the spines and from the spines to the senders' leaves. The victim
sends nothing to the incast's receiver, but its ring crosses the same spine->leaf ports and leaf
uplinks, and a PFC pause stops a port's whole lossless class: head-of-line blocking.

Cases: the victim alone; beside the streaming noise (congestion spreads); beside the same noise
with receiver-driven admission (CTS keeps the incast's bytes in flight below the pause
thresholds, so nothing spreads); beside the noise carried in the lossy class (DSCP 0: it is
tail-dropped at the receiver's leaf instead of pausing anyone, and retransmits).
"""

from __future__ import annotations

from fabriclab.errors import LabError
from fabriclab.results import figures
from fabriclab.table import format_table
from fabriclab.units import human_size
from fabriclab.workflows.experiments import first_size, hops, label, queue_totals
from fabriclab.workflows.experiments.incast import incast_ack_timeout
from fabriclab.workflows.plan import Job, RunPlan

NAME = "victim-noise"
SUMMARY = "a victim AllReduce beside an incast noise job: busbw with and without congestion spreading"
DEFAULT_SPEC = "incast"
CONTROL_DSCP = 48
LOSSY_DSCP = 0
NOISE_ITERATIONS = 10_000          # the noise runs until the victim is done, not to a count
REFERENCE = {
    "source": "seed 000 section 5.2 (PFC's hop-by-hop propagation causes head-of-line blocking and "
              "flow unfairness) and 5.2.2 (receiver-driven admission keeps pauses away)",
    "finding": "a job that shares no endpoint with an incast still slows down when its pauses spread; "
               "admission control at the receiver removes the spreading",
}


def prepare(spec, options):
    if spec.queues is None or not spec.queues.pfc.enabled:
        raise LabError(f"victim-noise needs a spec with a queues: section and PFC on; {spec.name!r} "
                       f"has {'PFC off' if spec.queues else 'none'} (try the shipped `incast` spec)")
    return spec


def pick_hosts(fabric):
    """(victim hosts: the second host of each leaf; noise receiver; noise senders)."""
    by_leaf = {}
    for h in sorted(fabric.hosts, key=lambda h: int(h[1:])):
        by_leaf.setdefault(fabric.hosts[h].ports[0].leaf, []).append(h)
    leaves = sorted(by_leaf, key=lambda n: int(n[1:]))
    if len(leaves) < 3 or any(len(by_leaf[leaf]) < 2 for leaf in leaves):
        raise LabError(f"victim-noise needs at least 3 leaves with 2 hosts each; fabric {fabric.spec.name!r} "
                       f"has {len(leaves)} leaves")
    victim = [by_leaf[leaf][1] for leaf in leaves]
    receiver = by_leaf[leaves[0]][0]
    senders = [h for leaf in leaves[1:] for h in by_leaf[leaf] if h not in victim]
    return victim, receiver, senders


def runs(fabric, options):
    from fabriclab.traffic.collective import CollectiveSpec

    victim_hosts, receiver, senders = pick_hosts(fabric)
    victim_size = (256 if options.quick else 1024) * 1024
    block = (128 if options.quick else 256) * 1024
    iterations, warmup = (2, 0) if options.quick else (3, 1)
    victim = CollectiveSpec(collective="allreduce", sizes=(victim_size,), hosts=tuple(victim_hosts),
                            iterations=iterations, warmup=warmup, seed=options.seed)
    noise_size = block * (len(senders) + 1)
    # The victim starts once the noise's first iteration is done, and the noise gives up the
    # iteration it is in when the victim ends, if it has a measured one by then. --quick measures
    # the first (alone, before the victim): the victim sees the same noise, and the lossy case no
    # longer waits out a whole retransmitting iteration (10 s) after its victim ended (1.3 s).
    noise_warmup = 0 if options.quick else 1
    noise = dict(collective="gather", sizes=(noise_size,), hosts=(receiver, *senders),
                 root=0, iterations=NOISE_ITERATIONS, warmup=noise_warmup, seed=options.seed,
                 ack_timeout_s=incast_ack_timeout(noise_size, fabric.spec.host_rate_mbps))
    streaming = CollectiveSpec(**noise)
    admitted = CollectiveSpec(**noise, cts=True, cts_buffers=1, chunk_bytes=8192, control_dscp=CONTROL_DSCP)
    # The lossy noise keeps the incast's long timeout, not a lossy path's (the engine's default for
    # DSCP 0, 0.78 s here): with that, the full form's 12 senders of 256 KiB resent in step and one
    # QP ran out of its 7 retries (2026-11-29); the quick form's 128 KiB got through 10 draws of 10.
    lossy = CollectiveSpec(**noise, dscp=LOSSY_DSCP, control_dscp=LOSSY_DSCP)
    what = (f"victim: ring AllReduce {human_size(victim_size)} over {', '.join(victim_hosts)}; noise: "
            f"{len(senders)}:1 Gather of {human_size(block)} blocks into {receiver}")
    r = options.routing
    return [
        RunPlan("victim alone", r, [Job("victim", victim)], note=what),
        RunPlan("noise, PFC (spreading)", r, [Job("victim", victim), Job("noise", streaming, "noise")], note=what),
        RunPlan("noise with CTS", r, [Job("victim", victim), Job("noise", admitted, "noise")],
                note=what + "; the noise is admitted by CTS, 1 buffer of 8 KiB per sender"),
        RunPlan("noise in lossy class", r, [Job("victim", victim), Job("noise", lossy, "noise")],
                note=what + f"; the noise at DSCP {LOSSY_DSCP}: tail-dropped, never paused"),
    ]


def _pauses(run, hop):
    return hops(run).get(hop, {}).get("pauses_per_s") or 0


def table(doc):
    alone = first_size(doc["runs"][0], "victim")["busbw_mbps"]
    rows = []
    for run in doc["runs"]:
        v = first_size(run, "victim")
        n = first_size(run, "noise") if "noise" in run["jobs"] else None
        rows.append((label(run), f"{v['cct_ms']['p50']:.0f}", f"{v['cct_ms']['p99']:.0f}",
                     f"{v['busbw_mbps']:.2f}", f"{100 * v['busbw_mbps'] / alone:.0f}" if alone else "-",
                     f"{n['busbw_mbps']:.2f}" if n else "-",
                     _pauses(run, "leaf->spine"), _pauses(run, "spine->leaf"), _pauses(run, "leaf->NIC"),
                     queue_totals(run).get("drops", 0), v["counters"].get("retransmitted_packets", 0),
                     n["counters"].get("retransmitted_packets", 0) if n else "-"))
    scale = doc["scale"]
    title = (f"victim vs noise on {doc['fabric']['name']}, links {scale['host_rate_mbps']:g} Mbit/s "
             f"(time scale x{scale['time_scale'] or 1:.0f}); PFC pauses sent per second by hop while the "
             f"victim ran")
    header = ("case", "victim CCT p50 ms", "p99", "victim busbw", "% of alone", "noise busbw",
              "leaf->spine /s", "spine->leaf /s", "leaf->NIC /s", "lossy drops", "victim retrans",
              "noise retrans")
    return format_table(header, rows, title=title) + "\n" + doc["experiment"]["reference"]["finding"]


def plot(doc, folder):
    runs_ = doc["runs"]
    labels = [r["label"].replace(" (spreading)", "").replace("noise", "+noise") for r in runs_]
    figures.compare(folder / "victim_noise.png", "victim AllReduce beside an incast", labels, [
        ("victim busbw Mbit/s", [first_size(r, "victim")["busbw_mbps"] for r in runs_]),
        ("victim CCT p99 ms", [first_size(r, "victim")["cct_ms"]["p99"] for r in runs_]),
        ("spine->leaf pauses/s", [_pauses(r, "spine->leaf") for r in runs_]),
    ])
