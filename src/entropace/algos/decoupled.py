"""Off-policy pieces of the update: AReaL's behaviour importance weights, behaviour KL.

AReaL's decoupled PPO objective (Fu et al., arXiv 2505.24298, section 5.2) separates the policy
that SAMPLED a token (the behaviour policy ``pi_behav``, e.g. an asynchronous worker one or more
versions behind the learner) from the policy that ANCHORS the trust region (the proximal policy
``pi_prox``: here the learner's own weights at the start of the update). Per token (minimised)::

    r_t = pi(y_t) / pi_prox(y_t)                         the clipped ratio (vs proximal)
    w_t = pi_prox(y_t) / pi_behav(y_t)                   behaviour importance weight (detached)
    w_t = 0 if w_t > cap                                 AReaL's ``behav_imp_weight_cap``: such
                                                         tokens are filtered out (still counted
                                                         in the aggregation's token count)
    L_t = w_t * max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high))   (+ dual clip)

With ``pi_behav = pi_prox`` every ``w_t`` is exactly 1 and the objective is the plain PPO one
(:func:`entropace.algos.policy_losses.ppo_policy_loss`, which applies ``w_t`` when
:class:`~entropace.algos.policy_losses.LossInputs` carries ``behaviour_weights``).

Pure tensor functions: no config objects, no host syncs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from entropace.algos.surrogate import LOG_RATIO_CLAMP

__all__ = ["behaviour_importance_weights", "behaviour_kl_k3"]


def behaviour_importance_weights(
    prox_logprobs: Tensor, behav_logprobs: Tensor, mask: Tensor, cap: float | None
) -> tuple[Tensor, Tensor]:
    """AReaL's behaviour importance weights ``w_t = pi_prox(y_t) / pi_behav(y_t)``.

    Args:
        prox_logprobs: ``[B, T]`` ``log pi_prox(y_t)`` (the learner at update start).
        behav_logprobs: ``[B, T]`` ``log pi_behav(y_t)`` (recorded when the token was sampled).
        mask: ``[B, T]`` 0/1 loss mask.
        cap: tokens with ``w_t > cap`` get weight 0 (AReaL filters them; ``cap > 1``), None:
            no filter.

    Returns:
        ``(weights, capped)``: detached ``[B, T]`` weights in the dtype of ``prox_logprobs``
        (0 where masked or capped; the log-ratio is clamped to +-20 as the PPO ratio) and the
        bool ``[B, T]`` flag of the masked-in tokens the cap filtered out.
    """
    if prox_logprobs.shape != behav_logprobs.shape or mask.shape != prox_logprobs.shape:
        raise ValueError(
            "prox_logprobs, behav_logprobs and mask must share the shape [B, T]; got "
            f"{tuple(prox_logprobs.shape)}, {tuple(behav_logprobs.shape)}, {tuple(mask.shape)}"
        )
    m = mask.bool()
    zero = prox_logprobs.new_zeros(())
    prox = torch.where(m, prox_logprobs.detach(), zero)
    behav = torch.where(m, behav_logprobs.detach().to(prox.dtype), zero)
    weights = torch.exp((prox - behav).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    capped = m & (weights > cap) if cap is not None else torch.zeros_like(m)
    return torch.where(m & ~capped, weights, zero), capped


def behaviour_kl_k3(logprobs: Tensor, behav_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Per-token k3 estimate of ``KL(pi_behav || pi)`` from tokens sampled by ``pi_behav``.

    ``k3_t = (rho_t - 1) - log rho_t`` with ``rho_t = pi(y_t) / pi_behav(y_t)`` (Schulman's
    unbiased, non-negative estimator); ``[B, T]``, detached, 0 where masked. The mean over
    masked tokens is ``rollout/behaviour_kl`` (``pi`` = the learner at update start).
    """
    m = mask.bool()
    zero = logprobs.new_zeros(())
    log_rho = torch.where(m, logprobs.detach() - behav_logprobs.detach().to(logprobs.dtype), zero)
    log_rho = log_rho.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.where(m, torch.expm1(log_rho) - log_rho, zero)
