"""path-pinning: Meta's first routing scheme against job placement and a link failure (seed 000,
section 4.1.2).

Path pinning sends everything to a host along the path its "slice" (its downlink's index on its
leaf) picks at every switch: no hashing (the `pinning` app). An AlltoAll of 8 ranks on the 1:1
routing-schemes fabric (4 leaves x 4 uplinks, 4 hosts a leaf), under pinning, ECMP and E-ECMP:

- **full racks**: the job has leaves l1 and l2 whole. Its destinations are every slice, so each
  leaf's four uplinks carry one slice's flows each: pinning is as even as routing gets.
- **fragmented**: the job has l1 whole and the hosts other jobs left elsewhere: the first host
  (slice 0) of l2, l3 and l4, and l4's second. l1's four senders reach three of their four remote
  peers through slice 0, so under pinning one uplink carries three quarters of what l1 sends
  and two carry nothing; hashing spreads the same flows over all four.
- **l1-s1 fails**: the full-rack AlltoAll again, and l1's uplink to s1 goes down mid-run. Pinning
  hands the four flows to the slice-0 host, pinned to that uplink, to ECMP's hash over the three
  left, each already carrying its own slice's four: four flows cannot split evenly over three
  uplinks, so at best one carries six where the others carry five (max/mean 1.125).
"""

from __future__ import annotations

from fabriclab.results import figures
from fabriclab.table import format_table
from fabriclab.workflows import faults
from fabriclab.workflows.experiments import first_size, label, num
from fabriclab.workflows.plan import Job, RunPlan

NAME = "path-pinning"
SUMMARY = ("AlltoAll on full racks and on a fragmented placement under path pinning, ECMP and E-ECMP; "
           "then l1-s1 fails under each (seed 000 4.1.2)")
DEFAULT_SPEC = "routing"
DEFAULT_ROUTING = None       # the runs name their own routing apps
REFERENCE = {
    "source": "seed 000 section 4.1.2 (path pinning)",
    "finding": ("Paper: pinning by the destination's slice worked when every rack was fully assigned to one "
                "job and nothing failed; a rack partly used by a job loaded its RTSW's uplinks unevenly and "
                "slowed training by more than 30%, and after an uplink or CTSW failure ECMP reassigned the "
                "pinned flows unevenly onto the other CTSWs, where they collided."),
    "fragmented_loss": 0.30,
}
SCHEMES = (("pinning", "pinning"), ("ECMP", "ecmp"), ("E-ECMP", "eecmp"))
FAULT = ("l1", "s1")
FAULT_AFTER_S = 0.6          # into the measured iterations
LEAF = "l1"                  # the leaf the placements and the failure are about


def prepare(spec, options):
    return spec


def placements(fabric):
    """{"full racks": hosts, "fragmented": hosts}: 8 ranks each, leaf-major (see the docstring)."""
    by_leaf = {}
    for host in sorted(fabric.hosts.values(), key=lambda h: h.ports[0].leaf_port):
        by_leaf.setdefault(host.ports[0].leaf, []).append(host.name)
    leaves = sorted(by_leaf, key=lambda name: fabric.switches[name].index)
    first, second, *rest = leaves
    full = by_leaf[first] + by_leaf[second]
    fragmented = by_leaf[first] + [by_leaf[leaf][0] for leaf in (second, *rest)]
    fragmented += [h for h in by_leaf[leaves[-1]][1:] if h not in fragmented][:len(full) - len(fragmented)]
    return {"full racks": tuple(full), "fragmented": tuple(fragmented)}


def workload(options, hosts, iterations=None):
    from fabriclab.traffic.collective import CollectiveSpec

    return CollectiveSpec(collective="alltoall", sizes=((256 if options.quick else 1024) * 1024,), hosts=hosts,
                          iterations=iterations or (3 if options.quick else 4), warmup=1, seed=options.seed)


def runs(fabric, options):
    from fabriclab.apps.choice import Routing

    fault = faults.Fault(0, "link_down", f"{FAULT[0]}-{FAULT[1]}", FAULT_AFTER_S, {})
    # --quick: what the seed 000 claims read (pinning against ECMP; the failure under pinning)
    schemes = [(name, Routing.parse(choice)) for name, choice in SCHEMES if not (options.quick and name == "E-ECMP")]
    placed = placements(fabric)
    out = []
    for place, hosts in placed.items():
        for name, routing in schemes:
            out.append(RunPlan(f"{name}, {place}", routing, [Job("alltoall", workload(options, hosts))],
                               tags={"scheme": name, "placement": place}))
    for name, routing in schemes:
        if name == "pinning" or not options.quick:
            spec = workload(options, placed["full racks"], iterations=3 if options.quick else 6)
            out.append(RunPlan(f"{name}, {FAULT[0]}-{FAULT[1]} fails", routing,
                               [Job("alltoall", spec)], faults=[fault],
                               tags={"scheme": name, "placement": "full racks", "fault": f"{FAULT[0]}-{FAULT[1]}"}))
    return out


# -- reading a run ------------------------------------------------------------------------------------
def leaf_uplinks(run, leaf=LEAF):
    """{uplink: Mbit/s} of `leaf`'s uplinks over the measured iterations."""
    return {row["link"]: row["mbps"] for row in first_size(run, "alltoall")["links"]
            if row["direction"] == "up" and row["from"] == leaf}


def leaf_max_mean(run, leaf=LEAF):
    from fabriclab.measure.telemetry import max_mean_ratio

    return max_mean_ratio(leaf_uplinks(run, leaf).values())


def after_failure(run, leaf=LEAF):
    """Max/mean of `leaf`'s uplinks still up, after the failure (None for a run without one)."""
    fault = (run["faults"] or [{}])[0]
    return ((fault.get("uplinks_after") or {}).get("by_switch") or {}).get(leaf)


def find(doc, scheme, placement):
    return next((r for r in doc["runs"] if r["tags"]["scheme"] == scheme and r["tags"]["placement"] == placement
                 and not r["faults"]), None)


def busbw(run):
    return first_size(run, "alltoall")["busbw_mbps"] if run else None


def fragmented_loss(doc, scheme):
    """1 - busbw(fragmented) / busbw(full racks) under `scheme`: what fragmentation costs it."""
    full, frag = busbw(find(doc, scheme, "full racks")), busbw(find(doc, scheme, "fragmented"))
    return round(1 - frag / full, 4) if full and frag is not None else None


# -- reporting ----------------------------------------------------------------------------------------
def table(doc):
    rows = []
    for run in doc["runs"]:
        size = first_size(run, "alltoall")
        loads = leaf_uplinks(run)
        rows.append((label(run), f"{size['busbw_mbps']:.2f}", f"{size['cct_ms']['p50']:.0f}",
                     " ".join(f"{loads[k]:.1f}" for k in sorted(loads)), num(leaf_max_mean(run)),
                     num(after_failure(run)) if run["faults"] else ""))
    scale = doc["scale"]
    title = (f"path pinning on {doc['fabric']['name']}: AlltoAll of {human(doc)} per rank, links "
             f"{scale['host_rate_mbps']:g} Mbit/s (time scale x{scale['time_scale'] or 1:.0f}); {LEAF}'s uplinks "
             f"in Mbit/s over the measured iterations")
    header = ("case", "busbw Mbit/s", "CCT p50 ms", f"{LEAF} uplinks Mbit/s", f"{LEAF} max/mean",
              f"{LEAF} max/mean after the failure")
    losses = ", ".join(f"{name} {100 * loss:.0f}%" for name, _ in SCHEMES
                       if (loss := fragmented_loss(doc, name)) is not None)
    return (format_table(header, rows, title=title) + f"\nbusbw lost to the fragmented placement: {losses}\n"
            + doc["experiment"]["reference"]["finding"])


def human(doc):
    from fabriclab.units import human_size

    return human_size(first_size(doc["runs"][0], "alltoall")["size"])


def plot(doc, folder):
    placed = [(place, name) for place in ("full racks", "fragmented") for name, _ in SCHEMES
              if find(doc, name, place) is not None]
    figures.compare(folder / "path_pinning.png", "AlltoAll busbw by placement and scheme",
                    [f"{name}\n{place}" for place, name in placed], [
                        ("busbw Mbit/s", [busbw(find(doc, name, place)) for place, name in placed]),
                    ])
