"""The rollout batch: what the rollout engine hands to the update.

Alignment convention: every ``[B, L]`` tensor is aligned to *tokens*: column ``t`` describes
token ``input_ids[:, t]`` as predicted from the prefix ``input_ids[:, :t]`` (so column 0 never
carries a loss). The update computes logits on ``input_ids[:, :-1]`` and compares them with
columns ``1:`` of the per-token tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import Tensor


@dataclass
class EpisodeRecord:
    """Text of one episode, for logging samples and debugging (not used by the update)."""

    task: str
    seed: int
    messages: list[dict[str, str]]
    reward: float
    success: bool
    end_reason: str  # "terminated" | "truncated_turns" | "length" | "parse_error" | ...
    scores: dict[str, float] = field(default_factory=dict)  # last info value of SCORE_KEYS


#: Per-episode scores an environment may report in its step info, besides reward and success
#: (``kg``: ``f1``, AgentBench-KG's answer F1); the rollout keeps the last value of an episode.
SCORE_KEYS: tuple[str, ...] = ("f1",)


def info_scores(info: dict[str, Any]) -> dict[str, float]:
    """The finite numeric :data:`SCORE_KEYS` values of one step's ``info``."""
    out: dict[str, float] = {}
    for key in SCORE_KEYS:
        value = info.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            out[key] = float(value)
    return out


def task_scores(episodes: list[EpisodeRecord]) -> dict[str, float]:
    """``task/<task>/<score>``: each score's mean over the task's episodes.

    A task that reports a score reports it on every step, so an episode of that task without
    it ended before its first step and counts as 0. Tasks that never report it are left out.
    """
    out: dict[str, float] = {}
    for task in sorted({ep.task for ep in episodes}):
        eps = [ep for ep in episodes if ep.task == task]
        for key in sorted({k for ep in eps for k in ep.scores}):
            out[f"task/{task}/{key}"] = sum(ep.scores.get(key, 0.0) for ep in eps) / len(eps)
    return out


@dataclass
class RolloutBatch:
    """One step's trajectories, tokenised once.

    Shapes: B trajectories, L tokens (right-padded).

    Attributes:
        input_ids: ``[B, L]`` long, the whole trajectory (system/user prompt, every assistant
            turn, every environment observation, chat-template tokens), right-padded.
        attention_mask: ``[B, L]`` long, 1 on real tokens.
        loss_mask: ``[B, L]`` float32, 1 exactly on tokens the policy generated.
        old_logprobs: ``[B, L]`` float32, ``log pi_old(token_t | prefix)`` at the sampling
            temperature, recomputed by a forward pass of the sampling policy; 0 where masked.
        entropy: ``[B, L]`` float32, entropy of the sampling policy's next-token distribution
            at that state (after temperature); 0 where masked.
        sensitivity: ``[B, L]`` float32, PAPO's ``S = t2 - t1`` for the sampled token; 0 where
            masked.
        rewards: ``[B]`` float32, episode reward after abnormal-end penalties.
        group_ids: ``[B]`` long, equal for trajectories sampled from the same instance.
        task_ids: ``[B]`` long, index into ``task_names``.
        task_names: the task (family) names of this run, in a fixed order.
        success: ``[B]`` bool.
        abnormal: ``[B]`` bool, the episode ended abnormally (turn/length limit, unparseable).
        num_turns: ``[B]`` long.
        episodes: optional text records, one per trajectory.
        behaviour_policy: ``[B, L]`` long or None: with ``rollout.cross_policy``, the index
            in the pool (0 = the current weights) of the policy that sampled each token, -1
            where masked; ``old_logprobs``, ``entropy`` and ``sensitivity`` are that policy's.
        off_policy: some token may have been sampled by a policy other than the learner at
            update start (an asynchronous worker's older version, a cross-policy pool member):
            the update then runs its proximal pass (``rollout/behaviour_kl``).
        policy_version: ``[B]`` long, the version of the weights that generated each
            trajectory (version ``v`` = after ``v`` updates), stamped by the rollout worker
            (:mod:`entropace.rollout.worker`); None when no worker stamped it (a bare
            :func:`entropace.rollout.collect_rollouts` call).
    """

    input_ids: Tensor
    attention_mask: Tensor
    loss_mask: Tensor
    old_logprobs: Tensor
    entropy: Tensor
    sensitivity: Tensor
    rewards: Tensor
    group_ids: Tensor
    task_ids: Tensor
    task_names: list[str]
    success: Tensor
    abnormal: Tensor
    num_turns: Tensor
    episodes: list[EpisodeRecord] = field(default_factory=list)
    behaviour_policy: Tensor | None = None
    off_policy: bool = False
    policy_version: Tensor | None = None

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, index: Tensor) -> RolloutBatch:
        """The sub-batch of trajectories ``index`` (``[b]`` long or ``[B]`` bool)."""
        if index.dtype == torch.bool:
            index = index.nonzero().flatten()
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                out[f.name] = value[index]
            elif f.name == "episodes":
                out[f.name] = [value[i] for i in index.tolist()] if value else []
            else:
                out[f.name] = value
        return RolloutBatch(**out)

    def to(self, device: torch.device | str) -> RolloutBatch:
        out = {
            f.name: (
                getattr(self, f.name).to(device)
                if isinstance(getattr(self, f.name), Tensor)
                else getattr(self, f.name)
            )
            for f in fields(self)
        }
        return RolloutBatch(**out)
