"""Warm start: fine-tune the policy on demonstrations before RL, once, cached by its recipe.

Agent RL starts from a model that already acts in the task's format and has likely and unlikely
replies (a pretrained, instruction-tuned and often task-fine-tuned model), not from noise. A
random or untuned policy spreads its probability over the vocabulary, and a clip range then has
no likely and unlikely tokens to tell apart (Evidence II, docs/lab.md). The ``warm_start``
section of a training config fine-tunes ``model.name`` on demonstrations
(:mod:`entropace.train.demos`: the tasks' oracles, their demonstration priors, or a JSONL file
of chat exchanges), with the library's own chat layout and the loss on the replies only, and
the run starts from the result::

    loss = - sum_{t in replies} log p_theta(y_t | y_<t) / #reply tokens of the batch

(token-mean over every reply token of the batch, the replies' end-of-turn tokens included;
AdamW, linear warmup then constant LR, gradient-norm clipping; batches of ``batch_size`` demos
drawn without replacement, a new permutation per pass, from a generator seeded by ``seed``).

The result is a directory that ``model.name`` loads (a ``save_pretrained`` model and tokenizer,
or with ``warm_start.lora`` the adapter alone, merged into the base model as it loads),
stored in the cache under a key derived from everything that determines it
(:func:`warm_start_key`: the base model, this section, the tasks' environment settings, the
demonstrations file's hash, :data:`RECIPE_VERSION`), with ``warm_start.json`` beside it (the
recipe, the loss curve, measurements of the result, the weights' sha256). A second run with the
same recipe loads it in seconds, after checking the weights against that sha256
(:mod:`entropace.train.warm_store`). A build is written to a temporary directory and renamed,
so an interrupted build leaves nothing behind. Shipped warm starts (the lab's,
:data:`SHIPPED_DIR`) are found by the same key before the cache; ``sha256`` pins the weights
(the run refuses any other), so an experiment names exactly the model it ran.

``entropace warmstart`` builds one from a preset and prints where it is and what it measured.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from entropace._cache import cache_dir
from entropace.train.demos import (
    DEMO_SOURCES,
    Demo,
    oracle_policy,
    policy_demos,
    prior_policy,
    read_jsonl_demos,
    tokenize_demo,
)
from entropace.train.policy import lora_options
from entropace.train.schema import ConfigError, Range, register_ranges
from entropace.train.sft import fine_tune
from entropace.train.warm_store import (
    ADAPTER_FILE,
    WEIGHTS_FILE,
    WarmStart,
    WarmStartError,
    adapter_tensors,
    build_lock,
    file_sha256,
    read_entry,
    write_entry,
)

__all__ = [
    "RECIPE_VERSION",
    "SHIPPED_DIR",
    "WarmStart",
    "WarmStartConfig",
    "WarmStartError",
    "build_warm_start",
    "collect_demos",
    "ensure_warm_start",
    "file_sha256",
    "measure_policy",
    "validate_warm_start",
    "warm_start_key",
    "weights_file",
    "warm_started",
]

logger = logging.getLogger(__name__)

#: Bumped when the recipe's code changes what a given config builds (a new key: no stale cache).
RECIPE_VERSION = 1
#: Warm starts shipped with the package, ``<key>/`` directories found before the cache.
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "models" / "warm"


@dataclass
class WarmStartConfig:
    """Fine-tuning on demonstrations before RL (module docstring).

    Attributes:
        source: ``none`` (start from ``model.name`` as it is), ``oracle``, ``prior`` or
            ``jsonl`` (:mod:`entropace.train.demos`).
        path: the JSONL file of chat exchanges (``source: jsonl``).
        tasks: the tasks whose demonstrations are played (``oracle`` / ``prior``); empty: the
            run's ``tasks.names``.
        episodes: demonstrations played per task (``oracle`` / ``prior``), on train-split
            seeds ``seed_offset, seed_offset + 1, ...`` (far from the RL run's own seeds, which
            start at ``tasks.seed_offset``).
        seed_offset: the first train-split seed of the demonstrations.
        prior: per-task options of each task's demonstration prior (``source: prior``), e.g.
            ``{lab2-easy: {correct: [0.6, 0.2], favourite: [0.2, 0.6]}}``.
        lora: fine-tune a LoRA adapter (the model section's ``lora_r``, ``lora_alpha``,
            ``lora_dropout``, ``lora_target_modules``, ``lora_layers``; needs
            ``entropace[lora]``) instead of all weights. The entry holds the adapter only (a
            few MB, not a copy of the model); loading merges it into ``model.name``'s weights
            (:func:`entropace.train.warm_store.load_adapter_entry`), so the run starts from a
            plain model either way. An adapter on the upper layers only (``lora_layers``)
            leaves the lower layers without a backward pass: the cheap warm start of the CPU
            preset ``quick`` (shipped with the package).
        share_prefix: run each task's common prefix (its system prompt) once per micro-batch
            and the LM head on the replies only (:func:`entropace.train.sft.fine_tune`):
            several times faster on long prompts, equal up to float round-off but not bit for
            bit (off by default, so that pins made without it, e.g. lab3's, still hold).
        steps: optimiser steps.
        batch_size: demonstrations per optimiser step.
        micro_batch_size: demonstrations per forward pass (gradients are accumulated; the
            loss is normalised by the whole batch's reply tokens, so it does not change).
        lr, warmup_steps, weight_decay, max_grad_norm: AdamW, linear warmup then constant.
        max_tokens: a demonstration's most tokens (longer ones are cut); None: the rollout's
            ``max_episode_tokens``.
        seed: the seed of the demonstrations' sampling (priors), the batches and the measures.
        measure_prompts: train-split prompts per task on which the result is measured (seeds
            after the demonstrations'); 0: no measurement.
        measure_samples: samples per measured prompt (at the rollout's temperature).
        sha256: the sha256 of the result's weights file (``model.safetensors``, or
            ``adapter.safetensors`` with ``lora``); a result with another hash is refused (pins an experiment's model). None: any.
    """

    source: Literal["none", "oracle", "prior", "jsonl"] = "none"
    path: str | None = None
    tasks: list[str] = field(default_factory=list)
    episodes: int = 256
    seed_offset: int = 900_000
    prior: dict[str, dict[str, Any]] = field(default_factory=dict)
    lora: bool = False
    share_prefix: bool = False
    steps: int = 400
    batch_size: int = 48
    micro_batch_size: int = 48
    lr: float = 1e-3
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    max_tokens: int | None = None
    seed: int = 0
    measure_prompts: int = 16
    measure_samples: int = 8
    sha256: str | None = None

    @property
    def enabled(self) -> bool:
        return self.source != "none"


register_ranges(WarmStartConfig, {
    "episodes": Range(1, 1_000_000),
    "seed_offset": Range(0, 999_999),
    "steps": Range(1, 10_000_000),
    "batch_size": Range(1, 65_536),
    "micro_batch_size": Range(1, 65_536),
    "lr": Range(0, lo_open=True),
    "warmup_steps": Range(0, 10_000_000),
    "weight_decay": Range(0),
    "max_grad_norm": Range(0, lo_open=True),
    "max_tokens": Range(2, 2**24),
    "seed": Range(0, 2**32 - 1),
    "measure_prompts": Range(0, 100_000),
    "measure_samples": Range(1, 1024),
})  # fmt: skip


def validate_warm_start(cfg: Any, *, check_envs: bool = True) -> None:
    """Check ``cfg.warm_start`` against the rest of a training config when it loads:
    :class:`ConfigError` naming the key (a source without what it needs, tasks unknown to the
    run, a task without a prior, a missing file, a malformed pin); with ``check_envs``, each
    prior's options are tried on a real environment of its task."""
    w: WarmStartConfig = cfg.warm_start
    if w.source not in ("none", *DEMO_SOURCES):
        raise ConfigError(
            f"warm_start.source: {w.source!r}; allowed none, {', '.join(DEMO_SOURCES)}"
        )
    if not w.enabled:
        return
    if w.sha256 is not None and not (
        len(w.sha256) == 64 and all(c in "0123456789abcdef" for c in w.sha256)
    ):
        raise ConfigError("warm_start.sha256 must be 64 lowercase hex digits (or null)")
    if w.lora:
        try:
            import peft  # noqa: F401
        except ImportError:
            raise ConfigError(
                "warm_start.lora needs peft: pip install -c constraints.txt -e '.[lora]'"
            ) from None
    if w.micro_batch_size > w.batch_size:
        raise ConfigError(
            f"warm_start.micro_batch_size ({w.micro_batch_size}) exceeds warm_start.batch_size "
            f"({w.batch_size})"
        )
    if w.source == "jsonl":
        if not w.path:
            raise ConfigError("warm_start.source=jsonl needs warm_start.path (a .jsonl file)")
        if not Path(w.path).expanduser().is_file():
            raise ConfigError(f"warm_start.path: {w.path!r} does not exist or is not a file")
        if w.tasks or w.prior:
            raise ConfigError("warm_start.tasks / warm_start.prior do not apply to source=jsonl")
        return
    if w.path:
        raise ConfigError(f"warm_start.path applies to source=jsonl only (source is {w.source})")
    tasks = w.tasks or list(cfg.tasks.names)
    for task in tasks:
        if task not in cfg.tasks.names:
            raise ConfigError(
                f"warm_start.tasks: {task!r} is not among the run's tasks {cfg.tasks.names}"
            )
    for task in w.prior:
        if w.source != "prior":
            raise ConfigError("warm_start.prior applies to source=prior only")
        if task not in tasks:
            raise ConfigError(f"warm_start.prior: {task!r} is not among the warm start's tasks")
    if w.source == "prior" and check_envs:
        from entropace.envs import spec

        for task in tasks:
            if spec(task).prior is None:
                raise ConfigError(
                    f"warm_start.source=prior: task {task!r} has no demonstration prior; use "
                    "source=oracle or a file (source=jsonl)"
                )
            env = cfg.tasks.env_factory(task)()  # the prior's options checked on a real env
            env.reset(w.seed_offset)
            try:
                spec(task).prior(env, random.Random(0), **w.prior.get(task, {}))
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"warm_start.prior.{task}: {exc}") from None


# --------------------------------------------------------------------------------------------
# Demonstrations
# --------------------------------------------------------------------------------------------


def warm_start_tasks(cfg: Any) -> list[str]:
    """The tasks whose demonstrations a warm start plays (``warm_start.tasks`` or the run's)."""
    return list(cfg.warm_start.tasks or cfg.tasks.names)


def collect_demos(cfg: Any) -> tuple[list[Demo], dict[str, Any]]:
    """The warm start's demonstrations and a summary (episodes kept and dropped per task)."""
    from entropace.envs import seeds

    w: WarmStartConfig = cfg.warm_start
    if w.source == "jsonl":
        demos = read_jsonl_demos(w.path or "")
        return demos, {"file": str(w.path), "demos": len(demos)}
    rng = random.Random(w.seed)
    demo_seeds = [int(s) for s in seeds("train", w.episodes, offset=w.seed_offset)]
    demos: list[Demo] = []
    summary: dict[str, Any] = {}
    for task in warm_start_tasks(cfg):
        policy_of = (
            oracle_policy(task)
            if w.source == "oracle"
            else prior_policy(task, rng, dict(w.prior.get(task, {})))
        )
        kept, dropped = policy_demos(
            task, _turn_limited(cfg, task), demo_seeds, policy_of,
            keep_failures=w.source == "prior",
        )  # fmt: skip
        if not kept:
            raise WarmStartError(
                f"warm start: no {w.source} demonstration of {task!r} succeeded on "
                f"{len(demo_seeds)} seeds (turn limit {cfg.rollout.max_turns or 'the env'}'s)"
            )
        demos += kept
        summary[task] = {"kept": len(kept), "dropped": dropped}
    return demos, summary


def _turn_limited(cfg: Any, task: str) -> Callable[[], Any]:
    """``() -> env`` of ``task`` as training builds it, with the rollout's turn limit (the
    engine's ``rollout.max_turns`` override), so demonstrations fit the episodes RL plays."""
    factory = cfg.tasks.env_factory(task)
    if not cfg.rollout.max_turns:
        return factory

    def build() -> Any:
        env = factory()
        env.max_turns = int(cfg.rollout.max_turns)
        return env

    return build


# --------------------------------------------------------------------------------------------
# Fine-tuning
# --------------------------------------------------------------------------------------------


def measure_policy(model: Any, tokenizer: Any, cfg: Any) -> dict[str, dict[str, float]]:
    """Per task, on ``warm_start.measure_prompts`` train prompts after the demonstrations'
    seeds, ``measure_samples`` samples each at the rollout's temperature: the mean per-token
    entropy of the replies (as the trainer's ``task/<k>/entropy``), the sampled reward and
    success; and the greedy success on those prompts."""
    from entropace.control.signals import signals_from_sums, task_sums
    from entropace.envs import seeds
    from entropace.rollout import RolloutRequest, collect_rollouts

    w: WarmStartConfig = cfg.warm_start
    tasks = list(cfg.tasks.names)
    prompt_seeds = [
        int(s) for s in seeds("train", w.measure_prompts, offset=w.seed_offset + w.episodes)
    ]
    requests = [
        RolloutRequest(task=t, env=cfg.tasks.env_factory(t), seed=s, group_id=g)
        for g, (t, s) in enumerate((t, s) for t in tasks for s in prompt_seeds)
        for _ in range(w.measure_samples)
    ]
    sampled = collect_rollouts(model, tokenizer, requests, cfg.rollout, task_names=tasks,
                               seed=w.seed).batch  # fmt: skip
    signals = signals_from_sums(
        task_sums(sampled.entropy, sampled.loss_mask, sampled.rewards, sampled.success,
                  sampled.task_ids, len(tasks)),
        tasks,
    )  # fmt: skip
    greedy_cfg = dataclasses.replace(cfg.rollout, do_sample=False)
    greedy = collect_rollouts(
        model, tokenizer, requests[:: w.measure_samples], greedy_cfg, task_names=tasks, seed=w.seed
    ).batch
    out: dict[str, dict[str, float]] = {}
    for k, task in enumerate(tasks):
        out[task] = {
            "entropy": signals.task_entropy.get(task, math.nan),
            "reward": signals.task_reward[task],
            "success": signals.task_success[task],
            "greedy_success": float(greedy.success[greedy.task_ids == k].float().mean()),
        }
    return out


# --------------------------------------------------------------------------------------------
# The cache
# --------------------------------------------------------------------------------------------


def warm_start_key(cfg: Any) -> str:
    """A key (24 hex digits) of everything that determines a warm start's result: the base
    model (``model.name``, dtype; the adapter's shape with ``warm_start.lora``), the
    ``warm_start`` section (its pin aside), the environment settings of the demonstrated
    tasks (difficulty, options, interface, profile, the rollout's turn limit and
    ``max_episode_tokens``), the JSONL file's sha256, and :data:`RECIPE_VERSION`. The thread count and the machine are not in it: the build is
    deterministic for a given torch build and thread count (tests), and a pin (``sha256``)
    catches any other difference."""
    w = dataclasses.asdict(cfg.warm_start)
    w.pop("sha256")
    for option in ("lora", "share_prefix"):
        if not w[option]:
            w.pop(option)  # off, the keys are those from before the option
    w.pop("measure_prompts")  # measuring does not change the weights
    w.pop("measure_samples")
    m = cfg.model
    lora = (  # a LoRA warm start's entry is its adapter ("format"), loaded on its base
        {
            "lora": [m.lora_r, m.lora_alpha, m.lora_dropout, m.lora_target_modules,
                     m.lora_layers],
            "format": "adapter",
        }
        if cfg.warm_start.lora
        else {}
    )  # fmt: skip
    t = cfg.tasks
    tasks = [] if w["source"] == "jsonl" else warm_start_tasks(cfg)
    recipe = {
        "version": RECIPE_VERSION,
        "model": {"name": cfg.model.name, "dtype": cfg.model.dtype, **lora},
        "warm_start": w,
        "tasks": {
            "names": tasks,
            "difficulty": t.difficulty,
            "options": {k: t.options.get(k, {}) for k in tasks},
            "interface": t.interface,
            "profile": t.profile,
        },
        "rollout": {
            "max_turns": cfg.rollout.max_turns,
            "max_episode_tokens": cfg.rollout.max_episode_tokens,
        },
        "file": file_sha256(Path(w["path"]).expanduser()) if w["source"] == "jsonl" else None,
    }
    text = json.dumps(recipe, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _say(log: Callable[[str], None] | None) -> Callable[[str], None]:
    return log or (lambda m: logger.info("%s", m))


def weights_file(w: WarmStartConfig) -> str:
    """The file whose sha256 names the weights of a warm start of ``w``: the adapter
    (``warm_start.lora``) or the full model (:mod:`entropace.train.warm_store`)."""
    return ADAPTER_FILE if w.lora else WEIGHTS_FILE


def ensure_warm_start(
    cfg: Any, *, log: Callable[[str], None] | None = None, rebuild: bool = False
) -> WarmStart:
    """The warm start of ``cfg``: shipped (:data:`SHIPPED_DIR`), cached, or built now into the
    cache (``cache_dir("warmstart", key)``); ``rebuild`` builds anew whatever exists. Every
    entry is checked as it loads (:func:`entropace.train.warm_store.read_entry`: its weights
    against its record's sha256, and ``warm_start.sha256`` when set: :class:`WarmStartError`);
    a finished cache entry loads without the build lock (a read-only cache works).
    """
    w: WarmStartConfig = cfg.warm_start
    if not w.enabled:
        raise ValueError("warm_start.source is none: nothing to build")
    say = _say(log)
    key = warm_start_key(cfg)
    weights = weights_file(w)
    if not rebuild:
        shipped_dir = SHIPPED_DIR / key
        if shipped_dir.exists():
            shipped = read_entry(shipped_dir, key, weights, w.sha256, say)
            if shipped is None:
                raise WarmStartError(
                    f"warm start {shipped_dir}: the copy shipped with entropace is damaged; "
                    "reinstall entropace, or build it with `entropace warmstart --rebuild`"
                )
            say(f"warm start {key}: {shipped.path} (shipped; sha256 {shipped.sha256[:12]}...)")
            return shipped
    root = cache_dir("warmstart")
    target = root / key
    found = None if rebuild else read_entry(target, key, weights, w.sha256, say)
    if found is None:
        # one build per key at a time: processes started together (a grid's runs) wait for the
        # first one's build and then load it
        with build_lock(root / f".{key}.lock"):
            found = None if rebuild else read_entry(target, key, weights, w.sha256, lambda m: None)
            if found is None:
                say(f"warm start {key}: building from {w.source} demonstrations into {target}")
                build_warm_start(cfg, target, log=say)
                found = read_entry(target, key, weights, w.sha256, say)
                if found is None:
                    raise WarmStartError(f"warm start {target}: not readable after its build")
                return dataclasses.replace(found, built=True)
    say(f"warm start {key}: {target} (sha256 {found.sha256[:12]}...)")
    return found


def warm_started(
    cfg: Any, *, log: Callable[[str], None] | None = None
) -> tuple[Any, WarmStart | None]:
    """``(cfg, None)`` without a warm start; else ``(cfg with model.name the warm start's
    directory, the warm start)``, building it first if needed (:func:`ensure_warm_start`). The
    trainer builds every copy of the policy (learner, async worker) from the returned config;
    the run's saved config keeps the user's ``model.name`` and ``warm_start`` section."""
    if not cfg.warm_start.enabled:
        return cfg, None
    warm = ensure_warm_start(cfg, log=log)
    model = dataclasses.replace(cfg.model, name=str(warm.path))
    return dataclasses.replace(cfg, model=model), warm


def build_warm_start(
    cfg: Any, target: Path, *, log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Build the warm start of ``cfg`` into ``target`` (replaced atomically); returns the record
    written as ``warm_start.json``."""
    from entropace.train.policy import build_model
    from entropace.train.threads import plan_threads, torch_threads

    say = log or (lambda m: logger.info("%s", m))
    t0 = time.perf_counter()
    # the adapter (warm_start.lora) has the model section's shape; only it is trained
    base = dataclasses.replace(cfg.model, lora=cfg.warm_start.lora)
    # the adapter's initialisation drawn from the recipe's seed, whatever the process drew
    # before (`train` and `warmstart` build the same bytes); the caller's RNG state is kept
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.warm_start.seed)
        model, tokenizer, _device = build_model(base)
        threads = plan_threads(
            cfg.threads, n_params=sum(p.numel() for p in model.parameters()), processes=1
        )  # the run's own rule: one thread for a tiny model, the cores for a real one
        with torch_threads(threads.learner):
            return _build(cfg, model, tokenizer, target, say, t0)


def _build(
    cfg: Any, model: Any, tokenizer: Any, target: Path, say: Callable[[str], None], t0: float
) -> dict[str, Any]:
    from entropace.rollout.chat import ChatLayout

    w: WarmStartConfig = cfg.warm_start
    demos, demo_summary = collect_demos(cfg)
    layout = ChatLayout(tokenizer)
    max_tokens = w.max_tokens or cfg.rollout.max_episode_tokens
    rows = [tokenize_demo(layout, d, max_tokens) for d in demos]
    reply_tokens = sum(sum(r.loss_mask) for r in rows)
    if reply_tokens == 0:  # nothing to learn: the loss would be 0 at every step
        raise WarmStartError(
            f"warm start: the {len(rows)} demonstrations have no reply token within "
            f"{max_tokens} tokens ({sum(r.truncated for r in rows)} cut before their first "
            "reply); raise warm_start.max_tokens or shorten the prompts and tools"
        )
    say(
        f"warm start: {len(rows)} demonstrations ({reply_tokens} reply tokens, "
        f"{sum(r.truncated for r in rows)} cut at {max_tokens} tokens); {w.steps} steps of "
        f"{w.batch_size}"
    )
    every = max(1, w.steps // 10)

    def progress(step: int, loss: float) -> None:
        if step % every == 0 or step == w.steps:
            say(f"warm start: step {step}/{w.steps} loss {loss:.4f}")

    if not w.lora:
        model.requires_grad_(True)
    losses = fine_tune(
        model, rows, steps=w.steps, batch_size=w.batch_size, micro_batch_size=w.micro_batch_size,
        lr=w.lr, warmup_steps=w.warmup_steps, weight_decay=w.weight_decay,
        max_grad_norm=w.max_grad_norm, seed=w.seed, pad_id=int(tokenizer.pad_token_id),
        share_prefix=w.share_prefix, progress=progress,
    )  # fmt: skip
    adapter = adapter_tensors(model) if w.lora else {}
    if w.lora:  # the entry holds the adapter; measured on the merged model, as it loads
        model = model.merge_and_unload()  # W + (alpha / r) B A: a plain model again
    model.requires_grad_(False)
    seconds = time.perf_counter() - t0
    measured = measure_policy(model, tokenizer, cfg) if w.measure_prompts else {}
    record = {
        "key": warm_start_key(cfg),
        "recipe_version": RECIPE_VERSION,
        "base_model": cfg.model.name,
        "warm_start": dataclasses.asdict(w),
        "tasks": warm_start_tasks(cfg) if w.source != "jsonl" else [],
        "demos": demo_summary,
        "reply_tokens": reply_tokens,
        "losses": losses,
        "seconds": seconds,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "measured": measured,
        "weights": weights_file(w),
    }
    if w.lora:
        record["adapter"] = lora_options(dataclasses.replace(cfg.model, lora=True))

    def write(directory: Path) -> None:
        if w.lora:
            from safetensors.torch import save_file

            save_file(adapter, str(directory / ADAPTER_FILE))
        else:
            model.save_pretrained(directory, safe_serialization=True)
            tokenizer.save_pretrained(directory)

    write_entry(target, write, record)
    for task, m in measured.items():
        say(
            f"warm start: {task}: entropy {m['entropy']:.3f} nats/token, sampled reward "
            f"{m['reward']:.3f}, success {m['success']:.3f}, greedy success "
            f"{m['greedy_success']:.3f}"
        )
    say(f"warm start: {target} (sha256 {record['sha256']}, {seconds:.0f} s)")
    return record
