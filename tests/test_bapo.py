"""BapoClipController (BAPO 2510.18927, BASELINES.md): hand-built batches with known answers."""

from __future__ import annotations

import json
import math

import pytest
import torch

from entropace.control import BapoClipController, BapoConfig, positive_share


def batch(ratios: list[float], advs: list[float]) -> tuple[torch.Tensor, ...]:
    old = torch.full((1, len(ratios)), -1.0)
    logprobs = old + torch.tensor([ratios], dtype=torch.float64).log().float()
    return logprobs, old, torch.tensor([advs]), torch.ones(1, len(ratios))


def test_balanced_batch_keeps_start_bounds() -> None:
    c = BapoClipController()
    eps = c.update(*batch([1.0, 1.0, 1.0, 1.0], [1.0, 1.0, -1.0, -1.0]))
    assert eps == (0.4, 0.2)
    assert c.share == pytest.approx(0.5)
    assert (c.steps, c.met_at_start, c.not_met) == (1, 1, 0)


def test_raises_c_high_to_first_bound_admitting_the_positive_token() -> None:
    # Positive tokens r = 1.0 and 1.42 (clipped at c_high = 1.2); negatives r = 1, A = -1 (x2).
    # Share: 1 / 3 < 0.4 until c_high >= 1.42, then 2.42 / 4.42. First candidate: 1.45.
    c = BapoClipController()
    eps_low, eps_high = c.update(*batch([1.0, 1.42, 1.0, 1.0], [1.0, 1.0, -1.0, -1.0]))
    assert (c.c_low, c.c_high) == (0.6, 1.45)
    assert (eps_low, eps_high) == pytest.approx((0.4, 0.45), abs=1e-12)
    assert c.share == pytest.approx(2.42 / 4.42, rel=1e-6)


def test_raises_c_low_after_c_high_is_capped() -> None:
    # One positive token (r = 1), negatives at r = 1.0, 0.75, 0.85. No positive token is clipped,
    # so c_high climbs to its cap 3.0 uselessly; then c_low: at 0.76 share = 1 / 2.85 < 0.4,
    # at 0.86 share = 1 / 2 -> stop at c_low = 0.86.
    c = BapoClipController()
    eps_low, eps_high = c.update(*batch([1.0, 1.0, 0.75, 0.85], [1.0, -1.0, -1.0, -1.0]))
    assert (c.c_low, c.c_high) == (0.86, 3.0)
    assert (eps_low, eps_high) == (0.14, 2.0)
    assert c.share == pytest.approx(0.5, rel=1e-6)


def test_unreachable_target_ends_at_both_caps() -> None:
    c = BapoClipController()
    assert c.update(*batch([1.0] * 4, [1.0, -1.0, -1.0, -1.0])) == (0.1, 2.0)
    assert c.share == pytest.approx(0.25)
    assert c.not_met == 1


def test_no_signal_batch_keeps_start_bounds() -> None:
    c = BapoClipController()
    assert c.update(*batch([1.0, 2.0], [0.0, 0.0])) == (0.4, 0.2)
    assert c.share == 1.0


def brute_share(r: list[float], a: list[float], c_low: float, c_high: float) -> float:
    p = sum(ai * ri for ri, ai in zip(r, a) if ai > 0 and ri <= c_high)
    n = sum(-ai * ri for ri, ai in zip(r, a) if ai < 0 and ri >= c_low)
    return 1.0 if p + n == 0 else p / (p + n)


def sequential_search(r: list[float], a: list[float], cfg: BapoConfig) -> tuple[float, float]:
    """The loop of BASELINES.md, literally (one candidate at a time)."""
    c_low, c_high, i, j = cfg.c_low0, cfg.c_high0, 0, 0
    while brute_share(r, a, c_low, c_high) < cfg.rho0:
        if c_high < cfg.c_high_max:
            i += 1
            c_high = round(min(cfg.c_high0 + i * cfg.step_high, cfg.c_high_max), 10)
        elif c_low < cfg.c_low_max:
            j += 1
            c_low = round(min(cfg.c_low0 + j * cfg.step_low, cfg.c_low_max), 10)
        else:
            break
    return c_low, c_high


def test_vectorised_search_matches_sequential_loop_on_random_batches() -> None:
    gen = torch.Generator().manual_seed(0)
    cfg = BapoConfig()
    for trial in range(40):
        n = 64
        log_r = torch.randn(n, generator=gen, dtype=torch.float64) * (0.05 + 0.02 * trial)
        adv = torch.randn(n, generator=gen, dtype=torch.float64) - 0.3 * (trial % 4)
        old = torch.zeros(n, dtype=torch.float64)
        mask = torch.ones(n)
        c = BapoClipController()
        c.update(log_r, old, adv, mask)
        r = torch.exp(log_r).tolist()
        assert (c.c_low, c.c_high) == sequential_search(r, adv.tolist(), cfg)
        assert c.share == pytest.approx(brute_share(r, adv.tolist(), c.c_low, c.c_high), abs=1e-12)


def test_positive_share_matches_brute_force_for_many_bounds() -> None:
    gen = torch.Generator().manual_seed(1)
    log_r = torch.randn(2, 50, generator=gen, dtype=torch.float64) * 0.4
    adv = torch.randn(2, 50, generator=gen, dtype=torch.float64)
    mask = (torch.rand(2, 50, generator=gen) > 0.3).float()
    lows = [0.5, 0.6, 0.8, 0.95]
    highs = [1.05, 1.2, 1.5, 3.0]
    got = positive_share(log_r, torch.zeros_like(log_r), adv, mask, lows, highs)
    sel = mask.flatten() != 0
    r = torch.exp(log_r.flatten()[sel]).tolist()
    a = adv.flatten()[sel].tolist()
    for k, (lo, hi) in enumerate(zip(lows, highs)):
        assert got[k].item() == pytest.approx(brute_share(r, a, lo, hi), abs=1e-12)


def test_masked_tokens_are_ignored_even_if_nan() -> None:
    lp, old, adv, mask = batch([1.0, 1.42, 1.0, 1.0, 5.0], [1.0, 1.0, -1.0, -1.0, 3.0])
    adv[0, 4] = float("nan")
    mask[0, 4] = 0.0
    c = BapoClipController()
    c.update(lp, old, adv, mask)
    assert (c.c_low, c.c_high) == (0.6, 1.45)
    mask[0, 4] = 1.0
    with pytest.raises(ValueError, match="NaN or inf"):
        c.update(lp, old, adv, mask)


def test_shape_mismatch() -> None:
    lp, old, adv, mask = batch([1.0, 1.0], [1.0, -1.0])
    with pytest.raises(ValueError, match="advantages has shape"):
        BapoClipController().update(lp, old, adv[:, :1], mask)


def test_state_dict_round_trip_and_candidates() -> None:
    c = BapoClipController()
    c.update(*batch([1.0, 1.42, 1.0, 1.0], [1.0, 1.0, -1.0, -1.0]))
    d = BapoClipController()
    d.load_state_dict(json.loads(json.dumps(c.state_dict())))
    assert d.state_dict() == c.state_dict()
    assert (d.eps_low, d.eps_high) == (c.eps_low, c.eps_high)
    lows, highs = BapoConfig().candidates()
    assert len(highs) == 37 + 15 and highs[36] == 3.0 and lows[36] == 0.6 and lows[-1] == 0.9
    assert all(math.isclose(h, 1.2 + 0.05 * i) for i, h in enumerate(highs[:37]))


def test_bad_config() -> None:
    with pytest.raises(ValueError, match="c_low0 <= c_low_max"):
        BapoClipController(c_low0=0.95)
    with pytest.raises(ValueError, match="rho0"):
        BapoClipController(rho0=2.0)
