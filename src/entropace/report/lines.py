"""Drawing primitives of the report's panels: lines that leave gaps where a value is missing,
one style per task (colour, line style, marker), tasks with equal curves drawn as one labelled
line, and the per-task / per-key / held-out / clip-bound lines the panels of
:mod:`entropace.report.plots` are made of. Each ``plot_*`` draws one run into one axes and
returns whether it drew anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from entropace.report.overview import run_config
from entropace.report.runs import RunData, Series

__all__ = [
    "LINESTYLES",
    "MARKERS",
    "MARKERS_BELOW",
    "eval_tasks",
    "line",
    "on_run_steps",
    "pacer_limits",
    "plot_eps",
    "plot_eval",
    "plot_keys",
    "plot_task_field",
    "points",
    "task_colours",
    "task_styles",
]

#: Series with fewer points than this are drawn with markers (a single point is invisible as
#: a line; a few are easier to read as dots); longer ones get about this many markers.
MARKERS_BELOW = 25


def line(ax, steps: np.ndarray, values: np.ndarray, **kwargs) -> None:
    """``ax.plot`` that leaves a gap at every NaN (a value the run did not define is not 0
    and is not interpolated), with markers for short series (a 1-step run's single point
    shows), spread markers on long ones when a ``marker`` is given, and a marker on every
    point isolated between gaps (which a line alone would not show)."""
    values = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(values)
    if int(finite.sum()) < MARKERS_BELOW:
        kwargs.setdefault("marker", "o")
        kwargs.setdefault("markersize", 3.5)
    elif kwargs.get("marker"):
        kwargs.setdefault("markevery", max(1, len(values) // 10))
        kwargs.setdefault("markersize", 4)
    (drawn,) = ax.plot(steps, values, **kwargs)
    prev = np.concatenate([[False], finite[:-1]])
    nxt = np.concatenate([finite[1:], [False]])
    isolated = finite & ~prev & ~nxt
    if isolated.any() and drawn.get_marker() in (None, "None", "", " "):
        steps = np.asarray(steps)
        ax.plot(steps[isolated], values[isolated], linestyle="none", marker="o", markersize=3.5,
                color=drawn.get_color())  # fmt: skip


def task_colours(runs: Sequence[RunData]) -> dict[str, str]:
    """The same colour for a task in every run and figure."""
    tasks = sorted({t for run in runs for t in run.tasks})
    cycle = [f"C{i % 10}" for i in range(len(tasks))]
    return dict(zip(tasks, cycle))


#: Line styles and markers given to tasks in turn, so that tasks whose curves overlap (two
#: tasks at success 0) stay distinguishable where they part.
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P")


def task_styles(runs: Sequence[RunData]) -> dict[str, dict[str, Any]]:
    """Per task, the same ``color``, ``linestyle`` and ``marker`` in every run and figure."""
    return {
        task: {"color": colour, "linestyle": LINESTYLES[i % len(LINESTYLES)],
               "marker": MARKERS[i % len(MARKERS)]}
        for i, (task, colour) in enumerate(task_colours(runs).items())
    }  # fmt: skip


def on_run_steps(run: RunData, s: Series) -> Series:
    """``s`` on every step the run logged, NaN where it has no value: a metric of every step
    that is missing at some (no gradient-carrying token, a task not in the batch) leaves a gap
    there instead of a line drawn across."""
    values = np.full(run.steps.shape, np.nan)
    values[np.searchsorted(run.steps, s.steps)] = s.values
    return Series(run.steps, values)


def plot_task_field(ax, run: RunData, styles: dict[str, dict[str, Any]], name: str) -> bool:
    """One line per task of ``task/<k>/<name>``; tasks with the same values at the same steps
    are one line labelled ``db = kg`` (else the later one would hide the earlier)."""
    groups: dict[tuple[tuple[int, ...], tuple[float | None, ...]], list[str]] = {}
    series: dict[str, Series] = {}
    for task in run.tasks:
        s = run.task_series(task, name)
        if s is None or not len(s.finite()):
            continue
        s = on_run_steps(run, s)
        series[task] = s
        key = (tuple(s.steps.tolist()),
               tuple(None if np.isnan(v) else float(v) for v in s.values))  # fmt: skip
        groups.setdefault(key, []).append(task)
    for tasks in groups.values():
        s = series[tasks[0]]
        style = dict(styles.get(tasks[0], {"color": "k"}))
        if len(tasks) > 1:
            style.update(color="k", linestyle="-", marker="o")
        line(ax, s.steps, s.values, label=" = ".join(tasks), **style)
    return bool(groups)


def plot_keys(ax, run: RunData, keys: Sequence[str], every_step: bool = True) -> bool:
    """One line per key; ``every_step``: a metric of every step (gaps where it is missing,
    :func:`on_run_steps`), else one of some steps (``audit.every``), drawn through them."""
    drawn = False
    for i, key in enumerate(keys):
        s = run.get(key)
        if s is None or not len(s.finite()):
            continue
        s = on_run_steps(run, s) if every_step else s
        line(ax, s.steps, s.values, color=f"C{i}", label=key)
        drawn = True
    return drawn


def plot_eval(ax, run: RunData, styles: dict[str, dict[str, Any]]) -> bool:
    """Held-out greedy success ``eval/<k>/success`` per task (step 0: before the first
    update), tasks with equal curves as one line."""
    drawn = False
    groups: dict[tuple[tuple[int, ...], tuple[float, ...]], list[str]] = {}
    for task in eval_tasks(run):
        s = run.get(f"eval/{task}/success")
        if s is not None and len(s.finite()):
            groups.setdefault(points(s), []).append(task)
    for (steps, values), tasks in groups.items():
        style = dict(styles.get(tasks[0], {"color": "k"}))
        if len(tasks) > 1:
            style.update(color="k", linestyle="-", marker="o")
        style["marker"] = style.get("marker") or "o"
        line(ax, np.asarray(steps), np.asarray(values), label=" = ".join(tasks), **style)
        drawn = True
    return drawn


def eval_tasks(run: RunData) -> list[str]:
    """Tasks with an ``eval/<k>/success`` key, sorted."""
    return sorted(k[5:-8] for k in run.series if k.startswith("eval/") and k.endswith("/success")
                  and k.count("/") == 2)  # fmt: skip


Points = tuple[tuple[int, ...], tuple[float, ...]]


def points(s: Series | None) -> Points:
    """A series' finite ``(steps, values)`` as hashable tuples (empty for None)."""
    if s is None:
        return (), ()
    f = s.finite()
    return tuple(f.steps.tolist()), tuple(f.values.tolist())


def pacer_limits(run: RunData) -> tuple[float, float] | None:
    """``(eps_min, eps_max)`` of EPPO's pacer from ``RUN/config.yaml`` when the run's clip rule
    is the per-task pacer (``algorithm.clip_rule: pacer``, ``pacer.task_wise``), else None."""
    config = run_config(run.path)
    algorithm = config.get("algorithm") if isinstance(config.get("algorithm"), dict) else {}
    pacer = algorithm.get("pacer") if isinstance(algorithm.get("pacer"), dict) else {}
    if algorithm.get("clip_rule") != "pacer" or pacer.get("task_wise") is False:
        return None
    lo, hi = pacer.get("eps_min"), pacer.get("eps_max")
    if isinstance(lo, int | float) and isinstance(hi, int | float):
        return float(lo), float(hi)
    return None


def plot_eps(ax, run: RunData, styles: dict[str, dict[str, Any]]) -> bool:
    """eps_low solid, eps_high dashed, per task. Tasks with identical bounds at every step (a
    fixed clip, EPPO's warmup) share one pair of lines labelled with their names (``all
    tasks``) and, when constant, the value; equal eps_low and eps_high are one line. EPPO's
    floor and ceiling of eps_low (``pacer.eps_min`` / ``eps_max``) are grey dotted lines."""
    groups: dict[tuple[Points, Points], list[str]] = {}
    for task in run.tasks:
        lo = points(run.task_series(task, "eps_low"))
        hi = points(run.task_series(task, "eps_high"))
        if lo[0] or hi[0]:
            groups.setdefault((lo, hi), []).append(task)
    for (lo, hi), tasks in groups.items():
        colour = styles.get(tasks[0], {}).get("color", "k") if len(tasks) == 1 else "k"
        label = "all tasks" if len(tasks) == len(run.tasks) > 1 else ", ".join(tasks)
        same = lo == hi
        constant = [sorted(set(part[1])) for part in ((lo,) if same else (lo, hi)) if part[0]]
        if all(len(c) == 1 for c in constant):
            label += " (fixed " + " / ".join(f"{c[0]:g}" for c in constant) + ")"
        if lo[0]:
            line(ax, np.asarray(lo[0]), np.asarray(lo[1]), color=colour,
                  label=f"{label}: eps_low = eps_high" if same else label)  # fmt: skip
        if hi[0] and not same:
            line(ax, np.asarray(hi[0]), np.asarray(hi[1]), color=colour, linestyle="--",
                  label=None if lo[0] else label)  # fmt: skip
    limits = pacer_limits(run) if groups else None
    if limits is not None:
        for value, name in zip(limits, ("floor eps_min", "ceiling eps_max"), strict=True):
            ax.axhline(value, color="0.5", linestyle=":", linewidth=1.0,
                       label=f"EPPO {name} = {value:g}")  # fmt: skip
    return bool(groups)
