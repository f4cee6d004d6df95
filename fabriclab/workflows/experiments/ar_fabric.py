"""ar-fabric: per-packet adaptive routing within a plane, weighted for a permanent remote failure,
and a local link failure handled in the data path (seed 002, sections 3.2, 4.1, 4.4.2, 6.4,
Figure 5).

The routing-schemes experiment's ring AllReduce (every hop crosses leaves, each leaf sends four
flows up four uplinks) on a lossless fabric with two parallel links per leaf-spine pair:

1. ECMP against AR on the healthy fabric: uplink balance (max/mean) and busbw.
2. s1 loses one of its two links to l1 for the whole run (a permanent remote failure): plain and
   weighted ECMP, AR with and without capacity weights. Every leaf's uplinks to s1 lead to half
   the capacity toward l1 that its uplinks to s2 do; the weighted schemes should send l1 a third of
   its traffic through s1 (its capacity share), the unweighted ones half.
3. l1-s1#1 fails during the ring (a local failure at both of its ends): AR takes the dead member
   out at the first packet that finds it without carrier, before the controller hears of it; the
   ring should see no local ACK timeout (go-back-N after a timeout is what a lost tail costs).
   The same link down for the whole run is the control: what the fabric left after the failure
   costs by itself, failure or not.

Per-packet AR reorders packets within a flow; the NICs place them by PSN (reorder: place) and
count them out of sequence, so reordering costs no retransmission; a loss still does.
"""

from __future__ import annotations

import dataclasses

from fabriclab.results import figures
from fabriclab.table import format_table
from fabriclab.workflows import faults
from fabriclab.workflows.experiments import first_size, label, num
from fabriclab.workflows.experiments.routing import workload
from fabriclab.workflows.plan import Job, RunPlan

NAME = "ar-fabric"
SUMMARY = ("ring AllReduce on a lossless fabric with parallel links: ECMP vs per-packet adaptive "
           "routing; a spine's link to l1 down for the run under plain and weighted ECMP and AR; "
           "a local link failure during the ring under AR")
DEFAULT_SPEC = "ar_fabric"
DEFAULT_ROUTING = None       # the runs name their own routing apps
REFERENCE = {
    "source": "seed 002 sections 3.2, 4.1, 4.4.2, 6.4 and Figure 5",
    "finding": ("Paper: per-packet AR (quantized JSQ) keeps fabric queues from building; a local link "
                "failure leaves AR's choice in O(100 ns), in hardware; a permanent remote failure "
                "is handled by weights proportional to the remaining capacity, which AR combines "
                "with local queue depth (Figure 5), so bandwidth degrades in proportion to the "
                "capacity lost (6.4: 10% fewer links, 11% less p01 bandwidth)."),
}
REMOTE = "l1-s1#2"           # s1 keeps one of its two links to l1
LOCAL = "l1-s1#1"            # one of l1's two links to s1: local to l1 and to s1
DEGRADED = ("s1", "l1")      # the spine that lost capacity and the leaf behind it
FAULT_AFTER_S = 0.6          # the local failure strikes this long into the measured iterations

HEALTHY = (("ECMP", "ecmp"), ("AR", "ar"))
REMOTE_CASES = (("ECMP", "ecmp"), ("weighted ECMP", "ecmp:weights=on"),
                ("AR unweighted", "ar:weights=off"), ("weighted AR", "ar"))
LOCAL_CASES = (("AR", "ar"),)            # --quick
FULL_LOCAL_CASES = (("AR", "ar"), ("AR without the carrier check", "ar:carrier=off"), ("ECMP", "ecmp"))


def prepare(spec, options):
    return spec


def ring_job(fabric, options, iterations=None):
    """The routing-schemes ring on NICs that place out-of-order packets by PSN, as the NICs a
    per-packet load-balanced fabric is built for do (seed 002 section 3): AR's reordering then
    costs no go-back-N, and ECMP, which does not reorder, is unaffected."""
    return Job("ring", dataclasses.replace(workload(fabric, options, iterations=iterations), reorder="place"))


def runs(fabric, options):
    """--quick: the healthy pair and the local failure (what claim 002-ar-balance and the lab test
    read); the remote-failure weights are tested on their own (tests/lab/test_adaptive_routing.py)."""
    ring = ring_job(fabric, options)
    out = [RunPlan(name, routing, [ring], tags={"scheme": name}) for name, routing in HEALTHY]
    local = faults.Fault(0, "link_down", LOCAL, FAULT_AFTER_S, {})
    longer = ring_job(fabric, options, iterations=3 if options.quick else 6)
    if options.quick:
        return out + [RunPlan(f"{name}, {LOCAL} fails", routing, [longer], faults=[local],
                              tags={"scheme": name, "fault": LOCAL}) for name, routing in LOCAL_CASES]
    remote = faults.Fault(0, "link_down", REMOTE, 0.0, {})
    out += [RunPlan(f"{name}, {REMOTE} down", routing, [ring], conditions=[remote],
                    tags={"scheme": name, "condition": REMOTE})
            for name, routing in REMOTE_CASES]
    out.append(RunPlan(f"AR, {LOCAL} down", "ar", [longer], conditions=[faults.Fault(0, "link_down", LOCAL, 0.0, {})],
                       tags={"scheme": "AR", "condition": LOCAL}))
    out += [RunPlan(f"{name}, {LOCAL} fails", routing, [longer], faults=[local],
                    tags={"scheme": name, "fault": LOCAL}) for name, routing in FULL_LOCAL_CASES]
    return out


# -- reading the document ---------------------------------------------------------------------------
def _labels(target):
    """The labels a link fault's target `A-B` or `A-B#N` can have (Link.label: member 1 has no #)."""
    a, b, member = faults.split_link(target)
    suffix = f"#{member + 1}" if member else ""
    return {f"{a}-{b}{suffix}", f"{b}-{a}{suffix}"}


def _down_links(run):
    """Labels of the links a run's conditions took down."""
    return {name for c in run["conditions"] if c["kind"] == "link_down" for name in _labels(c["target"])}


def live_uplinks(run):
    """Max/mean of the leaf uplinks that were up for the whole run (a link down for the run would
    count as an idle uplink); for a failure during the run, of those left once traffic recovered."""
    from fabriclab.measure.telemetry import max_mean_ratio

    if run["faults"]:
        return (run["faults"][0].get("uplinks_after") or {}).get("max_mean_ratio")
    down = _down_links(run)
    loads = [r["mbps"] for r in first_size(run, "ring")["links"]
             if r["direction"] == "up" and r["link"] not in down]
    return max_mean_ratio(loads) if loads else None


def share_via(run, spine=DEGRADED[0], leaf=DEGRADED[1]):
    """The share of what the spines delivered to `leaf` that came through `spine`."""
    rows = [r for r in first_size(run, "ring")["links"] if r["to"] == leaf and r["direction"] == "down"]
    total = sum(r["mbps"] for r in rows)
    return sum(r["mbps"] for r in rows if r["from"] == spine) / total if total else None


def failover_ms(run):
    """How long the stage kept choosing a port after a packet first found it dead (ms), the
    worst port; None when the stage saw no port die."""
    down = ((run["routing_state"] or {}).get("stage") or {}).get("down_ports") or {}
    return max((p["chosen_while_down_ms"] for p in down.values()), default=None)


def pauses(run):
    totals = ((run.get("queues") or {}).get("report") or {}).get("totals") or {}
    return totals.get("pause_tx")


# -- reporting --------------------------------------------------------------------------------------
def table(doc):
    rows = []
    for run in doc["runs"]:
        ring = first_size(run, "ring")
        counters = ring["counters"]
        fault = (run["faults"] or [{}])[0]
        recovery = (fault.get("impact") or {}).get("recovery_s")
        rows.append((label(run), f"{ring['busbw_mbps']:.2f}", f"{ring['cct_ms']['p50']:.0f}",
                     num(live_uplinks(run)), num(share_via(run)),
                     counters.get("out_of_sequence", 0), counters.get("retransmitted_packets", 0),
                     counters.get("local_ack_timeout_err", 0), num(pauses(run)),
                     num(recovery) if fault else "", num(failover_ms(run)) if fault else ""))
    scale = doc["scale"]
    title = (f"adaptive routing on {doc['fabric']['name']}, links {scale['host_rate_mbps']:g} Mbit/s "
             f"(time scale x{scale['time_scale'] or 1:.0f}); uplinks: leaf uplinks up for the whole run "
             f"(after a failure: once traffic recovered); "
             f"{DEGRADED[1]} via {DEGRADED[0]}: {DEGRADED[0]}'s share of what the spines delivered to "
             f"{DEGRADED[1]} (capacity share with {REMOTE} down: 1/3)")
    header = ("case", "busbw Mbit/s", "CCT p50 ms", "uplink max/mean", f"{DEGRADED[1]} via {DEGRADED[0]}",
              "OOS", "retrans", "ACK timeouts", "PFC pauses", "recovery s", "stage after down ms")
    return format_table(header, rows, title=title) + "\n" + doc["experiment"]["reference"]["finding"]


def plot(doc, folder):
    runs_ = doc["runs"]
    names = [r["label"].replace(", ", "\n") for r in runs_]
    figures.compare(folder / "ar_fabric.png", "same ring AllReduce, one scheme or failure per bar", names, [
        ("busbw (Mbit/s)", [first_size(r, "ring")["busbw_mbps"] for r in runs_]),
        ("uplink max/mean", [live_uplinks(r) for r in runs_]),
        (f"{DEGRADED[1]} via {DEGRADED[0]} (share)", [share_via(r) for r in runs_]),
        ("out-of-sequence packets", [first_size(r, "ring")["counters"].get("out_of_sequence", 0) for r in runs_]),
    ])
