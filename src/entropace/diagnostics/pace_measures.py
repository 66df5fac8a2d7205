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
- :func:`success_auc`: the area under a success curve over the run, normalised by its length
  (trapezoid rule over the evaluated steps, the first value held back to step 0), in [0, 1];
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
    "Solve",
    "noise_tied_crossovers",
    "pace_spread",
    "retained_ratio_curves",
    "step_noise",
    "success_auc",
    "time_to_solve",
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

    ``y`` is held at its first value from step 0 to the first evaluation and at its last value
    from the last evaluation to ``last`` (the run's last step, >= the last evaluated step).
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
