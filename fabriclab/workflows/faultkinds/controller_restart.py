"""`controller_restart: true`: the controller process restarts; the switches keep their entries
until it reconnects and rewrites them."""

from fabriclab.errors import LabError
from fabriclab.workflows.faultsteps import Step

TARGET = "true"
PARAMS = {}


def check_entry(target, at, params, where):
    if target is not True:
        raise LabError(f"{where}: controller_restart takes `true`")


def resolve(fault, lab):
    return []


def steps(fault, links, budget):
    return [Step(fault.at, fault.index, "controller", ())]


def count(fault, links, budget):
    return 1
