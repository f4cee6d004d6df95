"""`switch_down: SWITCH, for`: every link of the switch goes down (back up after `for`)."""

from fabriclab.errors import LabError
from fabriclab.loading import excerpt
from fabriclab.workflows.faultkinds.common import check_name, with_undo, with_undo_count

TARGET = "a switch"
PARAMS = {"for": (float, False)}


def check_entry(target, at, params, where):
    check_name(target, TARGET, "switch_down", where)


def resolve(fault, lab):
    if fault.target not in lab.fabric.switches:
        raise LabError(f"no switch {excerpt(fault.target)}")
    return []


def steps(fault, links, budget):
    return with_undo(fault, "switch", (fault.target, False), (fault.target, True))


count = with_undo_count          # its step, and the one that ends it after `for`
