"""Benchmark of the ``reasoning`` family: instance generation (reset), step (scoring) latency
and oracle success, per difficulty and per reasoning-gym dataset.

    python benchmarks/bench_envs_reasoning.py [--episodes 200]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections import defaultdict

from entropace.envs import make, spec
from entropace.envs.reasoning import DATASETS


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=200)
    args = ap.parse_args()
    print(
        f"python {platform.python_version()} on {platform.machine()}, "
        f"{args.episodes} episodes per (difficulty, dataset)\n"
    )
    print(
        "| difficulty | dataset | first reset (ms, builds dataset) | reset median (ms) "
        "| reset p95 (ms) | step median (ms) | step p95 (ms) | oracle success |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for difficulty in ("easy", "medium", "hard"):
        for name in DATASETS:
            env = make("reasoning", difficulty=difficulty, datasets=name)
            t = time.perf_counter()
            env.reset(10**6 + 99_999)
            first = time.perf_counter() - t
            resets, steps, solved = [], [], 0
            for seed in range(args.episodes):
                t = time.perf_counter()
                obs, _ = env.reset(seed)
                resets.append(1000 * (time.perf_counter() - t))
                action = spec("reasoning").oracle(env)(obs)
                t = time.perf_counter()
                _, _, _, _, info = env.step(action)
                steps.append(1000 * (time.perf_counter() - t))
                solved += int(info["success"])
            print(
                f"| {difficulty} | {name} | {1000 * first:.1f} | {statistics.median(resets):.3f} "
                f"| {pct(resets, 0.95):.3f} | {statistics.median(steps):.3f} | {pct(steps, 0.95):.3f} "
                f"| {solved / args.episodes:.3f} |"
            )
    totals: dict[str, list[float]] = defaultdict(list)
    for difficulty in ("easy", "medium", "hard"):
        env = make("reasoning", difficulty=difficulty)
        for seed in range(args.episodes):
            t = time.perf_counter()
            env.reset(seed)
            totals[difficulty].append(1000 * (time.perf_counter() - t))
    print("\nAll datasets mixed (default option):")
    for difficulty, xs in totals.items():
        print(
            f"- {difficulty}: reset median {statistics.median(xs):.3f} ms, p95 {pct(xs, 0.95):.3f} ms"
        )


if __name__ == "__main__":
    main()
