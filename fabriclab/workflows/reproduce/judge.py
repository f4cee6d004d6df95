"""Judging a claim over independent draws: each figure's mean and its 90% interval, and the
claim's verdict from where those intervals lie against the paper's side.

A paper's claim is a statement about a distribution, not about one run: a collision of ECMP's hash,
a pause that lands on one ring step, decide single draws either way. So every claim states its
direction as effects (`Effect`: a figure and the side of a bound the paper puts it on), the
catalogue measures them on N draws (hash seeds and run order drawn afresh), and a claim

- agrees when every effect's whole interval is on the paper's side,
- is inconclusive when an interval straddles its bound (or one draw is all there is),
- flipped when some effect's whole interval is on the wrong side.

The interval is Student's t for the mean: with the few draws a lab can afford (3-10) a bootstrap
interval is too narrow (it cannot see beyond the draws it has), t's is the honest width.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

LEVEL = 0.90
AGREE, STRADDLE, WRONG = "agree", "straddle", "wrong"


@dataclass(frozen=True)
class Interval:
    mean: float
    lo: float | None        # None with fewer than two draws: no interval
    hi: float | None
    n: int

    def text(self, digits=3):
        if self.lo is None:
            return f"{self.mean:.{digits}g} (1 draw)"
        if self.lo == self.hi:
            return f"{self.mean:.{digits}g}" + (f" (all {self.n} draws)" if self.n > 1 else "")
        return f"{self.mean:.{digits}g} [{self.lo:.{digits}g}, {self.hi:.{digits}g}]"

    def as_dict(self):
        return {"mean": _round(self.mean), "lo": _round(self.lo), "hi": _round(self.hi), "n": self.n}


def _round(v):
    return None if v is None else round(float(v), 6)


def t_quantile(p, df):
    """Student's t quantile (scipy's; the flow model already needs scipy)."""
    from scipy import stats

    return float(stats.t.ppf(p, df))


def interval(values, level=LEVEL, exact=False):
    """The mean of `values` and its two-sided `level` t interval; None for no values. `exact`: the
    values are computed, not drawn (a model's), so the interval is the value itself. Values that
    are not finite numbers are refused: a draw that could not be measured is left out before."""
    values = [float(v) for v in values]
    if not values:
        return None
    if not all(math.isfinite(v) for v in values):
        raise ValueError("interval: a draw's figure is not a finite number")
    mean = statistics.fmean(values)
    if exact:
        return Interval(mean, min(values), max(values), len(values))
    if len(values) == 1:
        return Interval(mean, None, None, 1)
    half = t_quantile(0.5 + level / 2, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return Interval(mean, mean - half, mean + half, len(values))


def side(iv, op, bound):
    """Where interval `iv` lies against `value op bound` (op '>' or '<'): AGREE (all of it on that
    side), WRONG (all of it on the other side; the bound itself is not the paper's side), or
    STRADDLE (both, or no interval)."""
    if iv.lo is None:
        return STRADDLE
    above, below = iv.lo > bound, iv.hi <= bound
    if op == "<":
        above, below = iv.hi < bound, iv.lo >= bound
    elif op != ">":
        raise ValueError(f"an effect's side is '>' or '<', got {op!r}")
    return AGREE if above else WRONG if below else STRADDLE


def verdict(sides):
    """A claim's verdict from its effects' sides: WRONG if any is, AGREE if all are, else STRADDLE."""
    sides = list(sides)
    if WRONG in sides:
        return WRONG
    return AGREE if sides and all(s == AGREE for s in sides) else STRADDLE
