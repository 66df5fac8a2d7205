"""Where the update's memory goes: the quick preset's batch (G=8) on SmolLM2-135M, variants side by side.

A quick-preset-shaped batch on the embedded SmolLM2-135M: 3 tasks x G=8 trajectories, each group
sharing a prompt (270, 450 and 610 tokens, the quick tasks' range: reasoning 267, kg 487, db 609
with SmolLM2's tokenizer), then two policy turns of 32 tokens around an observation of 40-80
tokens (uneven); rewards with variance in every group, so the update runs its passes. Each
variant runs in a fresh subprocess, in order, ``--repeats`` times (peak RSS is the process's,
``ru_maxrss``):

1. load the model (RSS after load),
2. the rollout's no-grad statistics pass (``sequence_token_stats``, ``rollout.micro_batch_size``
   of the preset, shared prefixes),
3. one ``update_step`` with the quick preset's PPO settings (1 epoch x 2 mini-batches).

Variants are ``key=value`` overrides of the quick preset (``ppo.fused_head``,
``rollout.fused_head``, ``ppo.micro_batch_size``, ``model.gradient_checkpointing``, ...);
an ``ENV:NAME=value`` item sets the child's environment instead (glibc's
``MALLOC_MMAP_THRESHOLD_``, say). ``--prompts 610`` keeps only the longest group: the peak is
set by the largest micro-batch, not by how many there are.
``--profile`` adds, per variant, torch's memory profiler over one micro-batch's forward +
backward (the categories of the live tensors at their peak: parameters, gradients, activations,
temporaries, autograd detail), which ``tracemalloc`` cannot see.

    python benchmarks/bench_update_memory.py --markdown benchmarks/results/update_memory.md \\
        "ppo.fused_head=false rollout.fused_head=false" "" "model.gradient_checkpointing=true"
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

PROMPTS = (270, 450, 610)
G = 8

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_prefix_update import make_batch  # noqa: E402  (the quick-shaped batch, one definition)


def rss_mib() -> float:
    """Current resident set size (``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def profile_micro_batch(learner, batch) -> dict[str, float]:
    """Peak of the live tensors (MiB) by category over one micro-batch's forward + backward,
    from ``torch.profiler``'s memory profile (``profile_memory`` + ``with_stack``)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Category, MemoryProfileTimeline

    from entropace.train.learner import MiniBatch, accumulate_gradients
    from entropace.train.micro_batches import group_micro_batches

    cfg = learner.cfg
    data = MiniBatch(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, loss_mask=batch.loss_mask,
        old_logprobs=batch.old_logprobs, advantages=batch.loss_mask * 0.5,
        eps_low=torch.full((len(batch.rewards), 1), 0.2),
        eps_high=torch.full((len(batch.rewards), 1), 0.28), task_ids=batch.task_ids,
        group_ids=batch.group_ids,
    )  # fmt: skip
    first = group_micro_batches(batch.group_ids, cfg.ppo.micro_batch_size)[-1]  # a 610-token group
    mb = data.select(first)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:  # fmt: skip
        accumulate_gradients(learner, mb)
    timeline = MemoryProfileTimeline(prof._memory_profile())
    times, sizes = timeline._coalesce_timeline("cpu")
    import numpy as np

    sizes = np.array(sizes, dtype=np.float64)  # [T, categories + 1] (column 0: unknown)
    total = sizes.sum(axis=1)
    at = int(total.argmax())
    names = ["unknown"] + [c.name.lower() for c in Category]
    out = {f"prof_{n}_mib": float(sizes[at, i]) / 2**20 for i, n in enumerate(names)}
    out["prof_peak_mib"] = float(total[at]) / 2**20
    learner.optimizer.zero_grad(set_to_none=True)
    return out


def saved_tensors_table(prompt: int = max(PROMPTS)) -> list[str]:
    """The tensors one micro-batch's forward keeps for its backward (a rows pair of the
    ``prompt``-token group, the quick preset's ``ppo.micro_batch_size=2``), by path: unique
    storages seen by ``saved_tensors_hooks`` (parameters excluded), MiB, by last dimension
    (SmolLM2-135M: 1536 = MLP, 576 = hidden / norms / projections, 64 = attention heads,
    49,152 = vocabulary). Exact and independent of the machine's load."""
    import collections

    import torch

    from entropace.models import load_model
    from entropace.rollout import sequence_token_stats
    from entropace.train.recompute import checkpoint_mlps

    model, _ = load_model("smollm2-135m")
    model.train()
    batch = make_batch(model.config.vocab_size, (prompt,), G)
    rows = torch.tensor([0, 1])
    length = int(batch.attention_mask[rows].sum(1).max())
    ids, attn = batch.input_ids[rows, :length], batch.attention_mask[rows, :length]
    loss_mask, groups = batch.loss_mask[rows, :length], batch.group_ids[rows]
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    lines = [f"One micro-batch: 2 rows of the {prompt}-token group, {int(attn.sum())} real "
             "tokens; tensors kept for the backward (MiB):", "",
             "| path | total | d_ff 1536 | d 576 | head 64 | vocab 49152 | other |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    variants = [("plain, materialised head", False, False, False),
                ("shared prefix, materialised head", True, False, False),
                ("shared prefix, fused head", True, True, False),
                ("shared prefix, fused head, checkpoint_mlp", True, True, True)]  # fmt: skip
    for name, share, fused, ckpt in variants:
        if ckpt:
            checkpoint_mlps(model)
        seen: dict[int, tuple[int, int]] = {}

        def pack(t: torch.Tensor, seen=seen) -> torch.Tensor:
            st = t.untyped_storage()
            if st.data_ptr() not in params:
                seen[st.data_ptr()] = (st.nbytes(), t.shape[-1] if t.dim() else 0)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            sequence_token_stats(model, ids, attn, temperature=1.0, loss_mask=loss_mask,
                                 grad=True, groups=groups if share else None, fused_head=fused,
                                 chunk_size=512)  # fmt: skip
        by = collections.Counter()
        for nbytes, last in seen.values():
            by[last if last in (1536, 576, 64, 49152) else -1] += nbytes
        mib = {k: v / 2**20 for k, v in by.items()}
        lines.append(
            f"| {name} | {sum(mib.values()):.0f} | "
            + " | ".join(f"{mib.get(k, 0.0):.0f}" for k in (1536, 576, 64, 49152, -1))
            + " |"
        )
    return lines


def child(overrides: list[str], profile_it: bool, prompts: tuple[int, ...] = PROMPTS) -> dict:
    import torch

    from entropace.rollout import sequence_token_stats
    from entropace.train.config import load_config
    from entropace.train.trainer import build_learner, build_model
    from entropace.train.update import update_step

    torch.manual_seed(0)
    cfg = load_config("quick", overrides, check_envs=False)
    out: dict = {"rss_start_mib": rss_mib()}
    model, _, _ = build_model(cfg.model)
    out["rss_model_mib"] = rss_mib()
    batch = make_batch(model.config.vocab_size, prompts, G)
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.no_grad():
        st = sequence_token_stats(
            model, batch.input_ids, batch.attention_mask, temperature=cfg.rollout.temperature,
            chunk_size=cfg.rollout.stats_chunk_size, micro_batch_size=cfg.rollout.micro_batch_size,
            loss_mask=batch.loss_mask, groups=batch.group_ids if cfg.rollout.share_prefix else None,
            fused_head=cfg.rollout.fused_head,
        )  # fmt: skip
    out.update(stats_s=time.perf_counter() - t0, stats_cpu_s=time.process_time() - c0)
    out["peak_after_stats_mib"] = peak_mib()
    batch.old_logprobs, batch.entropy = st.logprob * batch.loss_mask, st.entropy * batch.loss_mask
    batch.sensitivity = st.sensitivity * batch.loss_mask
    learner = build_learner(cfg, model)
    if profile_it:
        out.update(profile_micro_batch(learner, batch))
    t0, c0 = time.perf_counter(), time.process_time()
    metrics = update_step(learner, batch, generator=torch.Generator().manual_seed(0))
    out.update(update_s=time.perf_counter() - t0, update_cpu_s=time.process_time() - c0,
               loss=metrics["loss"], grad_norm=metrics["grad_norm"])  # fmt: skip
    out["rss_end_mib"] = rss_mib()
    out["peak_rss_mib"] = peak_mib()
    out["tokens"] = int(batch.attention_mask.sum())
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("variants", nargs="*", default=["ppo.fused_head=false rollout.fused_head=false",
                                                   ""])  # fmt: skip
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--prompts", default=",".join(map(str, PROMPTS)),
                   help="prompt lengths, one group of G=8 each (the peak is set by the longest)")  # fmt: skip
    p.add_argument("--markdown", type=Path)
    p.add_argument("--saved-tensors", action="store_true",
                   help="only the table of the tensors one micro-batch keeps for its backward")  # fmt: skip
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.saved_tensors:
        text = "\n".join(saved_tensors_table())
        print(text)
        if args.markdown:
            with args.markdown.open("a") as f:
                f.write("\nCommand: `python benchmarks/bench_update_memory.py --saved-tensors "
                        f"--markdown {args.markdown}` (appends)\n\n{text}\n")  # fmt: skip
        return 0
    if args.child is not None:
        prompts = tuple(int(x) for x in args.prompts.split(","))
        print(json.dumps(child(args.child.split(), args.profile, prompts)))
        return 0
    results: list[tuple[str, dict]] = []
    for _ in range(args.repeats):
        for variant in args.variants:
            # ENV:NAME=value items set the child's environment (e.g. glibc's
            # MALLOC_MMAP_THRESHOLD_); the others are config overrides
            items = variant.split()
            env = dict(os.environ)
            env.update(x[4:].split("=", 1) for x in items if x.startswith("ENV:"))
            overrides = " ".join(x for x in items if not x.startswith("ENV:"))
            cmd = [sys.executable, __file__, "--child", overrides, "--prompts", args.prompts]
            cmd += ["--profile"] if args.profile else []
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                raise SystemExit(f"variant {variant!r} failed:\n{proc.stderr[-3000:]}")
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            results.append((variant or "(defaults)", res))
            print(variant or "(defaults)", res, flush=True)
    lines = [
        "| variant | RSS after load MiB | peak after stats MiB | peak RSS MiB | stats CPU s | "
        "update CPU s | loss | grad norm |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results:
        lines.append(
            f"| `{name}` | {r['rss_model_mib']:.0f} | {r['peak_after_stats_mib']:.0f} | "
            f"{r['peak_rss_mib']:.0f} | {r['stats_cpu_s']:.1f} | {r['update_cpu_s']:.1f} | "
            f"{r['loss']:.6f} | {r['grad_norm']:.6f} |"
        )
    if args.profile:
        cats = [k for k in results[0][1] if k.startswith("prof_")]
        lines += ["", "Memory profile of one micro-batch (live tensors at their peak, MiB):", "",
                  "| variant | " + " | ".join(c[5:-4] for c in cats) + " |",
                  "|---|" + "---|" * len(cats)]  # fmt: skip
        for name, r in results:
            lines.append(f"| `{name}` | " + " | ".join(f"{r[c]:.0f}" for c in cats) + " |")
    base = results[0][1]
    for name, r in results[1:]:
        lines.append(
            f"\n`{name}` vs `{results[0][0]}`: update CPU {base['update_cpu_s'] / r['update_cpu_s']:.2f}x, "
            f"stats CPU {base['stats_cpu_s'] / r['stats_cpu_s']:.2f}x, "
            f"peak RSS {r['peak_rss_mib'] / base['peak_rss_mib']:.2f}x"
        )
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        quoted = " ".join(f'"{v}"' for v in args.variants)
        flags = f"--repeats {args.repeats} --prompts {args.prompts}"
        flags += " --profile" if args.profile else ""
        args.markdown.write_text(
            "# The update's memory (quick batch, G=8, SmolLM2-135M)\n\n"
            f"Command: `python benchmarks/bench_update_memory.py {flags} --markdown "
            f"{args.markdown} {quoted}`\n\n" + (__doc__ or "") + "\n" + text + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
