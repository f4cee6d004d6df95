"""`slow_receiver: HOST, fraction, for`: the host takes in only `fraction` of its line rate."""

from fabriclab.workflows.faultkinds.common import check_name, named, with_undo, with_undo_count

TARGET = "a host"
PARAMS = {"fraction": (float, True), "for": (float, False)}


def check_entry(target, at, params, where):
    check_name(target, TARGET, "slow_receiver", where)


def resolve(fault, lab):
    return named(fault, lab.fabric.hosts, "host")


def steps(fault, links, budget):
    return with_undo(fault, "receiver", (fault.target, fault.params["fraction"]), (fault.target, None))


count = with_undo_count          # its step, and the one that ends it after `for`
