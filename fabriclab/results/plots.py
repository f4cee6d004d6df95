"""PNG charts a person reads at a glance, written next to a results.json.

A few shapes cover the lab's results: a bar per alternative (routing schemes), lines over message
size (busbw per size), cumulative distributions (capacity under failures, completion times), rates
over time against the faults that hit them, and a heatmap of every link direction over time.
matplotlib runs headless (Agg) and is imported only when a chart is drawn.
"""

from __future__ import annotations

import pathlib


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def _written(plt, fig, path):
    """Write the figure and free it, whatever happens."""
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)


def _finish(plt, fig, ax, path, title, xlabel, ylabel):
    """Labels, grid, legend and title of a one-panel chart, then write it and free the figure."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    return _written(plt, fig, path)


def bars(path, title, labels, panels):
    """One panel per (ylabel, values) in `panels`, a bar per label."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (ylabel, values) in zip(axes[0], panels):
        shown = [v if v is not None else 0.0 for v in values]
        bars_ = ax.bar(labels, shown, color="#4C72B0")
        ax.bar_label(bars_, labels=[f"{v:.3g}" if v is not None else "-" for v in values], fontsize=8)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    return _written(plt, fig, path)


def hbars(path, title, labels, values, xlabel, colors=None, errors=None):
    """A horizontal bar per label (long labels stay readable), each with its value; `colors`, one
    per bar, tells sources apart (the paper's figure, the lab's, a model's); `errors`, one (lo, hi)
    or None per bar, draws an interval around the value (a mean over draws)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 0.9 + 0.45 * len(labels)))
    xerr = None
    if errors and any(e is not None for e in errors):
        spans = [(v - e[0], e[1] - v) if e is not None else (0.0, 0.0) for v, e in zip(values, errors)]
        xerr = [[s[0] for s in spans[::-1]], [s[1] for s in spans[::-1]]]
    rows = ax.barh(labels[::-1], values[::-1], color=(colors or ["#4C72B0"] * len(values))[::-1],
                   xerr=xerr, capsize=3 if xerr else 0, error_kw={"elinewidth": 1, "ecolor": "#333333"})
    ax.bar_label(rows, labels=[f"{v:.3g}" for v in values[::-1]], fontsize=8, padding=2)
    ax.set_xlabel(xlabel)
    top = max([e[1] for e in errors or () if e is not None] + list(values), default=1)
    ax.set_xlim(0, top * 1.18 or 1)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title, fontsize=10)
    return _written(plt, fig, path)


def lines(path, title, xs, series, xlabel, ylabel, log_x=True, reference=None, bands=None):
    """A line per name in `series` ({name: ys}) over `xs`; `reference` draws a dashed limit;
    `bands` ({name: (los, his)}) shades an interval around a line (a mean over draws)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, ys in series.items():
        line, = ax.plot(xs, ys, marker="o", label=name)
        if bands and name in bands:
            los, his = bands[name]
            ax.fill_between(xs, los, his, color=line.get_color(), alpha=0.2, linewidth=0)
    if reference is not None:
        value, label = reference
        ax.axhline(value, linestyle="--", color="grey", label=label)
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    return _finish(plt, fig, ax, path, title, xlabel, ylabel)


def cdfs(path, title, series, xlabel):
    """Empirical CDFs: `series` is {name: [[x, cumulative share], ...]} or {name: [values]}."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, data in series.items():
        if data and isinstance(data[0], (list, tuple)):
            xs, ys = [p[0] for p in data], [p[1] for p in data]
        else:
            xs = sorted(data)
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=name)
    ax.set_ylim(0, 1.02)
    return _finish(plt, fig, ax, path, title, xlabel, "share")


def timeseries(path, title, panels, xlabel="time (s)"):
    """Stacked panels over a shared time axis: `panels` is a list of (ylabel, {name: (ts, ys)}).
    Step lines, because every value is a sample held until the next one."""
    plt = _pyplot()
    fig, axes = plt.subplots(len(panels), 1, figsize=(7.6, 2.3 * len(panels) + 0.6), sharex=True,
                             squeeze=False)
    for ax, (ylabel, series) in zip(axes[:, 0], panels):
        for name, (ts, ys) in series.items():
            ax.step(ts, ys, where="post", label=name, linewidth=1.0)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        if series:
            ax.legend(fontsize=7, loc="upper right", ncol=2 if len(series) > 4 else 1)
    axes[-1, 0].set_xlabel(xlabel)
    fig.suptitle(title, fontsize=10)
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)


def timeline(path, title, series, xlabel, ylabel, spans=None, marks=None):
    """Step lines over time (`series` is {name: (ts, ys)}) with the periods something was wrong
    shaded (`spans`: [(start, end, label)]) and instants drawn as dashed lines (`marks`: [(t, label)]),
    so a dip reads against the fault that caused it."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.6, 3.6))
    for name, (ts, ys) in series.items():
        ax.step(ts, ys, where="post", label=name, linewidth=1.0)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (start, end, label) in enumerate(spans or ()):
        ax.axvspan(start, end, color=colors[(i + 3) % len(colors)], alpha=0.15, label=label)
    for i, (t, label) in enumerate(marks or ()):
        ax.axvline(t, linestyle="--", linewidth=1.0, color=colors[(i + 3) % len(colors)], label=label)
    ax.set_ylim(bottom=0)
    return _finish(plt, fig, ax, path, title, xlabel, ylabel)


def heatmap(path, title, row_labels, times, matrix, xlabel, clabel, vmax=None, marks=None):
    """A row per series (e.g. link directions), a column per time bin (`times` are bin starts), colour
    the value; `marks` ([(t, label)]) draw instants as vertical lines. Labels shrink so ~100 rows stay
    readable; beyond ~150 only every k-th row is named."""
    import math

    import numpy as np

    plt = _pyplot()
    data = np.asarray(matrix, dtype=float).reshape(len(row_labels), len(times))
    rows = max(len(row_labels), 1)
    font = max(4.0, min(8.0, 560 / rows))
    height = min(18.0, max(3.0, rows * font * 1.5 / 72 + 1.6))
    fig, ax = plt.subplots(figsize=(9.0, height))
    width = float(np.median(np.diff(times))) if len(times) > 1 else 1.0
    start = float(times[0]) if len(times) else 0.0
    end = float(times[-1]) + width if len(times) else 1.0
    if vmax is None:
        vmax = float(np.nanmax(data)) if data.size and np.nanmax(data) > 0 else 1.0
    image = ax.imshow(data, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0, vmax=vmax,
                      extent=(start, end, len(row_labels) - 0.5, -0.5))
    step = max(1, math.ceil(len(row_labels) / 150))
    ax.set_yticks(range(0, len(row_labels), step))
    ax.set_yticklabels(row_labels[::step], fontsize=font)
    for t, label in marks or ():
        ax.axvline(t, color="red", linestyle="--", linewidth=0.9)
        ax.text(t, 0.99, f" {label}", transform=ax.get_xaxis_transform(), rotation=90, va="top", ha="right",
                fontsize=7, color="white", bbox={"facecolor": "black", "alpha": 0.5, "pad": 1, "linewidth": 0})
    bar = fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    bar.set_label(clabel)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)
