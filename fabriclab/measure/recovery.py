"""How traffic took a fault: the delivered rate before it, how far it fell, and how long it took to
come back (seed 002 6.5: recovery time of a flap; seed 000 6.3: link flaps seen by the job).

The input is the total rate the NICs received, in bins (PortSeries.delivered): what the fabric
delivered to the collective, whatever path it took.
"""

from __future__ import annotations

import statistics

LOOKBACK_S = 0.5          # the baseline is the mean of this long of traffic before the fault
# A job idles between its iterations (and after its warm-up): a fault that strikes in such a gap
# takes its baseline from the traffic before the gap, looking back at most this far
SEARCH_S = 4 * LOOKBACK_S
FALL = 0.5                # "hit": a bin below half the baseline
BASELINE_FLOOR = 0.05     # a baseline under 5 % of the run's peak is start-up, not a baseline


def impact(times, mbps, fault_at, end=None, lookback_s=LOOKBACK_S, fall=FALL):
    """Seconds and Mbit/s around one fault at series time `fault_at` (bins of `times`/`mbps`, up
    to `end`): baseline before it, the lowest bin after it, whether the rate fell below `fall` x
    baseline, the recovery time (from the fault to the first bin back at or above that line; 0
    when it never fell, None when it never came back) and the mean rate from then on.

    The baseline is the mean of the last `lookback_s` of bins that carried traffic (above the
    floor) within SEARCH_S before the fault; `idle_before_s` says how long the fabric had delivered
    nothing when the fault struck (0 when it struck mid-traffic). A fault in such a gap "falls"
    until the job sends again: the series cannot tell a job's pause from the fault's."""
    width = _width(times)
    end = times[-1] + width if end is None else end
    floor = BASELINE_FLOOR * max(mbps, default=0.0)
    earlier = [(t, m) for t, m in zip(times, mbps) if fault_at - SEARCH_S <= t and t + width <= fault_at]
    busy = [(t, m) for t, m in earlier if m > floor]
    if busy:
        # the bins within lookback_s of the last busy bin, idle ones among them included
        last = busy[-1][0]
        before = [m for t, m in earlier if last - lookback_s + width - 1e-9 <= t <= last]
    else:
        before = []
    after = [(t, m) for t, m in zip(times, mbps) if t >= fault_at and t < end]
    base = statistics.fmean(before) if before else 0.0
    if not after or base <= floor:
        return {"baseline_mbps": None, "recovery_s": None,
                "note": "no traffic before the fault to compare with" if after else "no traffic after the fault"}
    idle = max(0.0, fault_at - (busy[-1][0] + width))
    low_t, low = min(after, key=lambda p: p[1])
    fell, back_at = False, None
    for t, m in after:
        if m < fall * base:
            fell = True
        elif fell:
            back_at = t
            break
    recovery = 0.0 if not fell else (None if back_at is None else round(back_at - fault_at, 3))
    settled_from = fault_at if not fell else back_at
    settled = [m for t, m in after if settled_from is not None and t >= settled_from]
    settled_mbps = statistics.fmean(settled) if settled else None
    return {"baseline_mbps": round(base, 3), "idle_before_s": round(idle, 3), "min_mbps": round(low, 3), "min_at_s": round(low_t - fault_at, 3),
            "fell": fell, "recovery_s": recovery,
            "after_mbps": None if settled_mbps is None else round(settled_mbps, 3),
            "retained": None if settled_mbps is None or base <= 0 else round(settled_mbps / base, 3)}


def _width(times):
    return times[1] - times[0] if len(times) > 1 else 0.0
