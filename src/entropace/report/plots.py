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
from entropace.report.lines import (
    eval_tasks,
    line,
    on_run_steps,
    pacer_limits,
    plot_eps,
    plot_eval,
    plot_keys,
    plot_task_field,
    task_colours,
    task_styles,
)
from entropace.report.runs import RunData

__all__ = [
    "FigureSpec",
    "Panel",
    "audit_figure",
    "draw_figure",
    "figures",
    "render_figure",
    "pacer_limits",
    "task_colours",
    "task_styles",
]

# A panel draws one run into one axes and returns False if the run has none of its data; the
# third argument is the figure's :func:`task_styles`.
PanelFn = Callable[["object", RunData, dict[str, dict[str, Any]]], bool]


@dataclass(frozen=True)
class Panel:
    """One axes per run: its title, how to draw it, whether a run has any of its metrics, and
    what the figure's caption says about it (only when it is drawn)."""

    title: str
    draw: PanelFn
    has_data: Callable[[RunData], bool]
    caption: str = ""
    ylabel: str = ""
    ylim: tuple[float, float] | None = None  # fixed y range (rates in [0, 1])


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


def entropy_panel(ema: float | None, crossings: dict[str, list[tuple[int, float]]]) -> Panel:
    """Per-task entropy: raw (thin) with its first and last values as dots (the numbers of
    the report's table), EMA-smoothed (thick, the curves the crossovers are counted on),
    crossovers marked with x."""

    def draw(ax, run: RunData, styles: dict[str, dict[str, Any]]) -> bool:
        drawn = False
        for task in run.tasks:
            s = run.task_series(task, "entropy")
            if s is None or not len(s.finite()):
                continue
            f = s.finite()
            c = styles.get(task, {}).get("color", "k")
            if ema is not None:
                raw = on_run_steps(run, s)
                ax.plot(raw.steps, raw.values, color=c, alpha=0.45, linewidth=0.9)
                smooth = ema_smooth(f.values, ema)
                line(ax, f.steps, smooth, color=c, label=task, linewidth=1.8)
                ends = [0, len(f) - 1]
                ax.plot(f.steps[ends], f.values[ends], linestyle="none", marker="o",
                        markersize=4, color=c)  # fmt: skip
            else:
                raw = on_run_steps(run, s)
                line(ax, raw.steps, raw.values, color=c, label=task)
            drawn = True
        marks = crossings.get(run.name, [])
        if marks:
            xs, ys = zip(*marks)
            ax.scatter(xs, ys, marker="x", color="k", s=40, zorder=5, label="crossover")
        return drawn

    title = "task entropy h_k" + (f" (thick: EMA {ema})" if ema is not None else "")
    return Panel(title, draw, _has_task_field("entropy"), ylabel="entropy (nats)")


#: The y range of a panel of rates (shares in [0, 1]), with room for the markers.
RATE = (-0.05, 1.05)


def _task_panel(
    title: str, name: str, caption: str = "", ylabel: str = "",
    ylim: tuple[float, float] | None = None,
) -> Panel:  # fmt: skip
    return Panel(
        title,
        lambda ax, run, styles: plot_task_field(ax, run, styles, name),
        _has_task_field(name),
        caption,
        ylabel,
        ylim,
    )


def _keys_panel(
    title: str, keys: Sequence[str], caption: str = "", ylabel: str = "", every_step: bool = True
) -> Panel:
    return Panel(
        title, lambda ax, run, styles: plot_keys(ax, run, keys, every_step), _has_keys(*keys),
        caption, ylabel,
    )  # fmt: skip


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


def _first_order_panel(ax, run: RunData, styles: dict[str, dict[str, Any]]) -> bool:
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
        ylabel="|dH - dH_lin|",
    )
    return FigureSpec(
        "audit.png",
        "Polarity audit (audited steps): token-level sign agreement / Spearman of P and the "
        "realised dH (P != 0 tokens; 0.5 = chance), mean realised dH per branch, the probe's "
        "branch-restricted steps, and the first-order error against the step size.",
        (
            _keys_panel(
                "audit: P vs realised dH", AUDIT_AGREEMENT, ylabel="agreement", every_step=False
            ),
            _keys_panel(
                "audit: mean realised dH", AUDIT_REALISED, ylabel="dH (nats)", every_step=False
            ),
            _keys_panel(
                "audit: probe dH (one step per branch)",
                AUDIT_PROBE,
                ylabel="dH (nats)",
                every_step=False,
            ),
            first_order,
        ),
    )


def _has_eval(run: RunData) -> bool:
    return any(len(run.series[f"eval/{t}/success"].finite()) for t in eval_tasks(run))


def figures(ema: float | None, crossings: dict[str, list[tuple[int, float]]]) -> list[FigureSpec]:
    """The report's figures, in order."""
    smoothing = (
        f"thin: raw, dots: its first and last values (the summary's entropy start / end); "
        f"thick: EMA {ema}, which lags the raw curve by about {1 / (1 - ema):.0f} steps"
        if ema is not None
        else "unsmoothed"
    )
    return [
        FigureSpec(
            "entropy.png",
            f"Per-task entropy ({smoothing}); x marks a crossover (two smoothed curves change "
            "order).",
            (entropy_panel(ema, crossings),),
        ),
        FigureSpec(
            "pace.png",
            "Clip control:",
            (
                Panel(
                    "clip eps_k",
                    plot_eps,
                    _has_task_field("eps_low", "eps_high"),
                    "clip bounds per task (solid eps_low, dashed eps_high; tasks with the same "
                    "bounds at every step share one line, labelled with the value when fixed; "
                    "grey dotted: EPPO's floor and ceiling of eps_low)",
                    "clip eps",
                ),
                _task_panel(
                    "pace z-score z_k", "pace_z", "EPPO's pace z-score z_k per task", "z_k"
                ),
                _keys_panel(
                    "BAPO ratio bounds (last search)",
                    ["bapo/c_low", "bapo/c_high"],
                    "BAPO's ratio bounds of the last search",
                    "ratio bound",
                ),
            ),
        ),
        FigureSpec(
            "success.png",
            "Per task (tasks with equal values at every step share one black line, "
            "labelled db = kg):",
            (
                Panel(
                    "held-out success (greedy)",
                    plot_eval,
                    _has_eval,
                    "held-out greedy success eval/<k>/success (step 0: before the first update)",
                    "success rate",
                    RATE,
                ),
                _task_panel(
                    "rollout success",
                    "success",
                    "success rate of each step's rollouts",
                    "success rate",
                    RATE,
                ),
                _task_panel(
                    "rollout reward",
                    "reward",
                    "mean episode reward of each step's rollouts",
                    "reward",
                ),
                _task_panel(
                    "learning signal",
                    "signal_frac",
                    "share of the task's episodes with a non-zero advantage (0: the "
                    "task got no gradient that step)",
                    "share of episodes",
                    RATE,
                ),
            ),
        ),
        FigureSpec(
            "polarity.png",
            "PAPO: share of sum|A| on P>0 / P<0 tokens (before reweighting; a gap where no "
            "token had a non-zero advantage) and branch weights.",
            (
                _keys_panel(
                    "polarity branch mass",
                    ["polarity/pos_mass", "polarity/neg_mass"],
                    ylabel="share of sum|A|",
                ),
                _keys_panel(
                    "branch weights", ["polarity/w_plus", "polarity/w_minus"], ylabel="weight"
                ),
            ),
        ),
        audit_figure(),
        FigureSpec(
            "training.png",
            "Global training signals.",
            (
                _keys_panel("reward / success", ["reward", "success"], ylabel="mean per episode"),
                _keys_panel("batch entropy", ["entropy"], ylabel="entropy (nats)"),
                _keys_panel("loss", ["loss"], ylabel="loss"),
                _keys_panel("grad norm", ["grad_norm"], ylabel="L2 norm"),
                _keys_panel(
                    "clip fraction", ["clip_frac_low", "clip_frac_high"], ylabel="share of tokens"
                ),
                _keys_panel("KL", ["approx_kl", "kl"], ylabel="KL (nats)"),
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

    styles = task_styles(runs)
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
            if panel.ylabel:
                ax.set_ylabel(panel.ylabel, fontsize=8)
            if panel.ylim is not None:
                ax.set_ylim(*panel.ylim)
            if panel.draw(ax, run, styles):
                ax.legend(fontsize=7, loc="best", framealpha=0.7)
                ax.grid(alpha=0.3)
            else:
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
            if not ax.get_xlabel():  # a panel may name its own x axis; steps are integers
                lo, hi = ax.get_xlim()
                if run.steps.size:  # every panel of a run spans its steps (gaps show as such)
                    first, last = float(run.steps[0]), float(run.steps[-1])
                    pad = 0.03 * (last - first)
                    lo, hi = min(lo, first - pad), max(hi, last + pad)
                    ax.set_xlim(lo, hi)
                if hi - lo < 2:  # a 1-step run: one step each side, integer ticks
                    ax.set_xlim((lo + hi) / 2 - 1, (lo + hi) / 2 + 1)
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
                if row == nrows - 1:
                    ax.set_xlabel("step")
    return fig
