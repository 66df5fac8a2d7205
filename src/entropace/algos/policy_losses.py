"""Registry of policy losses with one uniform signature (verl ``core_algos`` style).

Every registered loss is called as::

    fn(logprobs, old_logprobs, advantages, mask, *, eps_low=None, eps_high=None,
       agg="token-mean", num_tokens=None, num_seqs=None, seq_norm=None, **options) -> LossOutput

- ``logprobs`` / ``old_logprobs`` / ``mask``: ``[B, T]``; ``advantages``: ``[B]`` or ``[B, T]``.
- ``eps_low`` / ``eps_high``: floats or tensors broadcastable to ``[B, T]``; None means that
  loss's own default (table of BASELINES.md). A value passed by the caller is always used as is.
- ``agg``, ``num_tokens``, ``num_seqs``, ``seq_norm``: see :func:`entropace.algos.aggregate_loss`.
- ``options``: the loss's own hyperparameters (keyword-only, with the defaults listed below); an
  unknown option raises ``TypeError``.

Registered names: ``ppo`` (GRPO, Dr.GRPO, DAPO, RLOO, BAPO, EPPO all use it, with their own
bounds/aggregation), ``gspo``, ``clip_cov``, ``kl_cov``, ``dcpo``, ``ce_gppo``. Add one with
``@register_policy_loss("name")``.

No loss checks for NaN/inf (a host sync per call): the trainer checks the loss once per step and
skips non-finite steps. Masked-out positions never influence the loss or the gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor

from entropace.algos.aggregation import Count
from entropace.algos.surrogate import (
    LOG_RATIO_CLAMP,
    Bound,
    LossOutput,
    TokenInputs,
    apply_dual_clip,
    as_bound,
    check_dual_clip,
    clip_bounds,
    clipped_surrogate_loss,
    finish_loss,
    ppo_clip_token_loss,
    prepare_token_inputs,
)

__all__ = ["POLICY_LOSSES", "PolicyLossFn", "get_policy_loss", "register_policy_loss"]


class PolicyLossFn(Protocol):
    """The uniform signature of a registered policy loss (see the module docstring)."""

    def __call__(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        *,
        eps_low: Bound | None = None,
        eps_high: Bound | None = None,
        agg: str = "token-mean",
        num_tokens: Count | None = None,
        num_seqs: Count | None = None,
        seq_norm: Count | None = None,
        **options: Any,
    ) -> LossOutput: ...


POLICY_LOSSES: dict[str, PolicyLossFn] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator adding a loss with the uniform signature to :data:`POLICY_LOSSES`."""

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = fn
        return fn

    return decorator


def get_policy_loss(name: str) -> PolicyLossFn:
    """The registered loss ``name``; ``KeyError`` listing the known names otherwise."""
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise KeyError(f"unknown policy loss {name!r}; known: {sorted(POLICY_LOSSES)}") from None


def _or(value: Bound | None, default: float) -> Bound:
    return default if value is None else value


def _descending_rank(keys: Tensor) -> Tensor:
    """Rank of each entry of ``keys`` (any shape) in descending order, ties by flat index."""
    flat = keys.flatten()
    order = torch.argsort(flat, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(
        0, order, torch.arange(flat.numel(), device=flat.device)
    )
    return rank.view_as(keys)


def _token_covariance(inputs: TokenInputs) -> Tensor:
    """``cov_t = (log pi_t - mean log pi)(A_t - mean A)``, means over the masked tokens passed
    (Cui et al., arXiv 2505.22617). Detached ``[B, T]``; 0 where masked."""
    w = inputs.weight
    n = w.sum().clamp_min(1.0)
    lp = inputs.logprobs.detach()
    adv = inputs.advantages
    cov = (lp - (lp * w).sum() / n) * (adv - (adv * w).sum() / n)
    return cov * w


def _top_k_count(fraction: float, inputs: TokenInputs) -> Tensor:
    """``max(1, floor(fraction * N))`` with N the masked-token count, as a tensor (no sync)."""
    n = inputs.weight.sum().to(torch.float64)  # float64, as Python's int(fraction * n)
    return torch.floor(fraction * n).clamp_min(1.0)


@register_policy_loss("ppo")
def ppo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: Bound | None = None,
    eps_high: Bound | None = None,
    agg: str = "token-mean",
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    seq_norm: Count | None = None,
    dual_clip: float | None = 3.0,
) -> LossOutput:
    """PPO clipped surrogate with dual clip; see :func:`entropace.algos.clipped_surrogate_loss`.

    Defaults: ``eps_low = eps_high = 0.2``, ``dual_clip = 3``. DAPO passes 0.2 / 0.28 and
    ``token-mean``; EPPO passes per-task tensors; BAPO its adaptive bounds.
    """
    return clipped_surrogate_loss(
        logprobs, old_logprobs, advantages, mask,
        eps_low=_or(eps_low, 0.2), eps_high=_or(eps_high, 0.2), dual_clip=dual_clip,
        agg=agg, num_tokens=num_tokens, num_seqs=num_seqs, seq_norm=seq_norm,
    )  # fmt: skip


@register_policy_loss("gspo")
def gspo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: Bound | None = None,
    eps_high: Bound | None = None,
    agg: str = "token-mean",
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    seq_norm: Count | None = None,
    dual_clip: float | None = None,
) -> LossOutput:
    """GSPO: the ratio is the sequence's geometric-mean ratio, clipped per sequence (arXiv 2507.18071).

    ``s_i = exp(mean_{t in y_i} log r_t)``; loss ``max(-A s_i, -A clip(s_i, 1 - eps_l, 1 + eps_h))``.
    Implemented in the paper's GSPO-token form: every token of sequence i gets the ratio
    ``s_it = sg(s_i) * pi(y_t) / sg(pi(y_t))`` (value ``s_i``), so per-token advantages are
    allowed; with a per-sequence advantage and ``agg="seq-mean-token-mean"`` (the paper's
    aggregation) value and gradient equal the sequence-level objective
    ``mean_i max(-A_i s_i, -A_i clip(s_i))``.

    The bounds act on a sequence ratio, which moves far less than a token ratio: the defaults are
    the paper's ``eps_low = 3e-4``, ``eps_high = 4e-4``. Bounds passed by the caller are used as
    they are, so a preset must not hand GSPO token-scale bounds such as 0.2 unless it means it.
    ``dual_clip`` is off by default (the paper has none).
    """
    check_dual_clip(dual_clip)
    inputs = prepare_token_inputs(logprobs, old_logprobs, advantages, mask)
    lower, upper = clip_bounds(_or(eps_low, 3e-4), _or(eps_high, 4e-4), inputs.log_ratio)
    lengths = inputs.weight.sum(-1).clamp_min(1.0)
    seq_log_ratio = inputs.log_ratio.detach().sum(-1) / lengths  # [B]
    token_log_ratio = seq_log_ratio[:, None] + inputs.logprobs - inputs.logprobs.detach()
    ratio = torch.exp(token_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    loss_mat, flags = ppo_clip_token_loss(ratio, inputs.advantages, lower, upper, dual_clip)
    return finish_loss(
        loss_mat, inputs, ratio, flags,
        agg=agg, num_tokens=num_tokens, num_seqs=num_seqs, seq_norm=seq_norm,
    )  # fmt: skip


@register_policy_loss("clip_cov")
def clip_cov_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: Bound | None = None,
    eps_high: Bound | None = None,
    agg: str = "token-mean",
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    seq_norm: Count | None = None,
    clip_ratio: float = 2e-4,
    cov_lower: float = 1.0,
    cov_upper: float = 5.0,
    generator: torch.Generator | None = None,
) -> LossOutput:
    """Clip-Cov (Cui et al., "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617).

    PPO clip (no dual clip, as the reference implementation) plus: over the masked tokens passed
    (``N`` of them), ``cov_t = (log pi_t - mean log pi)(A_t - mean A)``; among tokens with
    ``cov_lower <= cov_t <= cov_upper`` whose PPO clip is not already binding, pick
    ``max(1, floor(clip_ratio * N))`` uniformly at random (``generator``) and drop their gradient
    (their loss value is kept, detached). Metric ``cov_drop_frac``: fraction of masked tokens
    dropped. Sync-free: the random pick is a rank cut on random keys.
    Defaults: ``eps 0.2 / 0.2``, ``clip_ratio 2e-4``, bounds ``[1, 5]``.
    """
    inputs = prepare_token_inputs(logprobs, old_logprobs, advantages, mask)
    lower, upper = clip_bounds(_or(eps_low, 0.2), _or(eps_high, 0.2), inputs.log_ratio)
    ratio = torch.exp(inputs.log_ratio)
    loss_mat, flags = ppo_clip_token_loss(ratio, inputs.advantages, lower, upper, None)
    del flags["dual_clip_frac"]
    cov = _token_covariance(inputs)
    already_clipped = flags["clip_frac_low"] | flags["clip_frac_high"]
    eligible = inputs.mask & ~already_clipped & (cov >= cov_lower) & (cov <= cov_upper)
    gen_device = generator.device if generator is not None else cov.device
    keys = torch.rand(cov.shape, generator=generator, device=gen_device).to(cov.device)
    keys = torch.where(eligible, keys, torch.full_like(keys, -1.0))
    drop = eligible & (_descending_rank(keys) < _top_k_count(clip_ratio, inputs))
    loss_mat = torch.where(drop, loss_mat.detach(), loss_mat)
    flags["cov_drop_frac"] = drop
    return finish_loss(
        loss_mat, inputs, ratio, flags,
        agg=agg, num_tokens=num_tokens, num_seqs=num_seqs, seq_norm=seq_norm,
    )  # fmt: skip


@register_policy_loss("kl_cov")
def kl_cov_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: Bound | None = None,
    eps_high: Bound | None = None,
    agg: str = "token-mean",
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    seq_norm: Count | None = None,
    kl_ratio: float = 2e-3,
    kl_coef: float = 1.0,
) -> LossOutput:
    """KL-Cov (Cui et al., arXiv 2505.22617): no clip; a KL penalty on the top-covariance tokens.

    Per token ``L_t = -A_t r_t``; the ``max(1, floor(kl_ratio * N))`` masked tokens with the
    largest ``cov_t`` (as in Clip-Cov; ties broken by position) get ``+ kl_coef |log r_t|``.
    ``eps_low`` / ``eps_high`` are accepted for the uniform signature and ignored. Defaults
    ``kl_ratio 2e-3`` (the paper's 7B value; 2e-4 for 32B), ``kl_coef 1``. Metric
    ``kl_cov_frac``: fraction of masked tokens penalised.
    """
    inputs = prepare_token_inputs(logprobs, old_logprobs, advantages, mask)
    ratio = torch.exp(inputs.log_ratio)
    cov = _token_covariance(inputs)
    keys = torch.where(inputs.mask, cov, torch.full_like(cov, -torch.inf))
    selected = inputs.mask & (_descending_rank(keys) < _top_k_count(kl_ratio, inputs))
    penalty = kl_coef * inputs.log_ratio.abs()
    loss_mat = -inputs.advantages * ratio + torch.where(
        selected, penalty, torch.zeros_like(penalty)
    )
    return finish_loss(
        loss_mat, inputs, ratio, {"kl_cov_frac": selected},
        agg=agg, num_tokens=num_tokens, num_seqs=num_seqs, seq_norm=seq_norm,
    )  # fmt: skip


def dcpo_bounds(
    old_logprobs: Tensor, eps_low: Bound, eps_high: Bound, r_max: float
) -> tuple[Tensor, Tensor]:
    """DCPO's ratio bounds from the old token probability ``q = exp(old_logprobs)`` (arXiv 2509.02333).

    ``lower = 0.5 + 0.5 sqrt(max(1 - 4 eps_l / q, 0))``,
    ``upper = min(0.5 + 0.5 sqrt(1 + 4 eps_h / q), r_max)``: rare tokens (small q) get a wider
    range, capped at ``r_max``. At ``q = 1`` with 0.16 / 0.2: ``[0.8, 1.171]``.
    """
    q = torch.exp(old_logprobs)
    lower = 0.5 + 0.5 * torch.sqrt(torch.clamp(1.0 - 4.0 * eps_low / q, min=0.0))
    upper = torch.clamp(0.5 + 0.5 * torch.sqrt(1.0 + 4.0 * eps_high / q), max=r_max)
    return lower, upper


@register_policy_loss("dcpo")
def dcpo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: Bound | None = None,
    eps_high: Bound | None = None,
    agg: str = "token-mean",
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    seq_norm: Count | None = None,
    r_max: float = 10.0,
    dual_clip: float | None = 3.0,
) -> LossOutput:
    """DCPO dynamic clipping (arXiv 2509.02333): the PPO surrogate with :func:`dcpo_bounds`.

    Defaults ``eps_low 0.16``, ``eps_high 0.2``, upper bound capped at ``r_max = 10``, dual clip 3
    (verl's default, on which DCPO's implementation is built). The paper aggregates a token mean
    per response summed over responses, i.e. ``seq-mean-token-mean`` times the (constant)
    number of responses: pass ``agg="seq-mean-token-mean"``.
    """
    check_dual_clip(dual_clip)
    inputs = prepare_token_inputs(logprobs, old_logprobs, advantages, mask)
    old = torch.where(inputs.mask, old_logprobs.detach().to(inputs.log_ratio.dtype), 0.0)
    eps_l = as_bound(_or(eps_low, 0.16), old, "eps_low")
    eps_h = as_bound(_or(eps_high, 0.2), old, "eps_high")
    lower, upper = dcpo_bounds(old, eps_l, eps_h, r_max)
    ratio = torch.exp(inputs.log_ratio)
    loss_mat, flags = ppo_clip_token_loss(ratio, inputs.advantages, lower, upper, dual_clip)
    return finish_loss(
        loss_mat, inputs, ratio, flags,
        agg=agg, num_tokens=num_tokens, num_seqs=num_seqs, seq_norm=seq_norm,
    )  # fmt: skip


@register_policy_loss("ce_gppo")
def ce_gppo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: Bound | None = None,
    eps_high: Bound | None = None,
    agg: str = "token-mean",
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    seq_norm: Count | None = None,
    beta1: float = 0.75,
    beta2: float = 1.0,
    dual_clip: float | None = 3.0,
) -> LossOutput:
    """CE-GPPO gradient-preserving clip (arXiv 2509.20712).

    Where PPO's clip binds, keep a bounded gradient instead of none (``sg`` = stop-gradient)::

        A < 0, r < 1 - eps_l:  L = -beta1 (1 - eps_l) (r / sg(r)) A   (grad -beta1 (1-eps_l) A dlog pi)
        A > 0, r > 1 + eps_h:  L = -beta2 (1 + eps_h) (r / sg(r)) A   (grad -beta2 (1+eps_h) A dlog pi)
        otherwise:             L = -A r,  then the dual clip for A < 0.

    Defaults (the authors' implementation): ``eps 0.2 / 0.2``, ``beta1 0.75``, ``beta2 1``,
    dual clip 3.
    """
    check_dual_clip(dual_clip)
    inputs = prepare_token_inputs(logprobs, old_logprobs, advantages, mask)
    lower, upper = clip_bounds(_or(eps_low, 0.2), _or(eps_high, 0.2), inputs.log_ratio)
    adv = inputs.advantages
    ratio = torch.exp(inputs.log_ratio)
    unit = ratio / ratio.detach()  # value 1, gradient d log pi
    low = (adv < 0) & (ratio < lower)
    high = (adv > 0) & (ratio > upper)
    loss_mat = -adv * ratio
    loss_mat = torch.where(low, -beta1 * lower * unit * adv, loss_mat)
    loss_mat = torch.where(high, -beta2 * upper * unit * adv, loss_mat)
    loss_mat, dual = apply_dual_clip(loss_mat, adv, dual_clip)
    flags = {"clip_frac_low": low, "clip_frac_high": high, "dual_clip_frac": dual}
    return finish_loss(
        loss_mat, inputs, ratio, flags,
        agg=agg, num_tokens=num_tokens, num_seqs=num_seqs, seq_norm=seq_norm,
    )  # fmt: skip
