"""`switch_down: SWITCH, for`: every link of the switch goes down (back up after `for`)."""

from fabriclab.workflows.faultkinds.common import check_name, named, with_undo, with_undo_count

TARGET = "a switch"
PARAMS = {"for": (float, False)}


def check_entry(target, at, params, where):
    check_name(target, TARGET, "switch_down", where)


def resolve(fault, lab):
    return named(fault, lab.fabric.switches, "switch")


def steps(fault, links, budget):
    return with_undo(fault, "switch", (fault.target, False), (fault.target, True))


count = with_undo_count          # its step, and the one that ends it after `for`
