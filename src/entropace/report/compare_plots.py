"""Figures of ``entropace compare``: per task, each algorithm's mean curve over seeds and its
t confidence band (matplotlib ``Figure`` + Agg canvas, no pyplot state)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from entropace._files import atomic_write
from entropace.report.runs import RunData
from entropace.report.stats import t_quantile

__all__ = ["band", "draw_band_figure"]


def algorithm_colours(algos: list[str]) -> dict[str, Any]:
    """A distinct colour per algorithm: matplotlib's 10-colour cycle, then ``tab20``'s light
    shades (so an 11th algorithm never repeats the first one's colour)."""
    import matplotlib

    if len(algos) <= 10:
        return {a: f"C{i}" for i, a in enumerate(algos)}
    cmap = matplotlib.colormaps["tab20"]
    order = [2 * i for i in range(10)] + [2 * i + 1 for i in range(10)]
    return {a: cmap(order[i % 20]) for i, a in enumerate(algos)}


def band(
    runs: Sequence[RunData], key: str, level: float = 0.95
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """``(steps [m], mean [m], half_width [m] or None)`` of ``key`` over ``runs``.

    On the ``m`` steps where every run has a finite value; ``half_width`` is the
    ``t_{(1+level)/2, n-1} s / sqrt(n)`` of each step (None with one run). None if there are no
    common steps.
    """
    series = [r.get(key) for r in runs]
    if not series or any(s is None for s in series):
        return None
    finite = [s.finite() for s in series if s is not None]
    common = np.array(sorted(set.intersection(*(set(f.steps.tolist()) for f in finite))))
    if common.size == 0:
        return None
    vals = np.stack([f.values[np.searchsorted(f.steps, common)] for f in finite])  # [n, m]
    mean = vals.mean(axis=0)
    n = vals.shape[0]
    if n < 2:
        return common, mean, None
    half = t_quantile(0.5 + level / 2, n - 1) * vals.std(axis=0, ddof=1) / np.sqrt(n)
    return common, mean, half


def draw_band_figure(
    data: Mapping[str, Mapping[int, RunData]],
    tasks: Sequence[str],
    field: str,
    out: Path,
    *,
    level: float = 0.95,
    label: str = "",
) -> bool:
    """One axes per task (``task/<k>/<field>``), one colour per algorithm; False (nothing
    written) if no algorithm has the field for any task."""
    from matplotlib.figure import Figure

    curves = {
        t: {a: band(list(runs.values()), f"task/{t}/{field}", level) for a, runs in data.items()}
        for t in tasks
    }
    if not any(b is not None for per in curves.values() for b in per.values()):
        return False
    colours = algorithm_colours(list(data))
    ncols = min(3, len(tasks))
    nrows = -(-len(tasks) // ncols)
    fig = Figure(figsize=(5.0 * ncols, 3.4 * nrows), dpi=100)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    for ax, task in zip(axes, tasks):
        ax.set_title(f"{task}: {label or field}", fontsize=9)
        drawn = False
        for algo, b in curves[task].items():
            if b is None:
                continue
            steps, mean, half = b
            n = len(data[algo])
            ax.plot(steps, mean, color=colours[algo], label=f"{algo} (n={n})", linewidth=1.6)
            if half is not None:
                ax.fill_between(steps, mean - half, mean + half, color=colours[algo], alpha=0.2)
            drawn = True
        if drawn:
            ax.legend(fontsize=7, loc="best", framealpha=0.7)
            ax.grid(alpha=0.3)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("step")
    for ax in axes[len(tasks) :]:
        ax.set_visible(False)
    fig.tight_layout()
    with atomic_write(out) as f:  # a symbolic link at ``out`` is replaced, never written through
        fig.savefig(f, format="png")
    return True
