"""Typed, validated options of the rollout engine (embedded in the trainer's config)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class RolloutConfig:
    """How episodes are sampled and scored.

    Attributes:
        max_turns: overrides every environment's own ``max_turns`` when set (``None``: keep the
            environment's limit).
        max_new_tokens_per_turn: generation budget of one assistant turn; a turn that hits it
            without an end-of-turn token is passed to the environment as is (cut text).
        max_episode_tokens: budget of the whole trajectory (prompt, every turn, every
            observation); the trainer refuses one not above a task's first prompt before its
            first rollout (:func:`entropace.train.preflight.check_prompt_budget`). A turn that runs into it, or an observation that leaves no room for
            another generated token, ends the episode abnormally (reason ``"length"``). The
            closing chat-template tokens of the last turn (e.g. ``<|im_end|>\\n``) may exceed it.
        temperature: sampling temperature, in [0.001, 1000]; the statistics (``old_logprobs``, entropy,
            sensitivity) are computed at this temperature.
        top_p: nucleus sampling threshold (1.0 = off). Statistics ignore it (they describe the
            temperature-scaled full distribution, as in the papers).
        do_sample: ``False`` for greedy decoding (evaluation); statistics still use
            ``temperature``.
        abnormal_penalty: the reward of an abnormal episode (turn/length limit, parse error
            when ``end_on_parse_error``, environment error). Default -0.2: the value
            ``docs/BASELINES.md`` lists for AgentRL (arXiv 2510.04206); AgentRL's code was not
            available to verify it. AgentBench FC's task code gives 0 at the turn limit and
            after invalid calls (``RewardHistoryItem(reward=0)`` on ``TASK_LIMIT_REACHED``),
            which the ``agentbench`` and ``paper`` presets use (``docs/envs/agentbench.md``).
        end_on_parse_error: end the episode on the first step whose info has
            ``parse_error=True`` (abnormal, reason ``"parse_error"``).
        stats_chunk_size: rows per chunk in :func:`entropace.algos.token_stats` (bounds the
            float32 full-vocabulary temporaries); ``None`` = its cache-friendly default.
        micro_batch_size: trajectories per forward pass of the statistics pass (``None`` =
            all at once).
        generation_batch_size: most episodes in one ``generate`` call (``None`` = all live
            episodes together, the default).
        share_prefix: episodes whose first prompts are equal (the ``G`` samples of a group)
            prefill that prompt once and start from copies of its key/value cache, and
            distinct prompts with a long common prefix (a task's system prompt) prefill it
            once (``entropace.rollout.kvcache``). Same ids, mask and positions as without it.
        reuse_kv: every live episode keeps its key/value cache between turns; the next turn
            prefills only the tokens after it (the last generated token, the template tokens
            and the new observation). Off: every turn re-encodes the whole history (the old
            path, kept for equality tests and benchmarks). Both switches fall back to the old
            path, with a warning, for models whose cache is not a full-attention
            ``DynamicCache`` (sliding-window or linear-attention layers).
        fused_head: the statistics pass takes the hidden states of the policy tokens only
            and fuses the LM head with the statistics (``sequence_token_stats(...,
            fused_head=True)``): no ``[b, L, V]`` logits. Off: materialised logits.
        stats_from_generation: take the sampling statistics (old log-probs, entropy, PAPO's
            ``t1``/``t2``) from generation's own logits instead of a second forward pass over
            the trajectories (:mod:`entropace.rollout.gen_stats`). Equal to the recomputed
            ones to float round-off in fp32 (tested to 1e-5); off by default because a bf16
            GPU engine's cached decoding drifts from the training forward, and recomputing
            stays the reference.
    """

    max_turns: int | None = None
    max_new_tokens_per_turn: int = 256
    max_episode_tokens: int = 4096
    temperature: float = 1.0
    top_p: float = 1.0
    do_sample: bool = True
    abnormal_penalty: float = -0.2
    end_on_parse_error: bool = False
    stats_chunk_size: int | None = None
    micro_batch_size: int | None = 8
    generation_batch_size: int | None = None
    share_prefix: bool = True
    reuse_kv: bool = True
    fused_head: bool = True
    stats_from_generation: bool = False

    def __post_init__(self) -> None:
        for name, (lo, hi, lo_open, hi_open) in ROLLOUT_RANGES.items():
            value = getattr(self, name)
            if value is None and name in OPTIONAL:
                continue
            integer = isinstance(lo, int)
            kinds = int if integer else int | float
            ok = isinstance(value, kinds) and not isinstance(value, bool)
            ok = ok and math.isfinite(value)
            ok = ok and (value > lo if lo_open else value >= lo)
            ok = ok and (value < hi if hi_open else value <= hi)
            if not ok:
                what = "an integer" if integer else "a finite number"
                span = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
                raise ValueError(f"rollout.{name} must be {what} in {span}, got {value!r}")
        for name in ("do_sample", "end_on_parse_error", "share_prefix", "reuse_kv", "fused_head",
                     "stats_from_generation"):  # fmt: skip
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"rollout.{name} must be true or false, got {getattr(self, name)!r}"
                )


#: Most tokens of one episode / one turn (a budget past any model's context is a typo).
MAX_EPISODE_TOKENS = 2**20
#: ``name: (lo, hi, lo_open, hi_open)``: the range of every numeric option (int bounds: an
#: integer option), checked on construction; the trainer's config checks the same ranges
#: when it loads (``entropace.train.config``). The temperature's bounds keep ``logits / T``
#: finite in float32 and bfloat16.
ROLLOUT_RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "max_turns": (1, 1000, False, False),
    "max_new_tokens_per_turn": (1, MAX_EPISODE_TOKENS, False, False),
    "max_episode_tokens": (2, MAX_EPISODE_TOKENS, False, False),
    "temperature": (1e-3, 1e3, False, False),
    "top_p": (0.0, 1.0, True, False),
    "abnormal_penalty": (-math.inf, math.inf, True, True),
    "stats_chunk_size": (1, 2**24, False, False),
    "micro_batch_size": (1, 65_536, False, False),
    "generation_batch_size": (1, 65_536, False, False),
}
#: The options where None is allowed (its meaning is in :class:`RolloutConfig`).
OPTIONAL = ("max_turns", "stats_chunk_size", "micro_batch_size", "generation_batch_size")
