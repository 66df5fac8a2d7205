"""Rollout workers: generate a training step's batch with the weights of a given policy version.

The interface the trainer's pipeline (:mod:`entropace.train.pipeline`) talks to:

* :class:`RolloutWorker` - holds a copy of the policy at some *version* (version ``v`` = the
  weights after ``v`` updates): :meth:`~RolloutWorker.load_weights` takes the named trainable
  tensors of version ``v``; :meth:`~RolloutWorker.run` generates a :class:`RolloutJob` and
  returns a :class:`RolloutOutput` whose batch carries the behaviour policy's per-token
  log-probs (``old_logprobs``, recorded at generation) and, per trajectory, the version that
  generated it (``RolloutBatch.policy_version``). :class:`ModelWorker` is the Hugging Face
  engine (:func:`entropace.rollout.collect_rollouts`); a vLLM or SGLang worker on GPUs is
  another subclass.
* A *host* runs a worker for the pipeline: :class:`InlineRollouts` in the learner's own process
  (``rollout.mode: sync``: a job runs when its batch is asked for; the worker *is* the learner's
  model, so loading weights copies nothing) and :class:`ProcessRollouts` in a spawned process
  (``async``), with its own torch threads and its own copy of the weights. The learner
  publishes each version into shared-memory slots (one tensor per trainable parameter, copied
  on publish, reused round-robin once the worker has loaded the version a slot held) and sends
  the worker a message naming the slot; no checkpoint file is involved. Batches come back
  serialised with :func:`output_state` (tensors and plain values, the format the checkpoint
  stores in-flight batches in).

A worker process never outlives its run: it ignores SIGINT (the trainer handles Ctrl-C and
then closes it), a watchdog thread exits it when the parent process dies (``kill -9``), and
:meth:`ProcessRollouts.close` stops, terminates or kills it. An exception in the worker comes
back to the trainer as :class:`RolloutWorkerError` naming it, with the worker's traceback.
"""

from __future__ import annotations

import errno
import importlib
import io
import os
import queue
import signal
import threading
import time
import traceback
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from torch import Tensor

from entropace.rollout.batch import EpisodeRecord, RolloutBatch
from entropace.rollout.config import RolloutConfig
from entropace.rollout.types import RolloutRequest, RolloutResult


class RolloutWorkerError(RuntimeError):
    """The rollout worker failed (its exception, named, with its traceback) or died, or its
    process could not be set up (no room in ``/dev/shm``).

    Attributes:
        worker_traceback: the worker's own traceback when it raised ("" otherwise).
    """

    def __init__(self, message: str, worker_traceback: str = "") -> None:
        super().__init__(message)
        self.worker_traceback = worker_traceback


@dataclass
class RolloutJob:
    """One training step's rollout.

    Attributes:
        step: the training step (1-based) that will consume the batch.
        version: the policy version that must generate it.
        requests: the episodes to sample (picklable: environments as factories).
        seed: seeds the sampling (:func:`entropace.rollout.collect_rollouts`).
    """

    step: int
    version: int
    requests: list[RolloutRequest]
    seed: int


@dataclass
class RolloutOutput:
    """A generated job: its rollout (``result.batch.policy_version`` set), when the worker
    ran it (``time.monotonic()`` seconds, one clock for every process of the machine) and the
    worker process's peak RSS (None for a worker in the learner's process)."""

    step: int
    version: int
    result: RolloutResult
    started: float
    finished: float
    worker_peak_rss_mib: float | None = None


def trainable_weights(model: torch.nn.Module) -> dict[str, Tensor]:
    """The tensors a version publishes: the trainable parameters by name (tied weights once;
    a LoRA model's adapter only). The rest of a worker's model is built from the same config
    and never changes."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


class RolloutWorker(ABC):
    """Generates rollouts with the policy of one version at a time (module docstring)."""

    version: int = -1  # no weights loaded yet

    @abstractmethod
    def load_weights(self, version: int, weights: Mapping[str, Tensor]) -> None:
        """Take the trainable tensors of ``version`` (named as :func:`trainable_weights`)."""

    @abstractmethod
    def run(self, job: RolloutJob) -> RolloutOutput:
        """Generate ``job`` with the weights of ``job.version`` (which must be loaded)."""


class ModelWorker(RolloutWorker):
    """:func:`entropace.rollout.collect_rollouts` with a Hugging Face model.

    Args:
        model, tokenizer: the policy; the learner's own model for the in-process host (then
            :meth:`load_weights` finds its own tensors and copies nothing), a copy otherwise.
        cfg: the rollout options.
        task_names: the run's task names (``RolloutBatch.task_ids`` index into them).
        policies: cross-policy sampling's other pool members, asked for at each job
            (``collect_rollouts(..., policies=...)``); None: the model alone.
    """

    def __init__(
        self, model: Any, tokenizer: Any, cfg: RolloutConfig, task_names: Sequence[str],
        policies: Callable[[], Sequence[Any]] | None = None,
    ) -> None:  # fmt: skip
        self.model, self.tokenizer, self.cfg = model, tokenizer, cfg
        self.task_names = list(task_names)
        self.policies = policies
        self._params = trainable_weights(model)

    def load_weights(self, version: int, weights: Mapping[str, Tensor]) -> None:
        missing = sorted(set(self._params) - set(weights))
        if missing:
            raise KeyError(f"weights of version {version} lack {missing[:3]}")
        with torch.no_grad():
            for name, dst in self._params.items():
                src = weights[name]
                if src.data_ptr() != dst.data_ptr():  # the learner's own model: nothing to copy
                    dst.copy_(src)
        self.version = version

    def run(self, job: RolloutJob) -> RolloutOutput:
        from entropace.rollout.engine import collect_rollouts

        if job.version != self.version:
            raise RuntimeError(
                f"the job of step {job.step} needs the weights of version {job.version}; "
                f"the worker holds version {self.version}"
            )
        started = time.monotonic()
        result = collect_rollouts(
            self.model, self.tokenizer, job.requests, self.cfg, task_names=self.task_names,
            seed=job.seed, policies=self.policies() if self.policies is not None else (),
        )  # fmt: skip
        batch = result.batch
        batch.policy_version = torch.full((batch.size,), self.version, dtype=torch.long)
        return RolloutOutput(job.step, self.version, result, started, time.monotonic())


# ---------------------------------------------------------------------------------------------
# Serialisation (worker -> learner, and the checkpoint's in-flight batches)
# ---------------------------------------------------------------------------------------------


def output_state(out: RolloutOutput) -> dict[str, Any]:
    """``out`` as tensors and plain containers (``torch.load(weights_only=True)`` loadable)."""
    batch = out.result.batch
    tensors = {
        f.name: getattr(batch, f.name)
        for f in fields(batch)
        if isinstance(getattr(batch, f.name), Tensor)
    }
    result = out.result
    return {
        "step": out.step,
        "version": out.version,
        "started": out.started,
        "finished": out.finished,
        "worker_peak_rss_mib": out.worker_peak_rss_mib,
        "batch": tensors,
        "task_names": list(batch.task_names),
        "episodes": [asdict(ep) for ep in batch.episodes],
        "timings": dict(result.timings),
        "counts": dict(result.counts),
        "task_counts": {k: dict(v) for k, v in result.task_counts.items()},
        "generate_batch_sizes": list(result.generate_batch_sizes),
    }


def output_from_state(state: dict[str, Any]) -> RolloutOutput:
    """Inverse of :func:`output_state`."""
    batch = RolloutBatch(
        **state["batch"],
        task_names=list(state["task_names"]),
        episodes=[EpisodeRecord(**ep) for ep in state["episodes"]],
    )
    result = RolloutResult(
        batch=batch, timings=dict(state["timings"]), counts=dict(state["counts"]),
        task_counts={k: dict(v) for k, v in state["task_counts"].items()},
        generate_batch_sizes=list(state["generate_batch_sizes"]),
    )  # fmt: skip
    return RolloutOutput(
        int(state["step"]), int(state["version"]), result, float(state["started"]),
        float(state["finished"]), state["worker_peak_rss_mib"],
    )  # fmt: skip


def to_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def from_bytes(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=True)


# ---------------------------------------------------------------------------------------------
# Hosts: how the pipeline reaches a worker
# ---------------------------------------------------------------------------------------------


class InlineRollouts:
    """A worker in the learner's process: :meth:`next_output` runs the oldest submitted job
    there and then (``rollout.mode: sync``; nothing overlaps)."""

    def __init__(self, worker: RolloutWorker) -> None:
        self.worker = worker
        self._jobs: deque[RolloutJob] = deque()

    def publish(self, version: int, weights: Mapping[str, Tensor]) -> None:
        self.worker.load_weights(version, weights)

    def submit(self, job: RolloutJob) -> None:
        self._jobs.append(job)

    def next_output(self) -> RolloutOutput:
        return self.worker.run(self._jobs.popleft())

    def close(self) -> None:
        self._jobs.clear()


def _exit_with_parent() -> None:
    """A daemon thread that ends this (worker) process as soon as its parent is gone."""
    import multiprocessing

    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os._exit(3)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def _serve(
    make_worker: Callable[[], RolloutWorker],
    slots: list[dict[str, Tensor]],
    commands: Any,
    outputs: Any,
    threads: int,
    imports: list[str],
) -> None:
    """The worker process: load weights / run jobs in the order the learner sent them."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    _exit_with_parent()
    torch.set_num_threads(threads)
    try:
        from entropace._memory import peak_rss_mib, tune_allocator

        tune_allocator()
        for module in imports:
            importlib.import_module(module)
        worker = make_worker()
        outputs.put(("ready", os.getpid()))
        while True:
            message = commands.get()
            if message[0] == "stop":
                break
            if message[0] == "weights":
                _, version, slot = message
                worker.load_weights(version, slots[slot])
                outputs.put(("loaded", version))
            else:
                out = worker.run(message[1])
                out.worker_peak_rss_mib = peak_rss_mib()
                outputs.put(("output", to_bytes(output_state(out))))
    except BaseException as exc:
        outputs.put(("error", type(exc).__name__, str(exc), traceback.format_exc()))
        outputs.close()
        outputs.join_thread()
        os._exit(1)
    outputs.close()
    outputs.join_thread()


def _shm_error(exc: BaseException, need: int) -> BaseException:
    """The error for a failure to set up the worker's shared memory: a
    :class:`RolloutWorkerError` naming ``/dev/shm`` and the remedies when ``exc`` is a full or
    missing ``/dev/shm`` (torch: "unable to allocate shared memory(shm) ... No space left on
    device"; a queue's semaphore: ``ENOSPC``), else ``exc`` itself."""
    text = str(exc)
    shm = "shared memory" in text or "shm" in text or getattr(exc, "errno", None) == errno.ENOSPC
    if not shm:
        return exc
    return RolloutWorkerError(
        f"rollout.mode=async needs {need / 2**20:.1f} MiB of shared memory in /dev/shm for the "
        f"policy's weights, and it could not be had ({text.splitlines()[0][:200]}); free "
        "space in /dev/shm (see `df -h /dev/shm`; a container's is often 64 MiB: e.g. "
        "docker run --shm-size=2g), or train with rollout.mode=sync"
    )


class ProcessRollouts:
    """A worker in its own spawned process (``rollout.mode: async``; module docstring).

    Args:
        make_worker: picklable ``() -> RolloutWorker``, called in the new process (it builds
            the model there, from the run's config).
        weights: the learner's trainable tensors (:func:`trainable_weights`): their names,
            shapes and dtypes size the shared-memory slots.
        slots: shared-memory copies of the weights; version ``v`` goes to slot ``v % slots``
            once the worker has loaded the version that slot held before.
        threads: torch threads of the worker process.
        imports: modules the worker imports first (``rollout.worker_imports``).
        poll_s: how often a waiting learner checks that the worker is alive.

    Raises:
        RolloutWorkerError: the worker failed to start (e.g. an environment it cannot build).
    """

    def __init__(
        self,
        make_worker: Callable[[], RolloutWorker],
        weights: Mapping[str, Tensor],
        *,
        slots: int = 1,
        threads: int = 1,
        imports: Sequence[str] = (),
        poll_s: float = 0.5,
    ) -> None:
        ctx = torch.multiprocessing.get_context("spawn")
        try:
            self._slots = [
                {
                    n: torch.empty_like(t.detach(), device="cpu").share_memory_()
                    for n, t in weights.items()
                }
                for _ in range(max(1, slots))
            ]
            self._commands = ctx.Queue()  # its semaphores are /dev/shm files too
            self._outputs = ctx.Queue()
        except (RuntimeError, OSError) as exc:
            need = max(1, slots) * sum(t.numel() * t.element_size() for t in weights.values())
            raise _shm_error(exc, need) from exc
        self._slot_version: list[int | None] = [None] * len(self._slots)
        self._loaded = -1
        self._ready: deque[RolloutOutput] = deque()
        self._poll_s = poll_s
        self.process = ctx.Process(
            target=_serve,
            args=(make_worker, self._slots, self._commands, self._outputs, threads, list(imports)),
            name="entropace-rollout-worker",
            daemon=True,  # multiprocessing ends it at the interpreter's exit, too
        )
        self.process.start()
        self.pid: int | None = None
        try:
            while self.pid is None:
                self._receive()
        except BaseException:
            self.close()
            raise

    # -- the learner's side ------------------------------------------------------------------

    def publish(self, version: int, weights: Mapping[str, Tensor]) -> None:
        """Copy ``weights`` (version ``version``) into a free slot and tell the worker."""
        i = version % len(self._slots)
        previous = self._slot_version[i]
        while previous is not None and self._loaded < previous:  # the slot is still needed
            self._receive()
        with torch.no_grad():
            for name, dst in self._slots[i].items():
                dst.copy_(weights[name].detach())
        self._slot_version[i] = version
        self._commands.put(("weights", version, i))

    def submit(self, job: RolloutJob) -> None:
        self._commands.put(("job", job))

    def next_output(self) -> RolloutOutput:
        """The oldest submitted job's output (blocks until the worker sends it)."""
        while not self._ready:
            self._receive()
        return self._ready.popleft()

    def close(self) -> None:
        """Stop the worker (at once: jobs still queued are abandoned); idempotent."""
        proc = self.process
        if proc.is_alive():
            self._commands.put(("stop",))
            proc.join(timeout=0.5)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join()
        for q in (self._commands, self._outputs):
            q.cancel_join_thread()
            q.close()

    def __enter__(self) -> ProcessRollouts:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- messages ----------------------------------------------------------------------------

    def _receive(self) -> None:
        """Handle one message from the worker; raise if it failed or died."""
        try:
            message = self._outputs.get(timeout=self._poll_s)
        except queue.Empty:
            message = None
        if message is None and not self.process.is_alive():
            try:  # what it sent before it exited (its error) comes first
                message = self._outputs.get(timeout=1.0)
            except queue.Empty:
                code = self.process.exitcode
                why = f" (signal {-code})" if code is not None and code < 0 else ""
                raise RolloutWorkerError(
                    f"the rollout worker process (pid {self.process.pid}) died with exit code "
                    f"{code}{why}" + ("; killed, out of memory?" if code == -9 else "")
                ) from None
        if message is None:
            return
        kind = message[0]
        if kind == "ready":
            self.pid = int(message[1])
        elif kind == "loaded":
            self._loaded = max(self._loaded, int(message[1]))
        elif kind == "output":
            self._ready.append(output_from_state(from_bytes(message[1])))
        elif kind == "error":
            _, name, text, trace = message
            self.process.join(timeout=5)
            raise RolloutWorkerError(
                f"the rollout worker failed: {name}: {text}\n--- worker traceback ---\n{trace}",
                trace,
            )
        else:  # pragma: no cover - a protocol bug
            raise RolloutWorkerError(f"unexpected message from the rollout worker: {kind!r}")
