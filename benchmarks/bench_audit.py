"""Cost of the polarity audit inside training (``audit.every``), next to the step's update.

One real rollout batch of a preset (default ``lab``: tiny model), then, interleaved ``--repeats``
times on that same batch: ``update_step`` (weights and optimiser restored before each run) and
one audited step (:func:`entropace.train.trainer.start_audit` + ``finish``) per
``max_states`` x ``mode``. CPU time (``time.process_time``, one thread) and wall time, medians.

    python benchmarks/bench_audit.py --preset lab --repeats 5 --markdown benchmarks/results/audit.md
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from pathlib import Path

import torch

from entropace.rollout import collect_rollouts
from entropace.train.config import load_config
from entropace.train.data import TaskSampler
from entropace.train.trainer import (
    build_learner,
    build_model,
    rollout_requests,
    start_audit,
    step_seed,
)
from entropace.train.update import update_step


def timed(fn) -> tuple[float, float]:
    c, w = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c, time.perf_counter() - w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="lab")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--states", default="32,64,128")
    ap.add_argument("--markdown", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)

    cfg = load_config(args.preset, [])
    model, tokenizer, _ = build_model(cfg.model)
    learner = build_learner(cfg, model)
    model.eval()
    prompts = TaskSampler(cfg.tasks).next_prompts()
    batch = collect_rollouts(
        model, tokenizer, rollout_requests(prompts, cfg), cfg.rollout,
        task_names=cfg.tasks.names, seed=step_seed(cfg, 1),
    ).batch  # fmt: skip
    weights = copy.deepcopy(model.state_dict())
    optim = copy.deepcopy(learner.optimizer.state_dict())

    def update() -> None:
        model.load_state_dict(weights)
        learner.optimizer.load_state_dict(optim)
        update_step(learner, batch, generator=torch.Generator().manual_seed(0))
        model.eval()

    variants = [(int(n), mode) for n in args.states.split(",") for mode in ("realised", "both")]
    configs = {
        v: load_config(args.preset, ["audit.every=1", f"audit.max_states={v[0]}", f"audit.mode={v[1]}"])
        for v in variants
    }  # fmt: skip
    times: dict[str, list[tuple[float, float]]] = {"update_step": []}
    for _ in range(args.repeats):
        times["update_step"].append(timed(update))
        for v, c in configs.items():
            model.load_state_dict(weights)

            def audit(c=c) -> None:
                start_audit(c, model, batch, 1).finish(model)

            times.setdefault(f"audit max_states={v[0]} mode={v[1]}", []).append(timed(audit))

    ref = statistics.median(t[0] for t in times["update_step"])
    lines = [
        f"# Polarity audit cost (`{args.preset}` preset)",
        "",
        f"Command: `python benchmarks/bench_audit.py --preset {args.preset} --repeats "
        f"{args.repeats} --states {args.states}`",
        "",
        f"Batch: {batch.size} trajectories x {batch.input_ids.shape[1]} tokens, "
        f"{int(batch.loss_mask.sum())} response tokens; one thread; load average "
        f"{os.getloadavg()[0]:.1f}; medians of {args.repeats} interleaved repeats.",
        "",
        "| what | CPU s | wall s | CPU vs update_step |",
        "|---|---|---|---|",
    ]
    for name, ts in times.items():
        cpu = statistics.median(t[0] for t in ts)
        wall = statistics.median(t[1] for t in ts)
        lines.append(f"| {name} | {cpu:.4f} | {wall:.4f} | {cpu / ref:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown is not None:
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()
