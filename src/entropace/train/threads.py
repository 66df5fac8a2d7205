"""Torch threads per process: chosen from the model size and the number of processes.

A run has one torch process (``rollout.mode: sync``) or two (``async``: the learner and its
rollout worker); ``entropace compare --jobs J`` runs ``J`` such runs side by side and gives each
``cpus // J`` cores through the ``ENTROPACE_CPUS`` environment variable. The rule
(:func:`plan_threads`):

* an explicit ``threads.learner`` / ``threads.rollout`` wins; then ``OMP_NUM_THREADS`` when the
  user set it (for every process of the run);
* a model under :data:`SMALL_MODEL_PARAMS` parameters (the lab preset's ``tiny`` model, ~0.1 M)
  gets 1 thread per process: its matmuls are too small to split, and a second thread only
  spins (on a loaded 2-core machine the lab preset ran ~40 s a step with torch's default
  threads and 4-10 s with one);
* otherwise the run's cores (``ENTROPACE_CPUS``, else the CPUs this process may run on) are
  split evenly between its processes, at least 1 each: on 2 cores, ``sync`` gets 2 threads,
  ``async`` 1 for the learner and 1 for the worker (``benchmarks/results/async.md``).

The trainer logs the plan and writes it into every metrics row (``threads/learner``,
``threads/rollout``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

#: Below this many parameters a model runs one thread per process.
SMALL_MODEL_PARAMS = 20_000_000
#: Environment variable with the cores a run may use (set by ``compare --jobs``).
CPUS_ENV = "ENTROPACE_CPUS"


@dataclass
class ThreadsConfig:
    """Torch intra-op threads of the run's processes (None: chosen, :func:`plan_threads`).

    Attributes:
        learner: threads of the learner's process (it also generates in ``sync`` mode).
        rollout: threads of the ``async`` rollout worker process.
    """

    learner: int | None = None
    rollout: int | None = None

    def __post_init__(self) -> None:
        for name in ("learner", "rollout"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise ValueError(
                    f"threads.{name} must be a positive integer or null, got {value!r}"
                )


@dataclass(frozen=True)
class ThreadPlan:
    """Threads of the learner and of the rollout worker, and why."""

    learner: int
    rollout: int
    reason: str

    def describe(self) -> str:
        return (
            f"torch threads: learner {self.learner}, rollout worker {self.rollout} ({self.reason})"
        )


def available_cpus() -> int:
    """Cores this run may use: ``ENTROPACE_CPUS`` when set, else this process's CPU affinity."""
    raw = os.environ.get(CPUS_ENV)
    if raw:
        try:
            return max(1, int(raw))
        except ValueError:
            raise ValueError(f"{CPUS_ENV}={raw!r} must be a positive integer") from None
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def plan_threads(
    cfg: ThreadsConfig, *, n_params: int, processes: int, cpus: int | None = None
) -> ThreadPlan:
    """The threads of a run with ``processes`` torch processes (1: sync, 2: async) and a model
    of ``n_params`` parameters (module docstring)."""
    cpus = available_cpus() if cpus is None else cpus
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) >= 1:
        auto, reason = int(omp), f"OMP_NUM_THREADS={omp}"
    elif n_params < SMALL_MODEL_PARAMS:
        auto, reason = (
            1,
            f"model of {n_params / 1e6:.2g} M parameters < {SMALL_MODEL_PARAMS / 1e6:g} M",
        )
    else:
        auto = max(1, cpus // processes)
        reason = f"{cpus} cores / {processes} process{'es' if processes > 1 else ''}"
    learner = cfg.learner if cfg.learner is not None else auto
    rollout = cfg.rollout if cfg.rollout is not None else auto
    if cfg.learner is not None or cfg.rollout is not None:
        reason += "; set in threads.*"
    return ThreadPlan(learner=learner, rollout=rollout, reason=reason)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(n)``; the previous count is restored."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
