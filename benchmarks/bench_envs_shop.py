"""Latency of the ``shop`` family: instance generation (reset), step latency, oracle success.

Run: python benchmarks/bench_envs_shop.py [--n 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

from entropace.envs import DIFFICULTIES, make, spec
from entropace.envs.checks import run_episode
from entropace.envs.shop import build_catalogue


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=200, help="instances per difficulty")
    args = parser.parse_args()
    build_catalogue.cache_clear()
    t0 = time.perf_counter()
    make("shop")
    print(f"catalogue + index build (once per process): {1e3 * (time.perf_counter() - t0):.1f} ms")
    print("| difficulty | reset median ms | step median ms | step p95 ms | steps | oracle success |")
    print("|---|---|---|---|---|---|")
    for difficulty in DIFFICULTIES:
        resets, steps, solved = [], [], 0
        for seed in range(args.n):
            env = make("shop", difficulty=difficulty)
            env.reset(seed)  # the oracle reads the instance; run_episode resets again, timed
            ep = run_episode(env, spec("shop").oracle(env), seed)
            resets.append(ep.reset_seconds)
            steps += ep.step_seconds
            solved += ep.success
        print(
            f"| {difficulty} | {1e3 * statistics.median(resets):.3f} | {1e3 * statistics.median(steps):.3f} "
            f"| {1e3 * percentile(steps, 0.95):.3f} | {len(steps)} | {solved / args.n:.2f} |"
        )


if __name__ == "__main__":
    main()
