"""`random_flaps: fabric | [A-B, ...], mtbf, duration, until, seed`: seed 002 section 6.6's failures:
every chosen link fails as a Poisson process with mean time between failures `mtbf` (counted from
the end of its previous flap), each failure lasting `duration`, until `until`."""

from __future__ import annotations

import random

from fabriclab.errors import LabError
from fabriclab.workflows.faultsteps import Step, split_link

TARGET = "`fabric` or a list of links"
PARAMS = {"mtbf": (float, True), "duration": (float, True), "until": (float, True), "seed": (int, False)}
MAX_FLAPS = 5_000                # faults.MAX_STEPS steps: a down and an up each


def check_entry(target, at, params, where):
    if target != "fabric" and not (isinstance(target, list) and target and all(isinstance(t, str) for t in target)):
        raise LabError(f"{where}: random_flaps takes `fabric` or a list of links like [l1-s1, l2-s2]")
    if params["until"] <= at:
        raise LabError(f"{where}: random_flaps until ({params['until']:g} s) must come after at ({at:g} s)")


def resolve(fault, lab):
    if fault.target == "fabric":
        return list(lab.fabric.fabric_links)
    return [link for text in fault.target for link in lab.resolve_link(*split_link(text))]


def flap_times(links, mtbf_s, duration_s, start, until, rng, limit=MAX_FLAPS):
    """[(time down, link)] for links failing independently with exponential gaps of mean mtbf_s
    (counted from the end of the previous flap of the same link), each down for duration_s.
    LabError past `limit` flaps, before drawing them all."""
    out = []
    for link in links:
        t = start + rng.expovariate(1 / mtbf_s)
        while t < until:
            out.append((t, link))
            if len(out) > limit:
                raise LabError(f"random flaps: more than {limit} flaps between {start:g} and {until:g} s; "
                               f"raise mtbf or shorten the window")
            t += duration_s + rng.expovariate(1 / mtbf_s)
    return sorted(out, key=lambda item: item[0])


def steps(fault, links, budget):
    p = fault.params
    times = flap_times(links, p["mtbf"], p["duration"], fault.at, p["until"], random.Random(p.get("seed", 1)),
                       budget // 2)
    out = []
    for t, link in times:
        out.append(Step(t, fault.index, "link", ([link], False)))
        out.append(Step(t + p["duration"], fault.index, "link", ([link], True), undo=True))
    return out


def count(fault, links, budget):
    p = fault.params
    return 2 * len(flap_times(links, p["mtbf"], p["duration"], fault.at, p["until"],
                              random.Random(p.get("seed", 1)), budget // 2))
