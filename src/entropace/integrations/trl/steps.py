"""The per-generation-batch arithmetic of the TRL plug-in, as pure tensor functions.

Every function sees one process's rows and, where the result must be the global batch's, a
``reduce`` callable (``SUM`` over processes; the identity on one process), so that a run on
several processes gives what one process would give on the global batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

import entropace.algos as algos

__all__ = ["batch_entropy", "completion_bounds", "global_polarity_reweight", "rloo_slice"]

Reduce = Callable[[Tensor], Tensor]


def batch_entropy(sums: Tensor) -> float:
    """Mean entropy over every masked token of the (reduced) :func:`entropace.control.task_sums`
    (rows 0 and 1: entropy sum, tokens); NaN without tokens. PAPO's ``Hbar``."""
    tokens = float(sums[1].sum())
    return float(sums[0].sum()) / tokens if tokens > 0 else math.nan


def completion_bounds(
    bounds: Mapping[str, tuple[float, float]],
    task_names: Sequence[str],
    task_ids: Tensor,
    default: tuple[float, float],
) -> tuple[Tensor, Tensor]:
    """Per-completion ``eps_low [B, 1]``, ``eps_high [B, 1]`` (float32) from per-task bounds;
    a task without bounds gets ``default``."""
    table = torch.tensor(
        [bounds.get(name, default) for name in task_names],
        dtype=torch.float32,
        device=task_ids.device,
    )
    per_row = table[task_ids.long()]  # [B, 2]
    return per_row[:, :1].contiguous(), per_row[:, 1:].contiguous()


def rloo_slice(rewards: Tensor, group_size: int, rows: slice) -> Tensor:
    """RLOO advantages ``R_i - mean_{j != i} R_j`` of the global batch's ``rewards`` ``[N]``
    (groups = consecutive runs of ``group_size``; NaN = unscorable: advantage 0), sliced to
    this process's ``rows``; float32."""
    group = torch.arange(rewards.numel(), device=rewards.device) // group_size
    adv = algos.rloo_advantages(torch.nan_to_num(rewards, nan=0.0), group)
    adv = torch.where(torch.isnan(rewards), torch.zeros_like(adv), adv)
    return adv[rows].to(torch.float32)


def global_polarity_reweight(
    advantages: Tensor,
    sensitivity: Tensor,
    mask: Tensor,
    *,
    w_plus: float,
    w_minus: float,
    reduce: Reduce,
    world_size: int,
) -> tuple[Tensor, dict[str, float]]:
    """PAPO on this process's rows with the global batch's rescaling factor.

    ``A_t = A`` on masked tokens (``A`` per sequence ``[B]`` or per token ``[B, T]``), 0
    elsewhere; ``P = A S``; :func:`entropace.algos.polarity_reweight` gives
    ``c w(P) A`` with ``c = sum|A| / sum|w(P) A|`` over this process's masked tokens. With
    several processes ``c`` must be the global batch's: the local result is multiplied by
    ``c_global / c_local`` (sums of ``|A|`` and ``|w A|`` reduced across processes).

    Returns:
        ``(A' [B, T] float32, {"pos_mass", "neg_mass"})``: the reweighted advantages and the
        shares of the global ``sum |A|`` on ``P > 0`` / ``P < 0`` tokens, before reweighting.
    """
    adv = advantages.to(torch.float32)
    adv_tok = (adv[:, None] if adv.dim() == 1 else adv) * mask
    polarity = algos.entropy_polarity(adv_tok, sensitivity)
    keep = mask > 0
    one = torch.ones((), dtype=torch.float64, device=adv.device)
    weight = torch.where(polarity > 0, w_plus * one, torch.where(polarity < 0, w_minus * one, one))
    a_abs = torch.where(keep, adv_tok.abs().double(), 0.0)
    local = torch.stack(
        [
            a_abs.sum(),
            (a_abs * (polarity > 0)).sum(),
            (a_abs * (polarity < 0)).sum(),
            (a_abs * weight).sum(),
        ]
    )
    total, pos, neg, after = reduce(local).tolist()
    out = algos.polarity_reweight(adv_tok, polarity, mask, w_plus=w_plus, w_minus=w_minus)
    if world_size > 1:
        local_total, local_after = float(local[0]), float(local[3])
        if local_after > 0 and after > 0:
            factor = (total / after) / (local_total / local_after)
            out = torch.where(keep, out * factor, out)
    masses = {
        "pos_mass": pos / total if total > 0 else 0.0,
        "neg_mass": neg / total if total > 0 else 0.0,
    }
    return out, masses
