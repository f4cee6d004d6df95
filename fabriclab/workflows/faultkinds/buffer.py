"""`buffer: SWITCH, fraction, for`: the switch's usable buffer is cut to `fraction` of each port's,
and what would queue past it is tail-dropped, the lossless class too (seed 000, 6.4.2: an outdated
SRAM size dropped RoCE once a buffer was half full). Needs the spec's queue model."""

from fabriclab.errors import LabError
from fabriclab.workflows.faultkinds.common import check_name, named, with_undo, with_undo_count

TARGET = "a switch"
PARAMS = {"fraction": (float, True), "for": (float, False)}


def check_entry(target, at, params, where):
    check_name(target, TARGET, "buffer", where)


def resolve(fault, lab):
    if lab.fabric.spec.queues is None:
        raise LabError(f"a buffer fault cuts the queue model's buffers; spec {lab.fabric.spec.name} "
                       f"has no queues: section")
    return named(fault, lab.fabric.switches, "switch")


def steps(fault, links, budget):
    return with_undo(fault, "buffer", (fault.target, fault.params["fraction"]), (fault.target, None))


count = with_undo_count          # its step, and the one that ends it after `for`
