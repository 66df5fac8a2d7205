"""Reduction of a per-token loss matrix to the scalar that is back-propagated.

Three modes (ALGORITHMS.md section 1), each a small function behind the ``_AGGREGATORS`` dict:

- ``token-mean``: ``sum_{i,t} m_it L_it / N_tok`` (DAPO, arXiv 2503.14476): every generated token
  weighs the same, long responses weigh more.
- ``seq-mean-token-mean``: ``(1 / N_seq) sum_i (sum_t m_it L_it / sum_t m_it)`` (GRPO,
  arXiv 2402.03300): every sequence weighs the same.
- ``seq-mean-token-sum-norm``: ``(1 / N_seq) sum_i (sum_t m_it L_it / seq_norm)`` with a constant
  ``seq_norm`` such as the maximum response length (Dr.GRPO, arXiv 2503.20783): removes GRPO's
  length bias.

``N_seq`` counts the sequences that hold at least one masked (generated) token; a fully masked row
neither contributes nor dilutes. Micro-batch invariance: when the caller passes the counts of the
WHOLE batch (``num_tokens`` / ``num_seqs``, see :func:`loss_counts`), the aggregated losses of
the micro-batches sum to the full-batch loss, and so do their gradients (every mode is linear in
the per-sequence sums, with divisors that no longer depend on the micro-batch).

No function here syncs with the host. The mask must hold 0/1 values (bool or float); checking it
would cost a sync, so that check is the separate :func:`check_mask`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

Count = int | float | Tensor

__all__ = ["AGG_MODES", "aggregate_loss", "check_mask", "loss_counts", "resolve_count"]


def loss_counts(mask: Tensor) -> tuple[Tensor, Tensor]:
    """Global counts to pass to :func:`aggregate_loss` for micro-batch invariance.

    Args:
        mask: ``[B, T]`` 0/1 loss mask of the whole batch (all micro-batches).

    Returns:
        ``(num_tokens, num_seqs)``: 0-dim float tensors, the number of masked tokens and the
        number of sequences with at least one masked token.
    """
    m = mask.to(torch.float32)
    return m.sum(), (m.sum(-1) > 0).to(torch.float32).sum()


def check_mask(mask: Tensor) -> None:
    """Raise ``ValueError`` unless ``mask`` holds only 0 and 1 (host sync: call once per step)."""
    if mask.dtype == torch.bool:
        return
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("loss mask must contain only 0 and 1")


def resolve_count(count: Count | None, local: Tensor) -> Tensor:
    """Divisor for a sum over masked entries: the global ``count`` when given, else ``local``.

    Clamped to at least 1, so an empty (micro-)batch gives a loss of 0, not NaN.
    """
    if count is None:
        return local.clamp_min(1.0)
    if isinstance(count, Tensor):
        return count.to(local.dtype).clamp_min(1.0)
    if count < 0:
        raise ValueError(f"counts must be non-negative, got {count}")
    return torch.as_tensor(max(float(count), 1.0), dtype=local.dtype, device=local.device)


def _token_mean(
    loss_mat: Tensor,
    mask: Tensor,
    num_tokens: Count | None,
    num_seqs: Count | None,
    seq_norm: Count | None,
) -> Tensor:
    return (loss_mat * mask).sum() / resolve_count(num_tokens, mask.sum())


def _seq_mean_token_mean(
    loss_mat: Tensor,
    mask: Tensor,
    num_tokens: Count | None,
    num_seqs: Count | None,
    seq_norm: Count | None,
) -> Tensor:
    tokens_per_seq = mask.sum(-1)
    seq_loss = (loss_mat * mask).sum(-1) / tokens_per_seq.clamp_min(1.0)  # [B]
    local_seqs = (tokens_per_seq > 0).to(loss_mat.dtype).sum()
    return seq_loss.sum() / resolve_count(num_seqs, local_seqs)


def _seq_mean_token_sum_norm(
    loss_mat: Tensor,
    mask: Tensor,
    num_tokens: Count | None,
    num_seqs: Count | None,
    seq_norm: Count | None,
) -> Tensor:
    if seq_norm is None:
        raise ValueError(
            "aggregation 'seq-mean-token-sum-norm' needs seq_norm (a constant such as the maximum "
            "response length; Dr.GRPO, arXiv 2503.20783)"
        )
    if not isinstance(seq_norm, Tensor) and seq_norm <= 0:
        raise ValueError(f"seq_norm must be positive, got {seq_norm}")
    seq_loss = (loss_mat * mask).sum(-1) / seq_norm  # [B]
    local_seqs = (mask.sum(-1) > 0).to(loss_mat.dtype).sum()
    return seq_loss.sum() / resolve_count(num_seqs, local_seqs)


_Aggregator = Callable[[Tensor, Tensor, "Count | None", "Count | None", "Count | None"], Tensor]

_AGGREGATORS: dict[str, _Aggregator] = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}

AGG_MODES: tuple[str, ...] = tuple(_AGGREGATORS)


def aggregate_loss(
    loss_mat: Tensor,
    mask: Tensor,
    mode: str = "token-mean",
    *,
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    seq_norm: Count | None = None,
) -> Tensor:
    """Reduce a per-token loss ``[B, T]`` to a scalar (see the module docstring for the formulas).

    Args:
        loss_mat: ``[B, T]`` per-token loss. Values at masked-out positions are ignored, but
            they must be finite (``0 * inf`` is NaN); the policy losses zero them beforehand.
        mask: ``[B, T]`` 0/1 loss mask (bool or float), 1 on generated tokens.
        mode: one of :data:`AGG_MODES`.
        num_tokens: masked-token count of the whole batch (``token-mean``); default: local count.
        num_seqs: count of sequences with at least one masked token in the whole batch
            (``seq-*`` modes); default: local count.
        seq_norm: the constant divisor of ``seq-mean-token-sum-norm`` (required there).

    Returns:
        0-dim tensor. With global counts, the sum over micro-batches equals the full-batch value.
    """
    try:
        aggregator = _AGGREGATORS[mode]
    except KeyError:
        raise ValueError(
            f"unknown aggregation mode {mode!r}; expected one of {list(AGG_MODES)}"
        ) from None
    if loss_mat.dim() != 2 or loss_mat.shape != mask.shape:
        raise ValueError(
            f"loss_mat and mask must both be [B, T]; got {tuple(loss_mat.shape)} and "
            f"{tuple(mask.shape)}"
        )
    return aggregator(loss_mat, mask.to(loss_mat.dtype), num_tokens, num_seqs, seq_norm)
