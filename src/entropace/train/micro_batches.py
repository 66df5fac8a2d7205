"""How a mini-batch's trajectories are split into micro-batches for gradient accumulation.

Any partition gives the same loss and gradients (every micro-batch's loss uses the
mini-batch's global token / sequence counts, :func:`entropace.train.learner.accumulate_gradients`),
so the partition is chosen for speed and memory only:

* :func:`group_micro_batches` (``ppo.micro_batch_size`` rows at most): group-mates together,
  so that with ``ppo.share_prefix`` they run their common prompt once per micro-batch;
* :func:`token_micro_batches` (also ``ppo.micro_batch_tokens``): the same, and no micro-batch
  runs more than a budget of token positions, so that the activations one micro-batch keeps
  for its backward are bounded whatever the trajectories' lengths (verl's
  ``ppo_max_token_len_per_gpu`` / ``use_dynamic_bsz`` play this role in verl). A micro-batch
  of shuffled rows from different groups costs far more than one of group-mates (no prompt
  shared); a budget in rows cannot see that, a budget in tokens does.

The cost of a micro-batch is the number of positions its forward runs
(:func:`micro_batch_cost`): with shared prefixes, each group present runs its common prefix
``P_g`` once and each of its ``n_g`` rows the columns after it up to the group's longest row
``L_g`` (``rollout/stats.py`` pads a group's tails to its own longest row only), so
``sum_g P_g + n_g (L_g - P_g)``; without, every row runs to the micro-batch's longest row,
``n * max L``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def group_micro_batches(group_ids: Tensor, size: int) -> list[Tensor]:
    """A partition of rows ``0..b-1`` into micro-batches of at most ``size`` rows that keeps
    group-mates together: each group's rows in full chunks of ``size``, then the groups'
    remainders (fewer than ``size`` rows each, never split) packed in order into chunks."""
    chunks: list[list[int]] = []
    rests: list[list[int]] = []
    for g in torch.unique(group_ids, sorted=True).tolist():
        rows = (group_ids == g).nonzero().flatten().tolist()
        full = len(rows) - len(rows) % size
        chunks += [rows[i : i + size] for i in range(0, full, size)]
        if full < len(rows):
            rests.append(rows[full:])
    current: list[int] = []
    for rest in rests:
        if len(current) + len(rest) > size:
            chunks.append(current)
            current = []
        current = current + rest
    if current:
        chunks.append(current)
    return [torch.tensor(c, dtype=torch.long) for c in chunks]


def shared_prefix_lengths(input_ids: Tensor, attention_mask: Tensor, group_ids: Tensor) -> Tensor:
    """``[b]``: for each row, the length of the longest common prefix of its group's rows
    (identical ids, all real; 0 for a row alone in its group)."""
    out = torch.zeros(group_ids.shape[0], dtype=torch.long)
    for g in torch.unique(group_ids).tolist():
        index = (group_ids == g).nonzero().flatten()
        if index.numel() < 2:
            continue
        ids, real = input_ids[index], attention_mask[index].bool()
        same = (ids == ids[:1]).all(dim=0) & real.all(dim=0)
        diff = (~same).nonzero()
        out[index] = int(diff.min()) if diff.numel() else ids.shape[1]
    return out


def micro_batch_cost(
    rows: list[int], lengths: list[int], groups: list[int], prefixes: list[int], *, share: bool
) -> int:
    """Token positions the forward of micro-batch ``rows`` runs (module docstring).

    Args:
        lengths, groups, prefixes: per row of the mini-batch: real length, group id, and
            (with ``share``) the group's common prefix length (:func:`shared_prefix_lengths`).
    """
    if not rows:
        return 0
    if not share:
        return len(rows) * max(lengths[r] for r in rows)
    members: dict[int, list[int]] = {}
    for r in rows:
        members.setdefault(groups[r], []).append(r)
    total = 0
    for mates in members.values():
        longest = max(lengths[r] for r in mates)
        prefix = max(min(prefixes[mates[0]], longest - 1), 0) if len(mates) > 1 else 0
        total += prefix + len(mates) * (longest - prefix)
    return total


def token_micro_batches(
    group_ids: Tensor,
    lengths: Tensor,
    prefixes: Tensor,
    *,
    max_rows: int,
    max_tokens: int,
    share: bool,
) -> list[Tensor]:
    """A partition of rows ``0..b-1`` into micro-batches of at most ``max_rows`` rows whose
    :func:`micro_batch_cost` is at most ``max_tokens`` (a row that alone costs more gets a
    micro-batch of its own: a row is never split).

    Groups are taken in order, each group's rows longest first; a group that does not fit in
    the current micro-batch but fits in an empty one starts a new micro-batch (its prompt then
    runs once), otherwise its rows fill the current one and continue in the next.

    Args:
        group_ids, lengths, prefixes: ``[b]`` group ids, real lengths, common prefix lengths.
        share: whether group-mates share their prefix (``ppo.share_prefix``).
    """
    if max_rows < 1 or max_tokens < 1:
        raise ValueError(f"max_rows and max_tokens must be >= 1, got {max_rows}, {max_tokens}")
    length, group, prefix = lengths.tolist(), group_ids.tolist(), prefixes.tolist()

    def cost(rows: list[int]) -> int:
        return micro_batch_cost(rows, length, group, prefix, share=share)

    def fits(rows: list[int]) -> bool:
        return len(rows) <= max_rows and cost(rows) <= max_tokens

    chunks: list[list[int]] = []
    current: list[int] = []
    for g in torch.unique(group_ids, sorted=True).tolist():
        rows = sorted((group_ids == g).nonzero().flatten().tolist(), key=lambda r: -length[r])
        if current and not fits(current + rows) and fits(rows):
            chunks.append(current)
            current = []
        for r in rows:
            if current and not fits(current + [r]):
                chunks.append(current)
                current = []
            current.append(r)
    if current:
        chunks.append(current)
    return [torch.tensor(c, dtype=torch.long) for c in chunks]
