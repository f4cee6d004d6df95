"""`latency: SWITCH | A-B, us, for`: every packet crossing the switch (each port it sends from) or
the link (each way) waits `us` microseconds more, in the real fabric's time, stretched by the time
scale as the spec's `delay:` is (seed 000, 6.4.1: a switch image that raised port-to-port latency
while no congestion metric moved). It changes the ports' netem delay in place: a full kernel, and
a spec whose cables there have a `delay:`; refused in one line otherwise."""

from fabriclab.workflows.faultkinds.common import check_name, one_link, with_undo, with_undo_count

TARGET = "a switch or a link A-B"
PARAMS = {"us": (float, True), "for": (float, False)}


def check_entry(target, at, params, where):
    check_name(target, TARGET, "latency", where)


def _target(fault, lab):
    """A switch's name, or the links of A-B."""
    return fault.target if fault.target in lab.fabric.switches or "-" not in fault.target else one_link(fault, lab)


def resolve(fault, lab):
    target = _target(fault, lab)
    lab.latency_ports(target)
    return [] if isinstance(target, str) else target


def steps(fault, links, budget):
    target = links or fault.target
    return with_undo(fault, "latency", (target, fault.params["us"]), (target, None))


count = with_undo_count          # its step, and the one that ends it after `for`
