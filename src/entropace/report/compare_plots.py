"""Figures of ``entropace compare``: per task, each algorithm's mean curve over seeds and its
t confidence band; the entropy half-lives per task and the pace gap per algorithm, every seed and
the mean's t interval (matplotlib ``Figure`` + Agg canvas, no pyplot state)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from entropace._files import atomic_write
from entropace.report.runs import RunData
from entropace.report.stats import mean_ci, t_quantile

if TYPE_CHECKING:
    from entropace.report.measures import RunMeasures

__all__ = ["band", "draw_band_figure", "draw_half_life_figure"]


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


def _seeds_and_mean(
    ax: Any, x: float, width: float, values: Sequence[float], censored: Sequence[bool],
    colour: Any, level: float, label: str | None,
) -> None:  # fmt: skip
    """In the slot ``[x - width / 2, x + width / 2]``: each seed's value as a dot on the left
    part (spread sideways; open when censored) and the mean with its ``level`` t interval as an
    error bar on the right."""
    if not values:
        return
    xs = x + width * (np.linspace(-0.4, 0.0, len(values)) if len(values) > 1 else np.array([-0.2]))
    for xi, v, c in zip(xs, values, censored):
        ax.plot(xi, v, "o", ms=3.5, alpha=0.7, color=colour,
                markerfacecolor="none" if c else colour)  # fmt: skip
    ci = mean_ci(list(values), level)
    ax.errorbar(x + 0.25 * width, ci.mean, yerr=ci.half_width or 0.0, fmt="s", ms=5,
                color=colour, capsize=3, label=label)  # fmt: skip


def draw_half_life_figure(
    measures: Mapping[str, Sequence[RunMeasures]],
    tasks: Sequence[str],
    out: Path,
    *,
    level: float = 0.95,
    fraction: float = 0.5,
) -> bool:
    """Top: per task, each algorithm's entropy half-lives (one dot per seed, open when
    censored) and their mean with its t interval; bottom: the pace gap per algorithm, drawn the
    same way. False (nothing written) when no run has a half-life."""
    if not any(m.half_life for runs in measures.values() for m in runs):
        return False
    from matplotlib.figure import Figure

    algos = list(measures)
    colours = algorithm_colours(algos)
    slot = 0.8 / len(algos)
    width = max(6.0, min(16.0, 1.0 + len(tasks) * (0.6 + 0.3 * len(algos))))
    fig = Figure(figsize=(width, 7.0), dpi=100)
    ax_hl, ax_gap = fig.subplots(2, 1)
    for j, algo in enumerate(algos):
        runs = measures[algo]
        for i, task in enumerate(tasks):
            have = [m for m in runs if task in m.half_life]
            _seeds_and_mean(
                ax_hl, i - 0.4 + slot * (j + 0.5), slot, [m.half_life[task] for m in have],
                [m.half_life_censored.get(task, False) for m in have], colours[algo], level,
                f"{algo} (n={len(runs)})" if i == 0 else None,
            )  # fmt: skip
        gaps = [m for m in runs if m.pace_gap is not None]
        _seeds_and_mean(
            ax_gap, float(j), 0.8, [float(m.pace_gap or 0.0) for m in gaps],
            [bool(m.pace_gap_censored) for m in gaps], colours[algo], level, None,
        )  # fmt: skip
    ax_hl.set_xticks(range(len(tasks)), list(tasks), fontsize=8)
    ax_hl.set_xlim(-0.5, len(tasks) - 0.5)
    ax_hl.set_ylabel("step")
    ax_hl.set_title(
        f"entropy half-life per task (time to {fraction:g} of the start)\ndots: seeds (open: "
        f"censored at the last step); squares: mean and {level * 100:g}% t interval",
        fontsize=9,
    )
    ax_hl.legend(fontsize=7, loc="best", framealpha=0.7, ncols=max(1, len(algos) // 6))
    ax_gap.set_xticks(range(len(algos)), algos, rotation=30, ha="right", fontsize=8)
    ax_gap.set_xlim(-0.5, len(algos) - 0.5)
    ax_gap.set_title("pace_gap: slowest minus fastest task's half-life, per run", fontsize=9)
    ax_gap.set_ylabel("steps")
    for ax in (ax_hl, ax_gap):
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    with atomic_write(out) as f:  # a symbolic link at ``out`` is replaced, never written through
        fig.savefig(f, format="png")
    return True
