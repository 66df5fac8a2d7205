"""The trainer's typed, validated configuration (one source of truth).

Every setting is a field of a dataclass below, with its default. A preset (``quick.yaml``,
``paper.yaml`` in :mod:`entropace.configs`) and the command line only *override* fields; the
algorithm name additionally brings its recipe's overrides (:mod:`entropace.train.algorithms`).
Resolution order, later wins::

    dataclass defaults < recipe of algorithm.name < preset YAML < CLI overrides

``load_config("quick", ["algo=eppo", "tasks=db,kg", "optim.lr=1e-5"])`` returns the resolved
:class:`TrainConfig`; the trainer saves it as ``RUN/config.yaml`` and ``--resume`` reads it
back with :func:`load_config_file`. An unknown key or a bad value raises :class:`ConfigError`
naming the key and the allowed keys/values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from entropace.control import BapoConfig, PacerConfig, PolarityConfig
from entropace.rollout.config import RolloutConfig
from entropace.train.schema import (
    ConfigError,
    build_dataclass,
    check_in,
    check_positive,
    merge,
    nest,
    suggest,
    to_dict,
)

__all__ = [
    "ConfigError",
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
    """

    names: list[str] = field(default_factory=lambda: ["db", "kg", "reasoning"])
    mix: dict[str, float] = field(default_factory=dict)
    prompts_per_task: int = 2
    group_size: int = 4
    difficulty: Literal["easy", "medium", "hard"] = "easy"
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    seed_offset: int = 0


@dataclass
class OverlongConfig:
    """DAPO's soft overlong penalty, added to the episode reward (response tokens)."""

    enabled: bool = False
    max_len: int = 1024
    cache_len: int = 256


@dataclass
class AlgorithmConfig:
    """The policy-optimisation algorithm. ``name`` selects a recipe; every other field can
    still be overridden (the recipe only changes their defaults).

    Attributes:
        name: a recipe of :data:`entropace.train.algorithms.RECIPES`.
        advantage: ``grpo`` | ``dr_grpo`` | ``rloo``.
        task_norm: AgentRL's per-task re-standardisation of token advantages.
        policy_loss: a name of :data:`entropace.algos.POLICY_LOSSES`.
        loss_options: that loss's own options (e.g. ``dual_clip``, ``beta1``).
        agg: ``token-mean`` | ``seq-mean-token-mean`` | ``seq-mean-token-sum-norm``.
        seq_norm: the constant of ``seq-mean-token-sum-norm`` (None: the rollout's
            ``max_episode_tokens``).
        clip_rule: ``fixed`` (eps_low/eps_high) | ``pacer`` (EPPO) | ``bapo``.
        eps_low, eps_high: the fixed clip range ``[1 - eps_low, 1 + eps_high]``.
        papo: reweight advantages by entropy polarity (PAPO).
        dynamic_sampling: DAPO's filter dropping groups whose rewards are all equal.
        kl_beta: coefficient of the k3 KL to a frozen reference (0: no reference model).
        entropy_coef: entropy bonus coefficient (loss -= coef * mean entropy).
    """

    name: str = "grpo"
    advantage: str = "grpo"
    task_norm: bool = False
    policy_loss: str = "ppo"
    loss_options: dict[str, Any] = field(default_factory=dict)
    agg: str = "token-mean"
    seq_norm: float | None = None
    clip_rule: str = "fixed"
    eps_low: float = 0.2
    eps_high: float = 0.2
    papo: bool = False
    dynamic_sampling: bool = False
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    kl_beta: float = 0.0
    entropy_coef: float = 0.0
    pacer: PacerConfig = field(default_factory=PacerConfig)
    polarity: PolarityConfig = field(default_factory=PolarityConfig)
    bapo: BapoConfig = field(default_factory=BapoConfig)


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
    ``num_minibatches`` optimiser steps, each accumulated over micro-batches of
    ``micro_batch_size`` trajectories (the log-prob chunking is ``rollout.stats_chunk_size``).
    Optimiser steps per training step = ``epochs * num_minibatches``; clip rules only act
    when that is > 1.
    """

    epochs: int = 2
    num_minibatches: int = 2
    micro_batch_size: int = 4
    shuffle: bool = True


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
    from entropace.algos import AGG_MODES, POLICY_LOSSES
    from entropace.train.algorithms import ADVANTAGES, RECIPES
    from entropace.train.clip_rules import CLIP_RULES

    a = cfg.algorithm
    check_in("algorithm.name", a.name, sorted(RECIPES))
    check_in("algorithm.advantage", a.advantage, sorted(ADVANTAGES))
    check_in("algorithm.policy_loss", a.policy_loss, sorted(POLICY_LOSSES))
    check_in("algorithm.agg", a.agg, list(AGG_MODES))
    check_in("algorithm.clip_rule", a.clip_rule, sorted(CLIP_RULES))
    for key in ("eps_low", "eps_high"):
        check_positive(f"algorithm.{key}", getattr(a, key))
    if a.eps_low >= 1:
        raise ConfigError(f"algorithm.eps_low must be < 1, got {a.eps_low}")
    check_positive("algorithm.kl_beta", a.kl_beta, strict=False)
    check_positive("algorithm.entropy_coef", a.entropy_coef, strict=False)
    if a.seq_norm is not None:
        check_positive("algorithm.seq_norm", a.seq_norm)
    if a.overlong.enabled and not 0 < a.overlong.cache_len <= a.overlong.max_len:
        raise ConfigError(
            "algorithm.overlong.cache_len must be in (0, algorithm.overlong.max_len], got "
            f"{a.overlong.cache_len} (max_len {a.overlong.max_len})"
        )

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
    check_positive("tasks.prompts_per_task", t.prompts_per_task)
    check_positive("tasks.group_size", t.group_size)
    if all(round(t.prompts_per_task * t.mix.get(k, 1.0)) == 0 for k in t.names):
        raise ConfigError("tasks.mix: every task rounds to 0 prompts per step")
    check_positive("tasks.seed_offset", t.seed_offset, strict=False)

    o = cfg.optim
    check_positive("optim.lr", o.lr)
    check_positive("optim.max_grad_norm", o.max_grad_norm)
    check_positive("optim.warmup_steps", o.warmup_steps, strict=False)
    check_positive("optim.weight_decay", o.weight_decay, strict=False)
    if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
        raise ConfigError(f"optim.betas must be two numbers in [0, 1), got {o.betas}")

    p = cfg.ppo
    for key in ("epochs", "num_minibatches", "micro_batch_size"):
        check_positive(f"ppo.{key}", getattr(p, key))

    # the controllers' configs (algorithm.pacer / polarity / bapo) validate themselves on
    # construction; build_dataclass reports their errors under their dotted key.
    check_positive("steps", cfg.steps)
    check_positive("log.checkpoint_every", cfg.log.checkpoint_every, strict=False)
    check_positive("log.keep_last", cfg.log.keep_last)
    if cfg.model.lora:
        check_positive("model.lora_r", cfg.model.lora_r)
    return cfg


# --------------------------------------------------------------------------------------------
# Presets, overrides, files
# --------------------------------------------------------------------------------------------


def preset_names() -> list[str]:
    """The presets shipped in :mod:`entropace.configs`."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def _read_yaml(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text()) or {}
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
            f"unknown preset {str(preset)!r}{suggest(str(preset), preset_names())[:-1]}"
            f"; presets: {preset_names()} (or a path to a .yaml file)"
        )
    return _read_yaml(named)


def resolve(data: dict[str, Any], *, check_envs: bool = True) -> TrainConfig:
    """Build a :class:`TrainConfig` from a nested override dict, applying the recipe of the
    algorithm it names (its overrides sit below ``data``'s)."""
    from entropace.train.algorithms import get_recipe

    name = data.get("algorithm", {}).get("name", AlgorithmConfig().name)
    if not isinstance(name, str):
        raise ConfigError(f"algorithm.name must be a string, got {name!r}")
    recipe = get_recipe(name)  # unknown names raise ConfigError listing RECIPES
    merged = merge({"algorithm": recipe.overrides}, data)
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
    data = _preset_dict(preset)
    for text in overrides:
        data = merge(data, parse_override(text))
    return resolve(data, check_envs=check_envs)


def load_config_file(
    path: str | Path, overrides: list[str] | tuple[str, ...] = (), *, check_envs: bool = True
) -> TrainConfig:
    """Read a saved ``config.yaml`` (e.g. ``RUN/config.yaml``), plus overrides."""
    return load_config(Path(path), overrides, check_envs=check_envs)


def save_config(cfg: TrainConfig, path: str | Path) -> Path:
    """Write the resolved config as YAML (every field, so it fully describes the run)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    return path
