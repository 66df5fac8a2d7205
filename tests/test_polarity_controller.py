"""PolarityController (PAPO phase signal and branch weights, ALGORITHMS.md section 4)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entropace.control import PolarityController


def test_default_phase_ema_by_hand() -> None:
    """The default beta = 0.5 (issue 35): step 2 q = 0.5 -> rho = 0.75, g = -0.25,
    u = tanh(4 (0.6 - 0.75) + 20 * 0.25) = tanh(4.4); step 3 q = 0.1 -> rho = 0.425,
    g = -0.325, u = tanh(4 * 0.175 + 20 * 0.325) = tanh(7.2): a collapse turns u positive at
    once (with 0.95 it stays negative, test below)."""
    c = PolarityController()
    assert c.config.beta == 0.5
    c.update(2.0)
    assert c.u == pytest.approx(math.tanh(-1.6), abs=1e-12)
    c.update(1.0)
    assert (c.rho, c.g) == pytest.approx((0.75, -0.25), abs=1e-12)
    assert c.u == pytest.approx(math.tanh(4.4), abs=1e-12)
    c.update(0.2)
    assert (c.rho, c.g) == pytest.approx((0.425, -0.325), abs=1e-12)
    assert c.u == pytest.approx(math.tanh(7.2), abs=1e-12)


def test_formulas_by_hand_three_steps() -> None:
    c = PolarityController(beta=0.95)  # the EPPO-like EMA (the default before issue 35)
    # Step 1: reference 2.0, rho = 1, g = 0, u = tanh(4 (0.6 - 1)) = tanh(-1.6).
    w_plus, w_minus = c.update(2.0)
    assert c.ref == 2.0 and c.rho == 1.0 and c.g == 0.0
    assert c.u == pytest.approx(math.tanh(-1.6), abs=1e-12)
    assert (w_plus, w_minus) == pytest.approx(
        (1 + 0.5 * math.tanh(-1.6), 1 - 0.5 * math.tanh(-1.6))
    )
    # Step 2: q = 0.5, rho = 0.95 + 0.025 = 0.975, g = -0.025,
    # u = tanh(4 (0.6 - 0.975) + 20 * 0.025) = tanh(-1.0).
    c.update(1.0)
    assert c.rho == pytest.approx(0.975, abs=1e-12)
    assert c.g == pytest.approx(-0.025, abs=1e-12)
    assert c.u == pytest.approx(math.tanh(-1.0), abs=1e-12)
    # Step 3: q = 0.1, rho = 0.975 * 0.95 + 0.005 = 0.93125, g = -0.04375,
    # u = tanh(4 (0.6 - 0.93125) + 20 * 0.04375) = tanh(-0.45).
    w_plus, w_minus = c.update(0.2)
    assert c.rho == pytest.approx(0.93125, abs=1e-12)
    assert c.g == pytest.approx(-0.04375, abs=1e-12)
    assert c.u == pytest.approx(math.tanh(-0.45), abs=1e-12)
    assert w_plus == pytest.approx(1 + 0.5 * math.tanh(-0.45), abs=1e-12)
    assert w_minus == pytest.approx(1 - 0.5 * math.tanh(-0.45), abs=1e-12)
    assert c.metrics() == {
        "polarity/w_plus": w_plus,
        "polarity/w_minus": w_minus,
        "polarity/u": c.u,
        "polarity/rho": c.rho,
    }


def test_falling_entropy_favours_expansion() -> None:
    # Slope term alone (kappa = 0): falling -> u > 0, rising -> u < 0, flat -> u = 0.
    falling, rising = PolarityController(kappa=0.0), PolarityController(kappa=0.0)
    for h_f, h_r in [(1.0, 1.0), (0.5, 1.5)]:
        falling.update(h_f)
        rising.update(h_r)
    assert falling.u > 0 and falling.w_plus > 1 > falling.w_minus
    assert rising.u < 0 and rising.w_plus < 1 < rising.w_minus
    # Defaults: a collapse below the target favours expansion.
    c = PolarityController()
    c.update(1.0)
    for _ in range(60):
        c.update(0.3)
    assert c.rho < 0.6 and c.u > 0 and c.w_plus > c.w_minus
    # At the same rho a falling trajectory gets a larger u than a flat one (slope term).
    flat = PolarityController()
    flat.load_state_dict(c.state_dict())
    c.update(0.1)
    assert c.g < 0
    u_fall = c.u
    expected_flat = math.tanh(4 * (0.6 - c.rho))
    assert u_fall == pytest.approx(math.tanh(4 * (0.6 - c.rho) - 20 * c.g), abs=1e-12)
    assert u_fall > expected_flat


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(min_value=0.0, max_value=20.0), min_size=1, max_size=40),
    st.floats(min_value=0.0, max_value=1.0),
)
def test_weights_stay_in_band(entropies: list[float], lam: float) -> None:
    c = PolarityController(lam=lam)
    for h in entropies:
        w_plus, w_minus = c.update(h)
        assert 1 - lam - 1e-12 <= w_plus <= 1 + lam + 1e-12
        assert 1 - lam - 1e-12 <= w_minus <= 1 + lam + 1e-12
        assert w_plus + w_minus == pytest.approx(2.0, abs=1e-12)


def test_state_dict_round_trip() -> None:
    a = PolarityController(warmup_steps=2)
    for h in [1.0, 1.2, 0.9, 0.8]:
        a.update(h)
    b = PolarityController(warmup_steps=2)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    for h in [0.7, 1.1, 0.2]:
        assert a.update(h) == b.update(h)
    assert a.state_dict() == b.state_dict()
    with pytest.raises(ValueError, match="config mismatch on warmup_steps"):
        PolarityController().load_state_dict(a.state_dict())


def test_warmup_keeps_rho_at_one() -> None:
    c = PolarityController(warmup_steps=3)
    for h in [1.0, 2.0, 3.0]:
        c.update(h)
        assert c.rho == 1.0 and c.g == 0.0
    assert c.ref == 2.0
    c.update(1.0)
    assert c.rho == pytest.approx(0.5 + 0.5 * 0.5, abs=1e-12)  # beta 0.5, q = 1.0 / 2.0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_bad_entropy(bad: float) -> None:
    with pytest.raises(ValueError, match="batch_entropy"):
        PolarityController().update(bad)


@pytest.mark.parametrize(
    ("options", "message"),
    [({"lam": 1.5}, "lam must"), ({"kappa": -1}, "kappa must"), ({"rho_target": 0}, "rho_target")],
)
def test_bad_options(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PolarityController(**options)
