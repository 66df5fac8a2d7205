"""Supervised fine-tuning on tokenised demonstrations (the warm start's training loop).

The loss is the token-mean negative log-likelihood of the replies (the loss mask of
:class:`~entropace.train.demos.TokenizedDemo`) over a whole batch::

    loss = - sum_{t in replies of the batch} log p_theta(y_t | y_<t) / #reply tokens of the batch

accumulated over micro-batches with the batch's global token count, so it does not depend on
how the batch is split. AdamW, linear warmup then a constant learning rate, gradient-norm
clipping; batches of ``batch_size`` demonstrations drawn without replacement (a new permutation
per pass) from a generator seeded by ``seed``. Log-probs come from
:func:`entropace.rollout.stats.sequence_token_stats`, the same code the RL update uses, with
with ``share_prefix`` its two exact savings (values and gradients equal up to float
round-off, not bit for bit): the demonstrations of one task in a micro-batch run their common
prefix (the task's system prompt, often most of the tokens) once (``groups``), and the LM head
runs on the reply tokens only (``fused_head``); a batch's demonstrations are then sorted by
task and token ids before it is cut into micro-batches, so that those sharing the longest
prefixes run together (the loss is a sum over the batch: the order does not change it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from entropace.train.demos import TokenizedDemo

__all__ = ["SFTError", "batches", "fine_tune", "pad_rows"]


class SFTError(RuntimeError):
    """Fine-tuning that cannot go on (a non-finite loss)."""


def pad_rows(rows: Sequence[TokenizedDemo], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Right-padded ``ids [b, L]``, ``attention [b, L]``, ``loss mask [b, L]``."""
    length = max(len(r.ids) for r in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), length), dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.float32)
    for i, r in enumerate(rows):
        n = len(r.ids)
        ids[i, :n] = torch.tensor(r.ids)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(r.loss_mask, dtype=torch.float32)
    return ids, attn, mask


def batches(n: int, size: int, steps: int, generator: torch.Generator) -> list[list[int]]:
    """``steps`` batches of ``size`` indices into ``n`` items, without replacement within a pass
    (a new permutation each pass; a batch never repeats an item when ``size <= n``)."""
    out: list[list[int]] = []
    order: list[int] = []
    for _ in range(steps):
        batch: list[int] = []
        while len(batch) < size:
            if not order:
                order = torch.randperm(n, generator=generator).tolist()
            take = order[: size - len(batch)]
            order = order[len(take) :]
            batch += take
        out.append(batch)
    return out


def fine_tune(
    model: Any,
    rows: Sequence[TokenizedDemo],
    *,
    steps: int,
    batch_size: int,
    micro_batch_size: int,
    lr: float,
    pad_id: int,
    warmup_steps: int = 0,
    weight_decay: float = 0.0,
    max_grad_norm: float = 1.0,
    seed: int = 0,
    share_prefix: bool = False,
    progress: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Fine-tune ``model``'s trainable parameters on ``rows`` (module docstring's loss) for
    ``steps`` optimiser steps; returns every step's loss. Deterministic given ``seed`` and the
    torch thread count."""
    from entropace.rollout.stats import sequence_token_stats

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup_steps) if warmup_steps else 1.0
    )
    generator = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    model.eval()  # no dropout: the same forward as the rollout's
    task_ids = {task: k for k, task in enumerate(sorted({r.task for r in rows}))}
    for step, batch in enumerate(batches(len(rows), batch_size, steps, generator), 1):
        chosen = [rows[i] for i in batch]
        if share_prefix:
            chosen.sort(key=lambda r: (r.task, r.ids))
        total = float(sum(sum(r.loss_mask) for r in chosen))
        optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for start in range(0, len(chosen), micro_batch_size):
            micro = chosen[start : start + micro_batch_size]
            ids, attn, mask = pad_rows(micro, pad_id)
            device = next(model.parameters()).device
            ids, attn, mask = ids.to(device), attn.to(device), mask.to(device)
            if share_prefix:
                groups = torch.tensor([task_ids[r.task] for r in micro], device=device)
                stats = sequence_token_stats(
                    model, ids, attn, grad=True, loss_mask=mask, groups=groups, fused_head=True
                )
            else:
                stats = sequence_token_stats(model, ids, attn, grad=True, loss_mask=mask)
            loss = -(stats.logprob * mask).sum() / max(total, 1.0)
            loss.backward()
            loss_sum += float(loss.detach())
        if not math.isfinite(loss_sum):
            raise SFTError(f"fine-tuning: the loss is {loss_sum} at step {step}")
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        schedule.step()
        losses.append(loss_sum)
        if progress is not None:
            progress(step, loss_sum)
    model.eval()
    return losses
