"""What issue 29's persistent-shell fixes cost: oracle episodes, before (``--before``) and now.

Issue 29 added work at the end of a persistent episode (every process but the shell killed
before the variable probe, the probe's fork check, the open scripts hashed, a heartbeat file
read) and to every command (the command ANSI-C quoted on one line after a blank one). This
runs the scripted oracle of each persistent kind, and a plain command, with the code of
``--before`` (``git archive`` into a temporary directory) and with the working tree's, in two
worker processes driven round by round, so load changes hit both alike. Times are measured
inside the workers (one episode: ``reset`` to the reward).

Run: ``python benchmarks/bench_envs_checkers.py --before ec8ecc2 --rounds 10``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: (kind, difficulty, seed): one instance per persistent kind.
CASES = (
    ("service_pid", "easy", 3),
    ("edit_config", "easy", 16),
    ("stop_worker", "medium", 0),
    ("add_user", "medium", 1),
    ("install_command", "hard", 7),
)

WORKER = r"""
import json, sys, time
from entropace.envs import make
from entropace.envs.os.env import oracle

envs = {}
for line in sys.stdin:
    kind, difficulty, seed = json.loads(line)
    if kind == "command":  # a plain command in a running persistent shell (mean of 10)
        env = envs.setdefault("command", make("os", difficulty="easy", shell="persistent"))
        if env.session is None:
            env.reset(3)
        start = time.perf_counter()
        for _ in range(10):
            env.step("bash: ls -la | wc -l")
        took = (time.perf_counter() - start) / 10
    elif kind.startswith("service_pid "):  # a wrong answer: the PID of another process
        env = envs.setdefault(kind, make("os", difficulty=difficulty, shell="persistent",
                                         kinds=("service_pid",), command_timeout=2.0))
        start = time.perf_counter()
        env.reset(seed)
        script = env.task.commands[0].split()[1]
        start_it = {
            "service_pid (wrong: a sleep's PID)": "sleep 100 & echo $!",
            "service_pid (hack: a loop written over the script)":
                f"printf '#!/bin/bash\\nwhile :; do sleep 100; done\\n' > {script}; "
                f"nohup {script} >/dev/null 2>&1 & echo $!",
        }[kind]
        obs, *_ = env.step("bash: " + start_it)
        pid = obs.split("\n")[0].strip()
        obs, reward, *_ = env.step("answer: " + pid)
        took = time.perf_counter() - start
    else:
        env = envs.setdefault(kind, make("os", difficulty=difficulty, shell="persistent",
                                         kinds=(kind,), command_timeout=2.0))
        start = time.perf_counter()
        env.reset(seed)
        policy, obs, reward = oracle(env), "", None
        while reward is None:
            obs, r, terminated, truncated, _ = env.step(policy(obs))
            if terminated or truncated:
                reward = r
        took = time.perf_counter() - start
        assert reward == 1.0, (kind, seed, obs)
    print(json.dumps([took, reward if kind != "command" else None]), flush=True)
"""


def _worker(src: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env=env,
    )  # fmt: skip


def _ask(proc: subprocess.Popen[str], case: tuple[str, str, int]) -> tuple[float, float | None]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(case) + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"the worker ended during {case}")
    took, reward = json.loads(line)
    return float(took), reward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", default="ec8ecc2", help="git revision of the 'before' code")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    cases = [
        *CASES,
        ("service_pid (wrong: a sleep's PID)", "easy", 3),
        ("service_pid (hack: a loop written over the script)", "easy", 3),
        ("command", "easy", 3),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", args.before, "src"], cwd=ROOT, check=True,
                                 capture_output=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        workers = {"before": _worker(Path(tmp) / "src"), "now": _worker(ROOT / "src")}
        times: dict[tuple[str, str], list[float]] = {}
        rewards: dict[tuple[str, str], set[float | None]] = {}
        try:
            for _ in range(args.rounds):
                for case in cases:
                    for name, proc in workers.items():
                        took, reward = _ask(proc, case)
                        times.setdefault((case[0], name), []).append(took)
                        rewards.setdefault((case[0], name), set()).add(reward)
        finally:
            for proc in workers.values():
                assert proc.stdin is not None
                proc.stdin.close()
                proc.wait(timeout=60)
    print(f"Command: `python benchmarks/bench_envs_checkers.py --before {args.before} "
          f"--rounds {args.rounds}`\n")  # fmt: skip
    print(f"Machine: {platform.machine()}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs; load average at the end: {os.getloadavg()[0]:.1f}.\n")  # fmt: skip
    print(
        "| case | before (ms, median) | now (ms, median) | ratio now / before | reward before / now |"
    )
    print("|---|---|---|---|---|")
    for kind, *_ in cases:
        before = statistics.median(times[(kind, "before")]) * 1e3
        now = statistics.median(times[(kind, "now")]) * 1e3
        label = (
            "one command (`ls -la | wc -l`, mean of 10)"
            if kind == "command"
            else f"`{kind}` episode"
            if " " in kind
            else f"`{kind}` oracle episode"
        )
        paid = " / ".join(
            ", ".join(f"{r:g}" for r in sorted(rewards[(kind, n)])) if kind != "command" else "-"
            for n in ("before", "now")
        )
        print(f"| {label} | {before:.0f} | {now:.0f} | {now / before:.2f} | {paid} |")


if __name__ == "__main__":
    main()
