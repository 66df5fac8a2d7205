"""Per-token statistics of a policy over whole trajectories (one forward per micro-batch).

Used twice: by the rollout engine (``grad=False``, the sampling policy's ``old_logprobs``,
entropy and PAPO sensitivity) and by the update (``grad=True``, the current policy's log-probs
on a micro-batch).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from entropace.algos.token_stats import TokenStats


def sequence_token_stats(
    model: Any,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    micro_batch_size: int | None = None,
    grad: bool = False,
    loss_mask: Tensor | None = None,
) -> TokenStats:
    """Log-prob, entropy and PAPO terms of every token of ``input_ids`` under ``model``.

    For each real token ``y_t`` (``t >= 1``) with prefix ``y_<t``, from the temperature-scaled
    next-token distribution ``p = softmax(logits(y_<t) / temperature)`` (ALGORITHMS.md §4):
    ``logprob_t = log p(y_t)``, ``entropy_t = -sum_v p_v log p_v``, ``t1``, ``t2`` and
    ``sensitivity_t = t2 - t1``, computed by :func:`entropace.algos.token_stats` in chunks.

    Alignment (``rollout/batch.py``): column ``t`` describes token ``t``; column 0 and padding
    columns are 0. Any padding side works: positions are ``cumsum(attention_mask) - 1``, and
    columns that are padding in every row of a micro-batch are not computed, so the result for
    one trajectory does not depend on the other trajectories in the batch (up to float
    round-off of batched matmuls).

    Args:
        model: a causal LM returning ``.logits`` of shape ``[b, L, V]``.
        input_ids: ``[B, L]`` long.
        attention_mask: ``[B, L]``, 1 on real tokens.
        temperature: divides the logits (> 0).
        chunk_size: rows per chunk of the vocabulary-sized computation (``None``: the
            default of :func:`entropace.algos.token_stats`, about 2 MiB of float32 per buffer on CPU).
        micro_batch_size: rows per forward pass (``None``: all ``B`` at once).
        grad: keep the autograd graph (the update); otherwise runs under ``torch.no_grad``.
        loss_mask: optional ``[B, L]``; when given, the vocabulary-sized work (LM head and
            statistics) is done only from the first column that any row of the micro-batch
            has in its loss mask (models whose ``forward`` takes ``logits_to_keep``, as
            transformers' causal LMs do): the shared prompt prefix costs no logits. Columns
            before it are 0; the columns from it on are exactly as without ``loss_mask``.

    Returns:
        ``TokenStats`` (``logprob``, ``entropy``, ``t1``, ``t2``; ``sensitivity`` derived), each
        ``[B, L]`` float32 (float64 for a float64 model); gradients flow through ``logprob``
        and ``entropy`` when ``grad``.
    """
    from entropace.algos.token_stats import TokenStats, token_stats

    if input_ids.dim() != 2 or input_ids.shape != attention_mask.shape:
        raise ValueError(
            f"input_ids and attention_mask must both be [B, L]; got {tuple(input_ids.shape)} "
            f"and {tuple(attention_mask.shape)}"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if micro_batch_size is not None and micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    batch, length = input_ids.shape
    step = micro_batch_size or max(batch, 1)
    names = ("logprob", "entropy", "t1", "t2")  # sensitivity = t2 - t1 is a property
    param = next(model.parameters())
    dtype = torch.float64 if param.dtype == torch.float64 else torch.float32
    parts: dict[str, list[Tensor]] = {name: [] for name in names}
    with torch.set_grad_enabled(grad):
        for start in range(0, batch, step):
            ids = input_ids[start : start + step]
            mask = attention_mask[start : start + step].long()
            rows = ids.shape[0]
            # Drop trailing columns that are padding in every row of this micro-batch.
            real_cols = mask.any(dim=0).nonzero()
            used = int(real_cols.max()) + 1 if real_cols.numel() else 0
            if used < 2:  # no token has a real prefix
                for name in names:
                    parts[name].append(ids.new_zeros((rows, length), dtype=dtype))
                continue
            ids_u, mask_u = ids[:, :used], mask[:, :used]
            # First column whose statistics are needed (1 without a loss mask).
            first = 1
            if loss_mask is not None:
                loss_cols = loss_mask[start : start + step, :used].any(dim=0).nonzero()
                if loss_cols.numel():
                    first = max(1, int(loss_cols.min()))
            position_ids = (mask_u.cumsum(dim=-1) - 1).clamp(min=0)
            extra = (
                {"logits_to_keep": used - first + 1}
                if first > 1 and _takes_logits_to_keep(model)
                else {}
            )
            logits = model(
                input_ids=ids_u,
                attention_mask=mask_u,
                position_ids=position_ids,
                use_cache=False,
                **extra,
            ).logits
            logits = logits[
                :, logits.shape[1] - (used - first + 1) :
            ]  # positions first-1 .. used-1
            stats = token_stats(
                logits[:, :-1], ids_u[:, first:], temperature=temperature, chunk_size=chunk_size
            )
            # Column t (t >= 1) is the state before token t: real only if tokens t-1, t are.
            valid = (mask_u[:, first:] * mask_u[:, first - 1 : -1]).bool()
            zero = ids.new_zeros((rows, first), dtype=dtype)
            pad = ids.new_zeros((rows, length - used), dtype=dtype)
            for name in names:
                # where, not a product: a -inf logprob at a padded position must not become NaN
                value = torch.where(valid, getattr(stats, name).to(dtype), 0.0)
                parts[name].append(torch.cat([zero, value, pad], dim=1))
    return TokenStats(**{name: torch.cat(parts[name], dim=0) for name in names})


def _takes_logits_to_keep(model: Any) -> bool:
    """Whether ``model.forward`` (or, for a PEFT wrapper, its base model's) accepts
    ``logits_to_keep`` (transformers' causal LMs compute the LM head only on the last N)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return "logits_to_keep" in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False
