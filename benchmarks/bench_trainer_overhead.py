"""Step-time overhead of EPPO+PAPO over plain GRPO in our trainer (CPU). Goal: <= 1.05x.

The workload of ``bench_trainer_vs_trl.py`` (tiny random Llama from
``build_tiny_model(seed=0)``, single-turn reasoning-gym questions with the shaped reward,
G = 4, 64 new tokens, 2 mini-batches x 1 epoch, micro-batches of 8, AdamW, no KL, one torch
thread per process) with ``--tasks`` (3) task families so that EPPO's pacer has several tasks to
pace: ``bench_basic_arithmetic``, ``bench_chain_sum``, ``bench_word_sorting`` (``--prompts``
(12) per step, split evenly). Two measurements:

A. End to end: ``entropace.train.trainer.train`` with ``algo=grpo`` and ``algo=eppo+papo``,
   each run in its own subprocess, alternately, ``--repeats`` times; per-step wall and CPU
   time (first ``--warmup`` step left out; the pacer and PAPO controller act from step 2).
   Both algorithms sample with the same seeds from the same initial weights, so their
   rollouts start identical and stay close.

B. The update alone, on identical rollout batches: one subprocess collects the rollout
   batches of the trainer's first 3 steps (``collect_rollouts``) and then alternates
   ``update_step`` calls of a GRPO learner and an EPPO+PAPO learner (``build_learner``; each
   with its own copy of the initial weights), both cycling through the same batches,
   ``--update-repeats`` times each after one warm-up call each. This isolates what the
   algorithms add (controllers, polarity reweighting, per-task bounds) from rollout noise;
   ``estimated step ratio = (A's GRPO step CPU time + B's EPPO+PAPO - GRPO update CPU time)
   / A's GRPO step CPU time``.

CPU time (``time.process_time``) is reported next to wall time: on a shared machine the wall
time of a single-threaded process also measures how much of a core the scheduler gave it.

    python benchmarks/bench_trainer_overhead.py [--repeats 3] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_trainer_vs_trl as base  # noqa: E402 (sibling benchmark module)

ALGOS = ("grpo", "eppo+papo")
#: B: distinct rollout batches the update calls cycle through (so the controllers see change).
BATCHES = 3


def child_update(work: base.Workload) -> dict:
    """Measurement B: ``BATCHES`` rollout batches, alternating update steps of the two
    algorithms (call ``i`` of each algorithm consumes batch ``i % BATCHES``)."""
    import torch

    torch.set_num_threads(work.threads)
    from entropace.envs import make
    from entropace.rollout import RolloutRequest, collect_rollouts
    from entropace.train import TaskSampler, build_learner, build_model, load_config, update_step
    from entropace.train.trainer import step_seed

    names = base.bench_task_names(work)
    cfgs = {
        algo: load_config(None, base.ours_overrides(dataclasses.replace(work, algo=algo), names))
        for algo in ALGOS
    }
    cfg = cfgs[ALGOS[0]]
    model, tokenizer, _ = build_model(cfg.model)
    sampler = TaskSampler(cfg.tasks)
    batches = []
    for step in range(1, BATCHES + 1):  # the trainer's first steps' prompts and seeds
        requests = [
            RolloutRequest(
                task=p.task,
                env=functools.partial(make, p.task, difficulty=cfg.tasks.difficulty),
                seed=p.seed,
                group_id=p.group,
            )
            for p in sampler.next_prompts()
            for _ in range(cfg.tasks.group_size)
        ]
        rollout = collect_rollouts(
            model, tokenizer, requests, cfg.rollout, task_names=names, seed=step_seed(cfg, step)
        )
        batches.append(rollout.batch)
    learners = {algo: build_learner(cfgs[algo], copy.deepcopy(model)) for algo in ALGOS}
    times: dict[str, list[tuple[float, float]]] = {algo: [] for algo in ALGOS}
    controls: dict[str, dict[str, float]] = {}
    for rep in range(work.steps):
        order = ALGOS if rep % 2 == 0 else tuple(reversed(ALGOS))
        for algo in order:
            generator = torch.Generator().manual_seed(rep)
            t0, c0 = time.perf_counter(), time.process_time()
            batch = batches[rep % BATCHES]
            metrics = update_step(learners[algo], batch, generator=generator)
            times[algo].append((time.perf_counter() - t0, time.process_time() - c0))
            controls[algo] = {
                k: float(v)
                for k, v in metrics.items()
                if k.endswith(("/eps_low", "/eps_high")) or k.startswith("polarity/w_")
            }
    return {
        "side": "update",
        "times": times,
        "controls": controls,
        "response_tokens": [int(b.loss_mask.sum()) for b in batches],
        "trajectories": batches[0].size,
    }


CHILDREN = {"ours": base.child_ours, "update": child_update}


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _controls_line(controls: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.3f}" for k, v in sorted(controls.items())) or "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    base.add_workload_args(parser, CHILDREN)
    parser.add_argument("--tasks", type=int, default=3, help="task families (1-3)")
    parser.add_argument("--update-repeats", type=int, default=8, help="B: update calls each")
    parser.set_defaults(prompts=12)
    args = parser.parse_args()
    if args.child:
        base.child_main(args, CHILDREN)
        return

    script = str(Path(__file__).resolve())
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, model_desc = base.save_tiny_model(Path(tmp), args)
        work = dataclasses.replace(base.workload_from_args(args, model_dir), tasks=args.tasks)
        if work.prompts % work.tasks:
            raise SystemExit(f"--prompts ({work.prompts}) must be a multiple of --tasks")
        # A: end to end, alternating algorithms
        runs: dict[str, list[dict]] = {algo: [] for algo in ALGOS}
        for r in range(args.repeats):
            for algo in ALGOS if r % 2 == 0 else tuple(reversed(ALGOS)):
                w = dataclasses.replace(work, algo=algo)
                runs[algo].append(base.run_child(sys.executable, script, "ours", w, Path(tmp)))
                print(f"A {r + 1}/{args.repeats}: {algo} done", file=sys.stderr, flush=True)
        # B: the update alone on fixed rollout batches
        w = dataclasses.replace(work, steps=args.update_repeats + 1)
        upd = base.run_child(sys.executable, script, "update", w, Path(tmp))
        print("B done", file=sys.stderr, flush=True)
    load_after = os.getloadavg()

    work_desc = {
        k: v for k, v in dataclasses.asdict(work).items() if k not in ("model_dir", "algo")
    }
    lines += [
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, "
        + ", ".join(f"{k} {v}" for k, v in sorted(runs[ALGOS[0]][0]["versions"].items())),
        f"model: {model_desc}",
        f"workload: {json.dumps(work_desc)}",
        f"load average before: {' '.join(f'{x:.2f}' for x in load_before)}; after: "
        f"{' '.join(f'{x:.2f}' for x in load_after)}; total {time.perf_counter() - t_start:.0f} s",
        "",
        f"A. End to end (train()): medians over {args.repeats} runs x "
        f"{work.steps - work.warmup} measured steps, seconds per step:",
        "",
        "| algorithm | step wall | step CPU | generation | stats | reward | update | other "
        "| generated tok/s | generated tok/CPU-s | peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    summary = {algo: base.summarise(r, work.warmup) for algo, r in runs.items()}
    for algo, s in summary.items():
        lines.append(
            f"| {algo} | {s['wall']:.3f} | {s['cpu']:.3f} | "
            + " | ".join(f"{s[p]:.3f}" for p in base.PHASES)
            + f" | {s['gen_tok_per_s']:.0f} | {s['gen_tok_per_cpu_s']:.0f} | "
            f"{s['peak_rss_mib']:.0f} |"
        )
    g, e = summary["grpo"], summary["eppo+papo"]
    lines += [
        "",
        f"A. step time EPPO+PAPO / GRPO: wall {e['wall'] / g['wall']:.3f}x, "
        f"CPU {e['cpu'] / g['cpu']:.3f}x; update phase wall {e['update'] / g['update']:.3f}x "
        "(goal <= 1.05x)",
        "A. EPPO+PAPO controls at the last step of its first run: "
        + _controls_line(runs["eppo+papo"][0]["steps"][-1]["controls"]),
    ]
    upd_wall = {a: _median([t[0] for t in upd["times"][a][1:]]) for a in ALGOS}
    upd_cpu = {a: _median([t[1] for t in upd["times"][a][1:]]) for a in ALGOS}
    delta_cpu = upd_cpu["eppo+papo"] - upd_cpu["grpo"]
    lines += [
        "",
        f"B. update_step alone on {BATCHES} fixed rollout batches ({upd['trajectories']} "
        f"trajectories, {upd['response_tokens']} response tokens), cycled; median of "
        f"{args.update_repeats} calls after one warm-up call each:",
        "",
        "| algorithm | update wall (s) | update CPU (s) |",
        "|---|---|---|",
        *(f"| {a} | {upd_wall[a]:.4f} | {upd_cpu[a]:.4f} |" for a in ALGOS),
        "",
        f"B. update EPPO+PAPO / GRPO: wall {upd_wall['eppo+papo'] / upd_wall['grpo']:.3f}x, "
        f"CPU {upd_cpu['eppo+papo'] / upd_cpu['grpo']:.3f}x; difference {1000 * delta_cpu:+.1f} ms "
        "CPU per step",
        f"estimated step ratio (A's GRPO step CPU + B's difference) / A's GRPO step CPU: "
        f"{(g['cpu'] + delta_cpu) / g['cpu']:.3f}x (goal <= 1.05x)",
        "B. controls of the last call: "
        + "; ".join(f"{a}: {_controls_line(upd['controls'][a])}" for a in ALGOS),
        "",
        "B. every call (wall s / CPU s), warm-up first:",
        *(f"- {a}: " + ", ".join(f"{w:.3f}/{c:.3f}" for w, c in upd["times"][a]) for a in ALGOS),
        "",
        "A. every step of every run:",
        "",
        *base.step_table(runs, work.warmup),
    ]
    report = "\n".join(lines)
    print(report)
    if args.markdown:
        Path(args.markdown).write_text(report + "\n")


if __name__ == "__main__":
    main()
