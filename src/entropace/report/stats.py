"""Confidence intervals over seeds: Student-t quantiles, mean CIs and paired differences.

Dependency-free (no scipy): the t distribution's CDF is written through the regularised
incomplete beta function (Abramowitz & Stegun 26.7.1; evaluated by its continued fraction,
A&S 26.5.8, with the modified Lentz method) and inverted by bisection.

For samples ``x_1..x_n`` (n >= 2), the two-sided ``level`` interval of the mean is

    mean +- t_{(1 + level) / 2, n - 1} * s / sqrt(n),    s^2 = sum (x_i - mean)^2 / (n - 1)

and a paired difference is that interval of ``d_i = a_i - b_i`` over the pairs (same seed).
With n = 1 there is no interval (``half_width`` is None).

Binary outcomes per seed (a task solved or not) get exact tests instead of t intervals:
:func:`mcnemar_exact` for paired seeds (the two-sided binomial test on the discordant pairs,
``p = min(1, 2 P(X <= min(b, c)))``, ``X ~ Bin(b + c, 1/2)``) and :func:`fisher_exact` for two
independent samples (two-sided: the total probability of the 2x2 tables with the observed margins
that are at most as probable as the observed one, relative tolerance 1e-7 as in SciPy).
A family of tests is corrected with Holm's step-down method (:func:`holm`); the p-value of a
paired t test (:func:`paired_t_pvalue`) uses the same t distribution as the intervals.
:func:`wilcoxon_signed_rank` is the paired test without the normality assumption (the robustness
check of a preregistered t test): exact, conditional on the observed ranks (ties averaged), by
counting the sign assignments of the ranks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "ExactTest",
    "MeanCI",
    "fisher_exact",
    "mcnemar_exact",
    "mean_ci",
    "paired_difference",
    "holm",
    "paired_solves",
    "paired_t_pvalue",
    "t_cdf",
    "t_quantile",
    "wilcoxon_signed_rank",
]


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


# ----------------------------------------------------------------------------- exact tests
def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _check_count(name: str, v: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{name} must be an int >= 0, got {v!r}")
    return v


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts ``b`` (only A solved) and
    ``c`` (only B solved): ``min(1, 2 sum_{i <= min(b, c)} C(n, i) / 2^n)``, ``n = b + c``;
    1.0 when ``n = 0``."""
    b, c = _check_count("b", b), _check_count("c", c)
    n = b + c
    if n == 0:
        return 1.0
    tail = math.fsum(math.exp(_log_comb(n, i) - n * math.log(2.0)) for i in range(min(b, c) + 1))
    return min(1.0, 2.0 * tail)


def fisher_exact(a: int, b: int, c: int, d: int) -> float:
    """Two-sided Fisher exact p-value of the table ``[[a, b], [c, d]]`` (rows: samples,
    columns: solved / not solved).

    Sums the hypergeometric probabilities of every table with the observed margins whose
    probability is ``<= P(observed) * (1 + 1e-7)``.
    """
    a, b, c, d = (_check_count(n, v) for n, v in zip("abcd", (a, b, c, d)))
    row1, col1, n = a + b, a + c, a + b + c + d
    if n == 0:
        return 1.0
    lo, hi = max(0, col1 - (n - row1)), min(row1, col1)

    def logp(x: int) -> float:
        return _log_comb(row1, x) + _log_comb(n - row1, col1 - x) - _log_comb(n, col1)

    observed = logp(a)
    probs = [logp(x) for x in range(lo, hi + 1)]
    keep = [math.exp(lp) for lp in probs if lp <= observed + math.log1p(1e-7)]
    return min(1.0, math.fsum(keep))


@dataclass(frozen=True)
class ExactTest:
    """Solve counts of two arms and the exact test's two-sided p-value.

    ``paired``: McNemar over the seeds both arms ran (``both``, ``only_a``, ``only_b``,
    ``neither`` count those seeds); otherwise Fisher over each arm's own seeds (``solved_a`` of
    ``n_a``, ``solved_b`` of ``n_b``).
    """

    test: str
    p_value: float
    solved_a: int
    n_a: int
    solved_b: int
    n_b: int
    only_a: int | None = None
    only_b: int | None = None

    def format(self) -> str:
        """``"3/12 vs 1/12, McNemar p = 0.625"``."""
        return (
            f"{self.solved_a}/{self.n_a} vs {self.solved_b}/{self.n_b}, "
            f"{self.test} p = {self.p_value:.3g}"
        )


def paired_solves(a: Mapping[int, bool | None], b: Mapping[int, bool | None]) -> ExactTest:
    """Exact test of solve indicators per seed: McNemar over the common seeds when the two arms
    share every seed, Fisher over each arm's seeds otherwise (None values are dropped)."""
    a = {s: bool(v) for s, v in a.items() if v is not None}
    b = {s: bool(v) for s, v in b.items() if v is not None}
    if a and set(a) == set(b):
        only_a = sum(a[s] and not b[s] for s in a)
        only_b = sum(b[s] and not a[s] for s in a)
        return ExactTest(
            "McNemar", mcnemar_exact(only_a, only_b), sum(a.values()), len(a),
            sum(b.values()), len(b), only_a, only_b,
        )  # fmt: skip
    sa, sb = sum(a.values()), sum(b.values())
    return ExactTest(
        "Fisher", fisher_exact(sa, len(a) - sa, sb, len(b) - sb), sa, len(a), sb, len(b)
    )


def paired_t_pvalue(
    a: Mapping[int, float | None], b: Mapping[int, float | None], alternative: str = "two-sided"
) -> float | None:
    """p-value of the paired t test of ``d_s = a[s] - b[s]`` (the seeds both have finite).

    ``t = mean(d) / (sd(d) / sqrt(n))`` with ``n - 1`` degrees of freedom; ``alternative``:
    ``"two-sided"``, ``"less"`` (``a < b``) or ``"greater"``. None with fewer than 2 pairs; with
    zero spread, 1.0 or 0.0 by the sign of the mean (0 mean: 1.0).
    """
    if alternative not in ("two-sided", "less", "greater"):
        raise ValueError(f"alternative must be two-sided, less or greater, got {alternative!r}")
    ci = paired_difference(a, b)
    if ci.n < 2 or ci.mean is None or ci.std is None:
        return None
    if ci.std == 0.0:
        sign = 0 if ci.mean == 0 else (1 if ci.mean > 0 else -1)
        if sign == 0:
            return 1.0
        hit = {"two-sided": True, "less": sign < 0, "greater": sign > 0}[alternative]
        return 0.0 if hit else 1.0
    t = ci.mean / (ci.std / math.sqrt(ci.n))
    df = ci.n - 1
    if alternative == "less":
        return t_cdf(t, df)
    if alternative == "greater":
        return 1.0 - t_cdf(t, df)
    return min(1.0, 2.0 * (1.0 - t_cdf(abs(t), df)))


def holm(p_values: Mapping[str, float | None]) -> dict[str, float | None]:
    """Holm-adjusted p-values: sorted ascending, ``p_(i) * (m - i + 1)`` made monotone and
    capped at 1 (``m`` the number of non-None p-values; None stays None)."""
    items = sorted(((p, k) for k, p in p_values.items() if p is not None), key=lambda x: x[0])
    m = len(items)
    out: dict[str, float | None] = {k: None for k in p_values}
    running = 0.0
    for i, (p, k) in enumerate(items):
        running = max(running, min(1.0, (m - i) * p))
        out[k] = running
    return out


def wilcoxon_signed_rank(
    a: Mapping[int, float | None], b: Mapping[int, float | None], alternative: str = "two-sided"
) -> float | None:
    """Exact p-value of the Wilcoxon signed-rank test of ``d_s = a[s] - b[s]`` (the seeds both
    have finite).

    Zero differences are dropped (Wilcoxon's convention, SciPy's ``zero_method="wilcox"``); the
    others are ranked by ``|d|`` with tied ranks averaged, and ``W+`` is the sum of the ranks of
    the positive ``d``. Under the null every sign assignment of the ranks is equally likely:
    the distribution of ``W+`` is counted exactly over the ``2^n`` assignments by dynamic
    programming on the doubled ranks (integers). ``alternative``: ``"less"`` (``a < b``:
    ``P(W+ <= w)``), ``"greater"`` (``P(W+ >= w)``) or ``"two-sided"`` (twice the smaller
    tail, capped at 1). Equal to SciPy's ``wilcoxon(method="exact")`` without ties; with
    ties, exact where SciPy falls back to a normal approximation. None without a non-zero
    difference.
    """
    if alternative not in ("two-sided", "less", "greater"):
        raise ValueError(f"alternative must be two-sided, less or greater, got {alternative!r}")
    diffs = [
        float(a[k]) - float(b[k])  # type: ignore[arg-type]
        for k in a
        if k in b
        and a[k] is not None
        and b[k] is not None
        and math.isfinite(float(a[k]))  # type: ignore[arg-type]
        and math.isfinite(float(b[k]))  # type: ignore[arg-type]
    ]
    diffs = [d for d in diffs if d != 0.0]
    n = len(diffs)
    if n == 0:
        return None
    order = sorted(range(n), key=lambda i: abs(diffs[i]))
    doubled = [0] * n  # 2 x (average rank): an integer
    i = 0
    while i < n:
        j = i
        while j + 1 < n and abs(diffs[order[j + 1]]) == abs(diffs[order[i]]):
            j += 1
        for k in range(i, j + 1):
            doubled[order[k]] = (i + 1) + (j + 1)  # 2 x mean of ranks i+1 .. j+1
        i = j + 1
    total = sum(doubled)
    counts = [0] * (total + 1)  # counts[w] = assignments with doubled W+ = w
    counts[0] = 1
    for r in doubled:
        for w in range(total, r - 1, -1):
            counts[w] += counts[w - r]
    w_obs = sum(r for r, d in zip(doubled, diffs, strict=True) if d > 0)
    all_ = float(2**n)
    lower = sum(counts[: w_obs + 1]) / all_
    upper = sum(counts[w_obs:]) / all_
    if alternative == "less":
        return lower
    if alternative == "greater":
        return upper
    return min(1.0, 2.0 * min(lower, upper))
