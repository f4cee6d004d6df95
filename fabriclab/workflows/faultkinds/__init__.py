"""Fault kinds: one module each, implementing FaultKind, and one line each in KINDS.

A kind says what its target is, which parameters it takes, how a target is checked against the
fabric, and the Lab operations (`Step`s) it expands into. `workflows/faults.py` reads scenario
entries, checks them, and runs the steps on a timeline; it names no kind itself.
"""

from __future__ import annotations

import importlib
from typing import Protocol

# name -> module (the name is also the key a scenario's fault entry uses)
MODULES = {
    "link_down": "fabriclab.workflows.faultkinds.link_down",
    "link_up": "fabriclab.workflows.faultkinds.link_up",
    "flap": "fabriclab.workflows.faultkinds.flap",
    "random_flaps": "fabriclab.workflows.faultkinds.random_flaps",
    "degrade": "fabriclab.workflows.faultkinds.degrade",
    "slow_receiver": "fabriclab.workflows.faultkinds.slow_receiver",
    "loss": "fabriclab.workflows.faultkinds.loss",
    "switch_down": "fabriclab.workflows.faultkinds.switch_down",
    "buffer": "fabriclab.workflows.faultkinds.buffer",
    "latency": "fabriclab.workflows.faultkinds.latency",
    "controller_restart": "fabriclab.workflows.faultkinds.controller_restart",
}


class FaultKind(Protocol):
    """What a fault kind's module defines."""

    TARGET: str          # what the target is, for messages: "a link A-B"
    PARAMS: dict         # {parameter: (float | int, required)}; ranges are faults.BOUNDS'

    def check_entry(self, target, at, params, where):
        """LabError (starting with `where`) for a target or parameters the kind refuses."""

    def resolve(self, fault, lab):
        """The links the fault acts on ([] if none); LabError for a target the fabric lacks."""

    def steps(self, fault, links, budget):
        """[Step] at times after fault.at; LabError past `budget` steps."""

    def count(self, fault, links, budget):
        """How many steps `steps` would make, without making them (a plan's check counts the
        steps of every run; a timeline holds up to 10,000); LabError past `budget`."""


def kinds():
    """{name: module} of every kind, in MODULES' order."""
    return {name: importlib.import_module(path) for name, path in MODULES.items()}


def kind(name):
    return importlib.import_module(MODULES[name])
