"""Trainer benchmark: step-time split, tokens/s, peak memory; EPPO+PAPO vs GRPO update time.

Part 1 (``--steps N``, a real training run): runs ``entropace.train.trainer.train`` for N steps of
a preset (default ``quick``, the embedded SmolLM2-135M on db + kg + reasoning) and reports the
mean time split (generation / statistics / update / step), response tokens per second and the
process's peak resident memory (``ru_maxrss``).

Part 2 (``--ab R``): the overhead of EPPO+PAPO over plain GRPO in the update. One synthetic
rollout batch (random trajectories of the chosen model, loss mask on a response suffix, old
log-probs from the model itself), then ``update_step`` for ``grpo`` and ``eppo+papo`` with the
same aggregation, epochs and mini-batches, alternating, R times each from the same initial
weights; reports median seconds and the ratio (goal <= 1.05).

Usage::

    python benchmarks/bench_trainer.py --steps 2 --ab 5
    python benchmarks/bench_trainer.py --steps 0 --ab 7 --ab-model tiny
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


def part1(preset: str, steps: int, overrides: list[str]) -> dict[str, float]:
    from entropace.train.config import load_config
    from entropace.train.metrics_log import read_metrics
    from entropace.train.trainer import train

    cfg = load_config(preset, [f"steps={steps}", "log.progress=false", *overrides])
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        train(cfg, Path(tmp) / "run")
        wall = time.perf_counter() - t0
        rows = read_metrics(Path(tmp) / "run")
    keys = ["time/generation", "time/stats", "time/update", "time/step", "tokens_per_s"]
    out = {k: statistics.mean(r[k] for r in rows) for k in keys}
    out["response_tokens"] = statistics.mean(r["response_tokens"] for r in rows)
    out["wall_s"] = wall
    out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    return out


def synthetic_batch(model, *, batch: int, length: int, response: int, temperature: float):
    from entropace.rollout import RolloutBatch, sequence_token_stats

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, model.config.vocab_size, (batch, length), generator=g)
    attn = torch.ones(batch, length, dtype=torch.long)
    mask = torch.zeros(batch, length)
    mask[:, length - response :] = 1
    stats = sequence_token_stats(model, ids, attn, temperature=temperature, micro_batch_size=4)
    groups = torch.arange(batch) // 4
    rewards = (torch.rand(batch, generator=g) > 0.5).float()
    return RolloutBatch(
        input_ids=ids, attention_mask=attn, loss_mask=mask,
        old_logprobs=stats.logprob * mask, entropy=stats.entropy * mask,
        sensitivity=stats.sensitivity * mask, rewards=rewards, group_ids=groups,
        task_ids=groups % 3, task_names=["a", "b", "c"], success=rewards > 0,
        abnormal=torch.zeros(batch, dtype=torch.bool), num_turns=torch.ones(batch, dtype=torch.long),
    )  # fmt: skip


def part2(model_name: str, repeats: int, batch: int, length: int, response: int) -> dict:
    from entropace.train.config import load_config
    from entropace.train.trainer import build_learner, build_model
    from entropace.train.update import update_step

    common = ["tasks=a,b,c", "ppo.epochs=1", "ppo.num_minibatches=2", "ppo.micro_batch_size=4",
              "algorithm.agg=token-mean", f"model={model_name}", "optim.lr=1e-6"]  # fmt: skip
    cfgs = {
        name: load_config(None, [*common, f"algo={name}"], check_envs=False)
        for name in ("grpo", "eppo+papo")
    }
    model, _, _ = build_model(cfgs["grpo"].model)
    data = synthetic_batch(
        model, batch=batch, length=length, response=response,
        temperature=cfgs["grpo"].rollout.temperature,
    )  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in cfgs}
    for _ in range(repeats):
        for name, cfg in cfgs.items():
            net = copy.deepcopy(model)
            learner = build_learner(cfg, net)
            t0 = time.perf_counter()
            update_step(learner, data, generator=torch.Generator().manual_seed(0))
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    return {
        "model": model_name, "batch": batch, "length": length, "response": response,
        "median_s": med, "ratio_eppo_papo_over_grpo": med["eppo+papo"] / med["grpo"],
        "all_s": times,
    }  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="quick")
    p.add_argument("--steps", type=int, default=2, help="part 1 training steps (0: skip)")
    p.add_argument("--ab", type=int, default=5, help="part 2 repeats (0: skip)")
    p.add_argument("--ab-model", default="smollm2-135m")
    p.add_argument("--ab-batch", type=int, default=12)
    p.add_argument("--ab-length", type=int, default=512)
    p.add_argument("--ab-response", type=int, default=64)
    p.add_argument("overrides", nargs="*", help="part 1 config overrides")
    args = p.parse_args()
    torch.manual_seed(0)
    report: dict = {"torch_threads": torch.get_num_threads()}
    if args.steps:
        report["train"] = part1(args.preset, args.steps, args.overrides)
        print(json.dumps({"train": report["train"]}, indent=1), flush=True)
    if args.ab:
        report["update_ab"] = part2(
            args.ab_model, args.ab, args.ab_batch, args.ab_length, args.ab_response
        )
        print(json.dumps({"update_ab": report["update_ab"]}, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
