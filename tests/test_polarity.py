"""Entropy polarity: the first-order theorem on tabular softmaxes, and the advantage reweighting."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from entropace.algos.polarity import entropy_polarity, polarity_reweight
from entropace.algos.token_stats import token_stats


def entropy64(z: Tensor) -> Tensor:
    logp = torch.log_softmax(z, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def sgd_step_dh(z: Tensor, y: int, advantage: float, eta: float) -> float:
    """Realised entropy change of one SGD step on ``A log p_y`` with the logits as parameters."""
    zz = z.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(torch.log_softmax(zz, -1)[y], zz)  # = e_y - p
    return float(entropy64(z + eta * advantage * grad) - entropy64(z))


DISTS: dict[str, Callable[[int, torch.Generator], Tensor]] = {
    "random": lambda v, g: torch.randn(v, generator=g, dtype=torch.float64),
    "peaked": lambda v, g: (
        torch.randn(v, generator=g, dtype=torch.float64)
        + 8.0 * (torch.arange(v) == 0).to(torch.float64)
    ),
    "near-flat": lambda v, g: 0.1 * torch.randn(v, generator=g, dtype=torch.float64),
    "wide": lambda v, g: 3.0 * torch.randn(v, generator=g, dtype=torch.float64),
}


@pytest.mark.parametrize("vocab", [50, 2_000, 50_000])
@pytest.mark.parametrize("dist", sorted(DISTS))
def test_first_order_theorem_error_is_quadratic(vocab: int, dist: str) -> None:
    gen = torch.Generator().manual_seed(vocab)
    z = DISTS[dist](vocab, gen)
    p = torch.softmax(z, -1)
    tokens = {
        "frequent": int(p.argmax()),
        "rare": int(p.argmin()),
        "sampled": int(torch.multinomial(p, 1, generator=gen)),
    }
    for y in tokens.values():
        s = token_stats(z[None], torch.tensor([y])).sensitivity.item()
        for advantage in (1.0, -1.0, 0.5):
            # |dH - eta A S| / eta = O(eta): ten times smaller step, ten times smaller error
            errs = [
                abs(sgd_step_dh(z, y, advantage, eta) - eta * advantage * s) / eta
                for eta in (1e-2, 1e-3)
            ]
            assert 8.0 < errs[0] / errs[1] < 12.5, (dist, y, advantage, errs)
            # and the first-order term dominates at small steps
            assert errs[1] < 0.05 * abs(advantage * s), (dist, y, advantage, errs, s)


@pytest.mark.parametrize("seed", range(6))
def test_sign_claims_frequent_contracts_rare_expands(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    vocab = [10, 100, 1000, 5000, 32, 700][seed]
    scale = [0.3, 1.0, 2.0, 1.0, 5.0, 0.5][seed]
    z = scale * torch.randn(vocab, generator=gen, dtype=torch.float64)
    p = torch.softmax(z, -1)
    h = float(entropy64(z))
    frequent, rare = int(p.argmax()), int(p.argmin())
    stats = token_stats(z[None].expand(2, vocab), torch.tensor([frequent, rare]))
    # premises: the frequent token is more likely than typical, the rare one less
    assert stats.logprob[0] > -h > stats.logprob[1]
    pol = entropy_polarity(torch.tensor([1.0, 1.0], dtype=torch.float64), stats)
    assert pol[0] < 0 < pol[1]
    # reinforcing the frequent token contracts, reinforcing the rare token expands;
    # penalising them does the opposite
    assert sgd_step_dh(z, frequent, 1.0, 1e-3) < 0 < sgd_step_dh(z, rare, 1.0, 1e-3)
    assert sgd_step_dh(z, frequent, -1.0, 1e-3) > 0 > sgd_step_dh(z, rare, -1.0, 1e-3)


def test_entropy_polarity_broadcasts_sequence_advantages() -> None:
    gen = torch.Generator().manual_seed(7)
    z = torch.randn(2, 3, 40, generator=gen, dtype=torch.float64)
    y = torch.randint(40, (2, 3), generator=gen)
    stats = token_stats(z, y)
    adv_seq = torch.tensor([2.0, -0.5], dtype=torch.float64)
    pol = entropy_polarity(adv_seq, stats)
    expected = torch.stack([adv_seq[b] * stats.sensitivity[b] for b in range(2)])
    torch.testing.assert_close(pol, expected, rtol=0, atol=0)
    adv_tok = torch.randn(2, 3, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(
        entropy_polarity(adv_tok, stats.sensitivity), adv_tok * (stats.t2 - stats.t1)
    )
    with pytest.raises(ValueError, match="leading prefix"):
        entropy_polarity(torch.zeros(3), stats)


def reweight_loop(a: Tensor, pol: Tensor, mask: Tensor, wp: float, wm: float) -> Tensor:
    """Element-by-element reference of polarity_reweight, in float64."""
    shape = a.shape
    a, pol, mask = a.double().flatten(), pol.double().flatten(), mask.bool().flatten()
    new = a.clone()
    for i in range(a.numel()):
        if pol[i] > 0:
            new[i] = wp * a[i]
        elif pol[i] < 0:
            new[i] = wm * a[i]
    before = sum(abs(float(a[i])) for i in range(a.numel()) if mask[i])
    after = sum(abs(float(new[i])) for i in range(a.numel()) if mask[i])
    out = a.clone()
    for i in range(a.numel()):
        if mask[i] and after > 0:
            out[i] = new[i] * before / after
    return out.reshape(shape)


def test_reweight_hand_computed_example() -> None:
    a = torch.tensor([[1.0, -2.0, 3.0], [0.5, 1.0, -1.0]])
    pol = torch.tensor([[1.0, 1.0, -1.0], [0.0, -2.0, 3.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 1]])
    # masked A' = 1.5, -3, 1.5, 0.5, -1.5 -> sum |A'| = 8; sum |A| = 7.5 -> factor 15/16
    expected = torch.tensor([[1.5, -3.0, 1.5], [0.5, 1.0, -1.5]]) * torch.tensor(
        [[15 / 16, 15 / 16, 15 / 16], [15 / 16, 1.0, 15 / 16]]
    )
    got = polarity_reweight(a, pol, mask, w_plus=1.5, w_minus=0.5)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-7)


@pytest.mark.parametrize("seed", range(4))
def test_reweight_matches_loop_and_preserves_total(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(5, 9, generator=gen, dtype=torch.float64)
    pol = torch.randn(5, 9, generator=gen, dtype=torch.float64)
    pol[pol.abs() < 0.3] = 0.0  # some exact zeros
    mask = torch.rand(5, 9, generator=gen) < 0.7
    wp, wm = [(1.5, 0.5), (0.5, 1.5), (1.2, 0.8), (0.0, 1.0)][seed]
    got = polarity_reweight(a, pol, mask, w_plus=wp, w_minus=wm)
    torch.testing.assert_close(got, reweight_loop(a, pol, mask, wp, wm))
    assert torch.isclose(got[mask].abs().sum(), a[mask].abs().sum(), rtol=1e-12)
    assert torch.equal(got[~mask], a[~mask])
    # 0-dim tensor weights (e.g. from a controller) give the same result, without a host sync
    got_t = polarity_reweight(
        a, pol, mask, w_plus=torch.tensor(wp, dtype=torch.float64), w_minus=torch.tensor(wm)
    )
    torch.testing.assert_close(got_t, got)


def test_reweight_identity_cases() -> None:
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(3, 4, generator=gen)
    pol = torch.randn(3, 4, generator=gen)
    mask = torch.ones(3, 4, dtype=torch.bool)
    torch.testing.assert_close(polarity_reweight(a, pol, mask, w_plus=1.0, w_minus=1.0), a)
    # equal weights: the rescale undoes them
    torch.testing.assert_close(polarity_reweight(a, pol, mask, w_plus=1.3, w_minus=1.3), a)
    # every masked |A'| is zero: A comes back unchanged
    only_pos = pol.abs()
    assert torch.equal(polarity_reweight(a, only_pos, mask, w_plus=0.0, w_minus=1.0), a)
    assert torch.equal(
        polarity_reweight(torch.zeros(3, 4), pol, mask, w_plus=1.5, w_minus=0.5), torch.zeros(3, 4)
    )


def test_reweight_sequence_advantages_and_garbage_outside_mask() -> None:
    adv_seq = torch.tensor([1.0, -2.0])
    pol = torch.tensor([[1.0, -1.0, 5.0], [-1.0, 2.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    got = polarity_reweight(adv_seq, pol, mask, w_plus=1.5, w_minus=0.5)
    full = adv_seq[:, None].expand(2, 3)
    torch.testing.assert_close(got, reweight_loop(full, pol, mask, 1.5, 0.5).float())
    # NaN advantages on tokens outside the mask do not leak into the rescale factor
    a = torch.tensor([[1.0, -1.0, float("nan")]])
    out = polarity_reweight(
        a, torch.tensor([[1.0, 1.0, 1.0]]), torch.tensor([[1, 1, 0]]), w_plus=1.5, w_minus=0.5
    )
    torch.testing.assert_close(out[0, :2], torch.tensor([1.0, -1.0]))
    assert torch.isnan(out[0, 2])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"w_plus": -0.5}, "w_plus must be finite and >= 0"),
        ({"w_minus": float("inf")}, "w_minus must be finite and >= 0"),
        ({"w_plus": torch.ones(2)}, "w_plus must be a float or a 0-dim tensor"),
        ({"w_minus": "1"}, "w_minus must be a float or a 0-dim tensor"),
        ({"mask": torch.ones(2, 2)}, "mask shape"),
        ({"advantages": torch.ones(3)}, "leading prefix"),
    ],
)
def test_reweight_bad_arguments(kwargs: dict, message: str) -> None:
    args = {
        "advantages": torch.ones(2, 3),
        "polarity": torch.ones(2, 3),
        "mask": torch.ones(2, 3),
        "w_plus": 1.0,
        "w_minus": 1.0,
    } | kwargs
    with pytest.raises(ValueError, match=message):
        polarity_reweight(
            args["advantages"],
            args["polarity"],
            args["mask"],
            w_plus=args["w_plus"],
            w_minus=args["w_minus"],
        )
