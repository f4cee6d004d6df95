"""`loss: A-B | fabric, fraction, for`: the link (or every link) loses that share of its packets."""

from fabriclab.errors import LabError
from fabriclab.workflows.faultkinds.common import check_name, one_link, with_undo, with_undo_count

TARGET = "a link A-B or `fabric` (every link)"
PARAMS = {"fraction": (float, True), "for": (float, False)}


def check_entry(target, at, params, where):
    check_name(target, TARGET, "loss", where)
    if params["fraction"] >= 1:
        raise LabError(f"{where}.fraction is the share of packets lost, in (0, 1); got {params['fraction']:g}")


def resolve(fault, lab):
    return list(lab.fabric.links) if fault.target == "fabric" else one_link(fault, lab)


def steps(fault, links, budget):
    return with_undo(fault, "loss", (links, fault.params["fraction"]), (links, 0.0))


count = with_undo_count          # its step, and the one that ends it after `for`
