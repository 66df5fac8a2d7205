"""Latency of the ``shop`` family: instance generation (reset), step latency, oracle success.

Run: python benchmarks/bench_envs_shop.py [--n 200]

The second table compares the rewards ``exact`` (default) and ``webshop`` (WebShop's
``get_reward``): oracle step latency and success, interleaved seed by seed, the latency of the
``Buy Now`` step alone (where the reward is computed) for a buyer that takes the first search
result, and that buyer's mean reward under each.
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
    print(
        "| difficulty | reset median ms | step median ms | step p95 ms | steps | oracle success |"
    )
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
    reward_table(args.n)


def first_result_buyer(observation: str) -> str:
    """Searches the instruction's words, opens the first result, buys it (no options)."""
    lines = observation.splitlines()
    if "[Search]" in lines:
        return "search[" + lines[0].removeprefix("Instruction: ").split(", and price")[0] + "]"
    if "[Buy Now]" in observation:
        return "click[Buy Now]"
    first = next((ln for ln in lines if ln.startswith("[B0")), None)
    return f"click[{first[1:11]}]" if first else "click[Back to Search]"


def reward_table(n: int) -> None:
    print(f"\nreward='exact' vs reward='webshop', {n} instances per level:\n")
    print(
        "| difficulty | other steps median ms exact / webshop | oracle Buy Now median ms exact "
        "| webshop | webshop/exact | first-result Buy Now ms exact / webshop "
        "| oracle success exact / webshop | first-result buyer mean reward exact / webshop |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for difficulty in DIFFICULTIES:
        steps: dict[str, list[float]] = {"exact": [], "webshop": []}
        buys: dict[str, list[float]] = {"exact": [], "webshop": []}
        oracle_buys: dict[str, list[float]] = {"exact": [], "webshop": []}
        solved = {"exact": 0, "webshop": 0}
        rewards: dict[str, list[float]] = {"exact": [], "webshop": []}
        for seed in range(n):
            for reward in ("exact", "webshop"):  # interleaved: the same load for both
                env = make("shop", difficulty=difficulty, reward=reward)
                env.reset(seed)
                ep = run_episode(env, spec("shop").oracle(env), seed)
                steps[reward] += ep.step_seconds[:-1]  # search, clicks
                oracle_buys[reward].append(ep.step_seconds[-1])  # Buy Now: the reward
                solved[reward] += ep.success
                ep = run_episode(env, first_result_buyer, seed)
                if ep.terminated:
                    buys[reward].append(ep.step_seconds[-1])
                rewards[reward].append(ep.total_reward)
        med = {k: 1e3 * statistics.median(v) for k, v in steps.items()}
        buy = {k: 1e3 * statistics.median(v) for k, v in buys.items()}
        obuy = {k: 1e3 * statistics.median(v) for k, v in oracle_buys.items()}
        print(
            f"| {difficulty} | {med['exact']:.4f} / {med['webshop']:.4f} | {obuy['exact']:.4f} "
            f"| {obuy['webshop']:.4f} | {obuy['webshop'] / obuy['exact']:.1f} "
            f"| {buy['exact']:.4f} / {buy['webshop']:.4f} "
            f"| {solved['exact'] / n:.2f} / {solved['webshop'] / n:.2f} "
            f"| {statistics.mean(rewards['exact']):.3f} / {statistics.mean(rewards['webshop']):.3f} |"
        )


if __name__ == "__main__":
    main()
