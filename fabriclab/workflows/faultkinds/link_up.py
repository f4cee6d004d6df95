"""`link_up: A-B`: a link that is down comes up (the lab restores the fabric after the run)."""

from fabriclab.workflows.faultkinds import link_down
from fabriclab.workflows.faultkinds.common import check_name, with_undo_count

TARGET = link_down.TARGET
PARAMS = {}
resolve = link_down.resolve
count = with_undo_count


def check_entry(target, at, params, where):
    check_name(target, TARGET, "link_up", where)


def steps(fault, links, budget):
    return link_down.link_steps(fault, links, up=True)
