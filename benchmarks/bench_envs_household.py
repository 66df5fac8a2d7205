"""Latency of the ``household`` family: instance generation (reset), step latency, oracle and
explorer success.

Run: python benchmarks/bench_envs_household.py [--n 200]

The explorer is the non-privileged scripted baseline (it reads observations only); its success
within the turn limit and its median number of turns show how hard each level is to search.

The second table runs the oracle with the AgentBench-ALFWorld options off and on
(``action_list``, ``nearest_action``, ``repeat_limit=3``), interleaved seed by seed, and a
"sloppy" oracle (a "the" before every name: ``go to the fridge 1``) with the options on, whose
every command goes through the nearest-admissible BLEU mapping (the slowest path).
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

from entropace.envs import DIFFICULTIES, make, spec
from entropace.envs.checks import run_episode
from entropace.envs.household import generate
from entropace.envs.household.explorer import Explorer
from entropace.envs.household.generate import candidates, tables


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=200, help="instances per difficulty")
    args = parser.parse_args()
    t0 = time.perf_counter()
    tables()
    for difficulty in DIFFICULTIES:
        for seed in range(20):  # fills the per-(difficulty, task type) candidate tables
            generate(seed, difficulty)
    print(
        f"tables + candidate lists (once per process): {1e3 * (time.perf_counter() - t0):.1f} ms "
        f"({candidates.cache_info().currsize} candidate lists)"
    )
    print(
        "| difficulty | reset median ms | reset p95 ms | step median ms | step p95 ms | steps "
        "| oracle success | oracle turns (median) | explorer success "
        "| explorer turns (median, p90) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for difficulty in DIFFICULTIES:
        resets, steps, solved, turns = [], [], 0, []
        for seed in range(args.n):
            env = make("household", difficulty=difficulty)
            env.reset(seed)  # the oracle reads the instance; run_episode resets again, timed
            ep = run_episode(env, spec("household").oracle(env), seed)
            resets.append(ep.reset_seconds)
            steps += ep.step_seconds
            solved += ep.success
            turns.append(ep.last_info["turn"])
        explored, explorer_turns = 0, []
        for seed in range(args.n):
            env = make("household", difficulty=difficulty)
            obs, _ = env.reset(seed)
            policy = Explorer(obs)
            while True:
                obs, _r, terminated, truncated, info = env.step(policy(obs))
                if terminated or truncated:
                    explored += info["success"]
                    explorer_turns.append(info["turn"])
                    break
        print(
            f"| {difficulty} | {1e3 * statistics.median(resets):.3f} "
            f"| {1e3 * percentile(resets, 0.95):.3f} | {1e3 * statistics.median(steps):.3f} "
            f"| {1e3 * percentile(steps, 0.95):.3f} | {len(steps)} | {solved / args.n:.2f} "
            f"| {statistics.median(turns):.0f} | {explored / args.n:.3f} "
            f"| {statistics.median(explorer_turns):.0f}, {percentile(explorer_turns, 0.9):.0f} |"
        )
    agentbench_table(args.n)


AGENTBENCH = {"action_list": True, "nearest_action": True, "repeat_limit": 3}


def _sloppy(policy):  # noqa: ANN001, ANN202 - a policy wrapper
    return lambda obs: re.sub(r"\b([a-z]+ \d+)", r"the \1", policy(obs))


def _timed_episode(env, policy, seed: int) -> tuple[list[float], list[float], bool]:  # noqa: ANN001
    """Wall and CPU (process) seconds of every step, and success."""
    obs, _ = env.reset(seed)
    wall: list[float] = []
    cpu: list[float] = []
    while True:
        action = policy(obs)
        t, c = time.perf_counter(), time.process_time()
        obs, _r, terminated, truncated, info = env.step(action)
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        if terminated or truncated:
            return wall, cpu, bool(info["success"])


def agentbench_table(n: int) -> None:
    """Step latency and success with the AgentBench options off vs on, side by side.

    Wall-clock p95 on a loaded shared machine is dominated by preemption, so the CPU time of
    the slowest path (the sloppy oracle's BLEU mapping) is given too.
    """
    print(f"\nAgentBench-ALFWorld options off vs on ({AGENTBENCH}), {n} instances per level:\n")
    print(
        "| difficulty | oracle off step median ms | oracle on | on/off | oracle off p95 | on p95 "
        "| sloppy oracle on step median ms | sloppy on p95 (wall) | sloppy on p95 (CPU) "
        "| success off / on / sloppy on |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for difficulty in DIFFICULTIES:
        steps: dict[str, list[float]] = {"off": [], "on": [], "sloppy": []}
        cpu: list[float] = []
        solved = {"off": 0, "on": 0, "sloppy": 0}
        for seed in range(n):  # interleaved: the three runs of a seed see the same load
            for key in ("off", "on", "sloppy"):
                env = make(
                    "household", difficulty=difficulty, **({} if key == "off" else AGENTBENCH)
                )
                env.reset(seed)
                policy = spec("household").oracle(env)
                wall, cpu_s, ok = _timed_episode(
                    env, _sloppy(policy) if key == "sloppy" else policy, seed
                )
                steps[key] += wall
                solved[key] += ok
                if key == "sloppy":
                    cpu += cpu_s
        med = {k: 1e3 * statistics.median(v) for k, v in steps.items()}
        p95 = {k: 1e3 * percentile(v, 0.95) for k, v in steps.items()}
        print(
            f"| {difficulty} | {med['off']:.4f} | {med['on']:.4f} | {med['on'] / med['off']:.2f} "
            f"| {p95['off']:.4f} | {p95['on']:.4f} | {med['sloppy']:.4f} | {p95['sloppy']:.4f} "
            f"| {1e3 * percentile(cpu, 0.95):.4f} "
            f"| {solved['off'] / n:.2f} / {solved['on'] / n:.2f} / {solved['sloppy'] / n:.2f} |"
        )


if __name__ == "__main__":
    main()
