"""Shared prompt prefixes in the statistics pass and the update: plain vs shared, side by side.

A quick-preset-shaped batch on the embedded SmolLM2-135M: 3 tasks x G=4 trajectories, each
group sharing a prompt (270, 450 and 610 tokens, the quick tasks' range), then two policy turns
of 32 tokens around an observation of 40-80 tokens (uneven). Each mode runs in a fresh
subprocess (peak RSS is the process's), alternating, ``--repeats`` times:

- ``stats``: the rollout's no-grad statistics pass, ``sequence_token_stats`` with the quick
  preset's ``rollout.micro_batch_size=4`` and its loss mask;
- ``update``: one ``update_step`` with the quick preset's PPO settings (1 epoch x 2 mini-batches,
  micro-batches of 2) and ``ppo.share_prefix`` off / on.

    python benchmarks/bench_prefix_update.py --repeats 2 --markdown benchmarks/results/prefix_update.md
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

PROMPTS = (270, 450, 610)
G = 4


def make_batch(vocab: int, prompts: tuple[int, ...] = PROMPTS, group: int = G):
    """A quick-shaped batch: ``group`` two-turn trajectories per prompt length (uneven
    observations), rewards ``1, 0, 0, 1, 0, 0, 0, 1`` cut to the group (variance in every group;
    ``group <= 8``)."""
    import torch

    from entropace.rollout import RolloutBatch

    g = torch.Generator().manual_seed(0)
    rows = []
    for k, n in enumerate(prompts):
        prompt = torch.randint(10, vocab, (n,), generator=g)
        for i in range(group):
            obs = 40 + (13 * (3 * k + i)) % 41
            turn = [torch.randint(10, vocab, (32,), generator=g) for _ in range(2)]
            ids = torch.cat(
                [prompt, turn[0], torch.randint(10, vocab, (obs,), generator=g), turn[1]]
            )
            mask = torch.zeros(len(ids))
            mask[n : n + 32] = 1
            mask[n + 32 + obs :] = 1
            rows.append((ids, mask, k))
    length, batch = max(len(r[0]) for r in rows), len(rows)
    input_ids = torch.zeros(batch, length, dtype=torch.long)
    attn = torch.zeros(batch, length, dtype=torch.long)
    loss_mask = torch.zeros(batch, length)
    for i, (ids, mask, _) in enumerate(rows):
        input_ids[i, : len(ids)], attn[i, : len(ids)], loss_mask[i, : len(ids)] = ids, 1, mask
    groups = torch.tensor([k for _, _, k in rows])
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0][:group] * len(prompts))
    zeros = torch.zeros(batch, length)
    return RolloutBatch(
        input_ids=input_ids, attention_mask=attn, loss_mask=loss_mask, old_logprobs=zeros,
        entropy=zeros, sensitivity=zeros, rewards=rewards, group_ids=groups, task_ids=groups,
        task_names=["db", "kg", "reasoning"][: len(prompts)], success=rewards > 0,
        abnormal=torch.zeros(batch, dtype=torch.bool), num_turns=torch.full((batch,), 2),
    )  # fmt: skip


def child(mode: str, share: bool) -> dict:
    import torch

    from entropace.models import load_model
    from entropace.rollout import sequence_token_stats
    from entropace.train.config import load_config
    from entropace.train.trainer import build_learner
    from entropace.train.update import update_step

    torch.manual_seed(0)
    model, _ = load_model("smollm2-135m")
    batch = make_batch(model.config.vocab_size)
    groups = batch.group_ids if share else None
    t0 = time.perf_counter()
    c0 = time.process_time()
    with torch.no_grad():
        st = sequence_token_stats(model, batch.input_ids, batch.attention_mask, temperature=1.0,
                                  chunk_size=512, micro_batch_size=4, loss_mask=batch.loss_mask,
                                  groups=groups)  # fmt: skip
    out = {"stats_s": time.perf_counter() - t0, "stats_cpu_s": time.process_time() - c0}
    if mode == "update":
        batch.old_logprobs, batch.entropy = st.logprob, st.entropy
        batch.sensitivity = st.sensitivity
        cfg = load_config("quick", [f"ppo.share_prefix={str(share).lower()}"], check_envs=False)
        learner = build_learner(cfg, model)
        t0, c0 = time.perf_counter(), time.process_time()
        metrics = update_step(learner, batch, generator=torch.Generator().manual_seed(0))
        out.update(update_s=time.perf_counter() - t0, update_cpu_s=time.process_time() - c0,
                   loss=metrics["loss"], grad_norm=metrics["grad_norm"])  # fmt: skip
    out["tokens"] = int(batch.attention_mask.sum())
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--markdown", type=Path)
    p.add_argument("--child", nargs=2, metavar=("MODE", "SHARE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1] == "1")))
        return 0
    results: dict[str, list[dict]] = {}
    for r in range(args.repeats):
        for share in (False, True) if r % 2 == 0 else (True, False):
            key = "shared" if share else "plain"
            cmd = [sys.executable, __file__, "--child", "update", "1" if share else "0"]
            res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True)
                             .stdout.strip().splitlines()[-1])  # fmt: skip
            results.setdefault(key, []).append(res)
            print(key, res, flush=True)
    lines = ["| path | stats pass s (CPU s) | update s (CPU s) | peak RSS MiB | loss | grad norm |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for key, rows in results.items():
        for res in rows:
            lines.append(
                f"| {key} | {res['stats_s']:.1f} ({res['stats_cpu_s']:.1f}) | "
                f"{res['update_s']:.1f} ({res['update_cpu_s']:.1f}) | {res['peak_rss_mib']:.0f} | "
                f"{res['loss']:.6f} | {res['grad_norm']:.6f} |"
            )
    plain, shared = results["plain"], results["shared"]
    for name in ("stats_s", "update_s", "stats_cpu_s", "update_cpu_s"):
        ratio = sum(r[name] for r in plain) / sum(r[name] for r in shared)
        lines.append(f"\n{name}: plain / shared = {ratio:.2f}x")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        args.markdown.write_text(
            "# Shared prompt prefixes in the statistics pass and the update\n\n"
            f"Command: `python benchmarks/bench_prefix_update.py --repeats {args.repeats} "
            f"--markdown {args.markdown}`\n\n" + (__doc__ or "") + "\n" + text + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
