"""Benchmark of the ``os`` environment: reset time, step latency, oracle success.

Usage::

    python benchmarks/bench_envs_os.py [--seeds 50] [--out benchmarks/results/envs_os.md]

Per difficulty it measures ``reset`` (instance generation: tree, task, tar archive), the
latency of one ``bash:`` step (a fresh bubblewrap sandbox with the work tree copied in and
out) for a few ordinary commands, and the oracle's success rate on train seeds. It also times
a few hostile commands (bounded by the 5 s per-command limit) and prints a markdown report.

The persistent shell (``shell="persistent"``: one bash per episode) is measured side by side
with the fresh one: the same seeds and commands, the two modes' steps interleaved (fresh,
persistent, fresh, ...) so that the machine's load hits both alike; its reset includes
starting the episode's sandbox and shell, and its oracle row covers all its kinds.
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
    shell_rows = []
    for difficulty in DIFFICULTIES:
        fresh = make("os", difficulty=difficulty)
        pers = make("os", difficulty=difficulty, shell="persistent")
        times: dict[str, list[float]] = {"fresh": [], "persistent": [], "reset": []}
        for seed in seeds("train", args.seeds):
            fresh.reset(seed)
            t = time.perf_counter()
            pers.reset(seed)
            times["reset"].append(time.perf_counter() - t)
            for command in COMMANDS:
                for name, e in (("fresh", fresh), ("persistent", pers)):
                    t = time.perf_counter()
                    e.step(f"bash: {command}")
                    times[name].append(time.perf_counter() - t)
        pers.close()
        ratio = statistics.median(times["fresh"]) / statistics.median(times["persistent"])
        solved = 0
        for seed in seeds("train", args.seeds):
            e = make("os", difficulty=difficulty, shell="persistent")
            e.reset(seed)
            solved += run_episode(e, spec("os").oracle(e), seed).success
        shell_rows.append(
            f"| {difficulty} | {ms(times['fresh'])} | {ms(times['persistent'])} | {ratio:.1f}x "
            f"| {ms(times['reset'])} | {solved}/{args.seeds} |"
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
    env = make("os", difficulty="medium", shell="persistent")
    persistent_rows = []
    for command in (*HOSTILE, "sleep 1000", "exit 3", "exec sleep 100"):
        env.reset(0)
        t = time.perf_counter()
        obs, *_, info = env.step(f"bash: {command}")
        dt = time.perf_counter() - t
        after, *_ = env.step("bash: echo alive")
        note = obs.strip().splitlines()[-2][:90] if obs.count("\n") else ""
        cell = command.replace("|", "\\|")
        persistent_rows.append(
            f"| `{cell}` | {1000 * dt:.0f} | {info['timed_out']} | {info['restarted']} "
            f"| `{note.replace('|', '/')}` | {after.splitlines()[0] == 'alive'} |"
        )
    env.close()
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
            "Fresh vs persistent shell, side by side (same seeds and commands, steps "
            "interleaved): one `bash:` step in ms (median / p95), the ratio of the medians, "
            "and the persistent mode's reset (tree + starting the sandbox and its shell) and "
            "its oracle over all its kinds (the fresh kinds plus the process, user, PATH and "
            "edit kinds).",
            "",
            "| difficulty | fresh step (ms) | persistent step (ms) | fresh / persistent "
            "| persistent reset (ms) | persistent oracle |",
            "|---|---|---|---|---|---|",
            *shell_rows,
            "",
            "Hostile commands (difficulty medium, 5 s limit): wall time of the step.",
            "",
            "| command | ms | timed out | last line of the observation |",
            "|---|---|---|---|",
            *hostile_rows,
            "",
            "The same hostile commands (and three that only a long-lived shell has to survive) "
            "in the persistent shell: wall time, the session's note (the line above "
            "`[exit code: N]`), and whether the next command (`echo alive`) works.",
            "",
            "| command | ms | timed out | shell restarted | note | next command ok |",
            "|---|---|---|---|---|---|",
            *persistent_rows,
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
