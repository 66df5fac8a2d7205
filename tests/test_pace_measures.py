"""Pace and success measures of issues 23 and 28 (diagnostics.pace_measures) and the exact tests
(report.stats): hand computations, the pacer's own tracker, an independent interpolation and
SciPy as references."""

from __future__ import annotations

import math

import numpy as np
import pytest

from entropace.control import EntropyPacer
from entropace.diagnostics import crossover_count
from entropace.diagnostics.pace_measures import (
    HalfLife,
    half_life,
    half_lives,
    noise_tied_crossovers,
    pace_gap,
    pace_spread,
    retained_ratio_curves,
    step_noise,
    success_auc,
    time_to_solve,
    window_mean,
)
from entropace.report.stats import (
    fisher_exact,
    holm,
    mcnemar_exact,
    paired_solves,
    paired_t_pvalue,
)


def test_step_noise_recovers_white_noise_sd_around_a_trend() -> None:
    rng = np.random.default_rng(3)
    trend = np.linspace(2.0, 0.5, 400)
    est = step_noise(trend + rng.normal(0, 0.1, 400))
    assert est == pytest.approx(0.1, rel=0.12)
    assert step_noise(trend) == pytest.approx(0.0, abs=1e-12)  # a pure line: equal differences
    assert step_noise([1.0, 2.0]) == 0.0


def test_jitter_is_no_crossover_but_a_real_swap_is_one() -> None:
    rng = np.random.default_rng(0)
    n = 200
    a = 1.0 + rng.normal(0, 0.01, n)  # two curves that differ by jitter only
    b = 1.0 + rng.normal(0, 0.01, n)
    assert crossover_count({"a": a, "b": b}, ema=0.9) >= 5  # the old count: jitter flips
    assert noise_tied_crossovers({"a": a, "b": b}, ema=0.9) == []
    # A real swap: a falls from 1.5 to 0.5 while b stays at 1.0 (same noise): one flip, where the
    # smoothed curves part by more than k noise SDs of their difference.
    a2 = np.linspace(1.5, 0.5, n) + rng.normal(0, 0.01, n)
    events = noise_tied_crossovers({"a": a2, "b": b}, ema=0.9)
    assert [(e.upper, e.lower) for e in events] == [("b", "a")]
    assert 100 <= events[0].step <= 120  # the lines meet at 100; the EMA (0.9) lags ~9 steps


def test_warmup_window_and_tie_rule() -> None:
    """k = 0 (tol = 0): every strict flip after the warm-up counts; flips inside the warm-up
    window neither count nor set the order."""
    a = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    b = [0.5] * 8
    all_flips = noise_tied_crossovers({"a": a, "b": b}, ema=0.0, k=0.0, warmup=0)
    assert [e.step for e in all_flips] == [1, 2, 3, 4, 6]
    late = noise_tied_crossovers({"a": a, "b": b}, ema=0.0, k=0.0, warmup=4)
    assert [e.step for e in late] == [6]  # order set at step 4 (a above), flips at 6


def test_tolerance_is_k_noise_sds_of_the_difference() -> None:
    """a steps from 1 down to 0 with noise; b is flat at 0.5 (sigma_b = 0). With ema = 0 the
    smoothed factor is 1 and tol = k sigma_a: the flip counts iff tol is below both the largest
    gap above b before the step and the largest gap below b after it."""
    rng = np.random.default_rng(7)
    a = np.concatenate([np.full(20, 1.0), np.zeros(20)]) + rng.normal(0, 0.05, 40)
    b = np.full(40, 0.5)
    d = np.diff(a)
    sigma = 1.482602218505602 * np.median(np.abs(d - np.median(d))) / math.sqrt(2)
    assert step_noise(a) == pytest.approx(sigma, rel=1e-12)
    gap = min((a[:20] - 0.5).max(), (0.5 - a[20:]).max())
    flips = noise_tied_crossovers({"a": a, "b": b}, ema=0.0, k=0.99 * gap / sigma, warmup=0)
    assert [(e.step, e.upper) for e in flips][:1] == [(int(np.argmax(a < 0.5)), "b")]
    assert len(flips) == 1
    assert noise_tied_crossovers({"a": a, "b": b}, ema=0.0, k=1.01 * gap / sigma, warmup=0) == []


@pytest.mark.parametrize("bad", [{"ema": 1.0}, {"k": -1.0}, {"warmup": -1}, {"warmup": 1.5}])
def test_bad_options_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        noise_tied_crossovers({"a": [1.0, 2.0], "b": [2.0, 1.0]}, **bad)


def test_retained_ratio_is_the_pacers_m() -> None:
    rng = np.random.default_rng(1)
    curves = {t: list(1.0 + rng.uniform(-0.5, 0.5, 30)) for t in ("x", "y", "z")}
    pacer = EntropyPacer(warmup_steps=2)
    m = retained_ratio_curves(curves, warmup_steps=2)
    for s in range(30):
        pacer.update({t: v[s] for t, v in curves.items()})
        for t in curves:
            assert m[t][s] == pacer.snapshot()[t]["m"]  # the same tracker: bit-equal


def test_pace_spread_hand_computed() -> None:
    # a keeps its entropy (m_a = 1); b halves at step 2: q_b = 0.5 from then on.
    a, b = [1.0, 1.0, 1.0, 1.0], [2.0, 1.0, 1.0, 1.0]
    m_b = [1.0]
    for _ in range(3):
        m_b.append(0.95 * m_b[-1] + 0.05 * 0.5)
    spreads = [abs(1.0 - mb) / 2 for mb in m_b]  # population std of two values
    assert pace_spread({"a": a, "b": b}) == pytest.approx(sum(spreads) / 4, abs=1e-15)
    assert pace_spread({"a": a, "b": b}, start=2) == pytest.approx(sum(spreads[2:]) / 2, abs=1e-15)
    assert math.isnan(pace_spread({"a": a, "b": b}, start=4))
    with pytest.raises(ValueError, match="two tasks"):
        pace_spread({"a": a})


def test_success_auc_and_time_to_solve_hand_computed() -> None:
    # evaluated at steps 10 and 20 with success 0 then 1, run of 40 steps:
    # 0 on [0, 10], a ramp on [10, 20] (area 5), 1 on [20, 40] (area 20) -> 25 / 40.
    assert success_auc([10, 20], [0.0, 1.0], last=40) == pytest.approx(25 / 40, abs=1e-15)
    assert success_auc([5], [0.5], last=5) == pytest.approx(0.5, abs=1e-15)
    assert time_to_solve([10, 20, 30], [0.2, 0.95, 0.5], last=40).step == 20
    never = time_to_solve([10, 20], [0.2, 0.3], last=40)
    assert (never.step, never.censored) == (40.0, True)
    with pytest.raises(ValueError, match="last"):
        success_auc([10, 20], [0.0, 1.0], last=15)
    with pytest.raises(ValueError, match="increasing"):
        success_auc([20, 10], [0.0, 1.0], last=40)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        success_auc([10], [1.5], last=40)


def test_success_auc_starts_from_a_step_zero_evaluation() -> None:
    # success 0 at step 0 (before training), 1 at step 10, run of 10 steps: a ramp, area 5 -> 0.5.
    assert success_auc([0, 10], [0.0, 1.0], last=10) == pytest.approx(0.5, abs=1e-15)
    # without the step-0 row the first evaluation (1.0) is held back to step 0: 1.0
    assert success_auc([10], [1.0], last=10) == pytest.approx(1.0, abs=1e-15)
    # step 0 at 0.2, steps 10 / 20 at 0 / 1, last 40: 1 + 0 + 5 + 20 = 26 -> 26 / 40
    assert success_auc([0, 10, 20], [0.2, 0.0, 1.0], last=40) == pytest.approx(26 / 40, abs=1e-15)
    solved_at_start = time_to_solve([0, 10], [1.0, 1.0], last=10)
    assert (solved_at_start.step, solved_at_start.censored) == (0.0, False)


# --------------------------------------------------------------------- half-life, pace gap (28)
def test_half_life_interpolates_between_logged_steps() -> None:
    # target 0.5: last above is step 3 (0.6), first at/below step 4 (0.4): 3 + 0.1 / 0.2
    assert half_life([1.0, 0.8, 0.6, 0.4]) == HalfLife(3.5, False, 1.0, 0.5)
    assert half_life([1.0, 0.8, 0.6, 0.4], hold=0).step == 3.5
    # the same values at steps 0, 2, 4, 10: 4 + 6 * 0.1 / 0.2 = 7
    assert half_life([1.0, 0.8, 0.6, 0.4], [0, 2, 4, 10]).step == pytest.approx(7.0, abs=1e-15)
    # a value exactly at the target is the crossing: 2 + (1.5 - 1.0) / (1.5 - 1.0) = 3
    assert half_life([2.0, 1.5, 1.0, 0.9]).step == pytest.approx(3.0, abs=1e-15)
    # another fraction: target 0.3 of 2.0 = 0.6, between step 2 (1.0) and 3 (0.5): 2 + 0.4 / 0.5
    assert half_life([2.0, 1.0, 0.5], fraction=0.3).step == pytest.approx(2.8, abs=1e-15)
    assert half_life([2.0, 1.0, 0.5], fraction=0.3).target == pytest.approx(0.6, abs=1e-15)


def test_half_life_is_right_censored_at_the_last_step() -> None:
    never = half_life([1.0, 0.8, 0.6, 0.4], fraction=0.25)
    assert never == HalfLife(4.0, True, 1.0, 0.25)
    assert half_life([1.0, 0.9, 0.7], [5, 9, 30]) == HalfLife(30.0, True, 1.0, 0.5)
    rising = half_life([0.5, 0.6, 0.9])  # a curve that rises never halves
    assert (rising.step, rising.censored) == (3.0, True)


def test_half_life_noisy_dip_must_hold() -> None:
    dip = [1.0, 0.9, 0.45, 0.85, 0.7, 0.4, 0.3]
    # raw first crossing (hold 0): the one-step dip at step 3, 2 + 0.4 / 0.45
    assert half_life(dip, hold=0).step == pytest.approx(2 + 0.4 / 0.45, abs=1e-15)
    # hold 1 (default): the dip rises back at step 4, the crossing that holds is 5 + 0.2 / 0.3
    assert half_life(dip).step == pytest.approx(5 + 0.2 / 0.3, abs=1e-15)
    # hold 2 at the end of the curve: steps 6, 7 are all there is after the crossing
    assert half_life(dip, hold=2).step == pytest.approx(5 + 0.2 / 0.3, abs=1e-15)
    # a two-step dip passes hold 1 but not hold 2
    two = [1.0, 0.45, 0.4, 0.9, 0.8, 0.3, 0.2, 0.1]
    assert half_life(two).step == pytest.approx(1 + 0.5 / 0.55, abs=1e-15)
    assert half_life(two, hold=2).step == pytest.approx(5 + 0.3 / 0.5, abs=1e-15)
    # a crossing at the very last point has nothing to hold for: it counts (2 + 0.3 / 0.4)
    last = half_life([1.0, 0.8, 0.4])
    assert (last.step, last.censored) == (pytest.approx(2.75, abs=1e-15), False)
    # a dip at the last point after an earlier one that rose back: only the last one counts
    assert half_life([1.0, 0.4, 0.9, 0.45]).step == pytest.approx(3 + 0.4 / 0.45, abs=1e-15)


def test_half_life_drops_nan_and_spans_missing_steps() -> None:
    # NaN values are dropped with their steps: start = 1.0 at step 2; (4, 0.6) -> (5, 0.4)
    assert half_life([math.nan, 1.0, math.nan, 0.6, 0.4]) == HalfLife(4.5, False, 1.0, 0.5)
    # a missing value between steps 1 and 3: the interpolation spans it, 1 + 2 * 0.5 / 0.6
    assert half_life([1.0, math.nan, 0.4, 0.3]).step == pytest.approx(1 + 2 * 0.5 / 0.6, abs=1e-15)
    # the same as logging only steps 1, 3, 4
    assert half_life([1.0, 0.4, 0.3], [1, 3, 4]) == half_life([1.0, math.nan, 0.4, 0.3])


def test_half_life_equals_the_root_of_the_linear_interpolant() -> None:
    """Independent reference on strictly decreasing curves (where every crossing holds): the
    step at which numpy's piecewise-linear interpolant of (step, h) reaches the target."""
    rng = np.random.default_rng(11)
    for _ in range(50):
        n = int(rng.integers(3, 40))
        steps = np.cumsum(rng.integers(1, 4, n)).astype(float)
        h = np.cumsum(rng.uniform(0.01, 0.3, n))[::-1] + rng.uniform(0.0, 0.5)
        frac = float(rng.uniform(0.05, 0.95))
        target = frac * h[0]
        got = half_life(h, steps, fraction=frac)
        if h[-1] > target:
            assert (got.step, got.censored) == (steps[-1], True)
            continue
        ref = float(np.interp(target, h[::-1], steps[::-1]))
        assert got.step == pytest.approx(ref, rel=1e-12) and not got.censored
        assert half_life(h, steps, fraction=frac, hold=0) == got


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"fraction": 0.0}, "fraction"),
        ({"fraction": 1.0}, "fraction"),
        ({"hold": -1}, "hold"),
        ({"hold": 1.5}, "hold"),
        ({"hold": True}, "hold"),
        ({"values": [0.0, 0.0]}, "start"),
        ({"values": [math.nan, math.nan]}, "finite"),
        ({"values": [1.0, 0.5], "steps": [2, 2]}, "increasing"),
        ({"values": [1.0, 0.5], "steps": [1, 2, 3]}, "equal length"),
    ],
)
def test_half_life_refuses_bad_input(bad: dict, match: str) -> None:
    kwargs = {"values": [1.0, 0.4], **bad}
    with pytest.raises(ValueError, match=match):
        half_life(**kwargs)


def test_half_lives_and_pace_gap_over_tasks() -> None:
    curves = {
        "easy": [1.0, 0.4, 0.2, 0.1],
        "mid": [1.0, 0.9, 0.6, 0.2],
        "hard": [2.0, 1.8, 1.5, 1.2, 1.1],
    }
    lives = half_lives(curves)
    assert lives["easy"].step == pytest.approx(1 + 0.5 / 0.6, abs=1e-15)
    assert lives["mid"].step == pytest.approx(3 + 0.1 / 0.4, abs=1e-15)
    hard = lives["hard"]  # never at or below 1.0 = 0.5 * 2.0: censored at its last step
    assert (hard.step, hard.censored) == (5.0, True)
    assert pace_gap(lives) == pytest.approx(5.0 - (1 + 0.5 / 0.6), abs=1e-15)
    # each task on its own steps
    own = half_lives({"a": [1.0, 0.4], "b": [1.0, 0.4]}, {"a": [1, 2], "b": [1, 11]})
    assert (own["a"].step, own["b"].step) == (
        pytest.approx(1 + 0.5 / 0.6),
        pytest.approx(1 + 10 * 0.5 / 0.6),
    )
    assert pace_gap(own) == pytest.approx(9 * 0.5 / 0.6, abs=1e-12)
    assert pace_gap({"a": 4.5, "b": 12.0, "c": 7.0}) == 7.5
    with pytest.raises(ValueError, match="two tasks"):
        pace_gap({"a": 1.0})
    with pytest.raises(ValueError, match="finite"):
        pace_gap({"a": 1.0, "b": math.nan})


def test_window_mean_over_logged_steps() -> None:
    h = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert window_mean(h) == 3.0
    assert window_mean(h, first=2, last=4) == 3.0
    assert window_mean(h, first=4) == 4.5 and window_mean(h, last=1) == 1.0
    assert window_mean([1.0, 2.0, math.nan, 4.0], first=2) == 3.0  # NaN dropped: (2 + 4) / 2
    assert window_mean([1.0, 3.0], [10, 30], first=11, last=30) == 3.0
    assert math.isnan(window_mean(h, first=6))


def test_exact_tests_hand_values() -> None:
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(3, 0) == pytest.approx(0.25, abs=1e-15)  # 2 * (1/2)^3
    assert mcnemar_exact(6, 0) == pytest.approx(2 / 64, abs=1e-15)
    assert mcnemar_exact(2, 5) == mcnemar_exact(5, 2)
    # Fisher's tea-tasting table [[3, 1], [1, 3]]: (1 + 16 + 16 + 1) / 70 = 34/70
    assert fisher_exact(3, 1, 1, 3) == pytest.approx(34 / 70, abs=1e-12)
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


@pytest.mark.parametrize(
    "table", [(3, 1, 0, 4), (0, 5, 5, 0), (2, 10, 3, 7), (6, 6, 6, 6), (0, 0, 3, 9), (12, 0, 0, 12)]
)
def test_exact_tests_equal_scipy(table: tuple[int, int, int, int]) -> None:
    stats = pytest.importorskip("scipy.stats")
    a, b, c, d = table
    assert fisher_exact(a, b, c, d) == pytest.approx(
        stats.fisher_exact([[a, b], [c, d]]).pvalue, rel=1e-9
    )
    n = a + b
    if n:
        assert mcnemar_exact(a, b) == pytest.approx(stats.binomtest(a, n).pvalue, rel=1e-9)


def test_paired_solves_uses_mcnemar_on_shared_seeds_else_fisher() -> None:
    a = {101: True, 102: True, 103: True, 104: False}
    b = {101: True, 102: False, 103: False, 104: False}
    t = paired_solves(a, b)
    assert (t.test, t.only_a, t.only_b, t.solved_a, t.solved_b) == ("McNemar", 2, 0, 3, 1)
    assert t.p_value == pytest.approx(0.5, abs=1e-15)
    u = paired_solves(a, {201: True, 202: False})
    assert u.test == "Fisher" and (u.solved_a, u.n_a, u.solved_b, u.n_b) == (3, 4, 1, 2)
    assert u.format().startswith("3/4 vs 1/2, Fisher p = ")


def test_paired_t_pvalue_against_scipy_and_by_hand() -> None:
    stats = pytest.importorskip("scipy.stats")
    a = {1: 0.31, 2: 0.25, 3: 0.40, 4: 0.22, 5: 0.35}
    b = {1: 0.30, 2: 0.29, 3: 0.33, 4: 0.20, 5: 0.36, 6: 0.9}  # seed 6 has no partner
    x, y = [a[s] for s in range(1, 6)], [b[s] for s in range(1, 6)]
    for alt in ("two-sided", "less", "greater"):
        ref = stats.ttest_rel(x, y, alternative=alt).pvalue
        assert paired_t_pvalue(a, b, alt) == pytest.approx(ref, rel=1e-9)
    assert paired_t_pvalue({1: 1.0}, {1: 0.0}) is None
    assert paired_t_pvalue({1: 1.0, 2: 2.0}, {1: 0.0, 2: 1.0}, "less") == 1.0  # d = 1, 1
    with pytest.raises(ValueError):
        paired_t_pvalue(a, b, "bigger")


def test_holm_by_hand() -> None:
    # sorted 0.01, 0.02, 0.04 (m = 3): 0.03, 0.04 (2 x 0.02), max(0.04, 0.04) = 0.04
    assert holm({"a": 0.02, "b": 0.01, "c": 0.04, "d": None}) == pytest.approx(
        {"a": 0.04, "b": 0.03, "c": 0.04, "d": None}
    )
    assert holm({"a": 0.6, "b": 0.5}) == {"a": 1.0, "b": 1.0}
