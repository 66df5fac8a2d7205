"""Our trainer against TRL's ``GRPOTrainer`` on the same single-turn GRPO workload (CPU).

Both sides train the same tiny random Llama (``build_tiny_model(seed=0)``, or wider/deeper
with ``--hidden/--layers/--intermediate``; written once with ``save_pretrained`` and loaded
from that directory by both) on the same prompts with the same
reward, sampling and optimiser settings, each in its own subprocess, alternately, ``--repeats``
times. Per rollout step (one generation batch and the optimiser steps that consume it) we report
the wall time split into generation / statistics / reward / update, generated tokens per second,
trained tokens per second, CPU time, and the process's peak RSS.

Workload (defaults; every number is an option):

- prompts: ``--prompts`` (8) questions per step of reasoning-gym ``basic_arithmetic`` (easy),
  instances ``0, 1, 2, ...`` in order (the trainer's seed stream), rendered with the model's
  ChatML template as ``[system prompt, question]``; ``--group`` (G = 4) samples each;
- sampling: ``--max-new-tokens`` (64), temperature 1, top-p 1, no top-k, HF ``generate`` with a
  KV cache (no vLLM), stop at ``<|im_end|>``;
- reward: the ``reasoning`` environment's score (reasoning-gym's scorer on the ``<answer>`` tag)
  when positive, else ``0.1 x`` the share of digits in the response, so that a random model
  gets non-zero GRPO advantages (:func:`shaped_reward`); the same function on both sides (ours
  through a benchmark-only environment family, TRL through a reward function);
- GRPO advantages (group mean / std), PPO clip 0.2 both sides, no KL (beta 0, no reference
  model), per-sequence token mean (our ``algo=grpo`` recipe; TRL ``loss_type="grpo"``);
- each rollout batch of ``P x G`` trajectories is consumed in ``--epochs`` (1) passes of
  ``--minibatches`` (2) optimiser steps, each accumulated over micro-batches of
  ``--micro-batch`` (8) trajectories. TRL mapping: ``per_device_train_batch_size = micro``,
  ``gradient_accumulation_steps = P*G / minibatches / micro``, ``steps_per_generation =
  P*G / micro``, ``num_iterations = epochs`` (TRL then recomputes the sampling policy's
  log-probs in a no-grad pass, as we do);
- AdamW (``lr`` 1e-5, constant, no warm-up, no weight decay), grad-norm clip 1.0, float32,
  no gradient checkpointing, ``--threads`` (1) intra-op torch thread per process;
- ``--steps`` rollout steps per run; the first ``--warmup`` are excluded from the statistics.

Phase definitions. Step time: between consecutive end-of-step hooks (ours: after the step's
metrics row is written, through a thin subclass of the trainer's ``MetricsWriter``; TRL: a
``TrainerCallback.on_step_end`` after every ``minibatches``-th optimiser step), so it includes
each trainer's own per-step bookkeeping and logging.

- ours: generation / stats / env (reward) from the rollout engine's timings, update = the
  trainer's ``time/update`` (advantages, controllers, optimiser steps), other = the rest
  (tokenisation, padding, batch assembly, metrics);
- TRL: generation = ``GRPOTrainer._generate`` (prompt templating + tokenisation + ``generate``),
  reward = ``_calculate_rewards``, stats = the rest of ``_generate_and_score_completions``
  (the no-grad log-prob pass, advantages, decoding, metrics), update = step time minus
  ``_generate_and_score_completions`` (the optimiser steps, including the trainer loop).

Tokens: generated = sampled response tokens (incl. the stop token); trained = response tokens
x epochs (tokens that carry a loss). Peak memory: ``ru_maxrss`` of each subprocess (libraries
included), and its RSS before the model is loaded.

TRL runs from its own interpreter (``--trl-python``), a virtualenv that reuses the installed
torch/transformers, so TRL never touches the main environment::

    python -m venv --system-site-packages /tmp/venv-bench
    /tmp/venv-bench/bin/pip install -c constraints.txt "trl==1.16.0"
    python benchmarks/bench_trainer_vs_trl.py --trl-python /tmp/venv-bench/bin/python

Without a working TRL interpreter only our side is measured (and the report says why).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: The checkout this script belongs to: its ``src`` goes first on the import path of every
#: process, so the benchmark measures this working tree even if ``entropace`` is installed
#: from elsewhere.
REPO_SRC = Path(__file__).resolve().parents[1] / "src"
if (REPO_SRC / "entropace").is_dir() and str(REPO_SRC) not in sys.path:
    sys.path.insert(0, str(REPO_SRC))

#: Name of the benchmark-only environment family (registered in each subprocess).
ENV_NAME = "bench_arith"
#: Weight of the digit-share shaping term of :func:`shaped_reward`.
SHAPING = 0.1
#: Keys of one measured rollout step (seconds, except tokens).
PHASES = ("generation", "stats", "reward", "update", "other")


@dataclasses.dataclass
class Workload:
    """What both trainers run (see the module docstring)."""

    model_dir: str
    prompts: int = 8
    group: int = 4
    max_new_tokens: int = 64
    minibatches: int = 2
    micro_batch: int = 8
    epochs: int = 1
    steps: int = 5
    warmup: int = 1
    lr: float = 1e-5
    temperature: float = 1.0
    threads: int = 1
    seed: int = 0
    difficulty: str = "easy"
    dataset: str = "basic_arithmetic"
    algo: str = "grpo"
    tasks: int = 1  # overhead benchmark: number of benchmark task families (>1 for EPPO pacing)

    def check(self) -> None:
        batch = self.prompts * self.group
        if self.warmup >= self.steps:
            raise ValueError(f"--warmup ({self.warmup}) must be < --steps ({self.steps})")
        if batch % self.minibatches or (batch // self.minibatches) % self.micro_batch:
            raise ValueError(
                f"prompts x group ({batch}) must split into --minibatches ({self.minibatches}) "
                f"mini-batches of a whole number of --micro-batch ({self.micro_batch}) "
                "trajectories (TRL needs equal gradient-accumulation steps)"
            )


# ---------------------------------------------------------------------------------------------
# The shared reward and the benchmark environment family
# ---------------------------------------------------------------------------------------------


def shaped_reward(score: float, text: str) -> float:
    """``score`` when positive, else ``SHAPING * (digits in text) / len(text)`` (0 if empty)."""
    if score > 0:
        return float(score)
    return SHAPING * sum(c.isdigit() for c in text) / max(len(text), 1)


class BenchArithEnv:
    """A single-turn ``reasoning`` environment (one reasoning-gym dataset) whose reward is
    :func:`shaped_reward` of the reasoning-gym score and the response text."""

    max_turns = 1

    def __init__(
        self, difficulty: str = "easy", datasets: str = "basic_arithmetic", name: str = ENV_NAME
    ) -> None:
        from entropace.envs.reasoning import ReasoningEnv

        self.inner = ReasoningEnv(difficulty=difficulty, datasets=datasets)
        self.name = name
        self.system_prompt = self.inner.system_prompt

    @property
    def gold(self) -> str:
        return self.inner.gold

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        return self.inner.reset(seed)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, score, _, _, info = self.inner.step(action)
        return obs, shaped_reward(score, action), True, False, info


def register_bench_env(name: str = ENV_NAME, dataset: str = "basic_arithmetic") -> str:
    """Register :class:`BenchArithEnv` as environment family ``name`` (this process only)."""
    import functools

    from entropace.envs.reasoning import oracle
    from entropace.envs.registry import EnvSpec, register

    register(
        EnvSpec(
            name=name,
            factory=functools.partial(BenchArithEnv, datasets=dataset, name=name),
            oracle=oracle,
            description=f"benchmark: reasoning-gym {dataset}, shaped reward",
            options={"difficulty": "easy | medium | hard"},
        )
    )
    return name


# ---------------------------------------------------------------------------------------------
# Subprocess helpers
# ---------------------------------------------------------------------------------------------


def rss_mib() -> float:
    """Current resident set size of this process (MiB)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mib() -> float:
    """Peak resident set size of this process (``ru_maxrss``, KiB on Linux) in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class StepClock:
    """Wall and CPU timestamps at the end of every rollout step."""

    def __init__(self) -> None:
        self.stamps: list[tuple[float, float]] = [(time.perf_counter(), time.process_time())]

    def tick(self) -> None:
        self.stamps.append((time.perf_counter(), time.process_time()))

    def intervals(self) -> list[tuple[float, float]]:
        return [(b[0] - a[0], b[1] - a[1]) for a, b in zip(self.stamps, self.stamps[1:])]


def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[key] = str(threads)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.update(TOKENIZERS_PARALLELISM="false", TRANSFORMERS_VERBOSITY="error")
    if (REPO_SRC / "entropace").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_SRC), env.get("PYTHONPATH")]))
    return env


def run_child(python: str, script: str, side: str, work: Workload, out_dir: Path) -> dict:
    """Run ``script --child side`` under ``python``; return its JSON result."""
    spec = out_dir / f"spec-{side}-{time.monotonic_ns()}.json"
    out = spec.with_name(spec.name.replace("spec-", "out-"))
    spec.write_text(json.dumps(dataclasses.asdict(work)))
    cmd = [python, script, "--child", side, "--spec", str(spec), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=child_env(work.threads))
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(
            f"{side} run failed (exit {done.returncode}):\n{done.stderr[-4000:]}\n{done.stdout[-2000:]}"
        )
    return json.loads(out.read_text())


# ---------------------------------------------------------------------------------------------
# Our side: entropace.train.trainer.train on a resolved config
# ---------------------------------------------------------------------------------------------


def ours_overrides(work: Workload, task_names: list[str]) -> list[str]:
    """``load_config`` overrides of the workload (no preset: dataclass defaults + these)."""
    return [
        f"model.name={work.model_dir}",
        "model.device=cpu",
        "model.dtype=float32",
        f"tasks.names=[{', '.join(task_names)}]",
        f"tasks.prompts_per_task={work.prompts // len(task_names)}",
        f"tasks.group_size={work.group}",
        f"tasks.difficulty={work.difficulty}",
        "rollout.max_turns=1",
        f"rollout.max_new_tokens_per_turn={work.max_new_tokens}",
        f"rollout.temperature={work.temperature}",
        "rollout.top_p=1.0",
        f"rollout.micro_batch_size={work.micro_batch}",
        f"algo={work.algo}",
        "algorithm.kl_beta=0.0",
        f"ppo.epochs={work.epochs}",
        f"ppo.num_minibatches={work.minibatches}",
        f"ppo.micro_batch_size={work.micro_batch}",
        f"optim.lr={work.lr}",
        "optim.warmup_steps=0",
        "optim.schedule=constant",
        "optim.max_grad_norm=1.0",
        f"steps={work.steps}",
        f"seed={work.seed}",
        "log.tensorboard=false",
        "log.progress=false",
        "log.checkpoint_every=0",
        "log.keep_last=1",
    ]


def bench_task_names(work: Workload) -> list[str]:
    """One benchmark family, or ``work.tasks`` families over different reasoning-gym datasets
    (for the EPPO pacer, which needs several tasks)."""
    if work.tasks == 1:
        return [register_bench_env(ENV_NAME, work.dataset)]
    datasets = ("basic_arithmetic", "chain_sum", "word_sorting")
    if not 1 <= work.tasks <= len(datasets):
        raise ValueError(f"tasks must be in [1, {len(datasets)}], got {work.tasks}")
    return [register_bench_env(f"bench_{d}", d) for d in datasets[: work.tasks]]


def child_ours(work: Workload) -> dict:
    import torch

    torch.set_num_threads(work.threads)
    import entropace
    import entropace.train.trainer as trainer_mod
    from entropace.train import load_config, train

    names = bench_task_names(work)
    cfg = load_config(None, ours_overrides(work, names))
    # the same state as TRL's side before its model loads: transformers' Llama imported and
    # the reasoning-gym datasets built (TRL's side builds its prompt dataset from them)
    from transformers import LlamaForCausalLM  # noqa: F401

    from entropace.envs import make

    for name in names:
        make(name, difficulty=work.difficulty).reset(0)
    rss_before = rss_mib()
    clock = StepClock()

    class ClockedWriter(trainer_mod.MetricsWriter):  # stamps the end of every step
        def write(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
            row = super().write(step, metrics)
            clock.tick()
            return row

    trainer_mod.MetricsWriter = ClockedWriter  # type: ignore[misc]
    with tempfile.TemporaryDirectory() as run_dir:
        clock.stamps[0] = (time.perf_counter(), time.process_time())
        train(cfg, run_dir)
        rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    if len(clock.intervals()) != len(rows):
        raise RuntimeError(
            f"the step clock ticked {len(clock.intervals())} times for {len(rows)} metrics rows: "
            "entropace.train.trainer no longer writes its rows through MetricsWriter.write"
        )
    steps = []
    for row, (wall, cpu) in zip(rows, clock.intervals(), strict=True):
        phases = {
            "generation": row["time/generation"],
            "stats": row["time/stats"],
            "reward": row["time/env"],
            "update": row["time/update"],
        }
        phases["other"] = wall - sum(phases.values())
        steps.append(
            {
                "wall": wall,
                "cpu": cpu,
                "trainer_step_time": row["time/step"],
                "generated_tokens": int(row["response_tokens"]),
                "trained_tokens": int(row["response_tokens"]) * work.epochs,
                "optimizer_steps": int(row["optimizer_steps"]),
                "reward": row["reward"],
                **phases,
                # the controllers' state (EPPO clip ranges, PAPO weights) when present
                "controls": {
                    k: v
                    for k, v in row.items()
                    if k.endswith(("/eps_low", "/eps_high")) or k.startswith("polarity/w_")
                },
            }
        )
    import transformers

    return {
        "side": "ours",
        "versions": {
            "entropace": entropace.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "steps": steps,
        "rss_before_mib": rss_before,
        "peak_rss_mib": peak_rss_mib(),
    }


# ---------------------------------------------------------------------------------------------
# TRL's side: GRPOTrainer with the mapped GRPOConfig
# ---------------------------------------------------------------------------------------------


def trl_config_kwargs(work: Workload, output_dir: str) -> dict[str, Any]:
    """``GRPOConfig`` arguments of the workload (see the module docstring for the mapping)."""
    import torch

    batch = work.prompts * work.group
    return dict(
        output_dir=output_dir,
        per_device_train_batch_size=work.micro_batch,
        gradient_accumulation_steps=batch // work.minibatches // work.micro_batch,
        steps_per_generation=batch // work.micro_batch,
        num_iterations=work.epochs,
        num_generations=work.group,
        max_completion_length=work.max_new_tokens,
        temperature=work.temperature,
        top_p=1.0,
        top_k=0,
        repetition_penalty=1.0,
        beta=0.0,
        epsilon=0.2,
        loss_type="grpo",
        scale_rewards="group",
        learning_rate=work.lr,
        optim="adamw_torch",
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        max_steps=work.steps * work.minibatches * work.epochs,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        shuffle_dataset=False,
        seed=work.seed,
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        model_init_kwargs={"dtype": torch.float32},
    )


def child_trl(work: Workload) -> dict:
    import torch

    torch.set_num_threads(work.threads)
    import accelerate
    import datasets
    import transformers
    import trl
    from trl import GRPOConfig, GRPOTrainer

    from entropace.envs import make

    name = register_bench_env(ENV_NAME, work.dataset)
    rows = []
    for seed in range(work.prompts * work.steps):  # the trainer's seed stream, in order
        env = make(name, difficulty=work.difficulty)
        obs, _ = env.reset(seed)
        prompt = [
            {"role": "system", "content": env.system_prompt},
            {"role": "user", "content": obs},
        ]
        rows.append({"prompt": prompt, "seed": seed})
    dataset = datasets.Dataset.from_list(rows)

    def reward(prompts: list, completions: list, seed: list[int], **_: Any) -> list[float]:
        out = []
        for completion, s in zip(completions, seed, strict=True):
            text = completion[0]["content"] if isinstance(completion, list) else completion
            env = make(name, difficulty=work.difficulty)
            env.reset(int(s))
            out.append(env.step(text)[1])
        return out

    rss_before = rss_mib()
    clock = StepClock()
    per_gen = work.minibatches * work.epochs  # optimiser steps per rollout batch
    timed: dict[str, list[float]] = {"generation": [], "reward": [], "score": [], "tokens": []}

    class Clock(transformers.TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.stamps[0] = (time.perf_counter(), time.process_time())

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step % per_gen == 0:
                clock.tick()

    with tempfile.TemporaryDirectory() as out_dir:
        args = GRPOConfig(**trl_config_kwargs(work, out_dir))
        trainer = GRPOTrainer(
            model=work.model_dir,
            reward_funcs=reward,
            args=args,
            train_dataset=dataset,
            callbacks=[Clock()],
        )

        def timer(key: str, fn: Any) -> Any:
            def wrapped(*a: Any, **k: Any) -> Any:
                t0 = time.perf_counter()
                result = fn(*a, **k)
                timed[key].append(time.perf_counter() - t0)
                if key == "score":
                    timed["tokens"].append(int(result["completion_mask"].sum()))
                return result

            return wrapped

        trainer._generate = timer("generation", trainer._generate)
        trainer._calculate_rewards = timer("reward", trainer._calculate_rewards)
        trainer._generate_and_score_completions = timer(
            "score", trainer._generate_and_score_completions
        )
        trainer.train()
    steps = []
    for i, (wall, cpu) in enumerate(clock.intervals()):
        gen, rew, score = timed["generation"][i], timed["reward"][i], timed["score"][i]
        phases = {
            "generation": gen,
            "stats": score - gen - rew,
            "reward": rew,
            "update": wall - score,
            "other": 0.0,
        }
        steps.append(
            {
                "wall": wall,
                "cpu": cpu,
                "generated_tokens": timed["tokens"][i],
                "trained_tokens": timed["tokens"][i] * work.epochs,
                "optimizer_steps": per_gen,
                **phases,
            }
        )
    return {
        "side": "trl",
        "versions": {
            "trl": trl.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "accelerate": accelerate.__version__,
            "datasets": datasets.__version__,
        },
        "steps": steps,
        "rss_before_mib": rss_before,
        "peak_rss_mib": peak_rss_mib(),
    }


CHILDREN = {"ours": child_ours, "trl": child_trl}


# ---------------------------------------------------------------------------------------------
# The parent: build the model once, alternate the runs, summarise
# ---------------------------------------------------------------------------------------------


def save_tiny_model(directory: Path, args: argparse.Namespace | None = None) -> tuple[str, str]:
    """``build_tiny_model(seed=0)`` (dimensions from ``--hidden/--layers/--intermediate``
    when given) written with ``save_pretrained`` (model and tokenizer): ``(path, summary)``."""
    from entropace.models.tiny import build_tiny_model

    dims = {k: getattr(args, k) for k in ("hidden", "layers", "intermediate") if args}
    model, tokenizer = build_tiny_model(seed=0, **{k: v for k, v in dims.items() if v})
    path = directory / "tiny-model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    c = model.config
    return str(path), (
        f"build_tiny_model(seed=0): Llama hidden {c.hidden_size}, {c.num_hidden_layers} layers, "
        f"MLP {c.intermediate_size}, vocab {c.vocab_size}, "
        f"{sum(p.numel() for p in model.parameters()):,} parameters, float32"
    )


def resolve_model(name: str) -> tuple[str, str]:
    """``(directory, summary)`` of ``--model``: ``smollm2-135m`` (the cached conversion of the
    embedded GGUF) or a local directory with a causal LM and its tokenizer."""
    if name == "smollm2-135m":
        from entropace.models.smollm2 import ensure_smollm2

        path = str(ensure_smollm2())
    else:
        path = name
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(path)
    return path, (
        f"{name} ({path}): {c.model_type} hidden {c.hidden_size}, {c.num_hidden_layers} "
        f"layers, vocab {c.vocab_size}, float32"
    )


def summarise(runs: list[dict], warmup: int) -> dict[str, float]:
    """Medians over the measured steps of every run, token rates over their summed time."""
    steps = [s for r in runs for s in r["steps"][warmup:]]
    if not steps:
        raise RuntimeError("no measured steps")
    wall = sum(s["wall"] for s in steps)
    out = {key: statistics.median(s[key] for s in steps) for key in ("wall", "cpu", *PHASES)}
    out["steps"] = len(steps)
    out["generated_tokens"] = statistics.median(s["generated_tokens"] for s in steps)
    out["gen_tok_per_s"] = sum(s["generated_tokens"] for s in steps) / wall
    out["train_tok_per_s"] = sum(s["trained_tokens"] for s in steps) / wall
    out["gen_tok_per_cpu_s"] = sum(s["generated_tokens"] for s in steps) / sum(
        s["cpu"] for s in steps
    )
    out["peak_rss_mib"] = max(r["peak_rss_mib"] for r in runs)
    out["rss_before_mib"] = statistics.median(r["rss_before_mib"] for r in runs)
    return out


def step_table(runs: dict[str, list[dict]], warmup: int) -> list[str]:
    lines = [
        "| side | run | step | wall (s) | CPU (s) | generation | stats | reward | update | other "
        "| generated tokens |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for side, side_runs in runs.items():
        for r, run in enumerate(side_runs):
            for i, s in enumerate(run["steps"]):
                tag = f"{i + 1}{' (warm-up)' if i < warmup else ''}"
                lines.append(
                    f"| {side} | {r + 1} | {tag} | {s['wall']:.3f} | {s['cpu']:.3f} | "
                    + " | ".join(f"{s[p]:.3f}" for p in PHASES)
                    + f" | {s['generated_tokens']} |"
                )
    return lines


def trl_unavailable(python: str) -> str | None:
    """None when ``python`` can import trl, else the reason."""
    try:
        done = subprocess.run(
            [python, "-c", "import trl, sys; print(trl.__version__)"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python}: {exc}"
    if done.returncode != 0:
        return f"{python} cannot import trl: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
    return None


def add_workload_args(parser: argparse.ArgumentParser, children: dict[str, Any]) -> None:
    d = Workload(model_dir="")
    parser.add_argument("--prompts", type=int, default=d.prompts, help="prompts per step (P)")
    parser.add_argument("--group", type=int, default=d.group, help="samples per prompt (G)")
    parser.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    parser.add_argument("--minibatches", type=int, default=d.minibatches)
    parser.add_argument("--epochs", type=int, default=d.epochs, help="passes per rollout batch")
    parser.add_argument("--micro-batch", type=int, default=d.micro_batch)
    parser.add_argument("--steps", type=int, default=d.steps, help="rollout steps per run")
    parser.add_argument("--warmup", type=int, default=d.warmup, help="steps left out")
    parser.add_argument("--threads", type=int, default=d.threads, help="torch threads per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per side (alternating)")
    parser.add_argument("--hidden", type=int, default=None, help="model width (default 64)")
    parser.add_argument("--layers", type=int, default=None, help="model depth (default 2)")
    parser.add_argument("--intermediate", type=int, default=None, help="MLP width (default 128)")
    parser.add_argument(
        "--model",
        default=None,
        help="a local model directory, or smollm2-135m (the embedded SmolLM2-135M-Instruct, "
        "converted into the cache), instead of the tiny random model",
    )
    parser.add_argument("--markdown", default=None, help="also write the report to this file")
    parser.add_argument("--child", choices=sorted(children), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)


def child_main(args: argparse.Namespace, children: dict[str, Any]) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    work = Workload(**json.loads(Path(args.spec).read_text()))
    result = children[args.child](work)
    Path(args.out).write_text(json.dumps(result))


def workload_from_args(args: argparse.Namespace, model_dir: str) -> Workload:
    work = Workload(
        model_dir=model_dir,
        prompts=args.prompts,
        group=args.group,
        max_new_tokens=args.max_new_tokens,
        minibatches=args.minibatches,
        epochs=args.epochs,
        micro_batch=args.micro_batch,
        steps=args.steps,
        warmup=args.warmup,
        threads=args.threads,
    )
    try:
        work.check()
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from exc
    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_args(parser, CHILDREN)
    parser.add_argument(
        "--trl-python",
        default=os.environ.get("ENTROPACE_BENCH_TRL_PYTHON", "/tmp/venv-bench/bin/python"),
        help="interpreter with trl installed (a venv reusing this torch); default "
        "$ENTROPACE_BENCH_TRL_PYTHON or /tmp/venv-bench/bin/python",
    )
    args = parser.parse_args()
    if args.child:
        child_main(args, CHILDREN)
        return

    script = str(Path(__file__).resolve())
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            model_dir, model_desc = resolve_model(args.model)
        else:
            model_dir, model_desc = save_tiny_model(Path(tmp), args)
        work = workload_from_args(args, model_dir)
        reason = trl_unavailable(args.trl_python)
        sides = {"ours": sys.executable} | ({} if reason else {"trl": args.trl_python})
        runs: dict[str, list[dict]] = {side: [] for side in sides}
        for r in range(args.repeats):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for side in order:
                runs[side].append(run_child(sides[side], script, side, work, Path(tmp)))
                print(f"repeat {r + 1}/{args.repeats}: {side} done", file=sys.stderr, flush=True)
    load_after = os.getloadavg()

    summary = {side: summarise(side_runs, work.warmup) for side, side_runs in runs.items()}
    versions = {k: v for side_runs in runs.values() for k, v in side_runs[0]["versions"].items()}
    work_desc = {k: v for k, v in dataclasses.asdict(work).items() if k != "model_dir"}
    lines = [
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, "
        + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())),
        f"model: {model_desc}",
        f"workload: {json.dumps(work_desc)}",
        f"load average before: {' '.join(f'{x:.2f}' for x in load_before)}; after: "
        f"{' '.join(f'{x:.2f}' for x in load_after)}; total {time.perf_counter() - t_start:.0f} s",
    ]
    if reason:
        lines.append(f"TRL NOT MEASURED: {reason}")
    lines += [
        "",
        f"Medians over {args.repeats} runs x {work.steps - work.warmup} measured steps "
        "(seconds per rollout step; token rates = tokens / summed step wall time):",
        "",
        "| side | step wall | step CPU | generation | stats | reward | update | other "
        "| generated tok/s | trained tok/s | generated tok/CPU-s | RSS before model (MiB) "
        "| peak RSS (MiB) | peak - before (MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for side, s in summary.items():
        lines.append(
            f"| {side} | {s['wall']:.3f} | {s['cpu']:.3f} | "
            + " | ".join(f"{s[p]:.3f}" for p in PHASES)
            + f" | {s['gen_tok_per_s']:.0f} | {s['train_tok_per_s']:.0f} | "
            f"{s['gen_tok_per_cpu_s']:.0f} | {s['rss_before_mib']:.0f} | {s['peak_rss_mib']:.0f} "
            f"| {s['peak_rss_mib'] - s['rss_before_mib']:.0f} |"
        )
    if "trl" in summary:
        o, t = summary["ours"], summary["trl"]
        lines += [
            "",
            f"throughput ours / TRL (generated tok/s): {o['gen_tok_per_s'] / t['gen_tok_per_s']:.2f}x"
            f" (goal >= 1.0x); step wall TRL / ours: {t['wall'] / o['wall']:.2f}x; "
            f"tok per CPU-s ours / TRL: {o['gen_tok_per_cpu_s'] / t['gen_tok_per_cpu_s']:.2f}x; "
            f"peak RSS ours / TRL: {o['peak_rss_mib'] / t['peak_rss_mib']:.2f}x",
        ]
    lines += ["", "Every step of every run:", "", *step_table(runs, work.warmup)]
    report = "\n".join(lines)
    print(report)
    if args.markdown:
        Path(args.markdown).write_text(report + "\n")


if __name__ == "__main__":
    main()
