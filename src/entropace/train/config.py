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
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from entropace.rollout.config import RolloutConfig
from entropace.train.algorithms import IDENTITY, AlgorithmConfig, get_recipe, validate_algorithm
from entropace.train.schema import (
    ConfigError,
    build_dataclass,
    check_in,
    check_positive,
    did_you_mean,
    merge,
    nest,
    to_dict,
)
from entropace.train.threads import ThreadsConfig

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
        lora_r, lora_alpha, lora_dropout, lora_target_modules: the adapter (module names, or
            ``all-linear``).
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
    """AdamW with linear warmup (counted in optimiser steps), then ``schedule``."""

    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    max_grad_norm: float = 1.0
    warmup_steps: int = 0
    schedule: Literal["constant", "linear", "cosine"] = "constant"


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


@dataclass
class LogConfig:
    """Logging and checkpoints.

    Attributes:
        tensorboard: write ``RUN/events`` (needs ``tensorboard``, in ``entropace[train]``).
        progress: show the tqdm progress bar.
        checkpoint_every: training steps between checkpoints (0: only at the end / on stop).
        keep_last: checkpoints kept (older ones are deleted).
        report: write ``RUN/report`` at the end of ``entropace train``.
    """

    tensorboard: bool = True
    progress: bool = True
    checkpoint_every: int = 10
    keep_last: int = 2
    report: bool = True


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
    threads: ThreadsConfig = field(default_factory=ThreadsConfig)


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


def validate(cfg: TrainConfig, *, check_envs: bool = True) -> TrainConfig:
    """Range and registry checks; raises :class:`ConfigError` naming the key."""
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
    for name, w in t.mix.items():
        check_in("tasks.mix", name, t.names)
        check_positive(f"tasks.mix.{name}", w, strict=False)
    for name in t.options:
        check_in("tasks.options", name, t.names)
    if check_envs:  # build one environment per task now, not after the first rollout
        for name in t.names:
            try:
                t.env_factory(name)()
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"tasks.options.{name}: {exc}") from None
    check_positive("tasks.prompts_per_task", t.prompts_per_task)
    check_positive("tasks.group_size", t.group_size)
    if t.group_size < 2:
        raise ConfigError(
            f"tasks.group_size must be >= 2, got {t.group_size}: every advantage estimator "
            "compares a sample with its group, so a group of 1 has advantage 0 (nothing to learn)"
        )
    if all(round(t.prompts_per_task * t.mix.get(k, 1.0)) == 0 for k in t.names):
        raise ConfigError("tasks.mix: every task rounds to 0 prompts per step")
    check_positive("tasks.seed_offset", t.seed_offset, strict=False)

    o = cfg.optim
    check_positive("optim.lr", o.lr)
    check_positive("optim.max_grad_norm", o.max_grad_norm)
    check_positive("optim.warmup_steps", o.warmup_steps, strict=False)
    check_positive("optim.weight_decay", o.weight_decay, strict=False)
    check_positive("optim.eps", o.eps)
    if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
        raise ConfigError(f"optim.betas must be two numbers in [0, 1), got {o.betas}")

    p = cfg.ppo
    for key in ("epochs", "num_minibatches", "micro_batch_size"):
        check_positive(f"ppo.{key}", getattr(p, key))
    if p.micro_batch_tokens is not None:
        check_positive("ppo.micro_batch_tokens", p.micro_batch_tokens)

    # the controllers' configs (algorithm.pacer / polarity / bapo) validate themselves on
    # construction; build_dataclass reports their errors under their dotted key.
    check_positive("steps", cfg.steps)
    check_positive("audit.every", cfg.audit.every, strict=False)
    check_positive("audit.max_states", cfg.audit.max_states)
    check_positive("audit.probe_step", cfg.audit.probe_step)
    check_positive("log.checkpoint_every", cfg.log.checkpoint_every, strict=False)
    check_positive("log.keep_last", cfg.log.keep_last)
    if cfg.model.lora:
        check_positive("model.lora_r", cfg.model.lora_r)
    if not DEVICE_PATTERN.fullmatch(cfg.model.device):
        raise ConfigError(
            f"model.device: {cfg.model.device!r} is not a device; allowed: auto, cpu, cuda, "
            "cuda:N, mps"
        )
    return cfg


#: ``model.device`` values (whether the device exists is checked when the model is built).
DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


# --------------------------------------------------------------------------------------------
# Presets, overrides, files
# --------------------------------------------------------------------------------------------


def preset_names() -> list[str]:
    """The presets shipped in :mod:`entropace.configs`."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read ({exc})") from None
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
    merged = merge(merge(recipe, preset), overrides)
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
    cli: dict[str, Any] = {}
    for text in overrides:
        cli = merge(cli, parse_override(text))
    return resolve(_preset_dict(preset), cli, check_envs=check_envs)


def load_config_file(
    path: str | Path, overrides: list[str] | tuple[str, ...] = (), *, check_envs: bool = True
) -> TrainConfig:
    """Read a saved ``config.yaml`` (e.g. ``RUN/config.yaml``), plus overrides."""
    return load_config(Path(path), overrides, check_envs=check_envs)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(_flatten(value, dotted))
        else:
            out[dotted] = value
    return out


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``["steps: 2 -> 4", ...]``: every dotted key whose value differs between two config
    dicts (:func:`to_dict` output), sorted."""
    a, b = _flatten(old), _flatten(new)
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
    path.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    return path
