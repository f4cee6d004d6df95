"""What several fault kinds share: a target that is one link, a step with an optional undo."""

from __future__ import annotations

from fabriclab.errors import LabError
from fabriclab.loading import excerpt
from fabriclab.workflows.faultsteps import Step, split_link


def check_name(target, meaning, kind, where):
    if not isinstance(target, str) or not target:
        raise LabError(f"{where}: {kind} takes {meaning}, got {excerpt(target)}")


def named(fault, names, what):
    """[] when the fault's target is one of `names` (the fabric's hosts, its switches)."""
    if fault.target not in names:
        raise LabError(f"no {what} {excerpt(fault.target)}")
    return []


def one_link(fault, lab):
    return lab.resolve_link(*split_link(fault.target))


def with_undo_count(fault, links, budget):
    """How many steps with_undo makes: the fault's, and its end if it has `for`."""
    return 1 + ("for" in fault.params)


def with_undo(fault, action, args, undo_args):
    """The fault's step at `at`, and the one that ends it `for` seconds later if it has `for`."""
    out = [Step(fault.at, fault.index, action, args)]
    if "for" in fault.params:
        out.append(Step(fault.at + fault.params["for"], fault.index, action, undo_args, undo=True))
    return out
