"""Per-token KL estimators."""

from __future__ import annotations

import torch
from torch import Tensor

from entropace.algos.surrogate import LOG_RATIO_CLAMP

__all__ = ["kl_k3"]


def kl_k3(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    *,
    max_log_ratio: float = LOG_RATIO_CLAMP,
    max_kl: float = 10.0,
) -> Tensor:
    """Schulman's k3 estimator of ``KL(pi || pi_ref)`` per sampled token (tokens drawn from pi).

    With ``d = log pi_ref(y) - log pi(y)``: ``k3 = exp(d) - d - 1`` (>= 0, unbiased, low variance;
    J. Schulman, "Approximating KL divergence", 2020; used in the GRPO loss, arXiv 2402.03300).

    For stability ``d`` is clamped to ``[-max_log_ratio, max_log_ratio]`` and the result to
    ``[0, max_kl]`` (as verl's ``low_var_kl``); the clamps cut the gradient of outlying tokens.

    Args:
        logprobs: ``[...]`` log-probabilities of the sampled tokens under the current policy.
        ref_logprobs: same shape, under the reference policy.

    Returns:
        ``[...]`` per-token estimate; apply the loss mask and aggregate with
        :func:`entropace.algos.aggregate_loss`.
    """
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"logprobs and ref_logprobs must have the same shape; got {tuple(logprobs.shape)} "
            f"and {tuple(ref_logprobs.shape)}"
        )
    d = (ref_logprobs - logprobs).clamp(-max_log_ratio, max_log_ratio)
    return (torch.exp(d) - d - 1.0).clamp(0.0, max_kl)
