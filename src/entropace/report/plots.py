"""The report's figures: one column per run, one row per panel, a fixed colour per task.

Matplotlib's object API with the Agg canvas (``Figure`` + ``savefig``), so no global backend or
pyplot state is touched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from entropace._files import atomic_write
from entropace.diagnostics import ema_smooth
from entropace.report.runs import RunData, Series

__all__ = [
    "FigureSpec",
    "Panel",
    "audit_figure",
    "draw_figure",
    "figures",
    "render_figure",
    "task_colours",
]

# A panel draws one run into one axes and returns False if the run has none of its data.
PanelFn = Callable[["object", RunData, dict[str, str]], bool]


@dataclass(frozen=True)
class Panel:
    """One axes per run: its title, how to draw it, whether a run has any of its metrics, and
    what the figure's caption says about it (only when it is drawn)."""

    title: str
    draw: PanelFn
    has_data: Callable[[RunData], bool]
    caption: str = ""


@dataclass(frozen=True)
class FigureSpec:
    """One PNG: its file name, a caption and its panels (rows). A caption ending in ``:`` is
    completed by the captions of the panels drawn (:meth:`caption_for`)."""

    filename: str
    caption: str
    panels: tuple[Panel, ...]

    def needs(self, run: RunData) -> bool:
        """Whether ``run`` has the metrics of at least one panel."""
        return any(p.has_data(run) for p in self.panels)

    def drawn(self, runs: Sequence[RunData]) -> list[Panel]:
        """The panels some run has data for (the figure's rows)."""
        return [p for p in self.panels if any(p.has_data(run) for run in runs)]

    def caption_for(self, runs: Sequence[RunData]) -> str:
        """The caption of the figure drawn for ``runs``: it names only the panels drawn."""
        parts = [p.caption for p in self.drawn(runs) if p.caption]
        if not self.caption.endswith(":"):
            return self.caption
        return f"{self.caption} {'; '.join(parts)}."


#: Series with fewer points than this are drawn with markers (a single point is invisible as
#: a line; a few are easier to read as dots).
MARKERS_BELOW = 25


def _line(ax, steps: np.ndarray, values: np.ndarray, **kwargs) -> None:
    """``ax.plot`` with markers for short series (a 1-step run's single point shows)."""
    if len(steps) < MARKERS_BELOW:
        kwargs.setdefault("marker", "o")
        kwargs.setdefault("markersize", 3.5)
    ax.plot(steps, values, **kwargs)


def task_colours(runs: Sequence[RunData]) -> dict[str, str]:
    """The same colour for a task in every run and figure."""
    tasks = sorted({t for run in runs for t in run.tasks})
    cycle = [f"C{i % 10}" for i in range(len(tasks))]
    return dict(zip(tasks, cycle))


def _plot_task_field(ax, run: RunData, colours: dict[str, str], name: str) -> bool:
    drawn = False
    for task in run.tasks:
        s = run.task_series(task, name)
        if s is None or not len(s.finite()):
            continue
        f = s.finite()
        _line(ax, f.steps, f.values, color=colours.get(task, "k"), label=task)
        drawn = True
    return drawn


def _plot_keys(ax, run: RunData, keys: Sequence[str]) -> bool:
    drawn = False
    for i, key in enumerate(keys):
        s = run.get(key)
        if s is None or not len(s.finite()):
            continue
        f = s.finite()
        _line(ax, f.steps, f.values, color=f"C{i}", label=key)
        drawn = True
    return drawn


def entropy_panel(ema: float | None, crossings: dict[str, list[tuple[int, float]]]) -> Panel:
    """Per-task entropy: raw (thin) and EMA-smoothed (thick), crossovers marked with x."""

    def draw(ax, run: RunData, colours: dict[str, str]) -> bool:
        drawn = False
        for task in run.tasks:
            s = run.task_series(task, "entropy")
            if s is None or not len(s.finite()):
                continue
            f = s.finite()
            c = colours.get(task, "k")
            if ema is not None:
                ax.plot(f.steps, f.values, color=c, alpha=0.3, linewidth=0.8)
                smooth = ema_smooth(f.values, ema)
                _line(ax, f.steps, smooth, color=c, label=task, linewidth=1.8)
            else:
                _line(ax, f.steps, f.values, color=c, label=task)
            drawn = True
        marks = crossings.get(run.name, [])
        if marks:
            xs, ys = zip(*marks)
            ax.scatter(xs, ys, marker="x", color="k", s=40, zorder=5, label="crossover")
        return drawn

    title = "task entropy h_k" + (f" (EMA {ema})" if ema is not None else "")
    return Panel(title, draw, _has_task_field("entropy"))


def _task_panel(title: str, name: str, caption: str = "") -> Panel:
    return Panel(
        title,
        lambda ax, run, colours: _plot_task_field(ax, run, colours, name),
        _has_task_field(name),
        caption,
    )


Points = tuple[tuple[int, ...], tuple[float, ...]]


def _points(s: Series | None) -> Points:
    """A series' finite ``(steps, values)`` as hashable tuples (empty for None)."""
    if s is None:
        return (), ()
    f = s.finite()
    return tuple(f.steps.tolist()), tuple(f.values.tolist())


def _eps_panel(ax, run: RunData, colours: dict[str, str]) -> bool:
    """eps_low solid, eps_high dashed, per task. Tasks with identical bounds at every step (a
    fixed clip, EPPO's warmup) share one pair of lines labelled with their names (``all
    tasks``) and, when constant, the value; equal eps_low and eps_high are one line."""
    groups: dict[tuple[Points, Points], list[str]] = {}
    for task in run.tasks:
        lo = _points(run.task_series(task, "eps_low"))
        hi = _points(run.task_series(task, "eps_high"))
        if lo[0] or hi[0]:
            groups.setdefault((lo, hi), []).append(task)
    for (lo, hi), tasks in groups.items():
        colour = colours.get(tasks[0], "k") if len(tasks) == 1 else "k"
        label = "all tasks" if len(tasks) == len(run.tasks) > 1 else ", ".join(tasks)
        same = lo == hi
        constant = [sorted(set(part[1])) for part in ((lo,) if same else (lo, hi)) if part[0]]
        if all(len(c) == 1 for c in constant):
            label += " (fixed " + " / ".join(f"{c[0]:g}" for c in constant) + ")"
        if lo[0]:
            _line(ax, np.asarray(lo[0]), np.asarray(lo[1]), color=colour,
                  label=f"{label}: eps_low = eps_high" if same else label)  # fmt: skip
        if hi[0] and not same:
            _line(ax, np.asarray(hi[0]), np.asarray(hi[1]), color=colour, linestyle="--",
                  label=None if lo[0] else label)  # fmt: skip
    return bool(groups)


def _keys_panel(title: str, keys: Sequence[str], caption: str = "") -> Panel:
    return Panel(
        title, lambda ax, run, colours: _plot_keys(ax, run, keys), _has_keys(*keys), caption
    )


def _has_task_field(*names: str) -> Callable[[RunData], bool]:
    """Whether some task has a finite value of one of ``names`` (an all-NaN series draws
    nothing, so it is no data)."""

    def has(run: RunData) -> bool:
        series = (run.task_series(t, n) for t in run.tasks for n in names)
        return any(s is not None and len(s.finite()) for s in series)

    return has


def _has_keys(*keys: str) -> Callable[[RunData], bool]:
    """Whether one of ``keys`` has a finite value (all-NaN draws nothing)."""
    return lambda run: any(run.get(k) is not None and len(run.get(k).finite()) for k in keys)


def _paired(run: RunData, x_key: str, y_key: str) -> tuple[np.ndarray, np.ndarray]:
    """Values of two keys at the steps where both are finite and > 0 (for log-log axes)."""
    xs, ys = run.get(x_key), run.get(y_key)
    if xs is None or ys is None:
        return np.empty(0), np.empty(0)
    common, ix, iy = np.intersect1d(xs.steps, ys.steps, return_indices=True)
    x, y = xs.values[ix], ys.values[iy]
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    return x[keep], y[keep]


def _first_order_panel(ax, run: RunData, colours: dict[str, str]) -> bool:
    """Polarity audit: ``|dH - dH_lin|`` against the logit step per audited step (log-log),
    with a slope-2 guide through the median point (the Taylor remainder is quadratic)."""
    x, y = _paired(run, "audit/logit_step_norm", "audit/first_order_error")
    if not x.size:
        return False
    ax.scatter(x, y, s=12, color="C0", label="audited step")
    guide = np.array([x.min(), x.max()])
    x0, y0 = float(np.median(x)), float(np.median(y))
    ax.plot(guide, y0 * (guide / x0) ** 2, color="k", linestyle="--", linewidth=0.8,
            label="slope 2")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("RMS logit step |dx|", fontsize=8)
    return True


AUDIT_AGREEMENT = (
    "audit/sign_agreement",
    "audit/spearman",
    "audit/sign_agreement_pos",
    "audit/sign_agreement_neg",
)
AUDIT_REALISED = ("audit/dH_pos", "audit/dH_neg", "audit/dH_mean")
AUDIT_PROBE = ("audit/probe_dH_pos", "audit/probe_dH_neg")


def audit_figure() -> FigureSpec:
    """PAPO's polarity audit inside training (``audit/*`` keys; ``audit.every``)."""
    first_order = Panel(
        "audit: first-order error |dH - dH_lin|",
        _first_order_panel,
        _has_keys("audit/first_order_error"),
    )
    return FigureSpec(
        "audit.png",
        "Polarity audit (audited steps): token-level sign agreement / Spearman of P and the "
        "realised dH (P != 0 tokens; 0.5 = chance), mean realised dH per branch, the probe's "
        "branch-restricted steps, and the first-order error against the step size.",
        (
            _keys_panel("audit: P vs realised dH", AUDIT_AGREEMENT),
            _keys_panel("audit: mean realised dH", AUDIT_REALISED),
            _keys_panel("audit: probe dH (one step per branch)", AUDIT_PROBE),
            first_order,
        ),
    )


def figures(ema: float | None, crossings: dict[str, list[tuple[int, float]]]) -> list[FigureSpec]:
    """The report's figures, in order."""
    return [
        FigureSpec(
            "entropy.png",
            "Per-task entropy; x marks a crossover (two EMA-smoothed curves change order).",
            (entropy_panel(ema, crossings),),
        ),
        FigureSpec(
            "pace.png",
            "Clip control:",
            (
                Panel(
                    "clip eps_k",
                    _eps_panel,
                    _has_task_field("eps_low", "eps_high"),
                    "clip bounds per task (solid eps_low, dashed eps_high; tasks with the same "
                    "bounds at every step share one line, labelled with the value when fixed)",
                ),
                _task_panel("pace z-score z_k", "pace_z", "EPPO's pace z-score z_k per task"),
                _keys_panel(
                    "BAPO ratio bounds (last search)",
                    ["bapo/c_low", "bapo/c_high"],
                    "BAPO's ratio bounds of the last search",
                ),
            ),
        ),
        FigureSpec(
            "success.png",
            "Per-task success rate of the rollout batch.",
            (_task_panel("task success", "success"),),
        ),
        FigureSpec(
            "polarity.png",
            "PAPO: share of sum|A| on P>0 / P<0 tokens (before reweighting) and branch weights.",
            (
                _keys_panel("polarity branch mass", ["polarity/pos_mass", "polarity/neg_mass"]),
                _keys_panel("branch weights", ["polarity/w_plus", "polarity/w_minus"]),
            ),
        ),
        audit_figure(),
        FigureSpec(
            "training.png",
            "Global training signals.",
            (
                _keys_panel("reward / success", ["reward", "success"]),
                _keys_panel("batch entropy", ["entropy"]),
                _keys_panel("loss", ["loss"]),
                _keys_panel("grad norm", ["grad_norm"]),
                _keys_panel("clip fraction", ["clip_frac_low", "clip_frac_high"]),
                _keys_panel("KL", ["approx_kl", "kl"]),
            ),
        ),
    ]


def draw_figure(spec: FigureSpec, runs: Sequence[RunData], out: Path) -> Path:
    """Draw ``spec`` with one column per run into ``out`` (PNG)."""
    with atomic_write(out) as f:  # a symbolic link at ``out`` is replaced, never written through
        render_figure(spec, runs).savefig(f, format="png")
    return out


def render_figure(spec: FigureSpec, runs: Sequence[RunData]) -> Any:
    """The matplotlib ``Figure`` of ``spec``: one column per run, one row per panel that some
    run has data for."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    colours = task_colours(runs)
    panels = spec.drawn(runs)  # drop empty rows
    nrows, ncols = len(panels), len(runs)
    height = 3.2 * nrows
    fig = Figure(figsize=(5.0 * ncols, height), dpi=100)
    # Fixed margins (in inches, converted): constrained layout would double the drawing time.
    fig.subplots_adjust(
        left=0.6 / (5.0 * ncols) + 0.02,
        right=0.98,
        top=1 - 0.3 / height,
        bottom=0.5 / height,
        hspace=0.35,
        wspace=0.18,
    )
    axes = np.atleast_2d(fig.subplots(nrows, ncols, squeeze=False))
    for col, run in enumerate(runs):
        for row, panel in enumerate(panels):
            ax = axes[row, col]
            ax.set_title(f"{run.name}: {panel.title}", fontsize=9)
            if panel.draw(ax, run, colours):
                ax.legend(fontsize=7, loc="best", framealpha=0.7)
                ax.grid(alpha=0.3)
            else:
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
            if not ax.get_xlabel():  # a panel may name its own x axis; steps are integers
                lo, hi = ax.get_xlim()
                if hi - lo < 2:  # a 1-step run: one step each side, integer ticks
                    ax.set_xlim((lo + hi) / 2 - 1, (lo + hi) / 2 + 1)
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
                if row == nrows - 1:
                    ax.set_xlabel("step")
    return fig
