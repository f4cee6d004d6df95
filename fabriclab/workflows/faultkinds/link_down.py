"""`link_down: A-B` (or A-B#N, a parallel member): the link goes down, back up after `for`."""

from fabriclab.workflows.faultkinds.common import check_name, one_link, with_undo, with_undo_count

TARGET = "a link A-B"
PARAMS = {"for": (float, False)}


def check_entry(target, at, params, where):
    check_name(target, TARGET, "link_down", where)


def resolve(fault, lab):
    return one_link(fault, lab)


def steps(fault, links, budget):
    return link_steps(fault, links, up=False)


def link_steps(fault, links, up):
    return with_undo(fault, "link", (links, up), (links, not up))


count = with_undo_count          # its step, and the one that ends it after `for`
