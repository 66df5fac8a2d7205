"""Generation of the quick workload in several source trees, side by side (issue 31).

Question: did a change between two commits slow the shared-prefix generation path? Each
tree is ``LABEL=PATH`` or ``PATH`` (labelled by its commit). Each measurement runs in a fresh
subprocess with ``PYTHONPATH=<tree>/src``, so it imports that tree's ``entropace`` (the harness code here is the same for every tree and uses only APIs all
have: ``load_config``, ``build_model``, ``TaskSampler``, ``rollout_requests``, ``step_seed``,
``collect_rollouts``). For each of the preset's first ``--steps`` training steps (the trainer's
prompts and step seed), each path runs in each tree, the trees alternating (A B, then B A on
the next path), so all see the same background load:

* ``fast``: the preset as shipped (shared prefixes, key/value reuse, statistics from
  generation);
* ``old``: ``rollout.share_prefix=false rollout.reuse_kv=false`` (the issue's old path; the
  update's ``ppo.share_prefix`` does not touch generation);
* ``old_nostats`` (with ``--old-nostats``): ``old`` plus ``rollout.stats_from_generation=false``,
  the old path of ``benchmarks/results/step_real_rewards.md`` (generation then does not record
  the statistics; they come from a separate pass, ``stats_s``).

Reported per run: ``generation_s`` (the engine's own timer: prefix prefill + every
``generate``), its process CPU time, the statistics pass, generated tokens, positions
prefilled, a hash of the sampled ids (the same tokens in every tree?) and the load average.
Only the rollout runs (no update): the question is generation.

Run: ``python benchmarks/bench_trees.py /work/wt/old-1e885ea . --steps 2
--markdown benchmarks/results/prefix_trees.md``. Each tree runs its own ``quick`` preset: the
measurement in ``benchmarks/results/prefix_trees.md`` compared trees from before 49c04f2, where
``quick`` was the 3-family preset without a warm start.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PATHS: dict[str, list[str]] = {
    "fast": [],
    "old": ["rollout.share_prefix=false", "rollout.reuse_kv=false"],
    "old_nostats": [
        "rollout.share_prefix=false", "rollout.reuse_kv=false",
        "rollout.stats_from_generation=false",
    ],
}  # fmt: skip


def child(preset: str, overrides: list[str], step: int, threads: int) -> dict[str, Any]:
    """One rollout of the preset's training step ``step`` with this process's ``entropace``."""
    import torch

    import entropace
    from entropace.rollout import collect_rollouts
    from entropace.train.config import load_config
    from entropace.train.data import TaskSampler
    from entropace.train.memory import tune_allocator
    from entropace.train.trainer import build_model, rollout_requests, step_seed

    torch.set_num_threads(threads)
    cfg = load_config(preset, overrides)
    tune_allocator()  # as the trainer does at its start
    torch.manual_seed(cfg.seed)
    model, tok, _ = build_model(cfg.model)
    model.eval()
    sampler = TaskSampler(cfg.tasks)
    for _ in range(step):
        prompts = sampler.next_prompts()
    requests = rollout_requests(prompts, cfg)
    c0, w0 = time.process_time(), time.perf_counter()
    result = collect_rollouts(
        model, tok, requests, cfg.rollout, task_names=cfg.tasks.names, seed=step_seed(cfg, step)
    )
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    ids = result.batch.input_ids
    return {
        "entropace": str(Path(entropace.__file__).parent),
        "generation_s": result.timings["generation_s"],
        "stats_s": result.timings["stats_s"],
        "rollout_s": wall,
        "rollout_cpu_s": cpu,
        "generated_tokens": result.counts["generated_tokens"],
        "prefill_tokens": result.counts.get("prefill_tokens"),
        "cached_tokens": result.counts.get("cached_tokens"),
        "episodes": result.counts["episodes"],
        "ids_sha": hashlib.sha1(
            ids.numpy().tobytes() + bytes(str(tuple(ids.shape)), "ascii")
        ).hexdigest()[:12],
        "threads": torch.get_num_threads(),
    }


def label(spec: str) -> tuple[str, Path]:
    """``LABEL=PATH`` or ``PATH`` (labelled by its commit)."""
    name, sep, path = spec.rpartition("=")
    tree = Path(path).resolve()
    if sep:
        return name, tree
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)  # fmt: skip
    return out.stdout.strip() or tree.name, tree


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("trees", nargs="*", help="source trees (repository roots), LABEL=PATH or PATH")
    p.add_argument("--preset", default="quick")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--old-nostats", action="store_true")
    p.add_argument("--markdown", type=Path)
    p.add_argument("--json", type=Path, help="append every run's row to this JSON-lines file")
    p.add_argument("--child", nargs=2, metavar=("PATH", "STEP"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        res = child(args.preset, PATHS[args.child[0]], int(args.child[1]), args.threads)
        print(json.dumps(res))
        return 0
    if len(args.trees) < 2:
        p.error("give at least two source trees")
    named = [label(t) for t in args.trees]
    paths = ["fast", "old"] + (["old_nostats"] if args.old_nostats else [])
    rows: list[dict[str, Any]] = []
    flip = False
    for step in range(1, args.steps + 1):
        for path in paths:
            for name, tree in reversed(named) if flip else named:
                env = {**os.environ, "PYTHONPATH": str(tree / "src"),
                       "OMP_NUM_THREADS": str(args.threads)}  # fmt: skip
                cmd = [sys.executable, __file__, "--preset", args.preset,
                       "--threads", str(args.threads), "--child", path, str(step)]  # fmt: skip
                load = os.getloadavg()[0]
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if proc.returncode != 0:
                    raise SystemExit(f"{tree} {path} step {step} failed:\n{proc.stderr[-3000:]}")
                res = json.loads(proc.stdout.strip().splitlines()[-1])
                res.update(step=step, path=path, tree=name, load1=load,
                           load1_after=os.getloadavg()[0])  # fmt: skip
                rows.append(res)
                print(json.dumps(res), flush=True)
                if args.json:
                    with args.json.open("a") as fh:
                        fh.write(json.dumps(res) + "\n")
            flip = not flip
    text = markdown(rows, named, paths, args.threads, args.preset)
    print(text)
    if args.markdown:
        argv = " ".join(sys.argv[1:])
        args.markdown.write_text(
            "# Generation in several source trees, side by side\n\n"
            f"Command: `python benchmarks/bench_trees.py {argv}`\n\n{text}\n"
        )
    return 0


def markdown(
    rows: list[dict[str, Any]], named: list[tuple[str, Path]], paths: list[str], threads: int,
    preset: str,
) -> str:  # fmt: skip
    """Every run in run order, then per tree and path: generation summed over the steps, its
    ratio to the fast path (summed and per step), the rollout's CPU time."""
    names = [n for n, _ in named]
    cols = ["step", "path", "tree", "generation_s", "rollout_cpu_s", "stats_s",
            "generated_tokens", "prefill_tokens", "ids_sha", "load1", "load1_after"]  # fmt: skip
    lines = [
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, {threads} torch "
        f"threads (OMP_NUM_THREADS={threads}), "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY') or 'unset (spinning)'}, "
        f"preset `{preset}`, "
        "trees " + ", ".join(f"{n} ({t})" for n, t in named) + "; rows in run order",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for r in rows:
        cells = [f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c]) for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "| tree | path | generation s (sum) | path / fast | per step | rollout CPU s (sum) "
        "| CPU path / fast | generated tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        mine = {(r["path"], r["step"]): r for r in rows if r["tree"] == name}
        steps = sorted({s for _, s in mine})
        gen = {p: sum(mine[p, s]["generation_s"] for s in steps) for p in paths}
        cpu = {p: sum(mine[p, s]["rollout_cpu_s"] for s in steps) for p in paths}
        for path in paths:
            per_step = " / ".join(
                f"{mine[path, s]['generation_s'] / mine['fast', s]['generation_s']:.2f}"
                for s in steps
            )
            tokens = " / ".join(str(mine[path, s]["generated_tokens"]) for s in steps)
            lines.append(
                f"| {name} | {path} | {gen[path]:.1f} | {gen[path] / gen['fast']:.2f} | "
                f"{per_step} | {cpu[path]:.1f} | {cpu[path] / cpu['fast']:.2f} | {tokens} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
