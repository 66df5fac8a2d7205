"""Confidence intervals over seeds: Student-t quantiles, mean CIs and paired differences.

Dependency-free (no scipy): the t distribution's CDF is written through the regularised
incomplete beta function (Abramowitz & Stegun 26.7.1; evaluated by its continued fraction,
A&S 26.5.8, with the modified Lentz method) and inverted by bisection.

For samples ``x_1..x_n`` (n >= 2), the two-sided ``level`` interval of the mean is

    mean +- t_{(1 + level) / 2, n - 1} * s / sqrt(n),    s^2 = sum (x_i - mean)^2 / (n - 1)

and a paired difference is that interval of ``d_i = a_i - b_i`` over the pairs (same seed).
With n = 1 there is no interval (``half_width`` is None).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["MeanCI", "mean_ci", "paired_difference", "t_cdf", "t_quantile"]


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of ``I_x(a, b)`` (modified Lentz); converges for x < (a+1)/(a+b+2)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                    -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):  # fmt: skip
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge (a={a}, b={b})")


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta ``I_x(a, b)`` for ``a, b > 0``, ``0 <= x <= 1``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
        + a * math.log(x) + b * math.log1p(-x)
    )  # fmt: skip
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """``P(T <= t)`` for Student's t with ``df > 0`` degrees of freedom.

    ``P(|T| > t) = I_{df / (df + t^2)}(df / 2, 1 / 2)`` (A&S 26.7.1).
    """
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df!r}")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (``0 < p < 1``).

    E.g. ``t_quantile(0.975, 3) = 3.182446``. Bisection on :func:`t_cdf` to ~1e-12 relative.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df!r}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    hi = 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
        if hi > 1e300:  # pragma: no cover - p within float precision of 1
            return math.inf
    lo = 0.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class MeanCI:
    """Mean of ``n`` samples and the half-width of its two-sided ``level`` t interval.

    ``half_width`` is None when ``n < 2`` (no interval from one sample) and ``mean`` is None
    when ``n == 0``. ``std`` is the sample standard deviation (``n - 1`` denominator).
    """

    mean: float | None
    half_width: float | None
    n: int
    std: float | None = None
    level: float = 0.95

    @property
    def low(self) -> float | None:
        return None if self.mean is None or self.half_width is None else self.mean - self.half_width

    @property
    def high(self) -> float | None:
        return None if self.mean is None or self.half_width is None else self.mean + self.half_width

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            "mean": self.mean,
            "half_width": self.half_width,
            "low": self.low,
            "high": self.high,
            "n": self.n,
            "std": self.std,
            "level": self.level,
        }

    def format(self, digits: int = 3) -> str:
        """``"0.512 ± 0.043"``; ``"0.512 (n=1)"`` without an interval; ``"n/a"`` for no data."""
        if self.mean is None:
            return "n/a"
        if self.half_width is None:
            return f"{self.mean:.{digits}g} (n={self.n})"
        return f"{self.mean:.{digits}g} ± {self.half_width:.{max(digits - 1, 1)}g}"


def mean_ci(values: Sequence[float | None], level: float = 0.95) -> MeanCI:
    """:class:`MeanCI` of the finite values (None / NaN are dropped), in float64.

    ``half_width = t_{(1 + level) / 2, n - 1} * s / sqrt(n)``.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must be in (0, 1), got {level!r}")
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(xs)
    if n == 0:
        return MeanCI(None, None, 0, None, level)
    mean = math.fsum(xs) / n
    if n == 1:
        return MeanCI(mean, None, 1, None, level)
    if min(xs) == max(xs):  # equal samples: exactly no spread (not fsum rounding noise)
        return MeanCI(xs[0], 0.0, n, 0.0, level)
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(0.5 + level / 2.0, n - 1) * std / math.sqrt(n)
    return MeanCI(mean, half, n, std, level)


def paired_difference(
    a: Mapping[int, float | None], b: Mapping[int, float | None], level: float = 0.95
) -> MeanCI:
    """:func:`mean_ci` of ``a[s] - b[s]`` over the seeds ``s`` both have a finite value for."""
    diffs = []
    for seed in sorted(set(a) & set(b)):
        va, vb = a[seed], b[seed]
        if va is None or vb is None or not (math.isfinite(va) and math.isfinite(vb)):
            continue
        diffs.append(float(va) - float(vb))
    return mean_ci(diffs, level)
