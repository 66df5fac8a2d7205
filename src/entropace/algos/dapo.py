"""DAPO's data-side components (arXiv 2503.14476): dynamic sampling and soft overlong penalty.

The loss side of DAPO is the ``ppo`` policy loss with clip-higher bounds (``eps_low 0.2``,
``eps_high 0.28``) and ``token-mean`` aggregation.
"""

from __future__ import annotations

import torch
from torch import Tensor

from entropace.algos.advantages import check_rewards, group_stats

__all__ = ["dynamic_sampling_mask", "overlong_penalty"]


def dynamic_sampling_mask(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Trajectories to keep under DAPO dynamic sampling.

    A group whose rewards are all equal (all solved or all failed) has zero GRPO advantage and no
    gradient; DAPO drops it and samples more prompts to refill the batch.

    Args:
        rewards: ``[B]`` finite rewards.
        group_ids: ``[B]`` integer group ids (any values, any order).

    Returns:
        ``[B]`` bool, True for trajectories whose group holds at least two distinct rewards
        (a singleton group is dropped).
    """
    check_rewards(rewards, group_ids)
    _, _, _, equal = group_stats(rewards, group_ids)
    return ~equal


def overlong_penalty(lengths: Tensor, *, max_len: int, cache_len: int) -> Tensor:
    """DAPO soft overlong punishment, added to the reward.

    With ``L_exp = max_len - cache_len``::

        0                          if len <= L_exp
        (L_exp - len) / cache_len  if L_exp < len <= max_len   (falls linearly from 0 to -1)
        -1                         if len > max_len

    Args:
        lengths: ``[B]`` response lengths in tokens (integers >= 0).
        max_len: maximum response length ``L_max``.
        cache_len: length ``L_cache`` of the punishment interval, ``0 < cache_len <= max_len``.

    Returns:
        ``[B]`` float32 penalties in ``[-1, 0]``.
    """
    if not 0 < cache_len <= max_len:
        raise ValueError(
            f"need 0 < cache_len <= max_len; got cache_len={cache_len}, max_len={max_len}"
        )
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D [B]; got shape {tuple(lengths.shape)}")
    if torch.is_floating_point(lengths) and not bool(torch.isfinite(lengths).all()):
        raise ValueError("lengths contain NaN or inf")
    if bool((lengths < 0).any()):
        raise ValueError("lengths must be >= 0")
    length = lengths.to(torch.float32)
    expected = float(max_len - cache_len)
    soft = (expected - length) / float(cache_len)
    penalty = torch.where(length <= expected, torch.zeros_like(length), soft)
    return torch.where(length > max_len, torch.full_like(length, -1.0), penalty)
