"""Requests and results of the rollout engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from entropace.envs.base import TextEnv
from entropace.rollout.batch import RolloutBatch

#: End reasons; every one but ``"terminated"`` is abnormal.
END_REASONS: tuple[str, ...] = (
    "terminated",
    "truncated_turns",
    "length",
    "parse_error",
    "env_error",
)


@dataclass
class RolloutRequest:
    """One episode to sample.

    Attributes:
        task: task (family) name; must be in the run's ``task_names``.
        env: a fresh environment, or a zero-argument factory returning one.
        seed: instance seed passed to ``env.reset``.
        group_id: equal for the episodes sampled from the same instance (a GRPO group).
    """

    task: str
    env: TextEnv | Callable[[], TextEnv]
    seed: int
    group_id: int


@dataclass
class RolloutResult:
    """A rollout batch and how it was obtained.

    Attributes:
        batch: the trajectories (see :class:`RolloutBatch`).
        timings: seconds spent in ``generation_s``, ``env_s`` (reset + step), ``stats_s``
            (statistics forward) and ``total_s``.
        counts: ``episodes``, ``generated_tokens``, ``turns``, ``generate_calls``,
            ``abnormal``, ``max_len`` (trajectory tokens, the padded ``L``), one
            ``end_<reason>`` entry per end reason, ``prefill_tokens`` (positions the model
            prefilled for generation, padding included) and ``cached_tokens`` (positions
            taken from key/value caches instead: ``rollout.share_prefix`` / ``reuse_kv``).
        task_counts: per task: ``episodes``, ``successes``, ``abnormal``, ``generated_tokens``,
            ``turns``, ``parse_errors`` (steps whose info has ``parse_error``: an unparseable
            action, or any tool error) and ``tool_errors`` (steps with an ``info["tool_error"]``,
            the tools interface's malformed calls).
        generate_batch_sizes: the batch size of every ``generate`` call, in order.
    """

    batch: RolloutBatch
    timings: dict[str, float]
    counts: dict[str, int]
    task_counts: dict[str, dict[str, int]]
    generate_batch_sizes: list[int] = field(default_factory=list)

    def task_error_rates(self) -> dict[str, float]:
        """``task/<k>/parse_errors`` and ``task/<k>/tool_errors``: the fraction of the task's
        environment steps (turns) with a parse error / a tool error (0 for a task without
        steps)."""
        out: dict[str, float] = {}
        for task, c in sorted(self.task_counts.items()):
            turns = max(c.get("turns", 0), 1)
            out[f"task/{task}/parse_errors"] = c.get("parse_errors", 0) / turns
            out[f"task/{task}/tool_errors"] = c.get("tool_errors", 0) / turns
        return out
