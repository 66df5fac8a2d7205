"""The task mix: which instances (task, seed) each training step samples.

Each step takes ``n_k = round(P * mix_k)`` prompts of task ``k`` (``P = prompts_per_task``,
``mix_k`` default 1), the next ``n_k`` seeds of that task's ``train`` split
(:func:`entropace.envs.seeds`), each sampled ``G = group_size`` times. The per-task position in
the seed stream is the sampler's state: it is checkpointed, so a resumed run sees exactly the
instances an uninterrupted run would.

"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from entropace.envs import seeds
from entropace.train.config import TRAIN_SEEDS, TasksConfig


@dataclass(frozen=True)
class Prompt:
    """One instance of a step: ``group`` numbers it within the step (the GRPO group id)."""

    task: str
    seed: int
    group: int


class TaskSampler:
    """Deterministic stream of prompts per task (see the module docstring)."""

    def __init__(self, cfg: TasksConfig) -> None:
        self.cfg = cfg
        self.position: dict[str, int] = {k: 0 for k in cfg.names}

    def counts(self) -> dict[str, int]:
        """Prompts per step of each task, ``round(P * mix_k)`` (tasks with 0 are skipped)."""
        p = self.cfg.prompts_per_task
        return {k: int(round(p * self.cfg.mix.get(k, 1.0))) for k in self.cfg.names}

    def next_prompts(self) -> list[Prompt]:
        """The next step's prompts, task by task in ``cfg.names`` order; advances the state."""
        out: list[Prompt] = []
        for task, n in self.counts().items():
            if n == 0:
                continue
            for seed in seeds("train", n, offset=self.cfg.seed_offset + self.position[task]):
                out.append(Prompt(task, int(seed), len(out)))
            self.position[task] += n
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"position": dict(self.position)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the per-task positions; a ``ValueError`` for a position that is not an
        integer in ``[0, TRAIN_SEEDS]`` or a task of this run without one."""
        position = {}
        for k, v in state["position"].items():
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= TRAIN_SEEDS:
                raise ValueError(
                    f"sampler position of {k!r} must be an integer in [0, {TRAIN_SEEDS}], "
                    f"got {str(v)[:40]}"
                )
            position[str(k)] = v
        missing = sorted(set(self.cfg.names) - set(position))
        if missing:
            raise ValueError(f"sampler state has no position for task(s) {missing}")
        self.position = position
