"""`flap: A-B, count, down, up`: the link goes down for `down` s and up for `up` s, `count` times."""

from fabriclab.workflows.faultkinds.common import check_name, one_link
from fabriclab.workflows.faultsteps import Step

TARGET = "a link A-B"
PARAMS = {"count": (int, False), "down": (float, False), "up": (float, False)}


def check_entry(target, at, params, where):
    check_name(target, TARGET, "flap", where)


def resolve(fault, lab):
    return one_link(fault, lab)


def steps(fault, links, budget):
    p, t, out = fault.params, fault.at, []
    for _ in range(p.get("count", 1)):
        out.append(Step(t, fault.index, "link", (links, False)))
        t += p.get("down", 1.0)
        out.append(Step(t, fault.index, "link", (links, True), undo=True))
        t += p.get("up", 1.0)
    return out


def count(fault, links, budget):
    return 2 * fault.params.get("count", 1)
