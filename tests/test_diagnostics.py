"""Pace-mismatch diagnostics and the polarity audit: constructed known answers, brute force."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from entropace.diagnostics import (
    average_ranks,
    crossover_count,
    crossover_events,
    ema_smooth,
    max_rise,
    polarity_audit,
    r2_log_fit,
    spearman,
    spike_amplitude,
    trend_r2,
)

# ------------------------------------------------------------------------------- crossovers


def test_two_lines_crossing_twice() -> None:
    curves = {"a": [0, 1, 2, 3, 2, 1, 0], "b": [1.5] * 7}
    events = crossover_events(curves)
    assert crossover_count(curves) == 2
    assert [(e.step, e.upper, e.lower) for e in events] == [(2, "a", "b"), (5, "b", "a")]


def test_ties() -> None:
    # Touch and separate again on the same side: no crossover.
    assert crossover_count({"a": [0, 1, 1, 0], "b": [1, 1, 1, 1]}) == 0
    # Pass through a tie: one crossover, at the step of strict reversal.
    events = crossover_events({"a": [0, 1, 2], "b": [1, 1, 1]})
    assert [(e.step, e.upper) for e in events] == [(2, "a")]
    # Ties at the start are skipped; identical curves never cross.
    assert crossover_count({"a": [1, 1, 2, 0], "b": [1, 1, 1, 1]}) == 1
    assert crossover_count({"a": [3, 2, 1], "b": [3, 2, 1]}) == 0
    # Within tol counts as a tie.
    assert crossover_count({"a": [0.0, 1.05, 0.0], "b": [1.0] * 3}, tol=0.1) == 0
    assert crossover_count({"a": [0.0, 1.05, 0.0], "b": [1.0] * 3}) == 2


def test_three_tasks_count_every_pair() -> None:
    # a falls through b and c; b and c never cross.
    curves = {"a": [3.0, 2.5, 1.5, 0.5], "b": [2.0, 2.0, 2.0, 2.0], "c": [1.0, 1.0, 1.0, 1.0]}
    events = crossover_events(curves)
    assert [(e.step, e.upper, e.lower) for e in events] == [(2, "b", "a"), (3, "c", "a")]


def test_ema_suppresses_a_one_step_blip() -> None:
    curves = {"a": [2.0, 2.0, 0.0, 2.0, 2.0], "b": [1.0] * 5}
    assert crossover_count(curves) == 2
    # EMA 0.9 of a: 2, 2, 1.8, 1.82, 1.838 -> stays above b.
    assert np.allclose(ema_smooth(curves["a"], 0.9), [2.0, 2.0, 1.8, 1.82, 1.838])
    assert crossover_count(curves, ema=0.9) == 0


def test_crossover_bad_inputs() -> None:
    with pytest.raises(ValueError, match="equal length"):
        crossover_count({"a": [1, 2], "b": [1, 2, 3]})
    with pytest.raises(ValueError, match="task 'b' has a non-finite value at index 1"):
        crossover_count({"a": [1, 2], "b": [1, float("nan")]})
    with pytest.raises(ValueError, match="non-empty"):
        crossover_count({})


# -------------------------------------------------------------------------------- trend R^2


def brute_r2(h: list[float]) -> float:
    x = [math.log(s) for s in range(1, len(h) + 1)]
    mx, my = sum(x) / len(x), sum(h) / len(h)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, h))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in h)
    return sxy * sxy / (sxx * syy)  # simple regression: R^2 = r^2


def test_exact_log_curve_has_r2_one() -> None:
    h = [1.3 - 0.4 * math.log(s) for s in range(1, 40)]
    assert r2_log_fit(h) == pytest.approx(1.0, abs=1e-12)
    assert trend_r2({"a": h, "b": [0.5 + 0.1 * math.log(s) for s in range(1, 10)]}) == (
        pytest.approx(1.0, abs=1e-12)
    )


def test_r2_matches_closed_form() -> None:
    rng = np.random.default_rng(0)
    a = list(rng.normal(size=30))
    b = [1 / s for s in range(1, 21)]
    assert r2_log_fit(a) == pytest.approx(brute_r2(a), abs=1e-10)
    assert trend_r2({"a": a, "b": b}) == pytest.approx((brute_r2(a) + brute_r2(b)) / 2, abs=1e-10)
    assert r2_log_fit([2.0, 2.0, 2.0]) == 1.0  # constant: fitted exactly
    with pytest.raises(ValueError, match="at least 2 values"):
        trend_r2({"a": [1.0]})


# --------------------------------------------------------------------------- spike amplitude


def test_spike_amplitude_known_bump() -> None:
    # a: running min 1, .5, .4, .4, .3 -> largest rise 0.7 - 0.4 = 0.3, ref 1.0.
    # b: running min 2, 1, 1 -> rise 0.5, ref 2.0 -> 0.25.
    curves = {"a": [1.0, 0.5, 0.4, 0.7, 0.3], "b": [2.0, 1.0, 1.5]}
    assert max_rise(curves["a"]) == pytest.approx(0.3, abs=1e-15)
    assert spike_amplitude(curves) == pytest.approx((0.3 + 0.25) / 2, abs=1e-15)
    assert spike_amplitude(curves, ref={"a": 0.5, "b": 2.0}) == pytest.approx(0.425, abs=1e-15)
    assert spike_amplitude({"a": [3.0, 2.0, 1.0]}) == 0.0
    with pytest.raises(ValueError, match="reference entropy of task 'a'"):
        spike_amplitude({"a": [0.0, 1.0]})


# ---------------------------------------------------------------------------- polarity audit


def slow_ranks(x: list[float]) -> list[float]:
    return [
        1 + sum(v < xi for v in x) + (sum(v == xi for v in x) - 1) / 2 for xi in x
    ]  # average rank for ties


def slow_spearman(x: list[float], y: list[float]) -> float:
    rx, ry = slow_ranks(x), slow_ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return num / den


def test_average_ranks_and_spearman_match_slow_loops() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        x = rng.integers(0, 6, size=25).astype(float)  # many ties
        y = x * 0.5 + rng.integers(0, 4, size=25)
        assert average_ranks(x).tolist() == slow_ranks(list(x))
        assert spearman(x, y) == pytest.approx(slow_spearman(list(x), list(y)), abs=1e-12)
    assert math.isnan(spearman(np.ones(5), np.arange(5.0)))


def test_spearman_matches_scipy_when_available() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(4)
    x, y = rng.integers(0, 5, 40).astype(float), rng.normal(size=40)
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)


def test_polarity_audit_hand_example() -> None:
    p = torch.tensor([[1.0, -2.0, 3.0, -1.0, 0.0, 9.0]])
    dh = torch.tensor([[0.5, -0.1, -0.2, 0.3, 0.1, float("nan")]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    out = polarity_audit(p, dh, mask)
    # Signed tokens 0..3: agree, agree, disagree, disagree.
    assert out["overall/sign_agreement"] == 0.5
    assert out["overall/tokens"] == 5 and out["overall/sign_tokens"] == 4
    assert out["overall/mean_dh"] == pytest.approx(0.6 / 5, abs=1e-7)
    assert out["pos/tokens"] == 2 and out["pos/sign_agreement"] == 0.5
    assert out["pos/mean_dh"] == pytest.approx(0.15, abs=1e-7)
    assert out["neg/mean_dh"] == pytest.approx(0.1, abs=1e-7)
    assert out["overall/spearman"] == pytest.approx(
        slow_spearman([1, -2, 3, -1, 0], [0.5, -0.1, -0.2, 0.3, 0.1]), abs=1e-7
    )
    # Two tokens per branch: ranks are +-1 exactly.
    assert out["pos/spearman"] == pytest.approx(-1.0)  # P up, dH down
    assert out["neg/spearman"] == pytest.approx(1.0)  # P -2 -> -1, dH -0.1 -> 0.3


def test_polarity_audit_random_against_loops() -> None:
    rng = np.random.default_rng(5)
    p = rng.normal(size=(4, 30))
    dh = 0.3 * p + rng.normal(size=(4, 30))
    mask = rng.random((4, 30)) > 0.4
    out = polarity_audit(p, dh, mask)
    pm, dm = p[mask].tolist(), dh[mask].tolist()
    for branch, keep in [
        ("overall", lambda v: True),
        ("pos", lambda v: v > 0),
        ("neg", lambda v: v < 0),
    ]:
        pairs = [(a, b) for a, b in zip(pm, dm) if keep(a)]
        xs, ys = [a for a, _ in pairs], [b for _, b in pairs]
        agree = sum((a > 0) == (b > 0) for a, b in pairs) / len(pairs)
        assert out[f"{branch}/sign_agreement"] == pytest.approx(agree, abs=1e-12)
        assert out[f"{branch}/spearman"] == pytest.approx(slow_spearman(xs, ys), abs=1e-12)
        assert out[f"{branch}/mean_dh"] == pytest.approx(sum(ys) / len(ys), abs=1e-12)
        assert out[f"{branch}/tokens"] == len(pairs)


def test_polarity_audit_errors_and_empty_branch() -> None:
    with pytest.raises(ValueError, match="non-finite value"):
        polarity_audit([1.0, float("inf")], [0.1, 0.2])
    with pytest.raises(ValueError, match=r"predicted has shape \(2,\), realised \(1,\)"):
        polarity_audit([1.0, 2.0], [0.1])
    out = polarity_audit([1.0, 2.0, 3.0], [0.1, 0.3, 0.2])
    assert out["neg/tokens"] == 0
    assert math.isnan(out["neg/sign_agreement"]) and math.isnan(out["neg/mean_dh"])
    assert out["pos/spearman"] == pytest.approx(0.5)


def test_every_pair_is_counted_once() -> None:
    # Brute-force count over pairs and steps on random curves with no exact ties.
    rng = np.random.default_rng(7)
    curves = {k: list(rng.normal(size=30)) for k in "abcd"}
    brute = 0
    for x, y in itertools.combinations(curves.values(), 2):
        d = np.sign(np.subtract(x, y))
        brute += int(np.sum(d[1:] != d[:-1]))
    assert crossover_count(curves) == brute
