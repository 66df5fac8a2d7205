"""Diagnostics of pace mismatch over per-task entropy curves (EPPO paper, Fig. 1; ALGORITHMS.md 5).

Every function takes ``curves``: ``{task: sequence of floats}``, value ``s - 1`` being the task's
entropy at its ``s``-th step. Values must be finite (a ValueError names the task otherwise);
computations are in float64 with numpy.

- :func:`crossover_count`: number of (pair of tasks, step) where the order of the two curves flips.
- :func:`trend_r2`: mean over tasks of the R^2 of the least-squares fit ``h(s) ~ a + b log s``.
- :func:`spike_amplitude`: mean over tasks of the largest rise above the running minimum,
  relative to the task's reference entropy.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "Crossover",
    "crossover_count",
    "crossover_events",
    "ema_smooth",
    "max_rise",
    "r2_log_fit",
    "spike_amplitude",
    "trend_r2",
]

Curves = Mapping[str, Sequence[float]]


def _as_array(task: str, values: Sequence[float], *, min_len: int = 1) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"curve of task {task!r} must be 1-D, got shape {arr.shape}")
    if arr.size < min_len:
        raise ValueError(f"curve of task {task!r} needs at least {min_len} values, got {arr.size}")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise ValueError(f"curve of task {task!r} has a non-finite value at index {int(bad[0])}")
    return arr


def _check_curves(curves: Curves) -> None:
    if not isinstance(curves, Mapping) or not curves:
        raise ValueError("curves must be a non-empty mapping {task: [values]}")


def ema_smooth(values: Sequence[float], beta: float) -> np.ndarray:
    """``e(1) = h(1)``, ``e(s) = beta e(s-1) + (1 - beta) h(s)`` (float64)."""
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"ema must be in [0, 1), got {beta!r}")
    h = np.asarray(values, dtype=np.float64)
    out = np.empty_like(h)
    acc = h[0] if h.size else 0.0
    for s, v in enumerate(h):
        acc = v if s == 0 else beta * acc + (1.0 - beta) * v
        out[s] = acc
    return out


@dataclass(frozen=True)
class Crossover:
    """One order flip: at index ``step`` (0-based) ``upper`` went above ``lower``."""

    step: int
    upper: str
    lower: str


def crossover_events(
    curves: Curves, *, ema: float | None = None, tol: float = 0.0
) -> list[Crossover]:
    """Every order flip of every pair of curves, sorted by step then pair.

    Args:
        curves: ``{task: [h(1), ..., h(n)]}``, all of the same length n.
        ema: if given, each curve is first EMA-smoothed with this beta (:func:`ema_smooth`).
        tol: differences with ``|h_i - h_j| <= tol`` count as ties.

    Ties: the order of a pair is the sign of ``h_i - h_j``. A tie (sign 0) neither counts nor
    resets the order: a flip is counted at the first step whose strict order is the opposite of
    the last strict order. So touching and separating again is no crossover; passing through a
    tie (above, equal, below) is one, at the step where the order is strictly reversed; ties at
    the start are skipped until the first strict order.
    """
    _check_curves(curves)
    arrays = {t: _as_array(t, v) for t, v in curves.items()}
    lengths = {a.size for a in arrays.values()}
    if len(lengths) != 1:
        raise ValueError(
            "crossover_count needs curves of equal length, got "
            + ", ".join(f"{t}: {a.size}" for t, a in arrays.items())
        )
    if ema is not None:
        arrays = {t: ema_smooth(a, ema) for t, a in arrays.items()}
    events: list[Crossover] = []
    for (ti, hi), (tj, hj) in itertools.combinations(arrays.items(), 2):
        events += order_flips(hi - hj, tol, ti, tj)
    events.sort(key=lambda e: e.step)
    return events


def order_flips(diff: np.ndarray, tol: float, ti: str, tj: str, start: int = 0) -> list[Crossover]:
    """The flips of one pair's difference ``diff = h_i - h_j``: the order at a step is its
    sign beyond ``tol`` (a tie within it); a flip counts where the strict order reverses
    (ties neither count nor reset it); steps before ``start`` are skipped."""
    sign = np.where(diff > tol, 1, np.where(diff < -tol, -1, 0))
    out: list[Crossover] = []
    last = 0
    for s in range(start, sign.size):
        sg = int(sign[s])
        if sg == 0:
            continue
        if last != 0 and sg != last:
            out.append(Crossover(s, ti, tj) if sg > 0 else Crossover(s, tj, ti))
        last = sg
    return out


def crossover_count(curves: Curves, *, ema: float | None = None, tol: float = 0.0) -> int:
    """Number of (pair of tasks, step) where the two curves' order flips.

    See :func:`crossover_events` for the tie rule. Two lines that cross twice give 2.
    """
    return len(crossover_events(curves, ema=ema, tol=tol))


def r2_log_fit(values: Sequence[float], *, task: str = "curve") -> float:
    """R^2 of the least-squares line ``h(s) = a + b log s``, ``s = 1..n`` (n >= 2).

    ``R^2 = 1 - SS_res / SS_tot``; a constant curve (``SS_tot = 0``) is fitted exactly and gets
    ``R^2 = 1``.
    """
    h = _as_array(task, values, min_len=2)
    x = np.log(np.arange(1, h.size + 1, dtype=np.float64))
    design = np.stack([np.ones_like(x), x], axis=1)
    coef, *_ = np.linalg.lstsq(design, h, rcond=None)
    ss_res = float(np.sum((h - design @ coef) ** 2))
    ss_tot = float(np.sum((h - h.mean()) ** 2))
    if ss_tot == 0.0:
        return 1.0
    return 1.0 - ss_res / ss_tot


def trend_r2(curves: Curves) -> float:
    """Mean over tasks of :func:`r2_log_fit` (each curve needs >= 2 values)."""
    _check_curves(curves)
    return math.fsum(r2_log_fit(v, task=t) for t, v in curves.items()) / len(curves)


def max_rise(values: Sequence[float], *, task: str = "curve") -> float:
    """``max_s (h(s) - min_{t <= s} h(t))`` >= 0: the largest rise above the running minimum."""
    h = _as_array(task, values)
    return float(np.max(h - np.minimum.accumulate(h)))


def spike_amplitude(curves: Curves, *, ref: Mapping[str, float] | None = None) -> float:
    """Mean over tasks of ``max_rise(h_k) / H_k^ref``.

    ``H_k^ref`` is ``ref[k]`` if given, else the curve's first value; it must be > 0.
    """
    _check_curves(curves)
    total = []
    for t, v in curves.items():
        h = _as_array(t, v)
        h_ref = float(ref[t]) if ref is not None and t in ref else float(h[0])
        if not (math.isfinite(h_ref) and h_ref > 0.0):
            raise ValueError(f"reference entropy of task {t!r} must be finite and > 0, got {h_ref}")
        total.append(max_rise(h, task=t) / h_ref)
    return math.fsum(total) / len(total)
