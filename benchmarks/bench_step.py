"""The whole training step of the quick workload, old path vs new path, side by side.

For each of the quick preset's first ``--steps`` training steps (the trainer's prompts and step
seeds: ``TaskSampler``, ``rollout_requests``, ``step_seed``), each path runs in a fresh
subprocess (the same initial SmolLM2-135M weights, a fresh learner), alternating old / new
(new / old on even steps), so the two share the machine's noise:

1. ``collect_rollouts`` with the path's rollout settings (generation + statistics),
2. ``update_step`` on that batch. With ``--force-update`` (default) the rewards are replaced
   by a fixed pattern with variance in every group (``1, 0, 0, 1, ...``), the same for both
   paths, so every measured step runs the update's forward + backward passes (the quick
   preset's 135M model rarely gets reward variance on its own; a zero-advantage step skips
   them).

Paths: ``old`` = every issue-12 switch off (``rollout.share_prefix``, ``rollout.reuse_kv``,
``rollout.fused_head``, ``ppo.share_prefix``, ``ppo.fused_head`` false,
``rollout.stats_from_generation`` false, ``ppo.checkpoint_mlp`` / ``checkpoint_norms`` /
``skip_inert`` false, ``ppo.micro_batch_tokens`` null); ``new`` = the preset as shipped. Settings that are not
issue-12 switches (``rollout.generation_batch_size``, micro-batch rows) are the preset's in
both paths, so both sample the same tokens. As in the trainer, large allocations get their own
mappings and freed heap memory is returned after the rollout (``entropace.train.memory``). Reported per step and path: generation / statistics / update CPU seconds (process
CPU time: on a shared machine wall times swing with the other jobs' load), wall seconds, peak
RSS of the process (``ru_maxrss``: model load, rollout and update), and whether both paths
sampled the same tokens. ``--check-stats`` also recomputes the new path's statistics with the
statistics pass and reports the largest difference (when the preset takes them from
generation).

    python benchmarks/bench_step.py --steps 2 --markdown benchmarks/results/step.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

OLD = [
    "rollout.share_prefix=false", "rollout.reuse_kv=false", "rollout.fused_head=false",
    "rollout.stats_from_generation=false", "ppo.share_prefix=false", "ppo.fused_head=false",
    "ppo.checkpoint_mlp=false", "ppo.checkpoint_norms=false", "ppo.skip_inert=false",
    "ppo.micro_batch_tokens=null",
]  # fmt: skip


def child(preset: str, overrides: list[str], step: int, force: bool, check: bool) -> dict:
    import torch

    from entropace.rollout import collect_rollouts, sequence_token_stats
    from entropace.train.config import load_config
    from entropace.train.data import TaskSampler
    from entropace.train.memory import release_memory, tune_allocator
    from entropace.train.trainer import build_learner, build_model, rollout_requests, step_seed
    from entropace.train.update import update_step

    cfg = load_config(preset, overrides)
    tune_allocator()  # as the trainer does at its start
    torch.manual_seed(cfg.seed)
    model, tok, _ = build_model(cfg.model)
    sampler = TaskSampler(cfg.tasks)
    for _ in range(step):
        prompts = sampler.next_prompts()
    requests = rollout_requests(prompts, cfg)
    learner = build_learner(cfg, model)
    model.eval()
    c0, w0 = time.process_time(), time.perf_counter()
    result = collect_rollouts(model, tok, requests, cfg.rollout, task_names=cfg.tasks.names,
                              seed=step_seed(cfg, step))  # fmt: skip
    rollout_cpu, rollout_wall = time.process_time() - c0, time.perf_counter() - w0
    release_memory()  # as the trainer does between the rollout and the update
    batch = result.batch
    out: dict[str, Any] = {
        "generation_s": result.timings["generation_s"],
        "stats_s": result.timings["stats_s"],
        "rollout_cpu_s": rollout_cpu,
        "rollout_s": rollout_wall,
        "episodes": result.counts["episodes"],
        "generated_tokens": result.counts["generated_tokens"],
        "ids_hash": hash(tuple(batch.input_ids.flatten().tolist())),
        "real_reward_variance_groups": sum(  # max > min: exact (a float std has round-off)
            bool(r.max() > r.min())
            for r in (batch.rewards[batch.group_ids == g] for g in batch.group_ids.unique())
        ),
    }
    if check:
        with torch.no_grad():
            st = sequence_token_stats(model, batch.input_ids, batch.attention_mask,
                                      temperature=cfg.rollout.temperature,
                                      loss_mask=batch.loss_mask)  # fmt: skip
        on = batch.loss_mask > 0
        out["stats_max_abs_diff"] = {
            "logprob": float((st.logprob - batch.old_logprobs)[on].abs().max()),
            "entropy": float((st.entropy - batch.entropy)[on].abs().max()),
            "sensitivity": float((st.sensitivity - batch.sensitivity)[on].abs().max()),
        }
    if force:
        pattern = torch.tensor([1.0, 0.0, 0.0, 1.0])
        batch.rewards = pattern.repeat(len(batch.rewards) // 4 + 1)[: len(batch.rewards)]
    c0, w0 = time.process_time(), time.perf_counter()
    metrics = update_step(learner, batch, generator=torch.Generator().manual_seed(step))
    out.update(
        trained_rows_frac=metrics.get("update/trained_rows_frac", 1.0),
        update_cpu_s=time.process_time() - c0,
        update_s=time.perf_counter() - w0,
        loss=metrics.get("loss"),
        grad_norm=metrics.get("grad_norm"),
        zero_advantage=metrics["update/zero_advantage"],
        peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    )
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--preset", default="quick")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--no-force-update", action="store_true")
    p.add_argument("--check-stats", action="store_true")
    p.add_argument(
        "--set", nargs="*", default=[], help="overrides for both paths, e.g. tasks.mix={}"
    )
    p.add_argument("--markdown", type=Path)
    p.add_argument("--child", nargs=2, metavar=("PATH", "STEP"), help=argparse.SUPPRESS)
    args = p.parse_args()
    force = not args.no_force_update
    if args.child:
        path, step = args.child[0], int(args.child[1])
        overrides = [*args.set, *(OLD if path == "old" else [])]
        res = child(args.preset, overrides, step, force, args.check_stats and path == "new")
        print(json.dumps(res))
        return 0
    load0 = os.getloadavg()
    rows = []
    for step in range(1, args.steps + 1):
        for path in ("old", "new") if step % 2 else ("new", "old"):
            cmd = [sys.executable, __file__, "--preset", args.preset, "--child", path, str(step)]
            cmd += ["--no-force-update"] if not force else []
            cmd += ["--check-stats"] if args.check_stats else []
            cmd += ["--set", *args.set] if args.set else []
            w0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"{path} step {step} failed:\n{proc.stderr[-3000:]}")
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            res.update(step=step, path=path, process_s=time.perf_counter() - w0)
            rows.append(res)
            print(json.dumps(res), flush=True)
    load1 = os.getloadavg()
    lines = [
        f"python {platform.python_version()}, {os.cpu_count()} CPUs; load average before "
        f"{load0[0]:.1f}, after {load1[0]:.1f}; preset `{args.preset}`, "
        f"{'forced' if force else 'real'} rewards",
        "",
        "| step | path | generation s | statistics s | rollout CPU s | update s | update CPU s "
        "| step CPU s | peak RSS MiB | generated tokens | same tokens | loss | grad norm |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by = {(r["step"], r["path"]): r for r in rows}
    for r in rows:
        other = by[(r["step"], "new" if r["path"] == "old" else "old")]
        lines.append(
            f"| {r['step']} | {r['path']} | {r['generation_s']:.1f} | {r['stats_s']:.1f} | "
            f"{r['rollout_cpu_s']:.1f} | {r['update_s']:.1f} | {r['update_cpu_s']:.1f} | "
            f"{r['rollout_cpu_s'] + r['update_cpu_s']:.1f} | {r['peak_rss_mib']:.0f} | "
            f"{r['generated_tokens']} | {'yes' if r['ids_hash'] == other['ids_hash'] else 'no'} | "
            f"{r['loss']:.6f} | {r['grad_norm']:.4f} |"
        )
    tot = {
        path: {
            k: sum(r[k] for r in rows if r["path"] == path)
            for k in ("rollout_cpu_s", "update_cpu_s", "generation_s", "stats_s", "update_s")
        }
        for path in ("old", "new")
    }
    o, n = tot["old"], tot["new"]
    lines += [
        "",
        f"old / new, summed over the steps: step CPU "
        f"{(o['rollout_cpu_s'] + o['update_cpu_s']) / (n['rollout_cpu_s'] + n['update_cpu_s']):.2f}x"
        f", rollout CPU {o['rollout_cpu_s'] / n['rollout_cpu_s']:.2f}x, update CPU "
        f"{o['update_cpu_s'] / n['update_cpu_s']:.2f}x; wall: generation "
        f"{o['generation_s'] / n['generation_s']:.2f}x, update {o['update_s'] / n['update_s']:.2f}x"
        f", step {(o['generation_s'] + o['stats_s'] + o['update_s']) / (n['generation_s'] + n['stats_s'] + n['update_s']):.2f}x"
        f"; peak RSS old {max(r['peak_rss_mib'] for r in rows if r['path'] == 'old'):.0f} MiB, "
        f"new {max(r['peak_rss_mib'] for r in rows if r['path'] == 'new'):.0f} MiB",
    ]
    checks = [r["stats_max_abs_diff"] for r in rows if "stats_max_abs_diff" in r]
    if checks:
        lines.append(f"\nnew path, statistics vs a recomputed statistics pass (max abs): {checks}")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        flags = f"--steps {args.steps}" + (" --no-force-update" if not force else "")
        flags += " --check-stats" if args.check_stats else ""
        flags += (" --set " + " ".join(f"'{x}'" for x in args.set)) if args.set else ""
        args.markdown.write_text(
            "# The whole step, old path vs new path (quick workload)\n\n"
            f"Command: `python benchmarks/bench_step.py {flags} --markdown {args.markdown}`\n\n"
            + (__doc__ or "") + "\n" + text + "\n"
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
