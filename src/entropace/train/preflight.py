"""Checks of the config that need the model's tokenizer, made on a run's first rollout.

A prompt's length in tokens is known only once the environment has rendered it through the
tokenizer's chat template, so ``rollout.max_episode_tokens`` cannot be compared with it when
the config loads. The rollout engine ends an episode whose first prompt already fills the
budget before its first turn (reason ``"length"``, no policy token); on the first rollout of a
run (or of a resumed run) :func:`check_prompt_budget` turns that into a :class:`ConfigError`
naming the key, the task, the seed and the prompt's length, before the update would average
over zero tokens (a NaN entropy: issue 21, item 13). Later steps keep the engine's warning
(one long prompt in a long run is an abnormal episode, not a reason to stop the run).
"""

from __future__ import annotations

from typing import Any

from entropace.rollout.config import RolloutConfig
from entropace.train.schema import ConfigError

__all__ = ["check_prompt_budget"]


def check_prompt_budget(batch: Any, cfg: RolloutConfig) -> None:
    """Raise :class:`ConfigError` if an episode of ``batch`` (a
    :class:`entropace.rollout.batch.RolloutBatch`) ended on its first prompt's length
    (``end_reason == "length"`` with no policy token: the prompt is all its ids)."""
    lengths = batch.attention_mask.sum(dim=1).tolist()
    policy = batch.loss_mask.sum(dim=1).tolist()
    cut = [
        (int(n), ep.task, ep.seed)
        for ep, n, p in zip(batch.episodes, lengths, policy, strict=True)
        if ep.end_reason == "length" and p == 0
    ]
    if not cut:
        return
    n, task, seed = max(cut)
    raise ConfigError(
        f"rollout.max_episode_tokens={cfg.max_episode_tokens} leaves no room for a reply: "
        f"{len(cut)} of the first rollout's {len(lengths)} episodes end before their first "
        f"turn; the longest prompt, task {task!r} seed {seed}, has {n} tokens. Raise "
        f"rollout.max_episode_tokens to at least {n + cfg.max_new_tokens_per_turn} (that "
        "prompt plus rollout.max_new_tokens_per_turn); nothing was trained"
    )
