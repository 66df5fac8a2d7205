"""The advantage estimators of verl 0.9.1 people compare GRPO against, exact against verl's.

Registered (:func:`entropace.algos.register_advantage`) under verl's names, for outcome rewards
``R_i`` (one per trajectory, placed by verl on the trajectory's last response token):

- ``reinforce_plus_plus`` (REINFORCE++, arXiv 2501.03262): token returns
  ``G_t = gamma^(k_t) R_i`` (``k_t``: masked tokens after ``t``; unmasked tokens between them,
  e.g. tool observations, neither decay nor receive a return), then whitened over every masked
  token of the batch: ``A_t = (G_t - mean) / sqrt(var + 1e-8)`` (unbiased variance; the
  global-batch normalisation that replaces the critic). ``[B, T]``; option ``gamma`` (1.0).
- ``reinforce_plus_plus_baseline``: ``R_i - mean_g R`` (the group mean; a singleton keeps
  ``R_i``, as verl), broadcast to the masked tokens, then whitened over the batch's masked
  tokens as above. ``[B, T]``.
- ``remax`` (arXiv 2310.10505): ``R_i - b_i`` with ``b_i`` the reward of the greedy response to
  trajectory ``i``'s prompt (``baselines=``; the trainer would have to generate it, see
  :func:`entropace.train.config.validate`).
- ``opo`` (On-Policy RL with Optimal reward baseline, arXiv 2505.23585): ``R_i - b_g`` with the
  length-weighted group baseline ``b_g = sum_j |y_j| R_j / sum_j |y_j|`` (``|y_j|``: masked
  tokens; a singleton keeps ``R_i``).
- ``grpo_passk`` (Pass@k training, arXiv 2503.19595): in each group only the best response
  gets an advantage, ``r_max - r_second`` (divided by ``std_g + eps``, the unbiased standard
  deviation, when ``norm_by_std``); every other response gets 0. A group needs two responses.
- ``gpg`` (GPG, arXiv 2504.02546): ``alpha (R_i - mean_g R)`` with ``alpha = B / M``, ``M``
  the number of non-zero rewards of the batch (at least 1); verl's ``f_norm`` is 1.

Statistics in float64; results in the rewards' floating dtype (float32 for integer rewards).
Rewards are checked for NaN/inf.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from entropace.algos.advantages import (
    check_rewards,
    check_std_eps,
    group_stats,
    out_dtype,
    register_advantage,
)

__all__ = [
    "PassKAdvantageConfig",
    "ReinforcePPConfig",
    "gpg_advantages",
    "grpo_passk_advantages",
    "masked_whiten",
    "opo_advantages",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "remax_advantages",
]


def _check_mask(mask: Tensor, rewards: Tensor) -> Tensor:
    if mask.dim() != 2 or mask.shape[0] != rewards.shape[0]:
        raise ValueError(
            f"mask must be [B, T] with B = {rewards.shape[0]}; got {tuple(mask.shape)}"
        )
    return mask.to(torch.float64)


def masked_whiten(values: Tensor, mask: Tensor) -> Tensor:
    """``(x - mean) / sqrt(var + 1e-8)`` over the masked entries (unbiased variance), 0 off
    the mask; all 0 when fewer than two entries are masked (verl raises there). float64."""
    m = mask.to(torch.float64)
    n = m.sum()
    if float(n) < 2:
        return torch.zeros_like(values, dtype=torch.float64)
    x = values.to(torch.float64)
    mean = (x * m).sum() / n
    var = (((x - mean) ** 2) * m).sum() / n * (n / (n - 1.0))
    return (x - mean) * torch.rsqrt(var + 1e-8) * m


@dataclass(frozen=True)
class ReinforcePPConfig:
    """``reinforce_plus_plus``: the discount ``gamma`` in [0, 1] (verl's ``algorithm.gamma``)."""

    gamma: float = 1.0

    def __post_init__(self) -> None:
        g = self.gamma
        if isinstance(g, bool) or not isinstance(g, int | float) or not 0.0 <= g <= 1.0:
            raise ValueError(f"gamma must be a number in [0, 1]; got {g!r}")


@register_advantage(
    "reinforce_plus_plus", config=ReinforcePPConfig, needs=("mask",), per_token=True
)
def reinforce_pp_advantages(
    rewards: Tensor, group_ids: Tensor, *, mask: Tensor, gamma: float = 1.0
) -> Tensor:
    """REINFORCE++ (module docstring): ``[B, T]`` whitened discounted returns.

    Args:
        rewards: ``[B]`` outcome rewards (the last masked token's reward).
        group_ids: ``[B]`` (unused: REINFORCE++ has no group baseline; checked).
        mask: ``[B, T]`` loss mask.
        gamma: discount per masked token.
    """
    check_rewards(rewards, group_ids)
    m = _check_mask(mask, rewards)
    after = m.flip(-1).cumsum(-1).flip(-1) - m  # masked tokens strictly after t
    returns = rewards.to(torch.float64)[:, None] * torch.pow(torch.full_like(m, gamma), after)
    return masked_whiten(returns * m, m).to(out_dtype(rewards))


def _group_mean_or_zero(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """``(count, mean)`` per element with verl's singleton rule: a singleton's mean is 0."""
    count, mean, _, _ = group_stats(rewards, group_ids)
    return count, torch.where(count > 1, mean, torch.zeros_like(mean))


@register_advantage("reinforce_plus_plus_baseline", needs=("mask",), per_token=True)
def reinforce_pp_baseline_advantages(rewards: Tensor, group_ids: Tensor, *, mask: Tensor) -> Tensor:
    """REINFORCE++ with the group-mean baseline (module docstring): ``[B, T]``."""
    check_rewards(rewards, group_ids)
    m = _check_mask(mask, rewards)
    _, mean = _group_mean_or_zero(rewards, group_ids)
    scores = rewards.to(torch.float64) - mean
    return masked_whiten(scores[:, None] * m, m).to(out_dtype(rewards))


@register_advantage("remax", needs=("baselines",))
def remax_advantages(rewards: Tensor, group_ids: Tensor, *, baselines: Tensor) -> Tensor:
    """ReMax: ``R_i - b_i`` with ``b_i`` the greedy response's reward (``[B]``)."""
    check_rewards(rewards, group_ids)
    check_rewards(baselines, group_ids, "baselines")
    adv = rewards.to(torch.float64) - baselines.to(torch.float64)
    return adv.to(out_dtype(rewards))


@register_advantage("opo", needs=("mask",))
def opo_advantages(rewards: Tensor, group_ids: Tensor, *, mask: Tensor) -> Tensor:
    """OPO: ``R_i - sum_j |y_j| R_j / sum_j |y_j|`` over the group (module docstring).

    A group whose responses have no masked token has baseline 0/0: verl's NaN; here 0."""
    check_rewards(rewards, group_ids)
    m = _check_mask(mask, rewards)
    lengths = m.sum(-1)
    r = rewards.to(torch.float64)
    _, inv = torch.unique(group_ids, return_inverse=True)
    k = int(inv.max()) + 1 if inv.numel() else 0
    weighted = torch.zeros(k, dtype=torch.float64, device=r.device).index_add_(0, inv, lengths * r)
    total = torch.zeros(k, dtype=torch.float64, device=r.device).index_add_(0, inv, lengths)
    count, _, _, _ = group_stats(rewards, group_ids)
    base = torch.where(total > 0, weighted / total.clamp_min(1e-300), torch.zeros_like(total))[inv]
    base = torch.where(count > 1, base, torch.zeros_like(base))
    return (r - base).to(out_dtype(rewards))


@dataclass(frozen=True)
class PassKAdvantageConfig:
    """``grpo_passk``: divide by the group's standard deviation (verl's
    ``norm_adv_by_std_in_grpo``), and the ``eps`` added to it, in ``(0, 1]``
    (:data:`entropace.algos.advantages.STD_EPS_MAX`)."""

    norm_by_std: bool = True
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if not isinstance(self.norm_by_std, bool):
            raise ValueError(f"norm_by_std must be true or false; got {self.norm_by_std!r}")
        check_std_eps(self.eps)


@register_advantage("grpo_passk", config=PassKAdvantageConfig)
def grpo_passk_advantages(
    rewards: Tensor, group_ids: Tensor, *, norm_by_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """GRPO pass@k (module docstring): the best response of each group gets
    ``(r_max - r_second) [/ (std_g + eps)]``, the others 0.

    Raises:
        ValueError: a group with fewer than two responses (as verl).
    """
    check_rewards(rewards, group_ids)
    count, _, var, _ = group_stats(rewards, group_ids)
    if bool((count < 2).any()):
        bad = group_ids[count < 2][:5].tolist()
        raise ValueError(f"grpo_passk needs at least 2 responses per group; groups {bad} have 1")
    r = rewards.to(torch.float64)
    _, inv = torch.unique(group_ids, return_inverse=True)
    k = int(inv.max()) + 1
    best = torch.full((k,), -torch.inf, dtype=torch.float64, device=r.device)
    best = best.scatter_reduce(0, inv, r, "amax")
    # the first index reaching the group's max is "the best" (a tie at the top gives 0 anyway)
    idx = torch.arange(r.numel(), device=r.device)
    at_max = r == best[inv]
    first = torch.full((k,), r.numel(), dtype=torch.long, device=r.device)
    first = first.scatter_reduce(0, inv, torch.where(at_max, idx, r.numel()), "amin")
    is_best = idx == first[inv]
    second = torch.full((k,), -torch.inf, dtype=torch.float64, device=r.device)
    second = second.scatter_reduce(0, inv, torch.where(is_best, -torch.inf, r), "amax")
    gap = (best - second)[inv]
    if norm_by_std:
        gap = gap / (var.sqrt() + eps)
    adv = torch.where(is_best, gap, torch.zeros_like(r))
    return adv.to(out_dtype(rewards))


@register_advantage("gpg")
def gpg_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """GPG: ``alpha (R_i - mean_g R)``, ``alpha = B / max(#{R_j != 0}, 1)`` over the batch; a
    singleton group's mean is 0 (module docstring)."""
    check_rewards(rewards, group_ids)
    _, mean = _group_mean_or_zero(rewards, group_ids)
    r = rewards.to(torch.float64)
    alpha = r.numel() / max(int((r != 0).sum()), 1)
    return (alpha * (r - mean)).to(out_dtype(rewards))
