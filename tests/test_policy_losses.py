"""Policy-loss registry: every baseline against a straightforward loop reference."""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch

from entropace.algos import (
    POLICY_LOSSES,
    LossInputs,
    LossOutput,
    clipped_surrogate_loss,
    get_policy_loss,
    register_policy_loss,
)
from entropace.algos.aggregation import loss_counts
from entropace.algos.policy_losses import GSPOLossConfig, PPOLossConfig

NAMES = ["ppo", "gspo", "clip_cov", "kl_cov", "dcpo", "ce_gppo"]
#: verl's trust regions and plain policy gradients (tests/test_trust_region_losses.py).
VERL_NAMES = ["cispo", "gmpo", "sapo", "dppo_tv", "dppo_kl", "dro", "gpg"]


INPUT_FIELDS = {"eps_low", "eps_high", "agg", "num_tokens", "num_seqs", "seq_norm", "generator"}


def call_loss(name, lp, old, adv, mask, **kw):
    """Call registered loss ``name``: LossInputs fields from ``kw``, the rest as its options."""
    spec = get_policy_loss(name)
    fields = {k: v for k, v in kw.items() if k in INPUT_FIELDS}
    options = {k: v for k, v in kw.items() if k not in INPUT_FIELDS}
    return spec(LossInputs(lp, old, adv, mask, **fields), spec.make_config(options))


def _inputs(seed: int, B: int = 6, T: int = 8, spread: float = 0.5, per_seq_adv: bool = False):
    g = torch.Generator().manual_seed(seed)
    lp = (torch.randn(B, T, generator=g, dtype=torch.float64) * 1.5 - 2.0).clamp(max=-1e-3)
    lp.requires_grad_(True)
    old = (lp.detach() + spread * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=0)
    adv = torch.randn(B, generator=g, dtype=torch.float64) * 2
    if not per_seq_adv:
        adv = adv[:, None] + torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) > 0.25).to(torch.float64)
    mask[:, 0] = 1.0
    mask[-1] = 0.0  # a fully masked row
    return lp, old, adv, mask


def _masked_cells(mask: torch.Tensor) -> list[tuple[int, int]]:
    return [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t]]


def test_registry_names_uniform_call_and_errors() -> None:
    assert set(NAMES) | set(VERL_NAMES) <= set(POLICY_LOSSES)
    lp, old, adv, mask = _inputs(0)
    for name in POLICY_LOSSES:
        fn = functools.partial(call_loss, name)
        for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
            out = fn(lp, old, adv, mask, eps_low=0.2, eps_high=0.28, agg=agg, seq_norm=8,
                     num_tokens=None, num_seqs=None)  # fmt: skip
            assert isinstance(out, LossOutput) and out.loss.dim() == 0
            assert torch.isfinite(out.loss)
            assert all(v.dim() == 0 and not v.requires_grad for v in out.metrics.values())
        # eps may be omitted: the loss's own defaults
        assert torch.isfinite(fn(lp, old, adv, mask).loss)
    with pytest.raises(KeyError, match="unknown policy loss 'grpo'.*ce_gppo.*ppo"):
        get_policy_loss("grpo")
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("ppo", config=PPOLossConfig, default_bounds=None)(
            POLICY_LOSSES["ppo"].fn
        )
    with pytest.raises(ValueError, match=r"'ppo': unknown option\(s\) \['beta1'\]"):
        call_loss("ppo", lp, old, adv, mask, beta1=0.5)
    with pytest.raises(TypeError, match="takes a PPOLossConfig; got GSPOLossConfig"):
        get_policy_loss("ppo")(LossInputs(lp, old, adv, mask), GSPOLossConfig())


@dataclasses.dataclass(frozen=True)
class _ReinforceConfig:
    scale: float = 1.0


def test_register_custom_loss() -> None:
    @register_policy_loss("_test_reinforce", config=_ReinforceConfig, default_bounds=None)
    def reinforce(inputs: LossInputs, cfg: _ReinforceConfig) -> LossOutput:
        mask = inputs.mask
        loss = -(inputs.advantages[:, None] * inputs.logprobs * mask).sum() / mask.sum()
        return LossOutput(loss=cfg.scale * loss, metrics={})

    try:
        spec = get_policy_loss("_test_reinforce")
        assert spec.fn is reinforce and spec.default_bounds is None and spec.advantage_weighted
        lp, old, _, mask = _inputs(0)
        adv = torch.ones(lp.shape[0], dtype=torch.float64)
        out = spec(LossInputs(lp, old, adv, mask), spec.make_config({"scale": 2.0}))
        expected = -2.0 * float((lp.detach() * mask).sum() / mask.sum())
        assert float(out.loss.detach()) == pytest.approx(expected)
    finally:
        del POLICY_LOSSES["_test_reinforce"]


def test_ppo_is_the_clipped_surrogate_with_defaults() -> None:
    lp, old, adv, mask = _inputs(1)
    a = call_loss("ppo", lp, old, adv, mask)
    b = clipped_surrogate_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.2, dual_clip=3.0)
    assert torch.equal(a.loss, b.loss)
    c = call_loss("ppo", lp, old, adv, mask, eps_low=0.2, eps_high=0.28, dual_clip=None)
    d = clipped_surrogate_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.28, dual_clip=None)
    assert torch.equal(c.loss, d.loss)


@pytest.mark.parametrize(("eps_low", "eps_high", "spread"), [(None, None, 1e-3), (0.05, 0.08, 0.2)])
def test_gspo_matches_sequence_level_reference(eps_low, eps_high, spread) -> None:
    lp, old, adv, mask = _inputs(2, spread=spread, per_seq_adv=True)
    lo, hi = (3e-4, 4e-4) if eps_low is None else (eps_low, eps_high)
    out = call_loss("gspo", lp, old, adv, mask, eps_low=eps_low, eps_high=eps_high,
                                  agg="seq-mean-token-mean")  # fmt: skip
    (grad,) = torch.autograd.grad(out.loss, lp)
    # reference: s_i = exp(mean_t log r_t), L_i = max(-A s, -A clip(s)), mean over sequences
    lp_ref = lp.detach().clone().requires_grad_(True)
    losses, clipped = [], 0
    for i in range(lp.shape[0]):
        cells = [t for t in range(lp.shape[1]) if mask[i, t]]
        if not cells:
            continue
        s = torch.exp(sum(lp_ref[i, t] - old[i, t] for t in cells) / len(cells))
        a = float(adv[i])
        s_clip = s.clamp(1 - lo, 1 + hi)
        clipped += int((-a * s_clip).item() > (-a * s).item())  # the clip binds
        losses.append(torch.maximum(-a * s, -a * s_clip))
    ref = torch.stack(losses).mean()
    (ref_grad,) = torch.autograd.grad(ref, lp_ref)
    torch.testing.assert_close(out.loss, ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-14)
    assert clipped > 0 and clipped < len(losses)  # the test exercises both branches


def test_gspo_default_bounds_hand_value() -> None:
    # one sequence, mean log r = log(1.001), A = 1: clipped at 1 + 4e-4
    lp = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    old = -torch.log(torch.tensor([[1.001, 1.001]], dtype=torch.float64))
    out = call_loss("gspo", lp, old, torch.ones(1, dtype=torch.float64), torch.ones(1, 2))
    assert math.isclose(out.loss.item(), -1.0004, rel_tol=1e-12)
    assert float(out.metrics["clip_frac_high"]) == 1.0


def _dcpo_ref(r: float, q: float, a: float, el: float, eh: float) -> tuple[float, float]:
    """(loss, d loss / d log pi) of one DCPO token (dual clip 3, r_max 10)."""
    lower = 0.5 + 0.5 * math.sqrt(max(1 - 4 * el / q, 0.0))
    upper = min(0.5 + 0.5 * math.sqrt(1 + 4 * eh / q), 10.0)
    unclipped, clipped = -a * r, -a * min(max(r, lower), upper)
    if clipped > unclipped:
        loss, grad = clipped, 0.0
    else:
        loss, grad = unclipped, -a * r
    if a < 0 and loss > -3 * a:
        loss, grad = -3 * a, 0.0
    return loss, grad


def test_dcpo_matches_loop_reference() -> None:
    lp, old, adv, mask = _inputs(3, spread=1.0)
    out = call_loss("dcpo", lp, old, adv, mask)
    (grad,) = torch.autograd.grad(out.loss, lp)
    cells = _masked_cells(mask)
    n = len(cells)
    total, clipped = 0.0, 0
    for i, t in cells:
        r = math.exp(float(lp.detach()[i, t] - old[i, t]))
        loss, g = _dcpo_ref(r, math.exp(float(old[i, t])), float(adv[i, t]), 0.16, 0.2)
        total += loss
        clipped += g == 0.0
        assert math.isclose(float(grad[i, t]), g / n, rel_tol=1e-10, abs_tol=1e-15)
    assert math.isclose(out.loss.item(), total / n, rel_tol=1e-12)
    assert 0 < clipped < n
    # at q = 1 the bounds are [0.8, 0.5 + 0.5 sqrt(1.8)]
    assert _dcpo_ref(2.0, 1.0, 1.0, 0.16, 0.2)[0] == pytest.approx(-(0.5 + 0.5 * math.sqrt(1.8)))
    assert _dcpo_ref(0.1, 1.0, -1.0, 0.16, 0.2)[0] == pytest.approx(0.8)


def test_dcpo_upper_bound_capped_at_r_max() -> None:
    # q = 1e-4: 0.5 + 0.5 sqrt(1 + 8000) > 10, so r = 30 with A = 1 is clipped at 10
    lp = torch.log(torch.tensor([[3e-3]], dtype=torch.float64)).requires_grad_(True)
    old = torch.log(torch.tensor([[1e-4]], dtype=torch.float64))
    out = call_loss("dcpo", lp, old, torch.ones(1, dtype=torch.float64), torch.ones(1, 1))
    assert math.isclose(out.loss.item(), -10.0, rel_tol=1e-12)


def test_ce_gppo_values_and_gradients_outside_clip_range() -> None:
    beta1, beta2, eps = 0.6, 0.9, 0.2
    lp, old, adv, mask = _inputs(4, spread=0.6)
    out = call_loss("ce_gppo", lp, old, adv, mask, beta1=beta1, beta2=beta2)
    (grad,) = torch.autograd.grad(out.loss, lp)
    cells = _masked_cells(mask)
    n = len(cells)
    total, seen = 0.0, set()
    for i, t in cells:
        r, a = math.exp(float(lp.detach()[i, t] - old[i, t])), float(adv[i, t])
        if a < 0 and r < 1 - eps:  # gradient preserved, scaled: -beta1 (1 - eps) A
            loss, g, case = -beta1 * (1 - eps) * a, -beta1 * (1 - eps) * a, "low"
        elif a > 0 and r > 1 + eps:
            loss, g, case = -beta2 * (1 + eps) * a, -beta2 * (1 + eps) * a, "high"
        else:
            loss, g, case = -a * r, -a * r, "inside"
            if a < 0 and loss > -3 * a:
                loss, g, case = -3 * a, 0.0, "dual"
        seen.add(case)
        total += loss
        assert math.isclose(float(grad[i, t]), g / n, rel_tol=1e-10, abs_tol=1e-15), case
    assert math.isclose(out.loss.item(), total / n, rel_tol=1e-12)
    assert {"low", "high", "inside"} <= seen


def _cov_ref(lp: torch.Tensor, adv: torch.Tensor, cells: list[tuple[int, int]]) -> dict:
    n = len(cells)
    mean_lp = sum(float(lp.detach()[c]) for c in cells) / n
    mean_a = sum(float(adv[c]) for c in cells) / n
    return {c: (float(lp.detach()[c]) - mean_lp) * (float(adv[c]) - mean_a) for c in cells}


def test_kl_cov_matches_loop_reference() -> None:
    lp, old, adv, mask = _inputs(5, B=8, T=10)
    kl_ratio, coef = 0.05, 0.7
    out = call_loss("kl_cov", lp, old, adv, mask, kl_ratio=kl_ratio, kl_coef=coef)
    (grad,) = torch.autograd.grad(out.loss, lp)
    cells = _masked_cells(mask)
    n = len(cells)
    cov = _cov_ref(lp.detach(), adv, cells)
    k = max(1, math.floor(kl_ratio * n))
    top = set(sorted(cells, key=lambda c: -cov[c])[:k])
    total = 0.0
    for c in cells:
        log_r = float(lp.detach()[c] - old[c])
        r, a = math.exp(log_r), float(adv[c])
        loss, g = -a * r, -a * r
        if c in top:
            loss += coef * abs(log_r)
            g += coef * math.copysign(1.0, log_r)
        total += loss
        assert math.isclose(float(grad[c]), g / n, rel_tol=1e-10, abs_tol=1e-15)
    assert k >= 2
    assert math.isclose(out.loss.item(), total / n, rel_tol=1e-12)
    assert math.isclose(float(out.metrics["kl_cov_frac"]), k / n, rel_tol=1e-12)


def _clip_cov_setup():
    lp, old, adv, mask = _inputs(6, B=10, T=12, spread=0.3)
    adv = adv * 2.5  # spread covariances so that several land in [1, 5]
    cells = _masked_cells(mask)
    cov = _cov_ref(lp.detach(), adv, cells)
    eligible = set()
    for c in cells:
        r, a = math.exp(float(lp.detach()[c] - old[c])), float(adv[c])
        clipped = (a < 0 and r < 0.8) or (a > 0 and r > 1.2)
        if not clipped and 1.0 <= cov[c] <= 5.0:
            eligible.add(c)
    return lp, old, adv, mask, cells, eligible


def test_clip_cov_drops_all_eligible_when_ratio_large() -> None:
    lp, old, adv, mask, cells, eligible = _clip_cov_setup()
    assert len(eligible) >= 4
    out = call_loss("clip_cov", lp, old, adv, mask, clip_ratio=1.0)
    (grad,) = torch.autograd.grad(out.loss, lp)
    n = len(cells)
    total = 0.0
    for c in cells:
        r, a = math.exp(float(lp.detach()[c] - old[c])), float(adv[c])
        clipped_r = min(max(r, 0.8), 1.2)
        loss = max(-a * r, -a * clipped_r)  # no dual clip; dropped tokens keep their value
        total += loss
        g = 0.0 if (c in eligible or -a * clipped_r > -a * r) else -a * r
        assert math.isclose(float(grad[c]), g / n, rel_tol=1e-10, abs_tol=1e-15)
    assert math.isclose(out.loss.item(), total / n, rel_tol=1e-12)
    assert math.isclose(float(out.metrics["cov_drop_frac"]), len(eligible) / n)


def test_clip_cov_random_subset_is_deterministic_per_generator() -> None:
    lp, old, adv, mask, cells, eligible = _clip_cov_setup()
    n = len(cells)
    clip_ratio = 2.5 / n  # k = 2 < |eligible|
    fn = functools.partial(call_loss, "clip_cov")
    dropped_sets = []
    for seed in (0, 0, 1, 2, 3):
        out = fn(
            lp, old, adv, mask, clip_ratio=clip_ratio, generator=torch.Generator().manual_seed(seed)
        )
        (grad,) = torch.autograd.grad(out.loss, lp)
        base = fn(lp, old, adv, mask, clip_ratio=1e-9, cov_lower=1e9, cov_upper=1e9)  # none
        (base_grad,) = torch.autograd.grad(base.loss, lp)
        assert torch.equal(out.loss, base.loss)  # values kept, only gradients dropped
        dropped = {c for c in cells if grad[c] == 0 and base_grad[c] != 0}
        assert len(dropped) == 2 and dropped <= eligible
        assert math.isclose(float(out.metrics["cov_drop_frac"]), 2 / n)
        dropped_sets.append(dropped)
    assert dropped_sets[0] == dropped_sets[1]
    assert len({frozenset(s) for s in dropped_sets}) > 1  # different seeds, different subsets


@pytest.mark.parametrize("name", NAMES + VERL_NAMES)
def test_masked_tokens_change_nothing(name: str) -> None:
    lp, old, adv, mask = _inputs(7)
    fn = functools.partial(call_loss, name)
    kw = {"agg": "seq-mean-token-mean"}
    gen = {"generator": torch.Generator().manual_seed(0)} if name == "clip_cov" else {}
    out = fn(lp, old, adv, mask, **kw, **gen)
    (grad,) = torch.autograd.grad(out.loss, lp)
    hole = mask == 0
    lp2 = lp.detach().clone()
    lp2[hole] = float("nan")
    lp2.requires_grad_(True)
    old2, adv2 = old.clone(), adv.clone()
    old2[hole], adv2[hole] = -1e30, float("nan")
    gen = {"generator": torch.Generator().manual_seed(0)} if name == "clip_cov" else {}
    out2 = fn(lp2, old2, adv2, mask, **kw, **gen)
    (grad2,) = torch.autograd.grad(out2.loss, lp2)
    assert torch.equal(out.loss, out2.loss)
    assert torch.equal(grad, grad2) and (grad[hole] == 0).all()
    for k in out.metrics:
        assert torch.equal(out.metrics[k], out2.metrics[k]), k


@pytest.mark.parametrize("name", ["ppo", "gspo", "dcpo", "ce_gppo", *VERL_NAMES])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batch_invariance(name: str, agg: str) -> None:
    # (clip_cov / kl_cov compute their covariance over the tokens passed: not invariant by design)
    lp, old, adv, mask = _inputs(8, B=9, spread=1.0)
    fn = functools.partial(call_loss, name)
    num_tokens, num_seqs = loss_counts(mask)
    kw = {"eps_low": 0.1, "eps_high": 0.15, "agg": agg, "seq_norm": 8}
    full = fn(lp, old, adv, mask, **kw)
    (full_grad,) = torch.autograd.grad(full.loss, lp)
    total, grads = 0.0, []
    for sl in (slice(0, 4), slice(4, 5), slice(5, 9)):
        part = lp.detach()[sl].clone().requires_grad_(True)
        out = fn(part, old[sl], adv[sl], mask[sl], num_tokens=num_tokens, num_seqs=num_seqs, **kw)
        grads.append(torch.autograd.grad(out.loss, part)[0])
        total = total + out.loss
    torch.testing.assert_close(total, full.loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(torch.cat(grads), full_grad, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", NAMES + VERL_NAMES)
def test_no_host_sync(name: str) -> None:
    """On the meta device any data-dependent host read (.item(), bool(), nonzero) raises, so a
    loss that runs there, forward and backward, cannot sync with the host."""
    with pytest.raises(RuntimeError, match="meta"):  # the probe does catch a sync
        torch.ones(2, device="meta").sum().item()
    B, T = 4, 6
    lp = torch.randn(B, T, device="meta", requires_grad=True)
    mask = torch.ones(B, T, device="meta")
    num_tokens, num_seqs = loss_counts(mask)
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        out = call_loss(name,
            lp, torch.randn(B, T, device="meta"), torch.randn(B, device="meta"), mask,
            eps_low=torch.full((B, 1), 0.2, device="meta"), eps_high=0.28, agg=agg, seq_norm=T,
            num_tokens=num_tokens, num_seqs=num_seqs,
        )  # fmt: skip
        out.loss.backward()
        assert out.loss.device.type == "meta" and lp.grad is not None
