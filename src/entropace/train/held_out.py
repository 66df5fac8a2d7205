"""Held-out evaluation of a policy in memory: per-task success on fixed held-out seeds.

:func:`held_out_episodes` runs one episode per ``(task, seed)`` with the rollout engine (greedy
decoding unless ``do_sample``), in chunks, and returns one record per episode; it is what
``entropace eval`` (:func:`entropace.train.evaluation.evaluate`, from a checkpoint) and the
trainer's periodic evaluation (``eval.every``, :func:`periodic_metrics`) both run, so a
success number means the same in both places.

The periodic evaluation gives the measures of issue 23 (``entropace compare``): success over
the whole run on held-out prompts (area under the success curve) and time to solve. The seeds
are the first ``eval.n`` of ``eval.split`` for every task, the same at every evaluation, so a
curve follows one fixed held-out set. The sampling seed is fixed too and the caller's torch RNG
is restored (:func:`entropace.rollout.collect_rollouts`), so evaluating does not change the
training run's own random stream.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["held_out_episodes", "held_out_metrics", "periodic_metrics", "per_task_summary"]


def held_out_episodes(
    model: Any,
    tokenizer: Any,
    rollout_cfg: Any,
    factories: dict[str, Callable[[], Any]],
    seeds: Sequence[int],
    *,
    do_sample: bool = False,
    batch_size: int = 64,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One episode per task of ``factories`` and seed of ``seeds``; one record per episode:
    ``{"task", "seed", "success", "reward", "abnormal", "end_reason", "scores", "actions"}``.

    Cost: one episode per (task, seed), with the run's rollout limits; the first prompts of a
    task share their common prefix (``rollout.share_prefix``) and no statistics pass runs."""
    from entropace.rollout import RolloutRequest, collect_rollouts

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    tasks = list(factories)
    # the token statistics of an evaluation are never read: take them from generation's own
    # logits (no second forward pass over the trajectories when the run recomputes them)
    cfg = dataclasses.replace(rollout_cfg, do_sample=do_sample, stats_from_generation=True)
    requests = [
        RolloutRequest(task=task, env=factories[task], seed=int(s), group_id=i)
        for i, (task, s) in enumerate((t, s) for t in tasks for s in seeds)
    ]
    records: list[dict[str, Any]] = []
    for start in range(0, len(requests), batch_size):
        chunk = requests[start : start + batch_size]
        batch = collect_rollouts(
            model, tokenizer, chunk, cfg, task_names=tasks, seed=seed + start
        ).batch
        for i, req in enumerate(chunk):
            ep = batch.episodes[i] if batch.episodes else None
            records.append({
                "task": req.task,
                "seed": req.seed,
                "success": bool(batch.success[i]),
                "reward": float(batch.rewards[i]),
                "abnormal": bool(batch.abnormal[i]),
                "end_reason": ep.end_reason if ep else None,
                "scores": dict(ep.scores) if ep else {},
                "actions": [m["content"] for m in ep.messages if m["role"] == "assistant"]
                if ep else [],
            })  # fmt: skip
    return records


def per_task_summary(records: Sequence[dict[str, Any]], tasks: Sequence[str]) -> dict[str, Any]:
    """``{task: {"success", "reward", "abnormal", "episodes", <scores>}}`` (means per task)."""
    out: dict[str, Any] = {}
    for task in tasks:
        rows = [r for r in records if r["task"] == task]
        if not rows:
            continue
        n = len(rows)
        out[task] = {
            "success": sum(r["success"] for r in rows) / n,
            "reward": math.fsum(r["reward"] for r in rows) / n,
            "abnormal": sum(r["abnormal"] for r in rows) / n,
            "episodes": n,
        }
        for key in sorted({k for r in rows for k in r["scores"]}):  # e.g. kg's f1
            out[task][key] = math.fsum(r["scores"].get(key, 0.0) for r in rows) / n
    return out


def periodic_metrics(
    model: Any,
    tokenizer: Any,
    rollout_cfg: Any,
    factories: dict[str, Callable[[], Any]],
    seeds: Sequence[int],
    *,
    do_sample: bool = False,
    batch_size: int = 64,
) -> dict[str, float]:
    """The trainer's ``eval/...`` metrics: ``eval/<task>/success``, ``eval/<task>/reward`` and
    ``eval/success`` (the mean over tasks) on the held-out ``seeds``."""
    records = held_out_episodes(
        model, tokenizer, rollout_cfg, factories, seeds, do_sample=do_sample,
        batch_size=batch_size,
    )  # fmt: skip
    summary = per_task_summary(records, list(factories))
    out: dict[str, float] = {}
    for task, row in summary.items():
        out[f"eval/{task}/success"] = float(row["success"])
        out[f"eval/{task}/reward"] = float(row["reward"])
    if summary:
        out["eval/success"] = math.fsum(r["success"] for r in summary.values()) / len(summary)
    return out


def held_out_metrics(model: Any, tokenizer: Any, cfg: Any) -> dict[str, float]:
    """:func:`periodic_metrics` as a training config sets it (``cfg.eval``, ``cfg.tasks``,
    ``cfg.rollout``): the first ``eval.n`` seeds of ``eval.split`` of every task."""
    from entropace.envs import seeds

    factories = {task: cfg.tasks.env_factory(task) for task in cfg.tasks.names}
    return periodic_metrics(
        model, tokenizer, cfg.rollout, factories, [int(s) for s in seeds(cfg.eval.split, cfg.eval.n)],
        do_sample=cfg.eval.do_sample, batch_size=cfg.eval.batch_size,
    )  # fmt: skip
