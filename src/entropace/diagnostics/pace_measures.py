"""Pace and success measures fit for comparing algorithms over seeds (issue 23, ``docs/lab.md``).

The first lab results counted 0.001-nat jitter as crossovers and averaged 0/1 success over the
last steps. The measures here are tied to the curves' own noise and to the whole run:

- :func:`step_noise`: a curve's step-to-step noise, ``sigma = 1.4826 MAD(diff h) / sqrt(2)``
  (the standard deviation of white noise around a slowly moving mean: the differences of two
  independent noisy values have variance ``2 sigma^2``; the median absolute deviation makes it
  robust to the few large moves a trend or a spike makes);
- :func:`noise_tied_crossovers`: order flips of the EMA-smoothed curves counted only when the
  two curves are more than ``k`` noise standard deviations of their smoothed difference apart,
  and only after a warm-up window. The smoothed difference of two white noises of
  ``sigma_i, sigma_j`` has standard deviation
  ``sqrt((sigma_i^2 + sigma_j^2) (1 - beta) / (1 + beta))`` (an EMA of weight ``1 - beta``
  passes ``(1 - beta) / (1 + beta)`` of a white noise's variance);
- :func:`retained_ratio_curves` / :func:`pace_spread`: the retained-entropy ratio ``m_k(s)`` the
  EPPO pacer acts on (ALGORITHMS.md section 3: ``q_k = h_k / H_k^ref``,
  ``m_k = beta m_k + (1 - beta) q_k``, computed by the pacer's own tracker,
  :class:`entropace.control._ratio.RatioEMA`), for any run, also one without a pacer; the pace
  measure is the time average, over the steps after a warm-up, of the population standard
  deviation of the tasks' ``m_k`` (0: every task keeps the same share of its entropy);
- :func:`half_life` / :func:`half_lives`: the step at which a task's entropy curve first falls
  to a ``fraction`` (default 0.5) of its start, linearly interpolated between logged steps and
  right-censored at the curve's last step; :func:`pace_gap`: the slowest task's half-life minus
  the fastest's (issue 28: a per-task pacer acts on that gap);
- :func:`window_mean`: a curve's mean over the logged steps of a window (e.g. a task's mean
  entropy over steps 1-60);
- :func:`success_auc`: the area under a success curve over the run, normalised by its length
  (trapezoid rule over the evaluated steps, from an evaluation at step 0 when there is one,
  otherwise the first value held back to step 0), in [0, 1];
- :func:`time_to_solve`: the first evaluated step at which success reaches a threshold, or the
  last step with ``censored=True`` when it never does.

All functions are numpy-only and work in float64.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from entropace.control._ratio import RatioEMA
from entropace.diagnostics.pace import (
    Crossover,
    _as_array,
    _check_curves,
    ema_smooth,
    order_flips,
)

__all__ = [
    "HalfLife",
    "Solve",
    "half_life",
    "half_lives",
    "noise_tied_crossovers",
    "pace_gap",
    "pace_spread",
    "retained_ratio_curves",
    "step_noise",
    "success_auc",
    "time_to_solve",
    "window_mean",
]

#: 1.4826 MAD estimates a normal standard deviation.
MAD_TO_SD = 1.482602218505602


def step_noise(values: Sequence[float], *, task: str = "curve") -> float:
    """``1.4826 * median(|d - median(d)|) / sqrt(2)`` of the first differences ``d`` (>= 0).

    A curve of fewer than 3 values has no estimate: 0.0.
    """
    h = _as_array(task, values)
    if h.size < 3:
        return 0.0
    d = np.diff(h)
    mad = float(np.median(np.abs(d - np.median(d))))
    return MAD_TO_SD * mad / math.sqrt(2.0)


def noise_tied_crossovers(
    curves: Mapping[str, Sequence[float]],
    *,
    ema: float = 0.9,
    k: float = 3.0,
    warmup: int = 20,
) -> list[Crossover]:
    """Order flips of the EMA-smoothed curves beyond ``k`` noise SDs, from index ``warmup`` on.

    For each pair ``(i, j)`` the tolerance is
    ``tol_ij = k * sqrt((sigma_i^2 + sigma_j^2) (1 - ema) / (1 + ema))`` with ``sigma`` from
    :func:`step_noise` on the raw curves. The pair's order at a step is the sign of the smoothed
    difference when ``|diff| > tol_ij`` and a tie otherwise; ties follow
    :func:`entropace.diagnostics.crossover_events`' rule (a flip counts when the strict order
    reverses). Steps before ``warmup`` neither count nor set the order.
    """
    _check_curves(curves)
    if not 0.0 <= ema < 1.0:
        raise ValueError(f"ema must be in [0, 1), got {ema!r}")
    if not (math.isfinite(k) and k >= 0):
        raise ValueError(f"k must be finite and >= 0, got {k!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    raw = {t: _as_array(t, v) for t, v in curves.items()}
    if len({a.size for a in raw.values()}) != 1:
        raise ValueError("noise_tied_crossovers needs curves of equal length")
    sigma = {t: step_noise(a, task=t) for t, a in raw.items()}
    smooth = {t: ema_smooth(a, ema) for t, a in raw.items()}
    factor = math.sqrt((1.0 - ema) / (1.0 + ema))
    events: list[Crossover] = []
    for ti, tj in itertools.combinations(raw, 2):
        tol = k * factor * math.hypot(sigma[ti], sigma[tj])
        events += order_flips(smooth[ti] - smooth[tj], tol, ti, tj, start=warmup)
    events.sort(key=lambda e: e.step)
    return events


def retained_ratio_curves(
    curves: Mapping[str, Sequence[float]], *, beta: float = 0.95, warmup_steps: int = 1
) -> dict[str, np.ndarray]:
    """``{task: m_k(s)}``: the pacer's retained-entropy ratio over each task's own curve.

    The same recursion as :class:`entropace.control.EntropyPacer`'s tracker (it is that tracker),
    so on an EPPO run this equals the logged ``task/<k>/pace_m``.
    """
    _check_curves(curves)
    out = {}
    for t, v in curves.items():
        tracker = RatioEMA(beta, warmup_steps)
        m = []
        for x in _as_array(t, v):
            tracker.observe(float(x))
            m.append(tracker.m)
        out[t] = np.asarray(m, dtype=np.float64)
    return out


def pace_spread(
    curves: Mapping[str, Sequence[float]],
    *,
    beta: float = 0.95,
    warmup_steps: int = 1,
    start: int = 0,
) -> float:
    """Time average over indices ``s >= start`` of ``std_k m_k(s)`` (population std over tasks).

    ``curves`` must share one time axis (equal lengths) and hold at least two tasks; ``NaN``
    when no step is left after ``start``.
    """
    m = retained_ratio_curves(curves, beta=beta, warmup_steps=warmup_steps)
    if len(m) < 2:
        raise ValueError("pace_spread needs at least two tasks")
    if len({a.size for a in m.values()}) != 1:
        raise ValueError("pace_spread needs curves of equal length")
    stack = np.stack(list(m.values()))[:, start:]  # [K, S']
    if stack.shape[1] == 0:
        return math.nan
    return float(stack.std(axis=0).mean())


def _curve(steps: Sequence[float] | None, values: Sequence[float]) -> tuple[np.ndarray, ...]:
    """``(steps, values)`` in float64 with the non-finite values (and their steps) dropped;
    ``steps`` default to ``1..n``. Steps must be finite and strictly increasing."""
    h = np.asarray(values, dtype=np.float64)
    s = (
        np.arange(1, h.size + 1, dtype=np.float64)
        if steps is None
        else np.asarray(steps, dtype=np.float64)
    )
    if h.ndim != 1 or s.shape != h.shape:
        raise ValueError(f"steps and values must be 1-D of equal length, got {s.shape}, {h.shape}")
    if not np.all(np.isfinite(s)) or np.any(np.diff(s) <= 0):
        raise ValueError("steps must be finite and strictly increasing")
    keep = np.isfinite(h)
    return s[keep], h[keep]


@dataclass(frozen=True)
class HalfLife:
    """When an entropy curve first fell to ``target = fraction * start`` (:func:`half_life`).

    ``step``: the interpolated crossing step, or the curve's last logged step when it never
    falls that far (``censored=True``: the true half-life is later than ``step``). ``start``: the
    value at the first logged step.
    """

    step: float
    censored: bool
    start: float
    target: float


def half_life(
    values: Sequence[float],
    steps: Sequence[float] | None = None,
    *,
    fraction: float = 0.5,
    hold: int = 1,
) -> HalfLife:
    """The step at which the curve ``h`` first falls to ``fraction`` of its start (issue 28).

    ``start = h(s_0)``, the value at the first logged step ``s_0`` (non-finite values, e.g. a
    step logged as ``null``, are dropped with their steps first); ``target = fraction * start``.
    The crossing is the first logged index ``i`` with ``h_i <= target`` *that holds*: the next
    ``hold`` logged values are at or below the target too (fewer at the end of the curve: a
    crossing in the last ``hold`` points must hold to the end). The half-life interpolates
    linearly between the last point above the target, ``(s_{i-1}, h_{i-1})``, and that one:

        t = s_{i-1} + (s_i - s_{i-1}) (h_{i-1} - target) / (h_{i-1} - h_i),

    so it is not quantised to logged steps (e.g. ``h = 1.0, 0.8, 0.6, 0.4`` at steps 1-4:
    ``t = 3 + (0.6 - 0.5) / (0.6 - 0.4) = 3.5``). A curve that never crosses is right-censored
    at its last logged step (``censored=True``). ``t`` is a coordinate on the run's step axis (the
    start is measured at ``s_0``, 1 in a trainer's run), so differences between runs and tasks do
    not depend on that origin.

    Why ``hold`` (default 1) and not an EMA: on a noisy curve the raw first crossing can be a
    one-step dip that rises back above the target; requiring the crossing to hold for the next
    logged step rejects such a dip and, on a curve that stays down once it has crossed, gives
    exactly the raw crossing. An EMA of weight ``1 - beta`` would lag every crossing by up to
    ``beta / (1 - beta)`` steps (9 at beta 0.9, more than a fast task's whole half-life) by an
    amount that depends on the curve's slope, i.e. on the arm. ``hold=0`` is the raw first
    crossing (the warm-start pilot's rule, which also rounded up to a logged step).

    Args:
        values: ``[n]`` the curve, e.g. ``task/<k>/entropy`` per logged step.
        steps: ``[n]`` strictly increasing steps of the values (default ``1..n``); missing steps
            are simply absent (the interpolation spans the gap).
        fraction: in (0, 1).
        hold: logged points after the crossing that must stay at or below the target (>= 0).

    Raises:
        ValueError: bad ``fraction`` / ``hold`` / steps, no finite value, or a start <= 0 (a
            curve at zero has no half-life).
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction!r}")
    if isinstance(hold, bool) or not isinstance(hold, int) or hold < 0:
        raise ValueError(f"hold must be an int >= 0, got {hold!r}")
    s, h = _curve(steps, values)
    if h.size == 0:
        raise ValueError("half_life needs at least one finite value")
    start = float(h[0])
    if not start > 0.0:
        raise ValueError(f"half_life needs a start > 0, got {start!r}")
    target = fraction * start
    below = h <= target
    for i in np.flatnonzero(below):  # i >= 1: h[0] = start > target
        if below[i : i + 1 + hold].all():
            # h[i - 1] > target: were it below, i - 1 would have held first (its window is
            # i - 1..i - 1 + hold, inside i..i + hold plus itself).
            t = s[i - 1] + (s[i] - s[i - 1]) * (h[i - 1] - target) / (h[i - 1] - h[i])
            return HalfLife(float(t), False, start, target)
    return HalfLife(float(s[-1]), True, start, target)


def half_lives(
    curves: Mapping[str, Sequence[float]],
    steps: Mapping[str, Sequence[float]] | None = None,
    *,
    fraction: float = 0.5,
    hold: int = 1,
) -> dict[str, HalfLife]:
    """``{task: half_life(curves[task], steps[task])}`` (each task on its own logged steps;
    ``steps`` default to ``1..n`` per task)."""
    _check_curves(curves)
    steps = steps or {}
    return {t: half_life(v, steps.get(t), fraction=fraction, hold=hold) for t, v in curves.items()}


def pace_gap(lives: Mapping[str, HalfLife | float]) -> float:
    """``max_k t_k - min_k t_k`` over the tasks' half-lives (steps; :class:`HalfLife` or floats).

    Censored half-lives count at their censoring step, so a gap whose slowest task is censored
    is a lower bound (:func:`half_life`); needs at least two tasks.
    """
    if len(lives) < 2:
        raise ValueError("pace_gap needs at least two tasks")
    t = [v.step if isinstance(v, HalfLife) else float(v) for v in lives.values()]
    if not all(math.isfinite(x) for x in t):
        raise ValueError(f"pace_gap needs finite half-lives, got {t}")
    return max(t) - min(t)


def window_mean(
    values: Sequence[float],
    steps: Sequence[float] | None = None,
    *,
    first: float | None = None,
    last: float | None = None,
) -> float:
    """Mean of the finite values logged at steps ``first <= s <= last`` (None: unbounded side).

    A plain mean over the logged steps in the window (a missing step is not filled in); ``NaN``
    when the window holds no finite value.
    """
    s, h = _curve(steps, values)
    keep = np.ones(s.shape, dtype=bool)
    if first is not None:
        keep &= s >= first
    if last is not None:
        keep &= s <= last
    return float(h[keep].mean()) if keep.any() else math.nan


def _success_curve(steps: Sequence[float], success: Sequence[float]) -> tuple[np.ndarray, ...]:
    s = np.asarray(steps, dtype=np.float64)
    y = _as_array("success", success)
    if s.shape != y.shape or s.size == 0:
        raise ValueError("steps and success must be non-empty and of equal length")
    if np.any(np.diff(s) <= 0) or s[0] < 0:
        raise ValueError("steps must be non-negative and strictly increasing")
    if np.any((y < 0) | (y > 1)):
        raise ValueError("success values must lie in [0, 1]")
    return s, y


def success_auc(steps: Sequence[float], success: Sequence[float], *, last: float) -> float:
    """``(1 / last) * integral_0^last y(s) ds`` of the piecewise-linear success curve.

    With an evaluation at step 0 (before the first training step) the curve starts from it;
    without one, ``y`` is held at its first evaluated value from step 0 to that evaluation. ``y``
    is held at its last value from the last evaluation to ``last`` (the run's last step, >= the
    last evaluated step).
    """
    s, y = _success_curve(steps, success)
    if not last >= s[-1] or last <= 0:
        raise ValueError(f"last must be > 0 and >= the last evaluated step, got {last!r}")
    xs = np.concatenate([[0.0], s, [float(last)]])
    ys = np.concatenate([[y[0]], y, [y[-1]]])
    area = float(np.sum((xs[1:] - xs[:-1]) * (ys[1:] + ys[:-1]) / 2.0))
    return area / float(last)


@dataclass(frozen=True)
class Solve:
    """First evaluated step with success >= threshold; ``censored``: never, ``step = last``."""

    step: float
    censored: bool


def time_to_solve(
    steps: Sequence[float], success: Sequence[float], *, last: float, threshold: float = 0.9
) -> Solve:
    """:class:`Solve` of a success curve (``threshold`` in (0, 1])."""
    s, y = _success_curve(steps, success)
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    hit = np.flatnonzero(y >= threshold)
    if hit.size:
        return Solve(float(s[hit[0]]), False)
    return Solve(float(last), True)
