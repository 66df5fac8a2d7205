"""The PPO clipped surrogate with per-token bounds and dual clip, and its building blocks.

Per token (minimised; ALGORITHMS.md section 1; PPO arXiv 1707.06347, dual clip arXiv 1912.09729):

    r_t = exp(clamp(log pi(y_t) - log pi_old(y_t), -20, 20))
    L_t = max(-A_t r_t, -A_t clip(r_t, 1 - eps_low_t, 1 + eps_high_t))
    L_t = min(L_t, -c A_t)            for A_t < 0 (dual clip, c > 1; c = None disables it)

The bounds are tensors broadcastable to ``[B, T]`` (a float, ``[B, 1]`` per trajectory or task,
``[B, T]`` per token), so per-task rules such as EPPO's pacer are just a different tensor.

The policy losses of :mod:`entropace.algos.policy_losses` share :func:`prepare_token_inputs`,
:func:`ppo_clip_token_loss` and :func:`finish_loss`.

Non-finite inputs: no function here checks for NaN/inf (it would cost a host sync per call). The
trainer checks the returned loss once per step and skips non-finite steps. Masked-out positions
may hold anything, NaN included: they are replaced before any arithmetic, so they change neither
the loss nor the gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from entropace.algos.aggregation import Count, aggregate_loss, resolve_count
from entropace.algos.limits import LOG_RATIO_MAX

__all__ = [
    "LOG_RATIO_CLAMP",
    "LossOutput",
    "TokenInputs",
    "Bound",
    "apply_dual_clip",
    "as_bound",
    "check_dual_clip",
    "clip_bounds",
    "clipped_surrogate_loss",
    "finish_loss",
    "ppo_clip_token_loss",
    "prepare_token_inputs",
    "token_metrics",
]

LOG_RATIO_CLAMP = LOG_RATIO_MAX

Bound = float | Tensor


@dataclass
class LossOutput:
    """Result of a policy loss.

    Attributes:
        loss: 0-dim tensor to back-propagate (already aggregated).
        metrics: 0-dim detached tensors (no host sync), averaged over masked tokens with the
            global token count when one is given, so they too sum over micro-batches (except the
            per-micro-batch ``ratio_min`` / ``ratio_max``).
        flags: the per-token indicators behind the fraction metrics, bool ``[B, T]`` (False
            where masked): ``clip_frac_low`` / ``clip_frac_high`` (where the loss's own clip
            binds, whatever its bounds: per-token, probability-dependent or on a sequence
            ratio), ``dual_clip_frac``, ``cov_drop_frac``, ``kl_cov_frac``. Callers that need
            per-task or pooled fractions count these instead of recomputing the clip.
    """

    loss: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)
    flags: dict[str, Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class TokenInputs:
    """Validated per-token inputs, with masked-out positions neutralised.

    Attributes:
        mask: ``[B, T]`` bool, True on tokens that carry a loss.
        weight: ``[B, T]`` float 0/1 (dtype of ``logprobs``).
        logprobs: ``[B, T]`` current log-probs, 0 where masked (gradient flows on masked-in).
        log_ratio: ``[B, T]`` ``clamp(log pi - log pi_old, -20, 20)``, 0 where masked.
        advantages: ``[B, T]`` detached advantages, 0 where masked.
    """

    mask: Tensor
    weight: Tensor
    logprobs: Tensor
    log_ratio: Tensor
    advantages: Tensor


def prepare_token_inputs(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor
) -> TokenInputs:
    """Check shapes and build :class:`TokenInputs`.

    Args:
        logprobs: ``[B, T]`` ``log pi(y_t)``, differentiable.
        old_logprobs: ``[B, T]`` ``log pi_old(y_t)`` (detached here).
        advantages: ``[B]`` (one per trajectory, broadcast to its tokens) or ``[B, T]``
            (detached here).
        mask: ``[B, T]`` 0/1 (bool or float).
    """
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T]; got shape {tuple(logprobs.shape)}")
    if old_logprobs.shape != logprobs.shape or mask.shape != logprobs.shape:
        raise ValueError(
            "logprobs, old_logprobs and mask must share the shape [B, T]; got "
            f"{tuple(logprobs.shape)}, {tuple(old_logprobs.shape)}, {tuple(mask.shape)}"
        )
    if advantages.dim() == 1 and advantages.shape[0] == logprobs.shape[0]:
        advantages = advantages[:, None].expand_as(logprobs)
    elif advantages.shape != logprobs.shape:
        raise ValueError(
            f"advantages must be [B] or [B, T] with [B, T] = {tuple(logprobs.shape)}; "
            f"got {tuple(advantages.shape)}"
        )
    if not torch.is_floating_point(logprobs):
        raise TypeError(f"logprobs must be a floating tensor; got {logprobs.dtype}")
    m = mask.bool() if mask.dtype != torch.bool else mask
    zero = logprobs.new_zeros(())
    lp = torch.where(m, logprobs, zero)
    old = torch.where(m, old_logprobs.detach().to(logprobs.dtype), zero)
    log_ratio = (lp - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    adv = torch.where(m, advantages.detach().to(logprobs.dtype), zero)
    return TokenInputs(
        mask=m, weight=m.to(logprobs.dtype), logprobs=lp, log_ratio=log_ratio, advantages=adv
    )


def as_bound(value: Bound, ref: Tensor, name: str) -> Tensor:
    """A bound parameter (float >= 0, or a 0-dim / broadcastable 2-D tensor) as a tensor on
    ``ref``'s device and dtype; a clear ``ValueError`` otherwise (shape checks only, no sync)."""
    if isinstance(value, Tensor):
        ok = value.dim() in (0, 2)
        if ok:
            try:
                ok = torch.broadcast_shapes(value.shape, ref.shape) == ref.shape
            except RuntimeError:
                ok = False
        if not ok:
            raise ValueError(
                f"{name} tensor must be 0-dim or broadcastable 2-D ([B, 1] per trajectory, "
                f"[B, T] per token) for tokens of shape {tuple(ref.shape)}; got "
                f"{tuple(value.shape)}"
            )
        return value.to(device=ref.device, dtype=ref.dtype)
    if not value >= 0.0:  # also rejects NaN
        raise ValueError(f"{name} must be >= 0; got {value}")
    return ref.new_tensor(float(value))


def clip_bounds(eps_low: Bound, eps_high: Bound, ref: Tensor) -> tuple[Tensor, Tensor]:
    """``(1 - eps_low, 1 + eps_high)`` as tensors on ``ref``'s device and dtype."""
    if not isinstance(eps_low, Tensor) and eps_low >= 1.0:
        raise ValueError(
            f"eps_low must be < 1 (the lower ratio bound is 1 - eps_low); got {eps_low}"
        )
    return 1.0 - as_bound(eps_low, ref, "eps_low"), 1.0 + as_bound(eps_high, ref, "eps_high")


def check_dual_clip(dual_clip: float | None) -> None:
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None to disable it); got {dual_clip}")


def ppo_clip_token_loss(
    ratio: Tensor, advantages: Tensor, lower: Tensor, upper: Tensor, dual_clip: float | None
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token clipped surrogate (formula in the module docstring) and where each clip binds.

    Args:
        ratio: ``[B, T]`` ``r_t`` (differentiable).
        advantages: ``[B, T]`` ``A_t``.
        lower, upper: ratio bounds, broadcastable to ``[B, T]``.
        dual_clip: ``c`` (> 1) or None.

    Returns:
        ``(loss [B, T], flags)``; ``flags`` maps metric names to bool ``[B, T]`` tensors:
        ``clip_frac_low`` (``A < 0, r < lower``: the bound binds, no gradient),
        ``clip_frac_high`` (``A > 0, r > upper``) and ``dual_clip_frac`` (``A < 0, r > c``).
    """
    clipped_ratio = torch.minimum(torch.maximum(ratio, lower), upper)
    loss = torch.maximum(-advantages * ratio, -advantages * clipped_ratio)
    flags = {
        "clip_frac_low": (advantages < 0) & (ratio < lower),
        "clip_frac_high": (advantages > 0) & (ratio > upper),
    }
    loss, flags["dual_clip_frac"] = apply_dual_clip(loss, advantages, dual_clip)
    return loss, flags


def apply_dual_clip(
    loss: Tensor, advantages: Tensor, dual_clip: float | None
) -> tuple[Tensor, Tensor]:
    """``L_t <- min(L_t, -c A_t)`` where ``A_t < 0`` (arXiv 1912.09729); returns the new loss
    and the bool ``[B, T]`` flag of tokens where the cap binds (their gradient is cut)."""
    if dual_clip is None:
        return loss, torch.zeros_like(loss, dtype=torch.bool)
    dual_loss = -advantages * dual_clip
    dual = (advantages < 0) & (loss > dual_loss)
    return torch.where(dual, dual_loss, loss), dual


def token_metrics(
    inputs: TokenInputs, ratio: Tensor, flags: dict[str, Tensor], num_tokens: Count | None
) -> dict[str, Tensor]:
    """Detached 0-dim metrics over masked tokens (no host sync).

    - one entry per bool flag ``[B, T]``: the fraction of masked tokens flagged;
    - ``ratio_mean``, ``ratio_min``, ``ratio_max`` of the ratio the loss used (the sequence
      ratio for GSPO); min / max are per call, ``+inf`` / ``-inf`` when no token is masked in;
    - ``approx_kl``: Schulman's k3 estimator of ``KL(pi_old || pi)`` from the token log-ratios
      (tokens sampled by pi_old), ``(r_t - 1) - log r_t``.
    """
    with torch.no_grad():
        w = inputs.weight
        denom = resolve_count(num_tokens, w.sum())
        ratio = ratio.detach()
        out = {name: (flag.to(w.dtype) * w).sum() / denom for name, flag in flags.items()}
        out["ratio_mean"] = (ratio * w).sum() / denom
        inf = ratio.new_tensor(float("inf"))
        out["ratio_min"] = torch.where(inputs.mask, ratio, inf).amin()
        out["ratio_max"] = torch.where(inputs.mask, ratio, -inf).amax()
        log_r = inputs.log_ratio.detach()  # token-level, also for sequence-ratio losses
        k3 = torch.expm1(log_r) - log_r
        out["approx_kl"] = (k3 * w).sum() / denom
    return out


def finish_loss(
    loss_mat: Tensor,
    inputs: TokenInputs,
    ratio: Tensor,
    flags: dict[str, Tensor],
    *,
    agg: str,
    num_tokens: Count | None,
    num_seqs: Count | None,
    seq_norm: Count | None,
) -> LossOutput:
    """Zero masked positions, aggregate, and attach :func:`token_metrics`."""
    loss_mat = torch.where(inputs.mask, loss_mat, loss_mat.new_zeros(()))
    loss = aggregate_loss(
        loss_mat, inputs.weight, agg, num_tokens=num_tokens, num_seqs=num_seqs, seq_norm=seq_norm
    )
    masked = {name: flag.detach() & inputs.mask for name, flag in flags.items()}
    return LossOutput(
        loss=loss, metrics=token_metrics(inputs, ratio, masked, num_tokens), flags=masked
    )


def clipped_surrogate_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: Bound,
    eps_high: Bound,
    dual_clip: float | None = 3.0,
    agg: str = "token-mean",
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    seq_norm: Count | None = None,
) -> LossOutput:
    """PPO clipped surrogate with asymmetric per-token bounds and dual clip, aggregated.

    Formula in the module docstring (PPO arXiv 1707.06347; clip-higher DAPO arXiv 2503.14476;
    dual clip arXiv 1912.09729). Examples: ``A = 1, r = 1.5, eps = 0.2`` gives
    ``L = -1.2`` with no gradient; ``A = -1, r = 5, eps = 0.2, c = 3``: the PPO term is
    ``max(5, 1.2) = 5``, the dual clip caps it at ``-c A = 3`` (objective ``-3``), no gradient.

    Args:
        logprobs: ``[B, T]`` ``log pi(y_t)``, differentiable.
        old_logprobs: ``[B, T]`` ``log pi_old(y_t)``.
        advantages: ``[B]`` (broadcast over tokens) or ``[B, T]``.
        mask: ``[B, T]`` 0/1 loss mask.
        eps_low, eps_high: floats or tensors broadcastable to ``[B, T]`` (per task / token).
        dual_clip: ``c > 1``, or None to disable.
        agg, num_tokens, num_seqs, seq_norm: see :func:`entropace.algos.aggregate_loss`.

    Returns:
        :class:`LossOutput` with metrics ``clip_frac_low``, ``clip_frac_high``,
        ``dual_clip_frac``, ``ratio_mean``, ``ratio_min``, ``ratio_max``, ``approx_kl``.
    """
    check_dual_clip(dual_clip)
    inputs = prepare_token_inputs(logprobs, old_logprobs, advantages, mask)
    lower, upper = clip_bounds(eps_low, eps_high, inputs.log_ratio)
    ratio = torch.exp(inputs.log_ratio)
    loss_mat, flags = ppo_clip_token_loss(ratio, inputs.advantages, lower, upper, dual_clip)
    return finish_loss(
        loss_mat,
        inputs,
        ratio,
        flags,
        agg=agg,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        seq_norm=seq_norm,
    )
