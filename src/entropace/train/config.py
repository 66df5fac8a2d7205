"""The trainer's typed, validated configuration (one source of truth).

Every setting is a field of a dataclass below, with its default (the ``algorithm`` section's
dataclass lives with the recipes, in :mod:`entropace.train.algorithms`). A preset (``quick.yaml``,
``paper.yaml`` in :mod:`entropace.configs`, a YAML file, or a saved ``RUN/config.yaml``) and the
command line only *override* fields; the algorithm name additionally brings its recipe's
identity (:data:`entropace.train.algorithms.IDENTITY`). Resolution order, later wins::

    dataclass defaults < recipe of the preset's algorithm < preset < CLI overrides
    dataclass defaults < preset < recipe of the CLI's algorithm < CLI overrides  (algo= changed)

A preset's algorithm settings belong to the algorithm it names: choosing another algorithm on
the command line puts that algorithm's recipe above them (``--preset paper algo=gspo`` gets
GSPO's own bounds, not the preset's), while the preset's other settings (controller options,
``kl_beta``, everything outside ``algorithm``) still apply.

``load_config("quick", ["algo=eppo", "tasks=db,kg", "optim.lr=1e-5"])`` returns the resolved
:class:`TrainConfig`; the trainer saves it as ``RUN/config.yaml`` and ``--resume`` reads it
back with :func:`load_config_file`. An unknown key or a bad value raises :class:`ConfigError`
naming the key and the allowed keys/values.
"""

from __future__ import annotations

import functools
import math
import os
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from entropace._files import UnsafeFileError, read_text, write_atomic
from entropace.envs.splits import SPLITS
from entropace.rollout.config import ROLLOUT_RANGES, RolloutConfig
from entropace.train.algorithms import IDENTITY, AlgorithmConfig, get_recipe, validate_algorithm
from entropace.train.schema import (
    ConfigError,
    Range,
    build_dataclass,
    check_in,
    check_ranges,
    did_you_mean,
    flat_config,
    merge,
    nest,
    register_ranges,
    to_dict,
)
from entropace.train.threads import ThreadsConfig
from entropace.train.warm_start import WarmStartConfig, validate_warm_start

__all__ = [
    "ConfigError",
    "config_changes",
    "TrainConfig",
    "load_config",
    "load_config_file",
    "parse_override",
    "preset_names",
    "resolve",
    "save_config",
    "to_dict",
    "validate",
]


# --------------------------------------------------------------------------------------------
# The sections
# --------------------------------------------------------------------------------------------


@dataclass
class ModelConfig:
    """The policy model.

    Attributes:
        name: Hugging Face hub id, local path, or the embedded alias ``smollm2-135m``.
        dtype: ``auto`` is bf16 on GPU and fp32 on CPU.
        device: ``auto`` picks ``cuda`` when available, else ``cpu``.
        lora: train a LoRA adapter (needs ``pip install 'entropace[lora]'``) instead of all
            weights; the checkpoint then holds the adapter only.
        lora_r, lora_alpha, lora_dropout, lora_target_modules: the adapter (a list of module
            names such as ``[q_proj, v_proj]``, a regex over full module names, or
            ``all-linear``).
        lora_layers: the top fraction of the decoder layers that get adapters: the last
            ``max(1, round(lora_layers * n))`` of the model's ``n`` layers (``0.333``: the upper
            third, SmolLM2's layers 20-29 of 30, the tiny model's layer 1 of 2); 1.0: every
            layer. Below 1 it needs ``lora_target_modules`` as a list of module names.
        gradient_checkpointing: trade compute for activation memory in the update.
    """

    name: str = "smollm2-135m"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: str = "auto"
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: str | list[str] = "all-linear"
    lora_layers: float = 1.0
    gradient_checkpointing: bool = False


@dataclass
class TasksConfig:
    """Which environment families a step samples, and how many prompts of each.

    Each training step takes ``round(prompts_per_task * mix.get(k, 1.0))`` prompts (instances)
    of task ``k`` (P per task by default), each sampled ``group_size`` (G) times. A task whose
    share rounds to 0 is absent from that step's batch. Seeds come from the ``train`` split in
    order, starting at ``seed_offset``; the position is checkpointed.

    Attributes:
        names: environment families (see ``entropace envs list``).
        mix: relative weight per task (default 1.0 each).
        prompts_per_task: P.
        group_size: G, samples per prompt (the GRPO group).
        difficulty: passed to every family (``easy`` / ``medium`` / ``hard``).
        options: extra keyword options per family, e.g. ``{db: {database: chinook}}``.
        seed_offset: first train-split seed used.
        interface: ``text`` (each family's own action syntax) or ``tools`` (JSON-schema tool
            calls rendered through the chat template; :mod:`entropace.envs.tools`).
        profile: ``default`` or ``agentbench`` (AgentBench FC's interface, observations, turn
            limits and output caps per family; :mod:`entropace.envs.agentbench`).
    """

    names: list[str] = field(default_factory=lambda: ["db", "kg", "reasoning"])
    mix: dict[str, float] = field(default_factory=dict)
    prompts_per_task: int = 2
    group_size: int = 4
    difficulty: Literal["easy", "medium", "hard"] = "easy"
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    seed_offset: int = 0
    interface: Literal["text", "tools"] = "text"
    profile: Literal["default", "agentbench"] = "default"

    def env_factory(self, task: str) -> Callable[[], Any]:
        """``() -> env`` of ``task`` with this run's difficulty and that task's options
        (:func:`entropace.envs.make`, which wraps every env in its turn limit); the one
        factory training, evaluation and config validation use."""
        from entropace.envs import make

        options = {"difficulty": self.difficulty, **self.options.get(task, {})}
        return functools.partial(
            make, task, interface=self.interface, profile=self.profile, **options
        )


@dataclass
class OptimConfig:
    """AdamW with linear warmup (counted in optimiser steps), then ``schedule``.

    ``nonfinite_patience``: an optimiser step whose loss or gradient is non-finite is skipped
    (``skipped_steps``); after this many training steps in a row whose every optimiser step
    was skipped, the run saves a checkpoint and stops with an error (the loss options or the
    learning rate train nothing; docs/training.md). 0: never stop.
    """

    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    max_grad_norm: float = 1.0
    warmup_steps: int = 0
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    nonfinite_patience: int = 3


@dataclass
class DecoupledConfig:
    """AReaL's decoupled PPO objective (arXiv 2505.24298; ALGORITHMS.md section 7).

    The clip is taken against the proximal policy (the learner at update start, one no-grad
    pass over the batch) and each token's term is weighted by ``pi_prox / pi_behav`` (the
    behaviour policy: the one that sampled it), tokens whose weight exceeds the cap are
    filtered out (:mod:`entropace.algos.decoupled`).

    Attributes:
        enabled: use the decoupled objective. Needs a policy loss registered with
            ``decoupled=True`` (the per-token losses: ``ppo``, ``ce_gppo``, ``cispo``, ``sapo``,
            ``dppo_tv``, ``dppo_kl``, ``dro``, ``gpg``); refused with BAPO's clip rule and the
            ``dcpo`` loss, which keep their own off-policy forms.
        behaviour_weight_cap: AReaL's ``behav_imp_weight_cap`` (> 1): tokens with
            ``pi_prox / pi_behav`` above it get weight 0; null: no filter.
    """

    enabled: bool = False
    behaviour_weight_cap: float | None = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(f"enabled must be true or false, got {self.enabled!r}")
        cap = self.behaviour_weight_cap
        if cap is not None and (
            isinstance(cap, bool) or not isinstance(cap, int | float) or not 1.0 < cap < math.inf
        ):
            raise ValueError(f"behaviour_weight_cap must be a number > 1 or null, got {cap!r}")


@dataclass
class PPOConfig:
    """How one rollout batch is consumed: ``epochs`` passes, each split into
    ``num_minibatches`` optimiser steps (clip rules act only when there are several), each
    accumulated over micro-batches with the mini-batch's global token / sequence counts, so
    that any partition gives the same loss and gradients. Every switch below is exact (the
    same loss and gradients up to float round-off; docs/training.md has the measurements).

    Attributes:
        micro_batch_size: trajectories per micro-batch at most.
        micro_batch_tokens: also at most this many token positions run by a micro-batch's
            forward, a group's shared prefix counted once (:mod:`entropace.train.micro_batches`;
            a longer trajectory runs alone); None: rows only.
        share_prefix: a group's trajectories in one micro-batch run their common prompt once,
            forward and backward (:func:`entropace.rollout.sequence_token_stats`).
        fused_head: the LM head fused with the log-prob / entropy computation on the policy
            tokens only (:func:`entropace.algos.hidden_token_stats`): no ``[b, L, V]`` logits.
        checkpoint_mlp, checkpoint_norms: recompute each decoder layer's MLP / each RMSNorm in
            the backward pass instead of keeping their activations (:mod:`entropace.train.recompute`).
        skip_inert: trajectories whose advantage is 0 on every token (a group with all-equal
            rewards) skip the forward/backward passes when they contribute exactly nothing: an
            ``advantage_weighted``, ``row_local`` loss (:class:`entropace.algos.PolicyLoss`) and
            ``algorithm.kl_beta = entropy_coef = 0``. A mini-batch with no row left takes a
            zero-gradient optimiser step. The loss-side metrics (``clip_frac_*``,
            ``approx_kl``, ``loss/*``) then cover the trajectories that ran; a task none of
            whose trajectories ran has no per-task flag metrics; ``update/trained_rows_frac``
            is the fraction that ran.
        decoupled: AReaL's decoupled objective for stale batches (:class:`DecoupledConfig`).
        autocast: ``bf16`` runs the update's forward and backward under
            ``torch.autocast(bfloat16)`` with fp32 master weights (optimiser, gradients);
            ``none`` (the default): the model's dtype throughout.
    """

    epochs: int = 2
    num_minibatches: int = 2
    micro_batch_size: int = 4
    shuffle: bool = True
    share_prefix: bool = True
    fused_head: bool = True
    checkpoint_mlp: bool = False
    checkpoint_norms: bool = False
    skip_inert: bool = True
    micro_batch_tokens: int | None = None
    decoupled: DecoupledConfig = field(default_factory=DecoupledConfig)
    autocast: Literal["none", "bf16"] = "none"


@dataclass
class LogConfig:
    """Logging and checkpoints.

    Attributes:
        trackers: where each step's metrics row goes besides ``RUN/metrics.jsonl`` (always
            written): any of ``tensorboard`` (``RUN/events``; in ``entropace[train]``),
            ``wandb``, ``mlflow``, ``trackio`` (extras of the same names), under our metric
            names, with the run's config recorded (:mod:`entropace.train.trackers`). ``[]``:
            none. The key ``log.tensorboard: true|false`` of older configs adds / removes
            ``tensorboard`` (:func:`legacy_log_keys`).
        project: the W&B project, MLflow experiment and trackio project of the run.
        run_name: the run's name in the trackers (default: the run directory's name).
        tracker_options: per tracker, its settings, e.g. ``{wandb: {entity: me, mode:
            offline}, mlflow: {tracking_uri: "sqlite:///mlflow.db"}}`` (the keys each takes are
            in ``docs/training.md``; unknown ones are refused when the config loads).
        progress: show the tqdm progress bar.
        checkpoint_every: training steps between checkpoints (0: only at the end / on stop).
        keep_last: checkpoints kept (older ones are deleted).
        optimizer_state: ``all`` keeps the optimiser state (``optim.pt``, twice the weights'
            size for AdamW) in every kept checkpoint; ``last`` only in the newest one (the older
            ones keep weights, RNG and state: enough for ``eval`` and reports, not to resume).
        report: write ``RUN/report`` at the end of ``entropace train``.
    """

    trackers: list[str] = field(default_factory=lambda: ["tensorboard"])
    project: str = "entropace"
    run_name: str | None = None
    tracker_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    progress: bool = True
    checkpoint_every: int = 10
    keep_last: int = 2
    optimizer_state: Literal["all", "last"] = "all"
    report: bool = True


def validate_log(log: LogConfig) -> None:
    """The ``log`` section: names and every tracker's name and options (its counts have their
    ranges in the range table below)
    (:func:`entropace.train.trackers.check_trackers`; its package is checked when training
    starts, :func:`entropace.train.trackers.require_trackers`)."""
    from entropace.train.trackers import check_trackers

    if not log.project.strip():
        raise ConfigError("log.project must not be empty")
    if log.run_name is not None and not log.run_name.strip():
        raise ConfigError("log.run_name must not be empty (leave it unset for the run dir's name)")
    check_trackers(log.trackers, log.tracker_options)


def legacy_log_keys(below: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    """``layer`` (a preset, a saved config or the command line) with the pre-``log.trackers``
    key ``log.tensorboard: true|false`` turned into ``log.trackers``: ``tensorboard`` added
    to / removed from the trackers that ``layer`` names, else those of the layers ``below``
    it (merged), else the default."""
    log = layer.get("log")
    if not isinstance(log, dict) or "tensorboard" not in log:
        return layer
    log = dict(log)
    on = log.pop("tensorboard")
    if not isinstance(on, bool):
        raise ConfigError(f"log.tensorboard: expected true/false, got {on!r}")
    below_log = below.get("log") if isinstance(below.get("log"), dict) else {}
    trackers = log.get("trackers", below_log.get("trackers", LogConfig().trackers))
    if isinstance(trackers, str):  # "tensorboard,wandb" on the command line
        trackers = [t.strip() for t in trackers.split(",") if t.strip()]
    if not isinstance(trackers, list):
        raise ConfigError(f"log.trackers: expected a list, got {trackers!r}")
    trackers = [t for t in trackers if t != "tensorboard"]
    log["trackers"] = ["tensorboard", *trackers] if on else trackers
    return {**layer, "log": log}


@dataclass
class AuditConfig:
    """PAPO's polarity audit during training (ALGORITHMS.md section 4;
    :mod:`entropace.diagnostics.training_audit`), logged as ``audit/*`` on audited steps.

    Attributes:
        every: audit every N-th training step (0: off). The audit never changes the run.
        max_states: response positions audited per step (all of them when the batch has
            fewer), drawn by whole trajectories in a random order (the audit's forward passes
            cost ~ the rows drawn).
        mode: ``realised`` (the update's realised entropy change against the predicted
            polarity, the first-order error, the step size), ``probe`` (from a copy of the
            policy, one step on each polarity branch's loss; for small models), or ``both``.
        probe_step: parameter-space norm of each probe step; small enough for the first-order
            regime (on the tiny model ``dH / probe_step`` settles only below ~2e-3: check
            with a second value, the probe's ``dH`` should halve with the step).
    """

    every: int = 0
    max_states: int = 128
    mode: Literal["realised", "probe", "both"] = "realised"
    probe_step: float = 1e-3


@dataclass
class EvalConfig:
    """Periodic held-out evaluation during training (:mod:`entropace.train.held_out`), logged
    as ``eval/<task>/success``, ``eval/<task>/reward`` and ``eval/success``.

    Attributes:
        every: evaluate before the first step (logged as step 0, the policy the run starts
            from), after every N-th training step and after the last one (0: off).
        n: held-out seeds per task (the first ``n`` of ``split``, the same at every evaluation).
        split: the seed split the held-out prompts come from (``test`` / ``test_unseen``).
        do_sample: sample at the run's temperature instead of greedy decoding.
        batch_size: episodes per rollout call.
    """

    every: int = 0
    n: int = 16
    split: str = "test"
    do_sample: bool = False
    batch_size: int = 64


@dataclass
class TrainConfig:
    """Everything a training run needs; saved as ``RUN/config.yaml``."""

    seed: int = 0
    steps: int = 100
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    log: LogConfig = field(default_factory=LogConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    threads: ThreadsConfig = field(default_factory=ThreadsConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)


#: Command-line shortcuts: ``algo=eppo`` is ``algorithm.name=eppo``, ``tasks=db,kg`` is
#: ``tasks.names=[db, kg]``.
SHORTCUTS: dict[str, str] = {
    "algo": "algorithm.name",
    "tasks": "tasks.names",
    "model": "model.name",
    "lr": "optim.lr",
    "P": "tasks.prompts_per_task",
    "G": "tasks.group_size",
}

PRESET_DIR = Path(__file__).resolve().parent.parent / "configs"


# --------------------------------------------------------------------------------------------
# Command-line overrides
# --------------------------------------------------------------------------------------------


def parse_override(text: str) -> dict[str, Any]:
    """``"a.b=value"`` -> ``{"a": {"b": value}}``; the value is parsed as YAML (numbers,
    booleans, lists ``[x, y]``, ``null``); shortcuts (:data:`SHORTCUTS`) are expanded."""
    if "=" not in text:
        raise ConfigError(
            f"override {text!r} must look like key.sub=value; shortcuts: {sorted(SHORTCUTS)}"
        )
    key, raw = text.split("=", 1)
    key = SHORTCUTS.get(key.strip(), key.strip())
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if key == "tasks.names" and isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    return nest(key, value)


# --------------------------------------------------------------------------------------------
# Validation that needs the registries (algorithms, losses, environments)
# --------------------------------------------------------------------------------------------


#: Most training steps (each consumes at least one of the train split's 1,000,000 seeds per task).
MAX_STEPS = 1_000_000
#: Most samples per prompt (G) and prompts per task (P) ...
MAX_GROUP = 1024
MAX_PROMPTS = 1024
#: ... and most episodes of one step (P x mix x G summed over the tasks).
MAX_EPISODES_PER_STEP = 65_536
#: Most rows / token positions of one micro-batch.
MAX_ROWS = 65_536
MAX_TOKENS = 2**24
#: The train split's seeds (``entropace.envs.splits.SPLITS["train"]``).
TRAIN_SEEDS = 1_000_000

_POSITIVE = Range(0, lo_open=True)
_NON_NEGATIVE = Range(0)

# The range of every numeric key, checked when the config loads (``build_dataclass``) and by
# :func:`validate`; a key not named here has its type's default (a finite float; an int in
# [0, 2**31 - 1]). The rollout and algorithm sections register theirs in their own modules.
register_ranges(TrainConfig, {
    "seed": Range(0, 2**32 - 1),  # numpy's and torch's seed range
    "steps": Range(1, MAX_STEPS),
})  # fmt: skip
register_ranges(ModelConfig, {
    "lora_r": Range(1, 4096),
    "lora_alpha": Range(1, 2**20),
    "lora_dropout": Range(0, 1, hi_open=True),
    "lora_layers": Range(0, 1, lo_open=True),
})  # fmt: skip
register_ranges(TasksConfig, {
    "mix": Range(0, MAX_PROMPTS),
    "prompts_per_task": Range(1, MAX_PROMPTS),
    "group_size": Range(2, MAX_GROUP, note=(
        "every advantage estimator compares a sample with its group, so a group of 1 has "
        "advantage 0 (nothing to learn)")),
    "seed_offset": Range(0, TRAIN_SEEDS - 1),
})  # fmt: skip
register_ranges(OptimConfig, {
    "lr": _POSITIVE,
    "weight_decay": _NON_NEGATIVE,
    "betas": Range(0, 1, hi_open=True),
    "eps": _POSITIVE,
    "max_grad_norm": _POSITIVE,
    "warmup_steps": Range(0, 2**31 - 1),
    "nonfinite_patience": Range(0, MAX_STEPS),
})  # fmt: skip
register_ranges(PPOConfig, {
    "epochs": Range(1, 1000),
    "num_minibatches": Range(1, MAX_ROWS),
    "micro_batch_size": Range(1, MAX_ROWS),
    "micro_batch_tokens": Range(1, MAX_TOKENS),
})  # fmt: skip
register_ranges(LogConfig, {
    "checkpoint_every": Range(0, MAX_STEPS),
    "keep_last": Range(1, 1000),
})  # fmt: skip
register_ranges(EvalConfig, {
    "every": Range(0, MAX_STEPS),
    "n": Range(1, 100_000),
    "batch_size": Range(1, MAX_ROWS),
})  # fmt: skip
register_ranges(AuditConfig, {
    "every": Range(0, MAX_STEPS),
    "max_states": Range(1, MAX_TOKENS),
    "probe_step": _POSITIVE,
})  # fmt: skip
register_ranges(RolloutConfig, {k: Range(*v) for k, v in ROLLOUT_RANGES.items()})


def validate(cfg: TrainConfig, *, check_envs: bool = True) -> TrainConfig:
    """Range and registry checks; raises :class:`ConfigError` naming the key.

    Every number is checked against its range (:func:`entropace.train.schema.check_ranges`:
    the ranges registered above and in the algorithm / rollout modules), then the relations
    between keys (a step's episodes, the seeds a run consumes, the overlong window)."""
    check_ranges(cfg)
    validate_algorithm(cfg.algorithm)

    t = cfg.tasks
    if not t.names:
        raise ConfigError("tasks.names must name at least one task")
    if len(set(t.names)) != len(t.names):
        raise ConfigError(f"tasks.names has duplicates: {t.names}")
    if check_envs:
        from entropace.envs import specs

        known = sorted(specs())
        for name in t.names:
            check_in("tasks.names", name, known)
    for name in t.mix:
        check_in("tasks.mix", name, t.names)
    for name in t.options:
        check_in("tasks.options", name, t.names)
    for name in cfg.algorithm.task_bounds:
        check_in("algorithm.task_bounds", name, t.names)
    if check_envs:  # build one environment per task now, not after the first rollout
        for name in t.names:
            try:
                t.env_factory(name)()
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"tasks.options.{name}: {exc}") from None
    counts = {k: round(t.prompts_per_task * t.mix.get(k, 1.0)) for k in t.names}
    if all(n == 0 for n in counts.values()):
        raise ConfigError("tasks.mix: every task rounds to 0 prompts per step")
    episodes = sum(counts.values()) * t.group_size
    if episodes > MAX_EPISODES_PER_STEP:
        raise ConfigError(
            f"tasks.prompts_per_task x tasks.mix x tasks.group_size: {episodes} episodes per "
            f"step (prompts per task {counts}, G={t.group_size}); at most "
            f"{MAX_EPISODES_PER_STEP}"
        )
    needed = t.seed_offset + cfg.steps * max(counts.values())
    if needed > TRAIN_SEEDS:
        raise ConfigError(
            f"tasks.seed_offset + steps x prompts per step: the run needs train seeds up to "
            f"{needed:,}, the train split has {TRAIN_SEEDS:,} (seed_offset {t.seed_offset}, "
            f"steps {cfg.steps}, at most {max(counts.values())} prompts of a task per step)"
        )

    o = cfg.optim
    if len(o.betas) != 2:
        raise ConfigError(f"optim.betas must be two numbers in [0, 1), got {o.betas}")
    check_in("eval.split", cfg.eval.split, [k for k in SPLITS if k != "train"])
    if cfg.rollout.mode == "async" and cfg.rollout.cross_policy.enabled:
        raise ConfigError(
            "rollout.cross_policy needs rollout.mode=sync: the asynchronous worker generates "
            "with one policy version (its stale snapshots and other models are not in the "
            "worker process)"
        )
    if cfg.ppo.decoupled.enabled:
        _check_decoupled(cfg)
    _check_advantage_inputs(cfg)
    _warn_autocast(cfg)
    validate_log(cfg.log)
    validate_warm_start(cfg, check_envs=check_envs)
    m = cfg.model
    if m.lora_layers < 1 and isinstance(m.lora_target_modules, str):
        raise ConfigError(
            f"model.lora_layers={m.lora_layers} needs model.lora_target_modules as a list of "
            f"module names (e.g. [q_proj, k_proj, v_proj, o_proj]), not {m.lora_target_modules!r}"
        )
    if not DEVICE_PATTERN.fullmatch(cfg.model.device):
        raise ConfigError(
            f"model.device: {cfg.model.device!r} is not a device; allowed: auto, cpu, cuda, "
            "cuda:N, mps"
        )
    return cfg


def _warn_autocast(cfg: TrainConfig) -> None:
    """Warn on autocast settings whose on-policy ratio is not 1 before any weight moves
    (``benchmarks/results/bf16.md``: up to 0.18 nats of log-ratio, the clip range itself)."""
    r, p = cfg.rollout, cfg.ppo
    if r.autocast != p.autocast:
        warnings.warn(
            f"rollout.autocast={r.autocast} but ppo.autocast={p.autocast}: the behaviour and "
            "the update log-probs come from different precisions, so on-policy ratios are not "
            "1 (up to ~0.1 nats of log-ratio on SmolLM2-135M); set both alike",
            UserWarning,
            stacklevel=3,
        )
    elif r.autocast == "bf16" and r.stats_from_generation:
        warnings.warn(
            "rollout.autocast=bf16 with rollout.stats_from_generation: bf16 decoding drifts "
            "from the bf16 training forward (on-policy log-ratios up to ~0.18 nats on "
            "SmolLM2-135M, the clip range itself); set rollout.stats_from_generation=false",
            UserWarning,
            stacklevel=3,
        )


def _check_decoupled(cfg: TrainConfig) -> None:
    """``ppo.decoupled`` needs a loss that takes behaviour weights; BAPO and DCPO keep their
    own off-policy forms (ALGORITHMS.md section 7), so the combination is refused."""
    from entropace.algos import POLICY_LOSSES, get_policy_loss

    a = cfg.algorithm
    if a.clip_rule == "bapo":
        raise ConfigError(
            "ppo.decoupled.enabled: BAPO's clip rule searches its bounds against the behaviour "
            "policy (its own off-policy form); turn ppo.decoupled off or use another clip rule"
        )
    if not get_policy_loss(a.policy_loss).decoupled:
        raise ConfigError(
            f"ppo.decoupled.enabled: algorithm.policy_loss {a.policy_loss!r} does not take "
            "behaviour importance weights (DCPO's bounds read the behaviour probability, GSPO's "
            "ratio is a sequence's); use one of "
            f"{sorted(n for n, s in POLICY_LOSSES.items() if s.decoupled)}, or turn "
            "ppo.decoupled off"
        )


def _check_advantage_inputs(cfg: TrainConfig) -> None:
    """The trainer gives an estimator rewards, groups and the loss mask; ReMax's ``baselines``
    (the reward of a greedy response per prompt) would need a greedy rollout it does not run."""
    from entropace.algos import get_advantage

    missing = [n for n in get_advantage(cfg.algorithm.advantage).needs if n != "mask"]
    if missing:
        raise ConfigError(
            f"algorithm.advantage={cfg.algorithm.advantage!r} needs {missing} (ReMax: the reward "
            "of a greedy response to each prompt), which entropace's trainer does not generate; "
            "use it through entropace.algos with your own baselines, or in verl (adv_estimator="
            "remax)"
        )


#: ``model.device`` values (whether the device exists is checked when the model is built).
DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


# --------------------------------------------------------------------------------------------
# Presets, overrides, files
# --------------------------------------------------------------------------------------------


def preset_names() -> list[str]:
    """The presets shipped in :mod:`entropace.configs`."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


#: The largest config file read (a resolved config is a few kB).
CONFIG_BYTES = 16 << 20


def _read_yaml(path: Path, *, follow_symlinks: bool = True) -> dict[str, Any]:
    """The mapping in the YAML file ``path``, which must be a regular file (a FIFO or device
    is refused, never waited on); ``follow_symlinks=False`` for a run directory's file."""
    try:
        text = read_text(path, limit=CONFIG_BYTES, follow_symlinks=follow_symlinks)
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from None
    except UnsafeFileError as exc:
        raise ConfigError(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot be read ({exc})") from None
    except RecursionError:
        raise ConfigError(f"{path}: YAML nested too deeply") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def _preset_dict(preset: str | Path | None) -> dict[str, Any]:
    if preset is None:
        return {}
    path = Path(preset)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        if not path.exists():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        return _read_yaml(path)
    named = PRESET_DIR / f"{preset}.yaml"
    if not named.exists():
        raise ConfigError(
            f"unknown preset {str(preset)!r}{did_you_mean(str(preset), preset_names())}; "
            f"presets: {preset_names()} (or a path to a .yaml file)"
        )
    return _read_yaml(named)


def _algorithm_name(data: dict[str, Any]) -> str | None:
    section = data.get("algorithm", {})
    if not isinstance(section, dict):
        raise ConfigError(f"algorithm: expected a mapping, got {section!r}")
    name = section.get("name")
    if name is not None and not isinstance(name, str):
        raise ConfigError(f"algorithm.name must be a string, got {name!r}")
    return name


#: The ``tasks`` keys that hold one entry per task name.
PER_TASK_KEYS: tuple[str, ...] = ("options", "mix")


def resolve(
    preset: dict[str, Any], overrides: dict[str, Any] | None = None, *, check_envs: bool = True
) -> TrainConfig:
    """Build a :class:`TrainConfig` from a preset's nested dict and command-line overrides,
    with the recipe of the algorithm they name in its place (module docstring)."""
    overrides = overrides or {}
    preset_name = _algorithm_name(preset)
    cli_name = _algorithm_name(overrides)
    name = cli_name or preset_name or AlgorithmConfig().name
    recipe = {"algorithm": {**get_recipe(name).identity(), "name": name}}
    if cli_name is not None and cli_name != preset_name:
        # the preset's identity settings were for its own algorithm: the new recipe replaces them
        section = {k: v for k, v in preset.get("algorithm", {}).items() if k not in IDENTITY}
        preset = {**preset, "algorithm": section}
    cli_tasks = overrides.get("tasks", {})
    if (
        isinstance(cli_tasks, dict)
        and "names" in cli_tasks
        and isinstance(preset.get("tasks"), dict)
    ):
        # the preset's per-task settings (options, mix weights) for tasks the command line
        # deselected do not apply
        names = cli_tasks["names"] if isinstance(cli_tasks["names"], list) else []
        tasks = dict(preset["tasks"])
        for key in PER_TASK_KEYS:
            if isinstance(tasks.get(key), dict):
                tasks[key] = {k: v for k, v in tasks[key].items() if k in names}
        preset = {**preset, "tasks": tasks}
    merged = recipe
    for layer in (preset, overrides):  # each layer's legacy log.tensorboard over those below
        merged = merge(merged, legacy_log_keys(merged, layer))
    return validate(build_dataclass(TrainConfig, merged), check_envs=check_envs)


def load_config(
    preset: str | Path | None = "quick",
    overrides: list[str] | tuple[str, ...] = (),
    *,
    check_envs: bool = True,
) -> TrainConfig:
    """Resolve a preset (name or YAML path) plus ``key.sub=value`` overrides.

    Args:
        preset: a shipped preset name (:func:`preset_names`), a YAML path, or None (defaults).
        overrides: dotted overrides and shortcuts, e.g. ``["algo=eppo", "tasks=db,kg",
            "ppo.epochs=2"]``; later ones win.
        check_envs: also check the task names against the environment registry.
    """
    return resolve(_preset_dict(preset), _overrides(overrides), check_envs=check_envs)


def _overrides(overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    cli: dict[str, Any] = {}
    for text in overrides:
        cli = merge(cli, parse_override(text))
    return cli


def load_config_file(
    path: str | Path, overrides: list[str] | tuple[str, ...] = (), *, check_envs: bool = True
) -> TrainConfig:
    """Read a saved ``config.yaml`` (e.g. ``RUN/config.yaml``), plus overrides. A run
    directory's file: a symbolic link there is refused, not followed."""
    path = Path(path)
    if not os.path.lexists(path):
        raise ConfigError(f"config file {str(path)!r} does not exist")
    data = _read_yaml(path, follow_symlinks=False)
    return resolve(data, _overrides(overrides), check_envs=check_envs)


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``["steps: 2 -> 4", ...]``: every dotted key whose value differs between two config
    dicts (:func:`to_dict` output), sorted."""
    a, b = flat_config(old), flat_config(new)
    missing = object()
    return [
        f"{key}: {a.get(key, missing)!r} -> {b.get(key, missing)!r}".replace(
            repr(missing), "(unset)"
        )
        for key in sorted(a.keys() | b.keys())
        if a.get(key, missing) != b.get(key, missing)
    ]


def save_config(cfg: TrainConfig, path: str | Path) -> Path:
    """Write the resolved config as YAML (every field, so it fully describes the run)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, yaml.safe_dump(to_dict(cfg), sort_keys=False), fsync=True)
