"""Cost of entropace's TRL plug-in: ``GRPOTrainer`` vs ``EntropaceGRPOTrainer``, side by side.

The same single-turn, two-task workload on each model (a tiny random Llama and SmolLM2-135M-
Instruct, fp32 on the CPU), four variants, each in its own subprocess, run alternately
``--repeats`` times:

- ``plain-grpo``: ``trl.GRPOTrainer`` with the ``grpo`` recipe's fields (``loss_type="grpo"``);
- ``ours-grpo``: ``EntropaceGRPOTrainer(algorithm="grpo")`` (must cost ~nothing: only per-task
  reward / success metrics are added);
- ``plain-dapo``: ``trl.GRPOTrainer`` with the ``eppo+papo`` recipe's fields
  (``loss_type="dapo"``), the fair baseline of
- ``ours-eppo+papo``: ``EntropaceGRPOTrainer(algorithm="eppo+papo")``: the no-grad statistics
  pass (entropy, PAPO's t1/t2 through the fused head), the cross-process reductions, both
  controllers, the (B, T) advantages and the per-completion clamp bounds.

Workload: ``--prompts-per-step`` prompts per step (alternating the ``reasoning`` and ``kg``
families' first observations as the user turn, no system prompt), ``--group`` completions
each, at most
``--max-new-tokens`` tokens, temperature 1, one optimiser step per generation batch, reward =
share of digits in the completion. Step time: between consecutive ``on_step_end`` callbacks
(generation + scoring + statistics + update). Peak memory: the subprocess's ``ru_maxrss``
(MiB). Ratios: total step time of ours / plain (steps after ``--warmup``) within the same
repeat round, then the median over rounds, in CPU time of the process (one torch thread, so
the work done; far less sensitive to other jobs on the shared machine) and in wall time;
also the median of the step-by-step wall ratios (both sides see the same prompts in the same
order). "statistics
pass" is the time of ``_token_stats`` per generation batch: with ``transformers.generate``
the statistics are collected during sampling, so it only aligns them. "entropace's own
code" is the wall time inside the plug-in's additions per generation batch (the logits
processor during ``generate``, then ``_entropace_process``: statistics, reductions,
controllers, PAPO, metrics) over the step time: an attribution that the machine's noise
barely touches, and a bound on the true ratio (1 + that share).

    python benchmarks/bench_trl_plugin.py                 # tiny + SmolLM2-135M, writes
                                                          # benchmarks/results/trl_plugin.md
    python benchmarks/bench_trl_plugin.py --models tiny:1x4 --no-write
"""

from __future__ import annotations

import argparse
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

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

VARIANTS = ("plain-grpo", "ours-grpo", "plain-dapo", "ours-eppo+papo")
PAIRS = (("ours-grpo", "plain-grpo"), ("ours-eppo+papo", "plain-dapo"))
TASKS = ("reasoning", "kg")


def dataset(prompts: int) -> Any:
    import datasets

    from entropace.envs import make

    rows = []
    for i in range(prompts):
        name = TASKS[i % len(TASKS)]
        env = make(name)
        obs, _ = env.reset(i)
        rows.append({"prompt": [{"role": "user", "content": obs}], "task": name})
    return datasets.Dataset.from_list(rows)


def digit_share(completions: list[Any], **_: Any) -> list[float]:
    out = []
    for c in completions:
        text = c[0]["content"] if isinstance(c, list) else c
        out.append(sum(ch.isdigit() for ch in text) / max(1, len(text)))
    return out


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(cfg["threads"])
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    import transformers
    import trl
    from trl import GRPOConfig, GRPOTrainer

    from entropace.integrations.trl import EntropaceGRPOTrainer, resolve_recipe

    variant = cfg["variant"]
    recipe = "grpo" if variant.endswith("grpo") else "eppo+papo"
    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    batch = cfg["prompts_per_step"] * cfg["group"]
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=batch,
            num_generations=cfg["group"],
            max_completion_length=cfg["max_new_tokens"],
            gradient_accumulation_steps=1,
            max_steps=cfg["steps"],
            learning_rate=1e-6,
            lr_scheduler_type="constant",
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            bf16=False,
            seed=cfg["seed"],
            disable_tqdm=True,
            model_init_kwargs={"dtype": torch.float32},
            **resolve_recipe(recipe, max_completion_length=cfg["max_new_tokens"]).trl_args,
        )
        stamps: list[tuple[float, float]] = []  # (wall, this process's CPU time)

        class Clock(transformers.TrainerCallback):
            def on_train_begin(self, *a: Any, **k: Any) -> None:
                stamps.append((time.perf_counter(), time.process_time()))

            def on_step_end(self, *a: Any, **k: Any) -> None:
                stamps.append((time.perf_counter(), time.process_time()))

        common = dict(
            args=args,
            train_dataset=dataset(cfg["prompts"]),
            callbacks=[Clock()],
        )
        if variant.startswith("plain"):
            trainer = GRPOTrainer(cfg["model"], digit_share, **common)
        else:
            trainer = EntropaceGRPOTrainer(cfg["model"], digit_share, algorithm=recipe, **common)
        stats_time: list[float] = []
        own_time: list[float] = []  # entropace's code per generation batch (see attribution)
        if hasattr(trainer, "_token_stats"):
            from entropace.integrations.trl import stats as stats_module

            collector_time = [0.0]

            def clocked(fn: Any, sink: list[float] | None) -> Any:
                def wrapped(*a: Any, **k: Any) -> Any:
                    t0 = time.perf_counter()
                    result = fn(*a, **k)
                    dt = time.perf_counter() - t0
                    if sink is None:
                        collector_time[0] += dt
                    else:
                        sink.append(dt)
                    return result

                return wrapped

            cls = stats_module.GenerationStats
            cls.__call__ = clocked(cls.__call__, None)  # type: ignore[method-assign]
            cls.finish = clocked(cls.finish, None)  # type: ignore[method-assign]
            trainer._token_stats = clocked(trainer._token_stats, stats_time)
            process = trainer._entropace_process

            def process_clocked(*a: Any, **k: Any) -> Any:
                t0 = time.perf_counter()
                result = process(*a, **k)
                own_time.append(time.perf_counter() - t0 + collector_time[0])
                collector_time[0] = 0.0
                return result

            trainer._entropace_process = process_clocked
        rss_model = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        trainer.train()
        tokens = [row["num_tokens"] for row in trainer.state.log_history if "num_tokens" in row]
    steps = [b[0] - a[0] for a, b in zip(stamps, stamps[1:], strict=False)]
    cpu = [b[1] - a[1] for a, b in zip(stamps, stamps[1:], strict=False)]
    return {
        "variant": variant,
        "step_s": steps,
        "cpu_s": cpu,
        "tokens": [b - a for a, b in zip([0.0, *tokens], tokens, strict=False)],
        "stats_s": stats_time,
        "own_s": own_time,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_start_mib": rss_start,
        "rss_after_load_mib": rss_model,
        "versions": {
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
    }


def run_child(cfg: dict[str, Any]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", json.dumps(cfg)]
    env = {**os.environ, "OMP_NUM_THREADS": str(cfg["threads"])}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"{cfg['variant']} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def model_path(name: str, workdir: str) -> str:
    if name == "tiny":
        from entropace.models.tiny import build_tiny_model

        path = os.path.join(workdir, "tiny")
        model, tokenizer = build_tiny_model(seed=0)
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        return path
    if name == "smollm2-135m":
        from entropace.models import ensure_smollm2

        return str(ensure_smollm2())
    return name


def summarise(results: dict[str, list[dict[str, Any]]], warmup: int) -> dict[str, Any]:
    """Per variant: median step time, statistics-pass time, peak RSS, tokens per step. Per
    pair: the ratio of total step time (steps after warm-up) within each round, its median
    over rounds, and the median of the step-by-step ratios (same data order on both sides)."""
    out: dict[str, Any] = {}
    for variant, runs in results.items():
        steps = [t for r in runs for t in r["step_s"][warmup:]]
        stats = [t for r in runs for t in r["stats_s"][warmup:]]
        own = [
            o / t
            for r in runs
            for o, t in zip(r["own_s"][warmup:], r["step_s"][warmup:], strict=False)
        ]
        tokens = [t for r in runs for t in r["tokens"][warmup:]]
        out[variant] = {
            "step_s": statistics.median(steps),
            "stats_s": statistics.median(stats) if stats else None,
            "own_frac": statistics.median(own) if own else None,
            "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
            "tokens": statistics.mean(tokens) if tokens else float("nan"),
        }
    for ours, plain in PAIRS:
        totals, per_step, cpu = [], [], []
        for a, b in zip(results[ours], results[plain], strict=True):
            sa, sb = a["step_s"][warmup:], b["step_s"][warmup:]
            totals.append(sum(sa) / sum(sb))
            per_step += [x / y for x, y in zip(sa, sb, strict=False)]
            cpu.append(sum(a["cpu_s"][warmup:]) / sum(b["cpu_s"][warmup:]))
        out[f"{ours} / {plain}"] = {
            "ratio": statistics.median(totals),
            "cpu_ratio": statistics.median(cpu),
            "cpu_per_round": cpu,
            "per_round": totals,
            "per_step_median": statistics.median(per_step),
            "peak_rss_delta_mib": out[ours]["peak_rss_mib"] - out[plain]["peak_rss_mib"],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--models",
        default="tiny:4x10,smollm2-135m:1x4",
        help="comma list of model[:RxS] (R rounds of S steps; default --repeats x --steps)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=32, help="dataset size")
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-write", action="store_true")
    ns = parser.parse_args()
    if ns.child is not None:
        print(json.dumps(child(json.loads(ns.child))))
        return
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as work:
        for spec in [m.strip() for m in ns.models.split(",") if m.strip()]:
            name, _, sizes = spec.partition(":")
            repeats, steps = ns.repeats, ns.steps
            if sizes:  # "name:RxS": R rounds of S steps for this model
                repeats, steps = (int(x) for x in sizes.split("x"))
            path = model_path(name, work)
            results: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
            for round_ in range(repeats):
                order = VARIANTS if round_ % 2 == 0 else tuple(reversed(VARIANTS))
                for variant in order:
                    cfg = {
                        "variant": variant,
                        "model": path,
                        "steps": steps,
                        "prompts": ns.prompts,
                        "prompts_per_step": ns.prompts_per_step,
                        "group": ns.group,
                        "max_new_tokens": ns.max_new_tokens,
                        "threads": ns.threads,
                        "seed": ns.seed,
                    }
                    results[variant].append(run_child(cfg))
                    print(name, variant, round_, f"{results[variant][-1]['step_s']}", flush=True)
            report[name] = {
                "rounds": repeats,
                "steps": steps,
                "summary": summarise(results, ns.warmup),
                "versions": results[VARIANTS[0]][0]["versions"],
            }
    text = render(report, ns)
    print(text)
    if not ns.no_write:
        (REPO / "benchmarks" / "results" / "trl_plugin.md").write_text(text)


def render(report: dict[str, Any], ns: argparse.Namespace) -> str:
    argv = " ".join(a for a in sys.argv[1:])
    lines = [
        "# TRL plug-in overhead: GRPOTrainer vs EntropaceGRPOTrainer",
        "",
        f"Command: `python benchmarks/bench_trl_plugin.py {argv}`".replace(" `", "`", 0),
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs (shared "
        f"with other jobs), {ns.threads} torch thread(s) per process, fp32, CPU.",
        f"Workload: {ns.prompts_per_step} prompts x {ns.group} completions per step, <= "
        f"{ns.max_new_tokens} new tokens, tasks {', '.join(TASKS)} (single-turn), "
        f"{ns.warmup} warm-up step(s) excluded; rounds alternate the variants' order.",
        "",
    ]
    for name, entry in report.items():
        s = entry["summary"]
        lines += [
            f"## {name}",
            "",
            f"{entry['rounds']} round(s) of {entry['steps']} steps per variant.",
            "",
            f"Versions: {entry['versions']}",
            "",
            "| variant | step time (s, median) | statistics (s / step) | entropace's own code "
            "(share of the step, median) | tokens / step | peak RSS (MiB) |",
            "|---|---|---|---|---|---|",
        ]
        for v in VARIANTS:
            stats, own = s[v]["stats_s"], s[v]["own_frac"]
            lines.append(
                f"| {v} | {s[v]['step_s']:.3f} | {'-' if stats is None else f'{stats:.4f}'} "
                f"| {'-' if own is None else f'{100 * own:.2f} %'} "
                f"| {s[v]['tokens']:.0f} | {s[v]['peak_rss_mib']:.0f} |"
            )
        lines += [
            "",
            "| ratio (ours / plain) | CPU time, median of rounds (per round) | wall time, "
            "median of rounds (per round) | median of per-step wall ratios | peak RSS delta "
            "(MiB) |",
            "|---|---|---|---|---|",
        ]
        for ours, plain in PAIRS:
            r = s[f"{ours} / {plain}"]
            rounds = ", ".join(f"{x:.3f}" for x in r["per_round"])
            cpu_rounds = ", ".join(f"{x:.3f}" for x in r["cpu_per_round"])
            lines.append(
                f"| {ours} / {plain} | {r['cpu_ratio']:.3f}x ({cpu_rounds}) | "
                f"{r['ratio']:.3f}x ({rounds}) | {r['per_step_median']:.3f}x | "
                f"{r['peak_rss_delta_mib']:+.0f} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
