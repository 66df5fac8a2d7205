"""Evaluate a run's checkpoint on held-out seeds: per-task success, written to ``RUN/eval.json``.

``evaluate(RUN, tasks=["db", "kg"], n=50)`` loads the run's config and its latest checkpoint
(or the one given), then samples one episode per seed of the first ``n`` seeds of each held-out
split of each task, greedily by default (``do_sample=True``: the run's sampling temperature /
top-p), with the run's rollout limits. The held-out splits (:mod:`entropace.envs.splits`):
``test`` (the training templates and units, instances whose content never occurs in
``train``) and ``test_unseen`` (held-out units: floor plans, task kinds, categories, ...),
for the families that offer it (:attr:`~entropace.envs.registry.EnvSpec.splits`); the others
are reported as n/a (``None``).

Cost: one episode per task, seed and split (``--n 20`` on ``db,kg``: 80 episodes; a family
without ``test_unseen``, e.g. ``reasoning``, plays only ``test``), generated with the run's rollout limits and torch
threads (:func:`entropace.train.threads.plan_threads`, as its trainer); measured times are in
``entropace eval --help``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from entropace._files import write_atomic
from entropace.train.checkpoint import check_warm_start, latest_checkpoint, load_checkpoint
from entropace.train.config import load_config_file
from entropace.train.held_out import held_out_episodes, per_task_summary
from entropace.train.policy import build_model
from entropace.train.threads import plan_threads, torch_threads
from entropace.train.warm_start import warm_started

#: The held-out splits ``evaluate`` reports by default.
HELD_OUT: tuple[str, ...] = ("test", "test_unseen")


def evaluate(
    run_dir: str | Path,
    *,
    tasks: list[str] | None = None,
    n: int = 50,
    split: str = "held_out",
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
        n: seeds per task and split (the first ``n`` of each).
        split: ``"held_out"`` (default: ``test`` and ``test_unseen``), or one of ``"train"``,
            ``"test"``, ``"test_unseen"``.
        checkpoint: a checkpoint directory; default the run's latest.
        do_sample: sample (the run's temperature / top-p) instead of greedy decoding.
        batch_size: episodes per :func:`collect_rollouts` call.
        seed: sampling seed (only matters with ``do_sample``).
        write: write ``RUN/eval.json``.

    Returns:
        ``{"step", "checkpoint", "split", "splits", "n", "do_sample", "tasks", "mean_success",
        "by_split", "episodes"}``: ``splits`` the evaluated splits; ``by_split[split]`` is
        ``{"tasks": {task: {"success", "reward", "abnormal", "episodes"} (plus each score
        the task's environment reports, e.g. kg's ``f1``) or None (n/a)}, "mean_success"}``
        (the mean over the tasks that have the split; None when none has it); ``tasks`` and
        ``mean_success`` are those of the first split (``test`` by default); each episode
        record names its ``split``.
    """
    from entropace.envs import seeds
    from entropace.envs.registry import has_split

    splits = list(HELD_OUT) if split == "held_out" else [split]
    if any(sp not in ("train", *HELD_OUT) for sp in splits):
        raise ValueError(f"split must be 'held_out', 'train' or one of {list(HELD_OUT)}: {split!r}")

    run_dir = Path(run_dir)
    if not os.path.lexists(run_dir / "config.yaml"):
        raise FileNotFoundError(f"{run_dir} is not a run directory (no config.yaml)")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    cfg = load_config_file(run_dir / "config.yaml")
    tasks = list(tasks or cfg.tasks.names)
    path = Path(checkpoint) if checkpoint else latest_checkpoint(run_dir / "checkpoints")
    if path is None:
        raise FileNotFoundError(f"no checkpoint under {run_dir / 'checkpoints'}")
    # the policy the run trained: its warm start (from the cache, built again if missing),
    # which a LoRA checkpoint's adapter sits on; the checkpoint names the weights it expects
    built, warm = warm_started(cfg)
    model, tokenizer, _ = build_model(built.model)
    state = load_checkpoint(path, model=model, restore_rng=False)
    n_params = sum(p.numel() for p in model.parameters())
    threads = plan_threads(cfg.threads, n_params=n_params, processes=1)  # as the run's trainer
    check_warm_start(state.get("warm_start"), warm, path)  # the weights the run trained on

    records: list[dict[str, Any]] = []
    for sp in splits:
        factories = {t: cfg.tasks.env_factory(t) for t in tasks if has_split(t, sp)}
        if not factories:
            continue
        with torch_threads(threads.learner):
            episodes = held_out_episodes(
                model, tokenizer, cfg.rollout, factories, [int(s) for s in seeds(sp, n)],  # type: ignore[arg-type]
                do_sample=do_sample, batch_size=batch_size, seed=seed,
            )  # fmt: skip
        records += [{**r, "split": sp} for r in episodes]

    by_split = {sp: _summarise(tasks, [r for r in records if r["split"] == sp]) for sp in splits}
    first = by_split[splits[0]]
    result = {
        "step": int(state["step"]),
        "checkpoint": str(path),
        "split": split,
        "splits": splits,
        "n": n,
        "do_sample": do_sample,
        "tasks": first["tasks"],
        "mean_success": first["mean_success"],
        "by_split": by_split,
        "episodes": records,
    }
    if write:
        write_atomic(run_dir / "eval.json", json.dumps(result, indent=1))
    return result


def _summarise(tasks: list[str], records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-task means of one split's episode records
    (:func:`~entropace.train.held_out.per_task_summary`; None for a task without episodes)."""
    summary = per_task_summary(records, tasks)
    per_task: dict[str, dict[str, float] | None] = {t: summary.get(t) for t in tasks}
    present = [t["success"] for t in per_task.values() if t is not None]
    mean = math.fsum(present) / len(present) if present else None
    return {"tasks": per_task, "mean_success": mean}


def format_table(result: dict[str, Any]) -> str:
    """A plain-text table of :func:`evaluate`'s per-task numbers, one block per split
    (``n/a`` where a task has no such split)."""
    lines: list[str] = []
    by_split = result.get("by_split") or {
        result["split"]: {"tasks": result["tasks"], "mean_success": result["mean_success"]}
    }
    for sp, block in by_split.items():
        if lines:
            lines.append("")
        lines.append(
            f"{'task':<14}{'split':<13}{'success':>9}{'reward':>9}{'abnormal':>10}{'episodes':>10}"
        )
        for task, r in block["tasks"].items():
            if r is None:
                lines.append(f"{task:<14}{sp:<13}{'n/a':>9}")
                continue
            lines.append(
                f"{task:<14}{sp:<13}{r['success']:>9.3f}{r['reward']:>9.3f}"
                f"{r['abnormal']:>10.3f}{r['episodes']:>10d}"
            )
        mean = block["mean_success"]
        lines.append(f"{'mean':<14}{sp:<13}" + (f"{mean:>9.3f}" if mean is not None else "n/a"))
    return "\n".join(lines)
