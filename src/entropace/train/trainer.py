"""The training loop: sample the task mix, roll out, update, log, checkpoint.

Each step (1-based)::

    rollout  = pipeline.next(step)                  # the batch of policy version behaviour_version(step)
    audit    = start_audit(cfg, model, batch, step)  # every audit.every steps, else None
    metrics  = rollout_metrics(batch) | update_step(learner, batch) | audit.finish(model)
    pipeline.publish(step, weights)                 # version `step`: unlocks the next job(s)
    writer.write(step, metrics)                     # metrics.jsonl + log.trackers
    save_checkpoint(...) every log.checkpoint_every steps, at the end, and on SIGINT/SIGTERM

``progress.phase(name, step)`` marks where the step is (rollout, update, eval, checkpoint) and
``progress.step_done(row)`` shows its per-task numbers (:mod:`entropace.train.progress`).

The rollouts come from :mod:`entropace.train.pipeline`: generated in this process right when
the step asks for them (``rollout.mode: sync``), or by a worker process that generates up to
``rollout.max_staleness`` versions ahead while the learner updates (``async``); each job's
prompts are the task sampler's next ones, drawn in step order when the job is submitted.

Everything random in a step derives from ``(cfg.seed, step)`` (the rollout seed, the
mini-batch shuffle), and the checkpoint holds model, optimiser, scheduler, controllers, data
position, RNG states and (``async``) the finished in-flight batches, so ``--resume`` continues
exactly: a run stopped after step 2 and resumed logs the same metrics for steps 3-4 as an
uninterrupted run (timings aside).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import random
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from entropace._text import printable
from entropace.algos import get_policy_loss
from entropace.control import StateError, build_clip_rule
from entropace.diagnostics.training_audit import TrainingAudit
from entropace.train.algorithms import clip_settings, loss_config
from entropace.train.checkpoint import (
    CheckpointError,
    check_warm_start,
    latest_checkpoint,
    load_checkpoint,
    load_extra,
    save_checkpoint,
)
from entropace.train.config import (
    OptimConfig,
    TrainConfig,
    config_changes,
    save_config,
    to_dict,
)
from entropace.train.data import Prompt, TaskSampler
from entropace.train.held_out import held_out_metrics
from entropace.train.learner import Learner, NonFiniteTrainingError, ReferenceFn
from entropace.train.memory import memory_metrics, release_memory, tune_allocator
from entropace.train.metrics_log import MetricsWriter
from entropace.train.pipeline import ROLLOUTS_FILE, open_pipeline, restored_outputs
from entropace.train.policy import MODEL_LOADERS, build_model, resolve_device  # noqa: F401
from entropace.train.preflight import check_prompt_budget
from entropace.train.progress import Progress
from entropace.train.rundir import (  # noqa: F401 (re-export)
    RUN_FILES,
    RunDirError,
    check_run_dir,
    prepare_run_dir,
)
from entropace.train.snapshots import PolicyPool
from entropace.train.threads import plan_threads, torch_threads
from entropace.train.trackers import require_trackers
from entropace.train.update import task_step, token_advantages, update_step
from entropace.train.warm_start import warm_started

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Components
# ---------------------------------------------------------------------------------------------


class WarmupSchedule:
    """LR factor per optimiser step ``s`` (0-based): linear warmup ``(s + 1) / warmup`` over
    ``warmup`` steps, then ``constant`` 1, ``linear`` decay to 0 or ``cosine`` decay to 0 at
    ``total`` steps."""

    def __init__(self, warmup: int, total: int, kind: str) -> None:
        self.warmup, self.total, self.kind = warmup, max(total, 1), kind

    def __call__(self, s: int) -> float:
        if s < self.warmup:
            return (s + 1) / self.warmup
        progress = min(1.0, (s - self.warmup) / max(self.total - self.warmup, 1))
        return {
            "constant": 1.0,
            "linear": 1.0 - progress,
            "cosine": 0.5 * (1.0 + float(np.cos(np.pi * progress))),
        }[self.kind]


def build_optimizer(
    params: list[torch.nn.Parameter], cfg: OptimConfig, total_steps: int, done_steps: int = 0
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``params`` and its warmup scheduler (stepped once per optimiser step)."""
    optimizer = torch.optim.AdamW(
        params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay
    )
    return optimizer, build_scheduler(optimizer, cfg, total_steps, done_steps)


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int, done_steps: int = 0
) -> torch.optim.lr_scheduler.LambdaLR:
    """The LR schedule of ``cfg`` over ``total_steps`` optimiser steps, positioned after
    ``done_steps`` of them (torchtune's ``last_epoch``): a resumed run rebuilds it from the
    resolved config, so a new horizon (``steps=``), ``optim.lr`` or ``optim.schedule`` takes
    effect. The optimiser's hyperparameters are (re)set from ``cfg`` too: a loaded optimiser
    state keeps its moments, not its old ``betas`` / ``eps`` / ``weight_decay``."""
    for group in optimizer.param_groups:
        group.update(
            lr=cfg.lr, initial_lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
            weight_decay=cfg.weight_decay,
        )  # fmt: skip
    schedule = WarmupSchedule(cfg.warmup_steps, total_steps, cfg.schedule)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule, last_epoch=done_steps - 1)


def optimizer_steps_total(cfg: TrainConfig) -> int:
    """Optimiser steps of the whole run (the schedule's horizon)."""
    return cfg.steps * cfg.ppo.epochs * cfg.ppo.num_minibatches


def build_reference(cfg: TrainConfig, model: Any) -> ReferenceFn | None:
    """Frozen reference log-probs for the KL term: the adapter-disabled model under LoRA,
    else a frozen copy of the initial weights. None when ``algorithm.kl_beta == 0``."""
    if cfg.algorithm.kl_beta <= 0:
        return None
    from entropace.rollout.stats import sequence_token_stats

    def logprobs(net: Any, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        stats = sequence_token_stats(
            net, ids, attn, temperature=cfg.rollout.temperature,
            chunk_size=cfg.rollout.stats_chunk_size, grad=False,
        )  # fmt: skip
        return stats.logprob

    if hasattr(model, "disable_adapter"):

        def lora_reference(ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
            with model.disable_adapter():
                return logprobs(model, ids, attn)

        return lora_reference
    frozen = copy.deepcopy(model).eval().requires_grad_(False)
    return lambda ids, attn: logprobs(frozen, ids, attn)


def build_learner(cfg: TrainConfig, model: Any) -> Learner:
    """The update's state: AdamW + warmup schedule over the trainable parameters, the clip
    rule, PAPO's controller (when ``algorithm.papo``), the KL reference (when
    ``algorithm.kl_beta > 0``)."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer, scheduler = build_optimizer(params, cfg.optim, optimizer_steps_total(cfg))
    polarity = None
    if cfg.algorithm.papo:
        from entropace.control import PolarityController

        polarity = PolarityController(config=cfg.algorithm.polarity)
    return Learner(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        clip_rule=build_clip_rule(
            cfg.algorithm.clip_rule, clip_settings(cfg.algorithm, seed=cfg.seed)
        ),
        polarity=polarity,
        reference=build_reference(cfg, model),
        cfg=cfg,
        loss=get_policy_loss(cfg.algorithm.policy_loss),
        loss_config=loss_config(cfg.algorithm),
        params=params,
    )


def step_seed(cfg: TrainConfig, step: int) -> int:
    """The seed of everything random in training step ``step``."""
    return (cfg.seed * 1_000_003 + step) % (2**63 - 1)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))  # noqa: NPY002 (legacy global state, for user code)
    torch.manual_seed(seed)


# ---------------------------------------------------------------------------------------------
# Stop requests (SIGINT / SIGTERM)
# ---------------------------------------------------------------------------------------------


class StopRequest:
    """Signal handler: the first SIGINT/SIGTERM asks the loop to checkpoint and stop after
    the current step; a second one interrupts at once (``KeyboardInterrupt``)."""

    def __init__(self) -> None:
        self.signal: str | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name
        print(
            f"\n{self.signal}: finishing the current step, then checkpointing "
            "(send again to abort at once)",
            file=sys.stderr,
        )


@contextmanager
def stop_handlers(stop: StopRequest) -> Iterator[StopRequest]:
    """Install ``stop`` for SIGINT and SIGTERM (main thread only), restore afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------


@dataclass
class TrainResult:
    run_dir: Path
    last_step: int
    stopped_by: str | None  # signal name when stopped early, else None


def rollout_requests(prompts: list[Prompt], cfg: TrainConfig) -> list[Any]:
    """Rollout requests: each prompt ``G`` times, sharing the prompt's group id; each episode
    gets a fresh environment (:meth:`TasksConfig.env_factory`)."""
    from entropace.rollout import RolloutRequest

    out = []
    for p in prompts:
        factory = cfg.tasks.env_factory(p.task)
        for _ in range(cfg.tasks.group_size):
            out.append(RolloutRequest(task=p.task, env=factory, seed=p.seed, group_id=p.group))
    return out


def start_audit(cfg: TrainConfig, model: Any, batch: Any, step: int) -> TrainingAudit | None:
    """The polarity audit of step ``step`` (``audit.every``; None on other steps), started
    before the update: samples ``audit.max_states`` states with a generator of its own (from
    :func:`step_seed`), records the policy at them and runs the probe (``audit.mode``)."""
    a = cfg.audit
    if not a.every or step % a.every:
        return None
    adv, keep = token_advantages(batch, cfg)
    return TrainingAudit.start(
        model, batch.input_ids, batch.attention_mask, batch.loss_mask,
        adv * keep[:, None], None if batch.off_policy else batch.sensitivity,
        temperature=cfg.rollout.temperature,
        max_states=a.max_states, generator=torch.Generator().manual_seed(step_seed(cfg, step)),
        realised=a.mode != "probe", probe_step=a.probe_step if a.mode != "realised" else None,
        micro_batch_size=cfg.ppo.micro_batch_size,
    )  # fmt: skip


def _warn_changes(saved: dict[str, Any] | None, cfg: TrainConfig, path: Path) -> None:
    """Log a warning naming every setting a resume changes (they change the run from here)."""
    if saved is None:
        return
    changes = config_changes(saved, to_dict(cfg))
    if changes:  # the saved config's values may hold anything: escaped
        logger.warning(
            "resuming %s with a changed config (the run continues under the new values): %s",
            printable(path), printable("; ".join(changes)),
        )  # fmt: skip


def train(
    cfg: TrainConfig, run_dir: str | Path, *, resume: bool = False, overwrite: bool = False
) -> TrainResult:
    """Train for ``cfg.steps`` steps into ``run_dir`` (resuming from its latest checkpoint).

    Writes ``config.yaml``, ``metrics.jsonl``, ``checkpoints/`` and what ``log.trackers`` write
    (``events/``, ``trackers.json``, ...). SIGINT or
    SIGTERM writes a checkpoint after the current step and returns (``stopped_by`` set).
    The run directory is locked for the whole call (:mod:`entropace.train.rundir`): another
    process training into it gets :class:`RunDirLocked` naming this one.
    """
    run_dir = Path(run_dir)
    require_trackers(cfg.log.trackers, cfg.log.tracker_options)  # packages: before the model
    with prepare_run_dir(run_dir, resume=resume, overwrite=overwrite):
        return _train(cfg, run_dir, resume=resume)


def nonfinite_message(learner: Learner, step: int, cfg: TrainConfig) -> str:
    """The error line of a run stopped by ``optim.nonfinite_patience``."""
    first = step - learner.lost_steps + 1
    return (
        f"steps {first}-{step}: every optimiser step had a non-finite loss or gradient and was "
        f"skipped ({learner.lost_steps} steps in a row, optim.nonfinite_patience="
        f"{cfg.optim.nonfinite_patience}); nothing was trained in them. The run stopped with "
        f"its state saved at step {step}. Check the algorithm's options "
        f"(algorithm.loss_options, the widths) and optim.lr"
    )


def _log_info(message: str) -> None:
    logger.info("%s", message)


def _console(message: str) -> None:
    """A line for the person watching the run (stderr, where the progress bar draws)."""
    print(message, file=sys.stderr, flush=True)


def _train(cfg: TrainConfig, run_dir: Path, *, resume: bool) -> TrainResult:
    """:func:`train` in a prepared, locked run directory."""
    from entropace.rollout.batch import task_scores
    from entropace.rollout.worker import (
        RolloutJob,
        output_state,
        trainable_weights,
    )

    ckpt_root = run_dir / "checkpoints"
    tune_allocator()  # large tensors in their own mappings: freed memory returns (train/memory.py)
    # The warm start (fine-tuned once on demonstrations, then cached): every copy of the policy
    # (learner, async worker) is built from `built`, whose model.name is its directory
    # (its build takes minutes the first time: with the progress bar on, its lines go to the
    # console too, so that a newcomer sees what the run is doing before step 1)
    built, warm = warm_started(cfg, log=_console if cfg.log.progress else _log_info)
    seed_everything(cfg.seed)

    # Components (torchtune style: built here, composed in the Learner)
    model, tokenizer, device = build_model(built.model)
    learner = build_learner(cfg, model)
    sampler = TaskSampler(cfg.tasks)
    pool = PolicyPool.build(  # cross-policy sampling's snapshots and other models, or None
        cfg.rollout.cross_policy,
        lambda name: build_model(replace(cfg.model, name=name, lora=False))[0],
    )
    threads = plan_threads(
        cfg.threads, n_params=sum(p.numel() for p in model.parameters()),
        processes=2 if cfg.rollout.mode == "async" else 1,
    )  # fmt: skip
    logger.info("%s", threads.describe())

    start, restored = 0, []
    if resume:
        path = latest_checkpoint(ckpt_root)
        if path is None:
            raise FileNotFoundError(f"--resume: no checkpoint under {ckpt_root}")
        state = load_checkpoint(path, model=model, optimizer=learner.optimizer)
        start = int(state["step"])
        _warn_changes(state.get("config"), cfg, path)
        check_warm_start(state.get("warm_start"), warm, path)
        try:
            learner.scheduler = build_scheduler(
                learner.optimizer, cfg.optim, optimizer_steps_total(cfg),
                int(state["scheduler_steps"]),
            )  # fmt: skip
            sampler.load_state_dict(state["sampler"])
            task_step(learner, cfg.tasks.names).load_state_dict(
                state["controller"], source=f"{path / 'state.json'} (controller)"
            )  # validated: schema, finite values in range, this run's tasks and configs
            learner.skipped_steps = int(state["skipped_steps"])
            stored = load_extra(path, ROLLOUTS_FILE) or []
            restored = restored_outputs(stored, start, path / ROLLOUTS_FILE)  # checked
        except StateError as exc:
            raise CheckpointError(str(exc)) from None
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(
                f"{path / 'state.json'}: does not fit this run's config ({exc!r})"
            ) from exc
    # log.trackers start here: one that does not is an error before any rollout, and before
    # config.yaml marks the directory as holding a run
    writer = MetricsWriter.open(
        run_dir, cfg.log, config=to_dict(cfg), resume_step=start if resume else None
    )
    save_config(cfg, run_dir / "config.yaml")  # after a resume has loaded: never on failure
    optimizer = learner.optimizer

    def make_job(step: int, version: int, prompts: list[Prompt]) -> RolloutJob:
        return RolloutJob(step, version, rollout_requests(prompts, cfg), step_seed(cfg, step))

    def checkpoint(step: int) -> None:
        sampler_state, in_flight = pipeline.checkpoint_state()
        state = {
            "config": to_dict(cfg),
            "scheduler_steps": learner.scheduler.last_epoch,
            "sampler": sampler_state,
            "controller": task_step(learner, cfg.tasks.names).state_dict(),
            "skipped_steps": learner.skipped_steps,
            "warm_start": {"key": warm.key, "sha256": warm.sha256} if warm else None,
        }
        extra = {ROLLOUTS_FILE: [output_state(o) for o in in_flight]} if in_flight else None
        save_checkpoint(
            ckpt_root, step, model=model, optimizer=optimizer, state=state,
            keep_last=cfg.log.keep_last, optimizer_state=cfg.log.optimizer_state,
            extra=extra,
        )  # fmt: skip

    progress = Progress(total=cfg.steps, start=start, tasks=cfg.tasks.names,
                        enabled=cfg.log.progress)  # fmt: skip
    stop = StopRequest()
    step = start
    weights = trainable_weights(model)
    try:
        with stop_handlers(stop), torch_threads(threads.learner):
            if not resume and cfg.eval.every:  # the policy the run starts from, as step 0
                progress.phase("eval", 0)
                t_eval = time.perf_counter()
                row = held_out_metrics(model, tokenizer, cfg)
                writer.write(0, {**row, "time/eval": time.perf_counter() - t_eval})
            pipeline = open_pipeline(
                built, model, tokenizer, sampler, make_job, build_model=build_model,
                rollout_threads=threads.rollout, start=start, restored=restored,
                policies=(lambda: pool.members(model)) if pool is not None else None,
            )  # fmt: skip
            with contextlib.closing(pipeline):  # the worker process ends with the loop
                for step in range(start + 1, cfg.steps + 1):
                    t_step = time.perf_counter()
                    seed = step_seed(cfg, step)
                    model.eval()
                    progress.phase("rollout", step)
                    output, pipe_metrics = pipeline.next(step)  # waits for the worker
                    rollout = output.result
                    if step == start + 1:  # prompts vs rollout.max_episode_tokens (preflight)
                        check_prompt_budget(rollout.batch, cfg.rollout)
                    release_memory()  # the rollout's freed caches back to the kernel
                    batch = rollout.batch.to(device)
                    if output.version < step - 1:  # older weights than the learner's: the
                        batch.off_policy = True  # update's proximal pass (ALGORITHMS.md 9)
                    progress.phase("update", step)
                    audit = start_audit(cfg, model, batch, step)  # None unless audited
                    t_update = time.perf_counter()
                    generator = torch.Generator().manual_seed(seed)
                    if pool is not None:
                        pool.before_update(model)
                    metrics = update_step(learner, batch, generator=generator)
                    release_memory()  # the update's freed activations back to the kernel
                    t_updated = time.perf_counter()
                    metrics["time/publish"] = pipeline.publish(step, weights)  # version step
                    metrics.update(pipe_metrics)
                    metrics.update(task_scores(rollout.batch.episodes))  # e.g. task/kg/f1
                    metrics.update(rollout.task_error_rates())
                    if audit is not None:
                        metrics.update(audit.finish(model))
                        metrics["time/audit"] = audit.seconds
                    now = time.perf_counter()
                    metrics["time/generation"] = float(rollout.timings["generation_s"])
                    metrics["time/stats"] = float(rollout.timings["stats_s"])
                    metrics["time/env"] = float(rollout.timings.get("env_s", 0.0))
                    metrics["time/update"] = t_updated - t_update
                    metrics["time/step"] = now - t_step
                    metrics["tokens_per_s"] = metrics["response_tokens"] / max(now - t_step, 1e-9)
                    metrics["threads/learner"] = threads.learner
                    metrics["threads/rollout"] = threads.rollout
                    metrics.update(memory_metrics())
                    if output.worker_peak_rss_mib is not None:
                        metrics["memory/worker_peak_rss_mib"] = output.worker_peak_rss_mib
                    if cfg.eval.every and (step % cfg.eval.every == 0 or step == cfg.steps):
                        progress.phase("eval", step)
                        t_eval = time.perf_counter()
                        metrics.update(held_out_metrics(model, tokenizer, cfg))
                        metrics["time/eval"] = time.perf_counter() - t_eval
                    row = writer.write(step, metrics)
                    progress.step_done(row)
                    every = cfg.log.checkpoint_every
                    patience = cfg.optim.nonfinite_patience
                    lost = bool(patience) and learner.lost_steps >= patience
                    periodic = every and step % every == 0
                    if periodic or step == cfg.steps or stop.signal or lost:
                        progress.phase("checkpoint", step)
                        checkpoint(step)
                    if lost:
                        raise NonFiniteTrainingError(nonfinite_message(learner, step, cfg))
                    if stop.signal:
                        break
    finally:
        progress.close()
        writer.close()
    return TrainResult(run_dir=run_dir, last_step=step, stopped_by=stop.signal)
