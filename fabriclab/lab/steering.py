"""Steering on a live lab: hand a plan (see apps/steering.py) to the routing app and wait until the
switches hold it.

The plan travels as `steering.json` in the run folder, which every routing app watches; it is kept
there, so a controller restart or a routing change reprograms it too.
"""

from __future__ import annotations

import itertools
import json
import os

from fabriclab.apps.steering import SteeringError, steering_state
from fabriclab.errors import LabError

_generations = itertools.count(1)


def apply(lab, plan, timeout=10.0):
    """Install `plan` ({services, groups, routes}) on `lab`'s switches; LabError if it is malformed
    (checked here, before the controller sees it) or not programmed within `timeout`."""
    plan = dict(plan)
    try:
        steering_state(lab.fabric, plan)
    except SteeringError as exc:
        raise LabError(str(exc)) from None
    plan["generation"] = generation = f"{os.getpid()}-{next(_generations)}"
    path = lab.run.path("steering.json")
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(plan, f, indent=1)
    os.replace(tmp, path)
    status = lab.controller.wait(
        lambda s: s.get("steering", {}).get("error") or
        (s.get("steering", {}).get("generation") == generation and s.get("programmed")),
        timeout, "the switches to take the steering plan")
    if status["steering"].get("error"):
        raise LabError(f"the controller refused the steering plan: {status['steering']['error']}")
    return generation


def clear(lab, timeout=10.0):
    """Remove every steering entry (the routing app's own state stays)."""
    if lab.run is not None and lab.controller is not None:
        apply(lab, {}, timeout)
