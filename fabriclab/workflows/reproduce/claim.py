"""A claim from a paper, and what the lab found when it checked it.

A claim names the packaged experiments it reads (or none: a model's claim), the paper's figure and
the conditions it was measured under, and a `measure(docs)` that turns one draw of the
experiments' results documents into a Finding: the lab's figure, the model's where one applies,
and the paper's direction as effects (figures against bounds). `agreement` judges the claim over
its draws' findings on each effect's interval (judge.py): agrees, inconclusive, flipped or not
judged, with the ratio lab / paper where the paper gives one number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

AGREES, INCONCLUSIVE, FLIPPED = "agrees", "inconclusive", "FLIPPED"
NOT_JUDGED, KNOWN = "not judged", "differs (known)"
STATUSES = (AGREES, INCONCLUSIVE, FLIPPED, KNOWN, NOT_JUDGED)


@dataclass(frozen=True)
class Claim:
    id: str                       # "000-eecmp-gain": the seed, then what it is about
    seed: str                     # "000"
    section: str                  # where in the paper: "4.3, Figure 7"
    statement: str                # the claim in one sentence
    paper: str                    # the paper's figure, as the paper gives it
    paper_value: float | None     # the number the lab's is set against (None: a direction only)
    experiments: tuple            # packaged experiments read (empty: the claim is a model's)
    measure: Callable             # measure(docs: {experiment: results document}) -> Finding, per draw
    conditions: str               # the paper's conditions, and how the lab sets them
    differs: str = ""             # why the lab's figure differs from the paper's, where it does
    reproduced: bool = True       # False: the lab is known not to reproduce the direction, for the
                                  # reason `differs` gives; a flip is then reported, not failed
    draws: int = 5                # independent draws of its experiments in the full catalogue
    quick_draws: int = 2          # ... and in the quick one (CI): enough for an interval

    def draws_for(self, quick):
        """How many draws the claim is judged over: one for a model's claim (nothing is drawn)."""
        if not self.experiments:
            return 1
        return self.quick_draws if quick else self.draws


@dataclass(frozen=True)
class Effect:
    """One figure of a draw and the side of a bound the paper puts it on: `value > bound` (op '>')
    or `value < bound` (op '<'). A claim's direction is all of its effects; each is judged on its
    interval over the draws (judge.py)."""
    name: str                     # what the figure is: "E-ECMP busbw / ECMP busbw"
    value: float
    op: str                       # ">" or "<"
    bound: float

    @property
    def holds(self):
        return self.value > self.bound if self.op == ">" else self.value < self.bound


@dataclass
class Finding:
    lab: str                      # the lab's figure, as text (one draw's)
    lab_value: float | None       # the number set against the claim's paper_value
    effects: tuple                # (Effect, ...): the paper's direction as figures and sides
    direction: str                # what was checked, in words ("E-ECMP busbw > ECMP busbw")
    model: str = ""               # the flow or analytical model's figure, where it applies
    bars: list = field(default_factory=list)      # [(label, value)] for the claim's plot
    unit: str = ""                # what the bars measure ("uplink max/mean")
    lines: dict | None = None     # {"x": [...], "xlabel", "ylabel", "series": {name: [...]}}
    invalid: list = field(default_factory=list)   # why a run the finding reads is not valid
    against: float | None = None  # the figure to set lab_value against where the lab derives it
                                  # (a bound for the lab's own worker count); else the paper's

    @property
    def holds(self):
        """The paper's direction holds on this draw alone (every effect on its side)."""
        return bool(self.effects) and all(e.holds for e in self.effects)


@dataclass
class Judgement:
    status: str                   # one of STATUSES
    text: str                     # the agreement as the catalogue states it
    effects: list                 # per effect: {"name", "op", "bound", "mean", "lo", "hi", "n", "side"}
    lab: object                   # judge.Interval of lab_value over the judged draws (None: no figure)
    draws: int                    # draws judged (valid ones)
    invalid: list                 # why draws were left out


def agreement(claim, findings):
    """The claim's Judgement over its draws' findings: each effect's mean and 90% interval over the
    valid draws; the claim agrees when every interval is on the paper's side, is inconclusive when
    one straddles, and flipped when one is wholly on the wrong side (`differs (known)` for a claim
    the lab is known not to reproduce). Not judged when too few draws are valid: at least two, and
    at least half of those run (one where one was run: a model's claim)."""
    from fabriclab.workflows.reproduce import judge

    findings = list(findings)
    invalid = [f"draw {k}: {reason}" for k, f in enumerate(findings, 1) for reason in f.invalid[:1]]
    invalid += [f"draw {k}: {e.name} is not a finite number" for k, f in enumerate(findings, 1)
                if not f.invalid for e in f.effects if not _finite(e.value)]
    valid = [f for f in findings if not f.invalid and all(_finite(e.value) for e in f.effects)]
    needed = 1 if len(findings) == 1 else max(2, (len(findings) + 1) // 2)
    if len(valid) < needed:
        return Judgement(NOT_JUDGED, "not judged: " + "; ".join(invalid[:2]), [], None, len(valid), invalid)
    shapes = {tuple((e.name, e.op, e.bound) for e in f.effects) for f in valid}
    if len(shapes) != 1 or not valid[0].effects:
        raise ValueError(f"{claim.id}: every draw must state the same effects, at least one")
    effects, exact = [], not claim.experiments            # a model's figures are computed, not drawn
    for i, first in enumerate(valid[0].effects):
        iv = judge.interval([f.effects[i].value for f in valid], exact=exact)
        effects.append({"name": first.name, "op": first.op, "bound": first.bound, **iv.as_dict(),
                        "side": judge.side(iv, first.op, first.bound)})
    values = [f.lab_value for f in valid if _finite(f.lab_value)]
    lab = judge.interval(values, exact=exact) if values else None
    verdict = judge.verdict(e["side"] for e in effects)
    over = f"over {len(valid)} draw{'s' if len(valid) > 1 else ''}"
    stated = "; ".join(effect_text(e) for e in effects)
    judged = lambda status, text: Judgement(status, text, effects, lab, len(valid), invalid)   # noqa: E731
    if verdict == judge.WRONG:
        wrong = "; ".join(effect_text(e) for e in effects if e["side"] == judge.WRONG)
        if not claim.reproduced:
            return judged(KNOWN, f"the lab differs, as expected, {over}: {wrong}")
        return judged(FLIPPED, f"direction FLIPPED {over}: {wrong}")
    if verdict == judge.STRADDLE:
        return judged(INCONCLUSIVE, f"inconclusive {over}: {stated}")
    reference = valid[0].against or claim.paper_value
    if reference and lab is not None:
        whose = "bound" if valid[0].against else "paper"
        return judged(AGREES, f"ratio {lab.mean / reference:.2f} (lab / {whose}); agrees {over}: {stated}")
    return judged(AGREES, f"agrees {over}: {stated}")


def _finite(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def effect_text(e):
    """An effect judged over draws, as a catalogue says it: "E-ECMP / ECMP busbw 1.21 [1.05, 1.37] > 1"."""
    from fabriclab.workflows.reproduce.judge import Interval

    return f"{e['name']} {Interval(e['mean'], e['lo'], e['hi'], e['n']).text()} {e['op']} {e['bound']:g}"


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
