"""Entropy polarity of token updates and polarity-aware advantage reweighting (PAPO).

See ``shared/docs/ALGORITHMS.md`` section 4. For a token with advantage ``A`` and sensitivity
``S = t2 - t1`` (:class:`entropace.algos.token_stats.TokenStats`), the polarity ``P = A * S`` is the
first-order entropy change of the state under one logit-space step on ``A log p_y``:
``dH = eta * P + O(eta^2)``. ``P > 0`` expands entropy, ``P < 0`` contracts it.

Advantages may be per token (shaped like the tokens, ``[B, T]``) or per sequence (``[B]``, or any
leading prefix of the token shape); a shorter tensor is broadcast over the trailing token dims,
i.e. ``A[b]`` applies to every token of sequence ``b`` (not numpy's trailing-dim alignment).
"""

from __future__ import annotations

import torch
from torch import Tensor

from entropace.algos.token_stats import TokenStats

__all__ = ["entropy_polarity", "polarity_reweight"]


def _broadcast_leading(advantages: Tensor, shape: torch.Size, name: str) -> Tensor:
    """View ``advantages`` (shape a prefix of ``shape``, or ``shape`` itself) expanded to ``shape``."""
    if advantages.dim() > len(shape) or tuple(advantages.shape) != tuple(shape[: advantages.dim()]):
        raise ValueError(
            f"{name}: advantages of shape {tuple(advantages.shape)} must equal the token shape "
            f"{tuple(shape)} or a leading prefix of it (per-sequence advantages)"
        )
    extra = len(shape) - advantages.dim()
    return advantages.reshape(tuple(advantages.shape) + (1,) * extra).expand(shape)


def entropy_polarity(advantages: Tensor, stats: TokenStats | Tensor) -> Tensor:
    """Polarity ``P_t = A_t * S_t`` (PAPO, first-order entropy change per unit step size).

    Args:
        advantages: ``[B, T]`` per token, or ``[B]`` per sequence (broadcast over tokens).
        stats: the :class:`TokenStats` of the same tokens, or directly their sensitivity tensor
            ``S = t2 - t1`` shaped ``[B, T]``.

    Returns:
        ``[B, T]`` polarity, in the promoted dtype of ``advantages`` and ``S``. Detached from the
        logits (``t1`` and ``t2`` are), differentiable w.r.t. ``advantages``.
    """
    sensitivity = stats.sensitivity if isinstance(stats, TokenStats) else stats
    if not isinstance(sensitivity, Tensor) or not isinstance(advantages, Tensor):
        raise ValueError("entropy_polarity: advantages and stats must be tensors / TokenStats")
    return _broadcast_leading(advantages, sensitivity.shape, "entropy_polarity") * sensitivity


def _check_weight(w: float | Tensor, name: str) -> None:
    if isinstance(w, Tensor):
        if w.dim() != 0:
            raise ValueError(f"polarity_reweight: {name} must be a float or a 0-dim tensor")
        return
    if isinstance(w, bool) or not isinstance(w, int | float):
        raise ValueError(f"polarity_reweight: {name} must be a float or a 0-dim tensor, got {w!r}")
    if not (w >= 0.0 and w != float("inf")):
        raise ValueError(f"polarity_reweight: {name} must be finite and >= 0, got {w}")


def polarity_reweight(
    advantages: Tensor,
    polarity: Tensor,
    mask: Tensor,
    *,
    w_plus: float | Tensor,
    w_minus: float | Tensor,
) -> Tensor:
    """Reallocate advantage pressure between the expanding and contracting branches (PAPO).

    ``A'_t = w_plus A_t`` where ``P_t > 0``, ``w_minus A_t`` where ``P_t < 0``, ``A_t`` where
    ``P_t = 0``; then every ``A'`` is multiplied by one factor ``c = sum_m |A| / sum_m |A'|`` (sums
    over the masked tokens of the whole batch) so that the total ``|A|`` is unchanged: pressure is
    moved, not added. If ``sum_m |A'| = 0`` the advantages are returned unchanged.

    Args:
        advantages: ``[B, T]`` per token or ``[B]`` per sequence (broadcast over tokens).
        polarity: ``[B, T]``, from :func:`entropy_polarity`.
        mask: ``[B, T]`` loss mask (bool or 0/1); tokens outside it keep their input advantage and
            do not enter the sums.
        w_plus, w_minus: branch weights (floats ``>= 0`` or 0-dim tensors, e.g. from the PAPO
            controller: ``w_plus = 1 + lam u``, ``w_minus = 1 - lam u``).

    Returns:
        ``[B, T]`` reweighted advantages. No host synchronisation.
    """
    if not all(isinstance(t, Tensor) for t in (advantages, polarity, mask)):
        raise ValueError("polarity_reweight: advantages, polarity and mask must be tensors")
    if tuple(mask.shape) != tuple(polarity.shape):
        raise ValueError(
            f"polarity_reweight: mask shape {tuple(mask.shape)} must equal polarity shape "
            f"{tuple(polarity.shape)}"
        )
    _check_weight(w_plus, "w_plus")
    _check_weight(w_minus, "w_minus")
    adv = _broadcast_leading(advantages, polarity.shape, "polarity_reweight")
    weight = torch.where(
        polarity > 0,
        torch.as_tensor(w_plus, dtype=adv.dtype, device=adv.device),
        torch.where(
            polarity < 0,
            torch.as_tensor(w_minus, dtype=adv.dtype, device=adv.device),
            torch.ones((), dtype=adv.dtype, device=adv.device),
        ),
    )
    reweighted = weight * adv
    keep = mask.bool()
    zero = torch.zeros((), dtype=adv.dtype, device=adv.device)
    # where(), not a product with the mask: values outside the mask never enter the sums
    total_before = torch.where(keep, adv.abs(), zero).sum()
    total_after = torch.where(keep, reweighted.abs(), zero).sum()
    # One batch-wide factor. If every masked |A'| is 0 there is nothing to rescale: return A.
    nonzero = total_after > 0
    scale = total_before / torch.where(nonzero, total_after, torch.ones_like(total_after))
    rescaled = torch.where(nonzero, reweighted * scale, adv)
    return torch.where(keep, rescaled, adv)
