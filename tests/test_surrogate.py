"""Clipped surrogate, aggregation and k3 KL: hand values, loops, masking, micro-batch invariance."""

from __future__ import annotations

import math

import pytest
import torch

from entropace.algos import AGG_MODES, aggregate_loss, clipped_surrogate_loss, kl_k3
from entropace.algos.aggregation import check_mask, loss_counts

EPS = 0.2


def _single_tokens(ratios: list[float], advs: list[float]):
    """One row of tokens with given ratios (old logprob chosen so that logprobs = 0)."""
    lp = torch.zeros(1, len(ratios), dtype=torch.float64, requires_grad=True)
    old = -torch.log(torch.tensor([ratios], dtype=torch.float64))
    return lp, old, torch.tensor([advs], dtype=torch.float64), torch.ones(1, len(ratios))


@pytest.mark.parametrize(
    ("ratio", "adv", "dual", "loss", "grad"),
    [
        (1.5, 1.0, 3.0, -1.2, 0.0),  # clip high binds: -A (1 + eps), no gradient
        (5.0, -1.0, 3.0, 3.0, 0.0),  # dual clip: min(5, -c A = 3), objective -3, no gradient
        (5.0, -1.0, None, 5.0, 5.0),  # dual clip off: -A r, gradient -A r = 5
        (2.0, -1.0, 3.0, 2.0, 2.0),  # A < 0, r above 1 + eps but below c: unclipped
        (0.5, 1.0, 3.0, -0.5, -0.5),  # A > 0, r below 1 - eps: unclipped (pessimistic side)
        (0.5, -1.0, 3.0, 0.8, 0.0),  # clip low binds: -A (1 - eps)
        (1.1, 2.0, 3.0, -2.2, -2.2),  # inside the trust region
        (1.1, 0.0, 3.0, 0.0, 0.0),  # zero advantage
    ],
)
def test_hand_values_and_gradients(ratio, adv, dual, loss, grad) -> None:
    lp, old, a, mask = _single_tokens([ratio], [adv])
    out = clipped_surrogate_loss(lp, old, a, mask, eps_low=EPS, eps_high=EPS, dual_clip=dual)
    assert math.isclose(out.loss.item(), loss, rel_tol=1e-12, abs_tol=1e-12)
    out.loss.backward()
    # d/dlogpi of -A r is -A r; 0 where a clip binds
    assert math.isclose(float(lp.grad[0, 0]), grad, rel_tol=1e-12, abs_tol=1e-12)


def test_metrics_hand_values() -> None:
    ratios = [1.5, 5.0, 0.5, 1.0]
    lp, old, a, mask = _single_tokens(ratios, [1.0, -1.0, -1.0, 1.0])
    m = clipped_surrogate_loss(lp, old, a, mask, eps_low=EPS, eps_high=EPS).metrics
    assert float(m["clip_frac_high"]) == 0.25 and float(m["clip_frac_low"]) == 0.25
    assert float(m["dual_clip_frac"]) == 0.25
    assert math.isclose(float(m["ratio_mean"]), 2.0)
    assert float(m["ratio_min"]) == pytest.approx(0.5) and float(m["ratio_max"]) == pytest.approx(5)
    k3 = sum((r - 1) - math.log(r) for r in ratios) / 4
    assert math.isclose(float(m["approx_kl"]), k3, rel_tol=1e-12)
    assert all(v.dim() == 0 and not v.requires_grad for v in m.values())


def _ref_token_loss(r: float, a: float, lo: float, hi: float, c: float | None) -> float:
    loss = max(-a * r, -a * min(max(r, 1 - lo), 1 + hi))
    if c is not None and a < 0:
        loss = min(loss, -c * a)
    return loss


def _random_inputs(seed: int, B: int = 5, T: int = 7, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    lp = (torch.randn(B, T, generator=g, dtype=dtype) - 1.0).requires_grad_(True)
    old = lp.detach() + 0.6 * torch.randn(B, T, generator=g, dtype=dtype)
    adv = torch.randn(B, T, generator=g, dtype=dtype)
    mask = (torch.rand(B, T, generator=g) > 0.3).to(dtype)
    mask[0] = 0.0  # a fully masked row
    mask[1, 0] = 1.0
    return lp, old, adv, mask


@pytest.mark.parametrize("eps_shape", ["token", "row"])
def test_per_token_eps_tensors_match_loop(eps_shape: str) -> None:
    lp, old, adv, mask = _random_inputs(0)
    B, T = lp.shape
    g = torch.Generator().manual_seed(1)
    shape = (B, T) if eps_shape == "token" else (B, 1)
    eps_low = 0.05 + 0.3 * torch.rand(shape, generator=g, dtype=torch.float64)
    eps_high = 0.05 + 0.3 * torch.rand(shape, generator=g, dtype=torch.float64)
    out = clipped_surrogate_loss(lp, old, adv, mask, eps_low=eps_low, eps_high=eps_high)
    lo, hi = eps_low.expand(B, T), eps_high.expand(B, T)
    r = torch.exp(lp.detach() - old)
    total, count = 0.0, 0
    for i in range(B):
        for t in range(T):
            if mask[i, t]:
                c = 3.0
                total += _ref_token_loss(
                    float(r[i, t]), float(adv[i, t]), float(lo[i, t]), float(hi[i, t]), c
                )
                count += 1
    assert math.isclose(out.loss.item(), total / count, rel_tol=1e-12)


def test_advantages_per_trajectory_broadcast() -> None:
    lp, old, _, mask = _random_inputs(2)
    adv = torch.randn(lp.shape[0], dtype=torch.float64)
    a = clipped_surrogate_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    b = clipped_surrogate_loss(
        lp, old, adv[:, None].expand_as(lp), mask, eps_low=0.2, eps_high=0.28
    )
    assert torch.equal(a.loss, b.loss)


def test_masked_tokens_change_nothing() -> None:
    lp, old, adv, mask = _random_inputs(3)
    out = clipped_surrogate_loss(
        lp, old, adv, mask, eps_low=0.2, eps_high=0.28, agg="seq-mean-token-mean"
    )
    (grad,) = torch.autograd.grad(out.loss, lp)
    assert (grad[mask == 0] == 0).all() and (grad[mask == 1] != 0).any()
    hole = mask == 0
    lp2 = lp.detach().clone()
    lp2[hole] = float("nan")
    lp2.requires_grad_(True)
    old2, adv2 = old.clone(), adv.clone()
    old2[hole] = 1e30
    adv2[hole] = float("inf")
    out2 = clipped_surrogate_loss(
        lp2, old2, adv2, mask, eps_low=0.2, eps_high=0.28, agg="seq-mean-token-mean"
    )
    (grad2,) = torch.autograd.grad(out2.loss, lp2)
    assert torch.equal(out.loss, out2.loss) and torch.equal(grad, grad2)
    for k in out.metrics:
        assert torch.equal(out.metrics[k], out2.metrics[k]), k
    # bool and float masks agree
    out3 = clipped_surrogate_loss(
        lp, old, adv, mask.bool(), eps_low=0.2, eps_high=0.28, agg="seq-mean-token-mean"
    )
    assert torch.equal(out.loss, out3.loss)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batch_invariance(mode: str) -> None:
    lp, old, adv, mask = _random_inputs(4, B=9, T=6)
    num_tokens, num_seqs = loss_counts(mask)
    kw = {"eps_low": 0.2, "eps_high": 0.28, "agg": mode, "seq_norm": 6}
    full = clipped_surrogate_loss(lp, old, adv, mask, **kw)
    (full_grad,) = torch.autograd.grad(full.loss, lp)
    total, grad_sum = 0.0, torch.zeros_like(lp)
    metric_sums = dict.fromkeys(("clip_frac_low", "clip_frac_high", "ratio_mean", "approx_kl"), 0.0)
    for sl in (slice(0, 2), slice(2, 3), slice(3, 9)):
        part_lp = lp.detach()[sl].clone().requires_grad_(True)
        out = clipped_surrogate_loss(
            part_lp, old[sl], adv[sl], mask[sl], num_tokens=num_tokens, num_seqs=num_seqs, **kw
        )
        (g,) = torch.autograd.grad(out.loss, part_lp)
        total = total + out.loss
        grad_sum[sl] = g
        for k in metric_sums:
            metric_sums[k] += out.metrics[k]
    torch.testing.assert_close(total, full.loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad_sum, full_grad, rtol=1e-12, atol=1e-14)
    for k, v in metric_sums.items():
        torch.testing.assert_close(v, full.metrics[k], rtol=1e-12, atol=1e-14)


def test_aggregation_hand_values() -> None:
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    assert float(aggregate_loss(loss, mask, "token-mean")) == pytest.approx(7 / 3)
    # per sequence: 1.5 and 4, empty row excluded from the count
    assert float(aggregate_loss(loss, mask, "seq-mean-token-mean")) == pytest.approx(2.75)
    # per sequence sums 3 and 4 over seq_norm 10, mean over 2 sequences
    got = aggregate_loss(loss, mask, "seq-mean-token-sum-norm", seq_norm=10)
    assert float(got) == pytest.approx(0.35)
    assert float(aggregate_loss(loss, mask, "token-mean", num_tokens=6)) == pytest.approx(7 / 6)
    assert float(aggregate_loss(loss, torch.zeros(3, 3), "token-mean")) == 0.0


def test_aggregation_errors() -> None:
    loss, mask = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="token-mean.*seq-mean-token-mean"):
        aggregate_loss(loss, mask, "sum")
    with pytest.raises(ValueError, match="seq_norm"):
        aggregate_loss(loss, mask, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        aggregate_loss(loss, torch.ones(2, 4), "token-mean")
    with pytest.raises(ValueError, match="0 and 1"):
        check_mask(torch.tensor([[1.0, 0.5]]))
    check_mask(torch.tensor([[1.0, 0.0]]))


def test_surrogate_argument_errors() -> None:
    lp, old, adv, mask = _random_inputs(5)
    with pytest.raises(ValueError, match="dual_clip"):
        clipped_surrogate_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.2, dual_clip=1.0)
    with pytest.raises(ValueError, match="eps_low"):
        clipped_surrogate_loss(lp, old, adv, mask, eps_low=1.0, eps_high=0.2)
    with pytest.raises(ValueError, match="eps_high"):
        clipped_surrogate_loss(lp, old, adv, mask, eps_low=0.2, eps_high=-0.1)
    with pytest.raises(ValueError, match=r"eps_low tensor.*\[B, 1\]"):  # [B] would align with T
        clipped_surrogate_loss(lp, old, adv, mask, eps_low=torch.full((5,), 0.2), eps_high=0.2)
    with pytest.raises(ValueError, match="eps_high tensor"):
        clipped_surrogate_loss(lp, old, adv, mask, eps_low=0.2, eps_high=torch.full((4, 1), 0.2))
    with pytest.raises(ValueError, match="advantages"):
        clipped_surrogate_loss(lp, old, adv[:, :3], mask, eps_low=0.2, eps_high=0.2)
    with pytest.raises(ValueError, match="share the shape"):
        clipped_surrogate_loss(lp, old[:, :3], adv, mask, eps_low=0.2, eps_high=0.2)
    with pytest.raises(ValueError, match="unknown aggregation"):
        clipped_surrogate_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.2, agg="mean")


def test_log_ratio_clamped() -> None:
    # log r = 50 would overflow float32 ratio-based arithmetic; it is clamped to 20
    lp, old, a, mask = _single_tokens([1.0], [-1.0])
    old = old - 50.0
    out = clipped_surrogate_loss(lp, old, a, mask, eps_low=EPS, eps_high=EPS, dual_clip=None)
    assert math.isclose(out.loss.item(), math.exp(20.0), rel_tol=1e-12)


def test_kl_k3_values_and_exact_expectation() -> None:
    lp = torch.log(torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64))
    ref = torch.log(torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64))
    k3 = kl_k3(lp, ref)
    d = ref - lp
    torch.testing.assert_close(k3, torch.exp(d) - d - 1)
    # E_{y ~ pi}[k3] = KL(pi || ref) exactly (E[ref/pi] = 1)
    p = lp.exp()
    kl = float((p * (lp - ref)).sum())
    assert math.isclose(float((p * k3).sum()), kl, rel_tol=1e-12)
    assert (kl_k3(torch.zeros(2), torch.tensor([0.0, 100.0])) == torch.tensor([0.0, 10.0])).all()
    with pytest.raises(ValueError, match="same shape"):
        kl_k3(torch.zeros(2), torch.zeros(3))
