"""Benchmark the ``db`` environment: reset time, step latency, oracle success per difficulty.

Usage::

    python benchmarks/bench_envs_db.py --n 200 > benchmarks/results/envs_db.md

Per difficulty, over seeds ``0..n-1`` (train split), with a fresh environment per seed:

* reset: instance generation (template, parameters, gold SQL) plus the first observation;
* step: every step of the oracle's episode (``SQL: <gold>`` then ``Answer: ...``) plus three
  exploratory queries an agent typically sends first (``SELECT * FROM t LIMIT 5``,
  ``SELECT COUNT(*) FROM t``, ``SELECT DISTINCT c FROM t``), on a random table;
* oracle success: fraction of seeds the scripted oracle solves.

Write tasks (``kinds="insert,update,delete"``), per difficulty, the same way: reset (instance
generation including the gold statements on a private copy, plus the agent's own private
copy), the three exploratory queries, each gold statement (``SQL: INSERT/UPDATE/DELETE ...``)
and ``Answer: done`` (the final-state comparison), timed separately by action type. Then the
worst case of the comparison: ``Answer`` after the agent duplicated all 27,004 flights.

The database build (once per cache) is timed separately and excluded from the above.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import tempfile
import time

from entropace.envs import make, spec
from entropace.envs.db.build import SOURCES, database_path
from entropace.envs.db.questions import trusted_connection


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def _explore_actions(database: str, rng: random.Random) -> list[str]:
    conn = trusted_connection(database)
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
        )
    ]
    table = rng.choice(sorted(tables))
    column = rng.choice([r[1] for r in conn.execute(f"PRAGMA table_info({table})")])
    return [
        f"SQL: SELECT * FROM {table} LIMIT 5",
        f"SQL: SELECT COUNT(*) FROM {table}",
        f"SQL: SELECT DISTINCT {column} FROM {table}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=200, help="seeds per difficulty")
    args = parser.parse_args()

    # Fresh builds into a throw-away cache (what a first run costs), then the real cache.
    build_times = {}
    with tempfile.TemporaryDirectory() as tmp:
        old = os.environ.get("ENTROPACE_CACHE")
        os.environ["ENTROPACE_CACHE"] = tmp
        try:
            for name in SOURCES:
                t = time.perf_counter()
                database_path(name, progress=False)
                build_times[name] = time.perf_counter() - t
        finally:
            if old is None:
                del os.environ["ENTROPACE_CACHE"]
            else:
                os.environ["ENTROPACE_CACHE"] = old
    for name in SOURCES:
        database_path(name, progress=False)

    print("# `db` environment benchmark\n")
    print(f"Command: `python benchmarks/bench_envs_db.py --n {args.n}`  ")
    print(
        f"Machine: {platform.processor() or platform.machine()}, Python "
        f"{platform.python_version()}, SQLite {__import__('sqlite3').sqlite_version}, "
        f"{os.cpu_count()} CPUs, load average at start {os.getloadavg()[0]:.1f}\n"
    )
    print(
        "One-time database build (into the cache): "
        + ", ".join(f"{k} {v:.2f} s" for k, v in build_times.items())
        + ".\n"
    )
    print(
        "| difficulty | seeds | oracle success | reset median ms | reset p95 ms "
        "| steps | step median ms | step p95 ms | step max ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    s = spec("db")
    rng = random.Random(0)
    all_steps: list[float] = []
    for difficulty in ("easy", "medium", "hard"):
        resets, steps = [], []
        solved = 0
        for seed in range(args.n):
            env = make("db", difficulty=difficulty)
            t = time.perf_counter()
            _, info = env.reset(seed)
            resets.append(time.perf_counter() - t)
            for action in _explore_actions(info["database"], rng):
                t = time.perf_counter()
                env.step(action)
                steps.append(time.perf_counter() - t)
            policy = s.oracle(env)
            obs = ""
            while True:
                action = policy(obs)
                t = time.perf_counter()
                obs, _, terminated, truncated, step_info = env.step(action)
                steps.append(time.perf_counter() - t)
                if terminated or truncated:
                    solved += int(step_info["success"])
                    break
        all_steps += steps
        print(
            f"| {difficulty} | {args.n} | {solved / args.n:.3f} "
            f"| {statistics.median(resets) * 1e3:.2f} | {_pct(resets, 0.95) * 1e3:.2f} "
            f"| {len(steps)} | {statistics.median(steps) * 1e3:.2f} "
            f"| {_pct(steps, 0.95) * 1e3:.2f} | {max(steps) * 1e3:.2f} |"
        )
    print(
        f"\nAll steps: median {statistics.median(all_steps) * 1e3:.2f} ms, "
        f"p95 {_pct(all_steps, 0.95) * 1e3:.2f} ms (goal: p95 < 50 ms)."
    )
    _bench_writes(args.n, rng)
    _bench_guard()


def _bench_guard(repeats: int = 15) -> None:
    """Cost of the statement guard: one heavy read with three progress handlers, interleaved."""
    from entropace.envs.db.sandbox import StatementGuard, connect_readonly

    conn = connect_readonly(database_path("flights"))
    query = (
        "SELECT a.name, COUNT(*) AS n FROM flights f JOIN airlines a ON a.carrier = f.carrier "
        "JOIN planes p ON p.tailnum = f.tailnum GROUP BY a.carrier ORDER BY n DESC"
    )

    def time_only(timeout_s: float):
        deadline = time.perf_counter() + timeout_s
        return lambda: int(time.perf_counter() > deadline)

    times: dict[str, list[float]] = {"guard": [], "time-only handler": [], "no handler": []}
    for _ in range(repeats):
        for name in times:
            handler = {"guard": StatementGuard, "time-only handler": time_only}.get(name)
            conn.set_progress_handler(handler(10.0) if handler else None, 1000)
            t = time.perf_counter()
            conn.execute(query).fetchall()
            times[name].append(time.perf_counter() - t)
            conn.set_progress_handler(None, 0)
    conn.close()
    print(
        f"\nStatement guard cost (3-table GROUP BY over all flights, median of {repeats} "
        "interleaved runs): "
        + ", ".join(f"{k} {statistics.median(v) * 1e3:.1f} ms" for k, v in times.items())
        + "."
    )


def _ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:.2f} / {_pct(xs, 0.95) * 1e3:.2f}"


def _bench_writes(n: int, rng: random.Random) -> None:
    """Write tasks: reset, reads, writes and the final comparison, per difficulty."""
    from entropace.envs.db.private import PrivateDb

    print('\n## Write tasks (`kinds="insert,update,delete"`)\n')
    print(
        "| difficulty | seeds | oracle success | reset median / p95 ms | read steps median / p95 "
        "ms | write steps | write median / p95 ms | Answer (compare) median / p95 ms | "
        "all steps p95 ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    s = spec("db")
    every: list[float] = []
    for difficulty in ("easy", "medium", "hard"):
        resets, reads, writes, answers = [], [], [], []
        solved = 0
        for seed in range(n):
            env = make("db", difficulty=difficulty, kinds="insert,update,delete")
            t = time.perf_counter()
            _, info = env.reset(seed)
            resets.append(time.perf_counter() - t)
            for action in _explore_actions(info["database"], rng):
                t = time.perf_counter()
                env.step(action)
                reads.append(time.perf_counter() - t)
            policy = s.oracle(env)
            obs = ""
            while True:
                action = policy(obs)
                t = time.perf_counter()
                obs, _, terminated, truncated, step_info = env.step(action)
                dt = time.perf_counter() - t
                (answers if action.startswith("Answer:") else writes).append(dt)
                if terminated or truncated:
                    solved += int(step_info["success"])
                    break
        every += reads + writes + answers
        print(
            f"| {difficulty} | {n} | {solved / n:.3f} | {_ms(resets)} | {_ms(reads)} "
            f"| {len(writes)} | {_ms(writes)} | {_ms(answers)} "
            f"| {_pct(reads + writes + answers, 0.95) * 1e3:.2f} |"
        )
    print(
        f"\nAll write-task steps: median {statistics.median(every) * 1e3:.2f} ms, "
        f"p95 {_pct(every, 0.95) * 1e3:.2f} ms."
    )
    copies = {}
    for database, table in (("chinook", "tracks"), ("flights", "flights")):
        times = []
        for _ in range(20):
            t = time.perf_counter()
            PrivateDb(database, [table]).close()
            times.append(time.perf_counter() - t)
        copies[database] = statistics.median(times)
    db = PrivateDb("flights", ["flights"])
    t = time.perf_counter()
    res = db.execute("INSERT INTO flights SELECT * FROM flights", timeout_s=10.0)
    dup = time.perf_counter() - t
    t = time.perf_counter()
    diff = db.diff()
    worst = time.perf_counter() - t
    db.close()
    print(
        "\nPrivate copy (backup API into memory + change-log triggers), median of 20: "
        + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in copies.items())
        + f". Worst case of the comparison: `INSERT INTO flights SELECT * FROM flights` "
        f"({res.rows_changed} rows) {dup * 1e3:.0f} ms, then the diff of {len(diff)} rows "
        f"{worst * 1e3:.0f} ms."
    )


if __name__ == "__main__":
    main()
