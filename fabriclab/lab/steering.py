"""Steering on a live lab: hand a plan (see apps/steering.py) to the routing app and wait until the
switches hold it.

The plan travels as the run folder's steering file (fabriclab.apps.control), which every routing
app watches; it is kept there, so a controller restart or a routing change reprograms it too.
"""

from __future__ import annotations

import itertools
import os

from fabriclab.apps import control
from fabriclab.apps.steering import SteeringError, steering_state
from fabriclab.errors import LabError

_generations = itertools.count(1)


def apply(lab, plan, timeout=10.0):
    """Install `plan` ({services, groups, routes}) on `lab`'s switches; LabError if it is malformed
    (checked here, before the controller sees it) or not programmed within `timeout`."""
    try:
        steering_state(lab.fabric, plan)
    except SteeringError as exc:
        raise LabError(str(exc)) from None
    generation = f"{os.getpid()}-{next(_generations)}"
    control.write_steering(control.RunFiles(lab.run.dir).steering, control.SteeringPlan(generation, dict(plan)))
    status = lab.controller.wait(
        lambda s: s.steering.generation == generation and (s.steering.error or s.programmed),
        timeout, "the switches to take the steering plan")
    if status.steering.error:
        raise LabError(f"the controller refused the steering plan: {status.steering.error}")
    return generation


def clear(lab, timeout=10.0):
    """Remove every steering entry (the routing app's own state stays)."""
    if lab.run is not None and lab.controller is not None:
        apply(lab, {}, timeout)
