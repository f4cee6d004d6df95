"""The experiments' pictures: a run's queues over time by hop, and runs side by side."""

from __future__ import annotations

from fabriclab.results import plots


def queue_timeline(series, path, title, origin=0.0):
    """Three panels over time, one line per hop (NIC->leaf, leaf->spine, spine->leaf, ...):
    lossless bytes queued at that hop, CE marks since the start, and ports holding a pause on
    their upstream (the pause goes from the hop's first node to its second). Time 0 is `origin`
    (seconds into the series: the measured traffic's start)."""
    ts = [t - origin for t in series.times]
    occupancy = {hop: (ts, values / 1024) for hop, values in series.hop_series("occ").items()}
    marks = {hop: (ts, values) for hop, values in series.hop_series("marks").items()}
    paused = {f"{hop} pauses": (ts, values) for hop, values in series.hop_series("paused").items()}
    timing = series.timing()
    reached = timing.get("reached_median_s")
    suffix = f" (sampled every {reached * 1e3:.1f} ms)" if reached else ""
    panels = [("queued KiB", occupancy)]
    if marks:
        panels.append(("CE marks (cumulative)", marks))
    else:
        suffix += ", no CE marks"
    panels.append(("ports holding a pause", paused))
    return plots.timeseries(path, title + suffix, panels, xlabel="time from the first measured iteration (s)")


def compare(path, title, labels, panels):
    """A bar per case in each panel: `panels` is [(ylabel, [value per case])]."""
    return plots.bars(path, title, list(labels), panels)
