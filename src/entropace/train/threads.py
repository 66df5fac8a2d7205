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

OpenMP's wait policy (:func:`default_wait_policy`): ``entropace``'s command line sets
``OMP_WAIT_POLICY=PASSIVE`` before torch starts its OpenMP runtime, unless the user chose a
policy (``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``, ``KMP_BLOCKTIME``). GNU OpenMP's default
spins each idle thread for ~300,000 iterations at every barrier; with other processes on the
cores, a thread that finished its share spins while its partner waits for a core, and every
one of the thousands of small parallel regions of a decoding step waits for a time slice:
beside 2 busy processes on 2 cores the main job's step ran 5.3 times slower than alone with
spinning threads and 1.5 times with passive ones, against 2 times for a fair share
(``benchmarks/results/load.md``). The price: alone, on a quiet machine, passive threads were
about 25 % slower (a sleeping thread takes longer to wake than a spinning one); a user with
the cores to themselves can set ``OMP_WAIT_POLICY=ACTIVE`` (or ``GOMP_SPINCOUNT``). A passive
thread sleeps at once and gives its core back. The policy cannot change once the runtime has
started, so a Python program that imports torch itself sets the variable before that import.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

#: Below this many parameters a model runs one thread per process.
SMALL_MODEL_PARAMS = 20_000_000
#: Environment variable with the cores a run may use (set by ``compare --jobs``).
CPUS_ENV = "ENTROPACE_CPUS"
#: Variables with which a user chooses how OpenMP threads wait (GNU and Intel runtimes).
WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
#: Set to ``1`` by :func:`default_wait_policy` when it chose the policy (children inherit it).
WAIT_MARK_ENV = "ENTROPACE_WAIT_POLICY_SET"


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
            f"torch threads: learner {self.learner}, rollout worker {self.rollout} "
            f"({self.reason}); {wait_policy()}"
        )


def default_wait_policy() -> str:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless the user chose a wait policy (any of
    :data:`WAIT_VARS`) or torch is already imported (its OpenMP runtime read the environment
    when it loaded). Call it before ``import torch`` (the command line's entry point does).
    Returns :func:`wait_policy`'s description of the policy in effect."""
    if not any(os.environ.get(v) for v in WAIT_VARS) and "torch" not in sys.modules:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.environ[WAIT_MARK_ENV] = "1"  # spawned children (async worker) see who chose
    return wait_policy()


def wait_policy() -> str:
    """The OpenMP wait policy this process's environment asks for, and who chose it."""
    chosen = {v: os.environ[v] for v in WAIT_VARS if os.environ.get(v)}
    if not chosen:
        return "OpenMP's default wait policy (spinning; the `entropace` command sets PASSIVE)"
    text = ", ".join(f"{k}={v}" for k, v in chosen.items())
    mine = os.environ.get(WAIT_MARK_ENV) == "1" and chosen == {"OMP_WAIT_POLICY": "PASSIVE"}
    return text + (" (entropace's default)" if mine else " (set by the user)")


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
