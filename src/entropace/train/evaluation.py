"""Evaluate a run's checkpoint on held-out seeds: per-task success, written to ``RUN/eval.json``.

``evaluate(RUN, tasks=["db", "kg"], n=50)`` loads the run's config and its latest checkpoint
(or the one given), then samples one episode per seed of the first ``n`` seeds of the
``test`` split (disjoint from ``train`` by construction) of each task, greedily by default
(``do_sample=True``: the run's sampling temperature / top-p), with the run's rollout limits.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from entropace.train.checkpoint import latest_checkpoint, load_checkpoint
from entropace.train.config import load_config_file
from entropace.train.held_out import held_out_episodes, per_task_summary
from entropace.train.trainer import build_model


def evaluate(
    run_dir: str | Path,
    *,
    tasks: list[str] | None = None,
    n: int = 50,
    split: str = "test",
    checkpoint: str | Path | None = None,
    do_sample: bool = False,
    batch_size: int = 64,
    seed: int = 0,
    write: bool = True,
) -> dict[str, Any]:
    """Per-task success / reward / abnormal-end rate of a checkpoint on ``n`` seeds per task.

    Args:
        run_dir: a run directory (with ``config.yaml`` and ``checkpoints/``).
        tasks: task families (default: the run's ``tasks.names``).
        n: seeds per task (the first ``n`` of ``split``).
        checkpoint: a checkpoint directory; default the run's latest.
        do_sample: sample (the run's temperature / top-p) instead of greedy decoding.
        batch_size: episodes per :func:`collect_rollouts` call.
        seed: sampling seed (only matters with ``do_sample``).
        write: write ``RUN/eval.json``.

    Returns:
        ``{"step", "checkpoint", "split", "n", "do_sample", "tasks": {task: {"success",
        "reward", "abnormal", "episodes"} (plus each score the task's environment reports,
        e.g. kg's ``f1``)}, "mean_success", "episodes": [per-episode records]}``.
    """
    from entropace.envs import seeds

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no config.yaml)")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    cfg = load_config_file(run_dir / "config.yaml")
    tasks = list(tasks or cfg.tasks.names)
    path = Path(checkpoint) if checkpoint else latest_checkpoint(run_dir / "checkpoints")
    if path is None:
        raise FileNotFoundError(f"no checkpoint under {run_dir / 'checkpoints'}")
    model, tokenizer, _ = build_model(cfg.model)
    state = load_checkpoint(path, model=model, restore_rng=False)

    factories = {task: cfg.tasks.env_factory(task) for task in tasks}
    records = held_out_episodes(
        model, tokenizer, cfg.rollout, factories, [int(s) for s in seeds(split, n)],  # type: ignore[arg-type]
        do_sample=do_sample, batch_size=batch_size, seed=seed,
    )  # fmt: skip
    per_task = per_task_summary(records, tasks)
    result = {
        "step": int(state["step"]),
        "checkpoint": str(path),
        "split": split,
        "n": n,
        "do_sample": do_sample,
        "tasks": per_task,
        "mean_success": math.fsum(t["success"] for t in per_task.values()) / len(per_task),
        "episodes": records,
    }
    if write:
        (run_dir / "eval.json").write_text(json.dumps(result, indent=1))
    return result


def format_table(result: dict[str, Any]) -> str:
    """A plain-text table of :func:`evaluate`'s per-task numbers."""
    lines = [f"{'task':<14}{'success':>9}{'reward':>9}{'abnormal':>10}{'episodes':>10}"]
    for task, r in result["tasks"].items():
        lines.append(
            f"{task:<14}{r['success']:>9.3f}{r['reward']:>9.3f}{r['abnormal']:>10.3f}"
            f"{r['episodes']:>10d}"
        )
    lines.append(f"{'mean':<14}{result['mean_success']:>9.3f}")
    return "\n".join(lines)
