"""`degrade: A-B, rate_mbps | fraction, for`: the link runs slower (a degraded optic, a lane down)."""

from fabriclab.errors import LabError
from fabriclab.workflows.faultkinds.common import check_name, one_link, with_undo, with_undo_count

TARGET = "a link A-B"
PARAMS = {"rate_mbps": (float, False), "fraction": (float, False), "for": (float, False)}


def check_entry(target, at, params, where):
    check_name(target, TARGET, "degrade", where)
    if ("rate_mbps" in params) == ("fraction" in params):
        raise LabError(f"{where}: degrade takes one of rate_mbps or fraction")


def resolve(fault, lab):
    links = one_link(fault, lab)
    rate = fault.params.get("rate_mbps")
    if rate is not None and rate >= min(link.rate_mbps for link in links):
        raise LabError(f"degrade rate_mbps {rate:g} is not below the link's "
                       f"{min(link.rate_mbps for link in links):g} Mbit/s")
    return links


def steps(fault, links, budget):
    rate = fault.params.get("rate_mbps") or links[0].rate_mbps * fault.params["fraction"]
    return with_undo(fault, "rate", (links, rate), (links, None))


count = with_undo_count          # its step, and the one that ends it after `for`
