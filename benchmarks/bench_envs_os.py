"""Benchmark of the ``os`` environment: reset time, step latency, oracle success.

Usage::

    python benchmarks/bench_envs_os.py [--seeds 50] [--out benchmarks/results/envs_os.md]

Per difficulty it measures ``reset`` (instance generation: tree, task, tar archive), the
latency of one ``bash:`` step (a fresh bubblewrap sandbox with the work tree copied in and
out) for a few ordinary commands, and the oracle's success rate on train seeds. It also times
a few hostile commands (bounded by the 5 s per-command limit) and prints a markdown report.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from entropace.envs import DIFFICULTIES, make, seeds, spec
from entropace.envs.checks import run_episode

COMMANDS = (
    "ls -la",
    "find . -type f | wc -l",
    "grep -rh ' ERROR ' logs | sort | head -n 3",
    "cat config/*.conf | head -n 5",
    "echo note > note.txt && wc -c note.txt",
)
HOSTILE = (
    ":(){ :|:& };:",
    "yes",
    "head -c 50000000 /dev/zero > big",
    "setsid sleep 100 &",
    "while :; do :; done",
)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def ms(xs: list[float]) -> str:
    return f"{1000 * statistics.median(xs):.1f} / {1000 * pct(xs, 0.95):.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows, hostile_rows = [], []
    for difficulty in DIFFICULTIES:
        env = make("os", difficulty=difficulty)
        resets, steps, sizes = [], [], []
        for seed in seeds("train", args.seeds):
            t = time.perf_counter()
            env.reset(seed)
            resets.append(time.perf_counter() - t)
            sizes.append(len(env.initial_state))
            for command in COMMANDS:
                t = time.perf_counter()
                env.step(f"bash: {command}")
                steps.append(time.perf_counter() - t)
        solved = 0
        for seed in seeds("train", args.seeds):
            e = make("os", difficulty=difficulty)
            e.reset(seed)
            solved += run_episode(e, spec("os").oracle(e), seed).success
        rows.append(
            f"| {difficulty} | {ms(resets)} | {ms(steps)} | {len(steps)} "
            f"| {statistics.mean(sizes) / 1024:.1f} | {solved}/{args.seeds} |"
        )
    env = make("os", difficulty="medium")
    for command in HOSTILE:
        env.reset(0)
        t = time.perf_counter()
        obs, *_, info = env.step(f"bash: {command}")
        dt = time.perf_counter() - t
        last = obs.strip().splitlines()[-1][:70]
        cell = command.replace("|", "\\|")
        hostile_rows.append(f"| `{cell}` | {1000 * dt:.0f} | {info['timed_out']} | `{last}` |")
    bwrap = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
    report = "\n".join(
        [
            "# `os` environment benchmark",
            "",
            f"Command: `python benchmarks/bench_envs_os.py --seeds {args.seeds}`",
            "",
            f"Machine: {platform.machine()}, Linux {platform.release()}, Python "
            f"{platform.python_version()}, {bwrap}; {os.cpu_count()} CPU cores shared with other "
            f"jobs (load average at the end: {os.getloadavg()[0]:.1f}).",
            "",
            "Times in ms as median / p95. A step is one `bash:` command in a fresh sandbox "
            f"(commands: {', '.join(f'`{c}`' for c in COMMANDS)}), on each of the seeds.",
            "",
            "| difficulty | reset (ms) | bash step (ms) | steps | state (KiB) | oracle |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            "Hostile commands (difficulty medium, 5 s limit): wall time of the step.",
            "",
            "| command | ms | timed out | last line of the observation |",
            "|---|---|---|---|",
            *hostile_rows,
            "",
        ]
    )
    print(report)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
        print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
