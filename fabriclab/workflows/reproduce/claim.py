"""A claim from a paper, and what the lab found when it checked it.

A claim names the packaged experiments it reads (or none: a model's claim), the paper's figure and
the conditions it was measured under, and a `measure(docs)` that turns the experiments' results
documents into a Finding: the lab's figure, the model's where one applies, and whether the paper's
direction holds. The agreement is a ratio where the paper gives one number to set the lab's
against, and "direction only" where it gives a trend or an ordering.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

AGREES, FLIPPED, NOT_JUDGED, KNOWN = "agrees", "FLIPPED", "not judged", "differs (known)"


@dataclass(frozen=True)
class Claim:
    id: str                       # "000-eecmp-gain": the seed, then what it is about
    seed: str                     # "000"
    section: str                  # where in the paper: "4.3, Figure 7"
    statement: str                # the claim in one sentence
    paper: str                    # the paper's figure, as the paper gives it
    paper_value: float | None     # the number the lab's is set against (None: a direction only)
    experiments: tuple            # packaged experiments read (empty: the claim is a model's)
    measure: Callable             # measure(docs: {experiment: results document}) -> Finding
    conditions: str               # the paper's conditions, and how the lab sets them
    differs: str = ""             # why the lab's figure differs from the paper's, where it does
    reproduced: bool = True       # False: the lab is known not to reproduce the direction, for the
                                  # reason `differs` gives; a flip is then reported, not failed


@dataclass
class Finding:
    lab: str                      # the lab's figure, as text
    lab_value: float | None       # the number set against the claim's paper_value
    holds: bool                   # the paper's direction holds in the lab
    direction: str                # what was checked, in words ("E-ECMP busbw > ECMP busbw")
    model: str = ""               # the flow or analytical model's figure, where it applies
    bars: list = field(default_factory=list)      # [(label, value)] for the claim's plot
    unit: str = ""                # what the bars measure ("uplink max/mean")
    lines: dict | None = None     # {"x": [...], "xlabel", "ylabel", "series": {name: [...]}}
    invalid: list = field(default_factory=list)   # why a run the finding reads is not valid
    against: float | None = None  # the figure to set lab_value against where the lab derives it
                                  # (a bound for the lab's own worker count); else the paper's


def agreement(claim, finding):
    """(status, text): AGREES, FLIPPED, NOT_JUDGED or KNOWN, and the agreement as the catalogue
    states it."""
    if finding.invalid:
        return NOT_JUDGED, "not judged: " + "; ".join(finding.invalid[:2])
    if not finding.holds and not claim.reproduced:
        return KNOWN, f"the lab differs, as expected: not {finding.direction}"
    if not finding.holds:
        return FLIPPED, f"direction FLIPPED: expected {finding.direction}"
    value, reference = finding.lab_value, finding.against or claim.paper_value
    if reference and value is not None and math.isfinite(value):
        whose = "bound" if finding.against else "paper"
        return AGREES, f"ratio {value / reference:.2f} (lab / {whose}); direction holds"
    return AGREES, "direction only: " + finding.direction


def ratio(a, b):
    """a / b, None where either is missing or b is zero."""
    if a is None or b is None or not b:
        return None
    return a / b


def runs_by_label(doc):
    return {r["label"]: r for r in doc["runs"]}


def invalid_reasons(doc, *labels):
    """Why the named runs (all runs: none named) of a results document are not valid."""
    runs = [r for r in doc["runs"] if not labels or r["label"] in labels]
    return sorted({f"{r['label']}: {reason}" for r in runs for reason in r["invalid"]})
