"""The trainer: typed config, algorithm recipes, the update step, the loop, checkpoints, eval.

Modules:
    config      ``TrainConfig`` (dataclasses, the one source of truth), ``load_config``
    algorithms  ``AlgorithmConfig`` and ``RECIPES``: algorithms by name (grpo ... eppo+papo
                and EPPO's ablations); ``algorithm_config`` for engine plug-ins
    update      ``update_step``: controllers, advantages, PAPO, PPO mini-batches x epochs
    learner     ``Learner``, ``MiniBatch``, one optimiser step (gradient accumulation)
    data        ``TaskSampler``: the task mix and its checkpointed seed position
    trainer     ``train``: rollout -> update -> log -> checkpoint, exact resume
    checkpoint  atomic keep-last-k checkpoints
    metrics_log ``metrics.jsonl``, each row fanned out to the trackers
    trackers    ``log.trackers``: TensorBoard, W&B, MLflow, trackio (``register_tracker``)
    evaluation  ``evaluate``: per-task success on held-out seeds
"""

from __future__ import annotations

from entropace._lazy import lazy_getattr

_EXPORTS: dict[str, str] = {
    "ConfigError": "config",
    "TrainConfig": "config",
    "load_config": "config",
    "load_config_file": "config",
    "save_config": "config",
    "AlgorithmConfig": "algorithms",
    "RECIPES": "algorithms",
    "algorithm_config": "algorithms",
    "Recipe": "algorithms",
    "register_recipe": "algorithms",
    "Learner": "learner",
    "update_step": "update",
    "TaskSampler": "data",
    "build_learner": "trainer",
    "build_model": "policy",
    "train": "trainer",
    "evaluate": "evaluation",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_getattr(__name__, _EXPORTS)
