"""A fault and the Lab operations it expands into: what fault kinds (faultkinds/) make and the
timeline (faults.py) runs."""

from __future__ import annotations

import dataclasses

from fabriclab.errors import LabError
from fabriclab.loading import excerpt


@dataclasses.dataclass
class Fault:
    index: int
    kind: str
    target: object
    at: float
    params: dict

    @property
    def label(self):
        if self.kind == "controller_restart":
            return "controller restart"
        target = self.target if isinstance(self.target, str) else ", ".join(map(str, self.target))
        return f"{self.kind.replace('_', ' ')} {target}"


@dataclasses.dataclass
class Step:
    t: float            # seconds after the origin
    fault: int          # index of the fault it belongs to
    action: str         # a Lab operation: link, rate, receiver, switch, controller, loss
    args: tuple
    undo: bool = False  # the step ends (repairs) its fault


def split_link(text):
    """`l1-s1` or `l1-s1#2` -> (node1, node2, member or None)."""
    member = None
    if "#" in text:
        text, _, number = text.partition("#")
        if not number.isdigit() or int(number) < 1:
            raise LabError(f"bad link member in {text}#{excerpt(number)}: use A-B#N with N >= 1")
        member = int(number) - 1
    nodes = text.split("-")
    if len(nodes) != 2 or not all(nodes):
        raise LabError(f"bad link {excerpt(text)}: write it as A-B, e.g. l1-s1")
    return nodes[0], nodes[1], member
