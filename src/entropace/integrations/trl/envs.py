"""entropace's environments as TRL multi-turn rollouts (a ``rollout_func`` adapter).

TRL 1.16 offers three multi-turn routes: ``tools`` and ``environment_factory`` (the model emits
tool calls that the tokenizer's response schema must parse; environment methods become tools)
and ``rollout_func(prompts, trainer) -> {"prompt_ids", "completion_ids", "logprobs", ...}``
whose extra ``env_mask`` field marks the model's own tokens (1) against inserted ones (0).
entropace's environments take free-text actions (``SQL: ...``, ``Action: tool(x)``), not tool
calls, so the adapter is a ``rollout_func`` that runs our own multi-turn engine
(:func:`entropace.rollout.collect_rollouts`: one batched ``generate`` per turn over every live
episode, observations appended with the chat template, abnormal-end penalty) and hands TRL:

* ``prompt_ids``: system prompt + first observation + assistant header;
* ``completion_ids``: every later token (assistant turns, observation turns, template tokens);
* ``env_mask``: 1 exactly on the sampled tokens, so observations carry no loss in TRL;
* ``logprobs``: the sampling policy's log-probs (0 off the mask);
* extra fields for reward functions and the trainer: ``entropace_reward`` (episode reward after
  the abnormal-end penalty), ``entropace_success``, ``entropace_abnormal``, ``entropace_turns``,
  and the per-token ``entropace_entropy`` / ``entropace_sensitivity`` our engine computed at the
  sampling temperature (so :class:`EntropaceGRPOTrainer` needs no extra statistics pass).

The dataset rows name the instance: ``task`` (family) and ``seed`` (:func:`env_dataset`). TRL
passes only the prompts to a ``rollout_func``; :class:`EntropaceGRPOTrainer` exposes the rows of
the batch being generated, which is why the adapter needs that trainer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EnvRolloutConfig", "env_dataset", "env_reward", "env_rollout_func"]


@dataclass
class EnvRolloutConfig:
    """Options of :func:`env_rollout_func` (the engine's :class:`RolloutConfig`, minus the
    temperature and top-p, which come from TRL's ``GRPOConfig``).

    Attributes:
        max_turns: overrides every environment's own turn limit (None: keep it).
        max_new_tokens_per_turn: generation budget of one assistant turn.
        max_episode_tokens: budget of the whole trajectory (prompt, turns, observations).
        abnormal_penalty: reward of an episode that ends abnormally (turn / length limit,
            parse error with ``end_on_parse_error``, environment error); AgentRL uses -0.2.
        end_on_parse_error: end an episode on its first unparseable action.
        env_options: ``{family: options}`` passed to ``entropace.envs.make(family, **options)``.
        task_column, seed_column: the dataset columns naming each row's family and instance.
        micro_batch_size: trajectories per forward of the engine's statistics pass.
    """

    max_turns: int | None = None
    max_new_tokens_per_turn: int = 256
    max_episode_tokens: int = 4096
    abnormal_penalty: float = -0.2
    end_on_parse_error: bool = False
    env_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    task_column: str = "task"
    seed_column: str = "seed"
    micro_batch_size: int | None = 8


def env_dataset(
    tasks: Sequence[str],
    instances_per_task: int,
    *,
    first_seed: int = 0,
    task_column: str = "task",
    seed_column: str = "seed",
) -> Any:
    """A ``datasets.Dataset`` of environment instances, tasks interleaved.

    Row ``i * len(tasks) + j`` is instance ``first_seed + i`` of ``tasks[j]``: ``prompt`` (a
    one-message placeholder naming the instance; the environment writes the real prompt),
    ``task_column`` and ``seed_column``.
    """
    import datasets

    from entropace.envs import make

    for name in tasks:
        make(name)  # fail early, naming the missing dependency or the known families
    rows = [
        {
            "prompt": [{"role": "user", "content": f"{name} instance {first_seed + i}"}],
            task_column: name,
            seed_column: first_seed + i,
        }
        for i in range(instances_per_task)
        for name in tasks
    ]
    return datasets.Dataset.from_list(rows)


def env_reward(
    completions: list[Any], entropace_reward: list[float] | None = None, **_: Any
) -> list[float]:
    """TRL reward function: the episode rewards :func:`env_rollout_func` computed."""
    if entropace_reward is None:
        raise ValueError(
            "env_reward reads the episode rewards of env_rollout_func; pass "
            "rollout_func=env_rollout_func(...) to EntropaceGRPOTrainer"
        )
    return [float(r) for r in entropace_reward]


def _split(row: int, batch: Any) -> dict[str, list[Any]]:
    """Trajectory ``row`` of a RolloutBatch cut into TRL's prompt / completion parts."""
    n = int(batch.attention_mask[row].sum())
    ids = batch.input_ids[row, :n].tolist()
    lm = batch.loss_mask[row, :n]
    generated = lm.nonzero()
    first = int(generated[0, 0]) if generated.numel() else n - 1
    return {
        "prompt_ids": ids[:first],
        "completion_ids": ids[first:],
        "env_mask": [int(v) for v in lm[first:].tolist()],
        "logprobs": batch.old_logprobs[row, first:n].tolist(),
        "entropace_entropy": batch.entropy[row, first:n].tolist(),
        "entropace_sensitivity": batch.sensitivity[row, first:n].tolist(),
    }


def env_rollout_func(
    config: EnvRolloutConfig | None = None,
) -> Callable[[list[Any], Any], dict[str, list[Any]]]:
    """A TRL ``rollout_func`` running entropace environments (see the module docstring).

    Use with :class:`~entropace.integrations.trl.EntropaceGRPOTrainer`,
    ``reward_funcs=[env_reward]`` and a dataset from :func:`env_dataset`.
    """
    cfg = config or EnvRolloutConfig()

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        from entropace.envs import make
        from entropace.rollout import RolloutConfig, RolloutRequest, collect_rollouts

        rows = getattr(trainer, "_entropace_inputs", None)
        if rows is None or len(rows) != len(prompts):
            raise RuntimeError(
                "env_rollout_func needs entropace.integrations.trl.EntropaceGRPOTrainer (TRL "
                "passes only the prompts to a rollout_func; that trainer exposes the rows)"
            )
        requests = []
        for i, row in enumerate(rows):
            if cfg.task_column not in row or cfg.seed_column not in row:
                raise KeyError(
                    f"env_rollout_func: each dataset row needs {cfg.task_column!r} and "
                    f"{cfg.seed_column!r} columns (see env_dataset); got {sorted(row)}"
                )
            task = str(row[cfg.task_column])
            options: Mapping[str, Any] = cfg.env_options.get(task, {})
            requests.append(
                RolloutRequest(
                    task=task,
                    env=functools.partial(make, task, **options),
                    seed=int(row[cfg.seed_column]),
                    group_id=i // max(1, int(trainer.num_generations)),
                )
            )
        rollout_cfg = RolloutConfig(
            max_turns=cfg.max_turns,
            max_new_tokens_per_turn=cfg.max_new_tokens_per_turn,
            max_episode_tokens=cfg.max_episode_tokens,
            temperature=float(trainer.temperature),
            top_p=float(trainer.args.top_p),
            abnormal_penalty=cfg.abnormal_penalty,
            end_on_parse_error=cfg.end_on_parse_error,
            micro_batch_size=cfg.micro_batch_size,
        )
        names = list(getattr(trainer, "task_names", None) or sorted({r.task for r in requests}))
        if not set(r.task for r in requests) <= set(names):
            names = sorted({r.task for r in requests})
        result = collect_rollouts(
            trainer.model, trainer.processing_class, requests, rollout_cfg, task_names=names
        )
        batch = result.batch
        out: dict[str, list[Any]] = {}
        for row in range(len(requests)):
            for key, value in _split(row, batch).items():
                out.setdefault(key, []).append(value)
        out["entropace_reward"] = batch.rewards.tolist()
        out["entropace_success"] = [bool(s) for s in batch.success.tolist()]
        out["entropace_abnormal"] = [bool(a) for a in batch.abnormal.tolist()]
        out["entropace_turns"] = [int(t) for t in batch.num_turns.tolist()]
        return out

    return rollout
