"""Forward + backward time of every registered policy loss, and of the advantage functions.

Usage: python benchmarks/bench_policy_losses.py [--batch 32] [--tokens 1024] [--repeats 20]
Recorded output: benchmarks/results/policy_losses.md
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from entropace.algos import POLICY_LOSSES, get_policy_loss, grpo_advantages, rloo_advantages
from entropace.algos.aggregation import loss_counts


def _time(fn, repeats: int) -> float:
    """Median wall time in ms (the machine is shared: the median resists outliers)."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    B, T = args.batch, args.tokens
    g = torch.Generator().manual_seed(0)
    base = torch.randn(B, T, generator=g) - 2.0
    old = base + 0.3 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.2).float()
    num_tokens, num_seqs = loss_counts(mask)
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, B={B}, T={T}, float32, CPU\n")  # fmt: skip
    print("| loss | forward+backward ms (median) | loss value |")
    print("|---|---|---|")
    for name in POLICY_LOSSES:
        fn = get_policy_loss(name)

        def step(fn=fn) -> torch.Tensor:
            lp = base.clone().requires_grad_(True)
            out = fn(lp, old, adv, mask, agg="seq-mean-token-mean",
                     num_tokens=num_tokens, num_seqs=num_seqs)  # fmt: skip
            out.loss.backward()
            return out.loss

        ms = _time(step, args.repeats)
        print(f"| {name} | {ms:.2f} | {step().item():.5f} |")
    rewards = torch.randint(0, 2, (4096,), generator=g).float()
    ids = torch.randint(0, 512, (4096,), generator=g)
    print("\n| advantages (B=4096, 512 groups) | ms |\n|---|---|")
    for name, fn in (("grpo", grpo_advantages), ("rloo", rloo_advantages)):
        print(f"| {name} | {_time(lambda fn=fn: fn(rewards, ids), args.repeats):.2f} |")


if __name__ == "__main__":
    main()
