"""Per-task statistics of one step's rollout batch: what the step-level controllers read.

One pass over the batch gives per-task SUMS (:func:`task_sums`, a float64 ``[7, K]`` tensor), so
an engine running on several processes reduces them with one ``all_reduce(SUM)`` and every rank
then derives the same :class:`StepSignals` (:func:`signals_from_sums`), hence the same controller
state and the same clip bounds.

Rows of the sums (indices in :data:`SUM_ROWS`), for task ``k``:

    entropy_sum   sum of the sampling entropy over k's masked (policy) tokens
    tokens        number of k's masked tokens
    episodes      number of k's episodes (trajectories)
    success_sum   number of k's successful episodes
    reward_sum    sum of k's episode rewards
    reward_sq     sum of the squared episode rewards
    abnormal_sum  number of k's abnormally ended episodes (0 when not given)

Signals of a task present in the batch (``episodes > 0``): ``h_k = entropy_sum / tokens`` (only
when ``tokens > 0``), success rate ``success_sum / episodes``, population reward variance
``reward_sq / n - (reward_sum / n)^2`` (clamped at 0 against rounding).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["SUM_ROWS", "StepSignals", "signals_from_sums", "task_sums"]

SUM_ROWS: tuple[str, ...] = (
    "entropy_sum",
    "tokens",
    "episodes",
    "success_sum",
    "reward_sum",
    "reward_sq",
    "abnormal_sum",
)


@dataclass
class StepSignals:
    """Per-task statistics of one step's rollout batch (tasks present in the batch only).

    Attributes:
        task_entropy: ``h_k``, mean sampling entropy over task k's masked tokens (tasks with
            at least one masked token).
        task_success: success rate of task k's episodes.
        task_reward_var: population variance of task k's episode rewards.
        task_reward: mean episode reward of task k.
        task_episodes: number of task k's episodes.
        task_tokens: number of task k's masked tokens.
        task_abnormal: fraction of task k's episodes that ended abnormally.
    """

    task_entropy: dict[str, float] = field(default_factory=dict)
    task_success: dict[str, float] = field(default_factory=dict)
    task_reward_var: dict[str, float] = field(default_factory=dict)
    task_reward: dict[str, float] = field(default_factory=dict)
    task_episodes: dict[str, int] = field(default_factory=dict)
    task_tokens: dict[str, int] = field(default_factory=dict)
    task_abnormal: dict[str, float] = field(default_factory=dict)


def task_sums(
    entropy: Tensor,
    mask: Tensor,
    rewards: Tensor,
    success: Tensor,
    task_ids: Tensor,
    num_tasks: int,
    abnormal: Tensor | None = None,
) -> Tensor:
    """Per-task sums of one batch (rows :data:`SUM_ROWS`), float64 ``[7, num_tasks]``.

    Args:
        entropy: ``[B, T]`` per-token sampling entropy (any value where ``mask`` is 0).
        mask: ``[B, T]`` 0/1 loss mask (policy tokens).
        rewards: ``[B]`` episode rewards.
        success: ``[B]`` episode success (bool or 0/1).
        task_ids: ``[B]`` integer task index in ``[0, num_tasks)``.
        num_tasks: K.
        abnormal: ``[B]`` abnormal end of each episode (bool or 0/1), optional.
    """
    if entropy.shape != mask.shape or entropy.dim() != 2:
        raise ValueError(
            f"entropy and mask must share the shape [B, T]; got {tuple(entropy.shape)} and "
            f"{tuple(mask.shape)}"
        )
    b = entropy.shape[0]
    if abnormal is None:
        abnormal = torch.zeros(b, device=entropy.device)
    named = (("rewards", rewards), ("success", success), ("task_ids", task_ids))
    for name, value in (*named, ("abnormal", abnormal)):
        if value.shape != (b,):
            raise ValueError(f"{name} must be [B] with B = {b}; got {tuple(value.shape)}")
    m = mask.to(torch.float64)
    ent = torch.where(mask.bool(), entropy.to(torch.float64), 0.0)
    r = rewards.to(torch.float64)
    per_traj = torch.stack(
        [
            (ent * m).sum(1),
            m.sum(1),
            torch.ones_like(r),
            success.to(torch.float64),
            r,
            r * r,
            abnormal.to(torch.float64),
        ]
    )  # [7, B]
    out = torch.zeros(len(SUM_ROWS), num_tasks, dtype=torch.float64, device=entropy.device)
    return out.index_add_(1, task_ids.long(), per_traj)


def signals_from_sums(sums: Tensor, task_names: Sequence[str]) -> StepSignals:
    """:class:`StepSignals` of the tasks present (``episodes > 0``) from :func:`task_sums`
    output (possibly reduced across processes). One host transfer."""
    if sums.shape != (len(SUM_ROWS), len(task_names)):
        raise ValueError(
            f"sums must be [{len(SUM_ROWS)}, {len(task_names)}]; got {tuple(sums.shape)}"
        )
    rows = dict(zip(SUM_ROWS, sums.detach().cpu().tolist(), strict=True))
    sig = StepSignals()
    for k, name in enumerate(task_names):
        n = rows["episodes"][k]
        if n <= 0:
            continue
        tokens = rows["tokens"][k]
        if tokens > 0:
            sig.task_entropy[name] = rows["entropy_sum"][k] / tokens
        mean = rows["reward_sum"][k] / n
        sig.task_success[name] = rows["success_sum"][k] / n
        sig.task_reward[name] = mean
        sig.task_reward_var[name] = max(rows["reward_sq"][k] / n - mean * mean, 0.0)
        sig.task_episodes[name] = int(round(n))
        sig.task_tokens[name] = int(round(tokens))
        sig.task_abnormal[name] = rows["abnormal_sum"][k] / n
    return sig
