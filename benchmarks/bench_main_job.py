"""The main job over several seeds: does it learn, and what does it cost?

Runs the README's main command, ``entropace train --preset quick --run-dir RUN``, once per run
seed (``seed=S``), each in its own process under ``/usr/bin/time -v``, one after the other,
and tabulates per task the greedy held-out success at step 0 (the warm-started policy, before
any RL) and at the last step (``eval/<task>/success`` in ``RUN/metrics.jsonl``), the mean
sampled entropy of the first and the last step (``task/<task>/entropy``), and per run the
wall time, CPU time (user + sys), peak RSS and the load average (sampled every 10 s while the
run lasts: the machine's other jobs inflate wall time).

With ``--fresh-cache`` the runs use a new ``ENTROPACE_CACHE`` (the converted model and the
environments' data linked in from the usual cache), so a warm start that is not shipped is
built by the first run, as a user's first run does, and the later seeds load it (the warm
start does not depend on the run seed). The build's own time is read from its
``warm_start.json``. The quick preset's warm start is shipped with the package (issue 37), so
no run builds it; ``benchmarks/bench_fresh_clone.py`` times the README's first command from a
fresh clone.

Usage::

    python benchmarks/bench_main_job.py --seeds 0,1,2 --fresh-cache --out /tmp/main_job \\
        --markdown benchmarks/results/main_job_runs.md
    python benchmarks/bench_main_job.py --seeds 0 --out /tmp/probe steps=4   # overrides
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

#: what the fresh cache links in from the usual one (the model and the environments' data)
SHARED_CACHE_ENTRIES = ("models", "downloads", "db", "kg")


def usual_cache() -> Path:
    return Path(os.environ.get("ENTROPACE_CACHE", Path.home() / ".cache" / "entropace"))


def fresh_cache(root: Path) -> Path:
    """A new cache directory sharing the model and data of the usual cache (no warm starts)."""
    cache = root / "cache"
    cache.mkdir(parents=True, exist_ok=False)
    for name in SHARED_CACHE_ENTRIES:
        source = usual_cache() / name
        if source.exists():
            (cache / name).symlink_to(source)
    return cache


class LoadSampler:
    """The 1-minute load average every ``every`` seconds while a run lasts."""

    def __init__(self, every: float = 10.0) -> None:
        self.every, self.samples = every, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(self.every)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def parse_time_v(text: str) -> dict[str, float]:
    """Wall, user, sys seconds and peak RSS (KiB) from ``/usr/bin/time -v``'s report."""

    def field(label: str) -> str:
        match = re.search(rf"{re.escape(label)}: (.+)", text)
        if match is None:
            raise ValueError(f"/usr/bin/time -v output has no {label!r}")
        return match.group(1).strip()

    parts = [float(p) for p in field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")]
    wall = sum(p * 60**i for i, p in enumerate(reversed(parts)))
    return {
        "wall_s": wall,
        "user_s": float(field("User time (seconds)")),
        "sys_s": float(field("System time (seconds)")),
        "peak_rss_kib": float(field("Maximum resident set size (kbytes)")),
    }


def run_summary(run_dir: Path) -> dict[str, Any]:
    """Per task: held-out greedy success at step 0 and at the last evaluation, sampled
    entropy and success of the first and last training steps; from ``metrics.jsonl``."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if line.strip()]  # fmt: skip
    evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
    steps = [r for r in rows if r.get("step", 0) >= 1 and any(k.startswith("task/") for k in r)]
    tasks = sorted({k.split("/")[1] for r in evals for k in r if k.endswith("/success")
                    and k.startswith("eval/") and k.count("/") == 2})  # fmt: skip
    first_eval, last_eval = evals[0], evals[-1]
    out: dict[str, Any] = {"tasks": {}, "eval_steps": [first_eval["step"], last_eval["step"]]}
    for task in tasks:
        key = f"eval/{task}/success"
        ent = [r.get(f"task/{task}/entropy") for r in steps]
        ent = [e for e in ent if e is not None and not math.isnan(e)]
        out["tasks"][task] = {
            "before": first_eval.get(key),
            "after": last_eval.get(key),
            "entropy_first": ent[0] if ent else None,
            "entropy_last": ent[-1] if ent else None,
            "train_success": [r.get(f"task/{task}/success") for r in steps],
        }
    out["eval_mean"] = [first_eval.get("eval/success"), last_eval.get("eval/success")]
    out["steps"] = len(steps)
    return out


def warm_starts(cache: Path) -> set[str]:
    """The keys of the warm starts built in ``cache``."""
    root = cache / "warmstart"
    return {p.name for p in root.iterdir() if (p / "warm_start.json").exists()} if root.exists() else set()


def warm_start_seconds(cache: Path, before: set[str]) -> float | None:
    """The build time of the warm start this run built (one that was not in the cache before
    it), from its ``warm_start.json``; None when the run loaded a cached one."""
    new = warm_starts(cache) - before
    if not new:
        return None
    return sum(json.loads((cache / "warmstart" / k / "warm_start.json").read_text())["seconds"]
               for k in new)  # fmt: skip


def run_one(seed: int, out: Path, cache: Path, preset: str, overrides: list[str]) -> dict[str, Any]:
    run_dir = out / f"seed{seed}"
    cmd = ["/usr/bin/time", "-v", "entropace", "train", "--preset", preset,
           "--run-dir", str(run_dir), f"seed={seed}", *overrides]  # fmt: skip
    env = {**os.environ, "ENTROPACE_CACHE": str(cache)}
    print(f"[seed {seed}] {' '.join(cmd)}", file=sys.stderr, flush=True)
    start = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    log_path = out / f"seed{seed}.log"
    cached = warm_starts(cache)
    with LoadSampler() as load, log_path.open("w") as log:
        proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    log_text = log_path.read_text()
    if proc.returncode != 0:
        raise RuntimeError(f"seed {seed}: exit {proc.returncode}; log in {log_path}")
    result = {"seed": seed, "start": start, **parse_time_v(log_text), **run_summary(run_dir)}
    result["load_mean"] = sum(load.samples) / len(load.samples)
    result["load_max"] = max(load.samples)
    result["warm_start_build_s"] = warm_start_seconds(cache, cached)
    print(f"[seed {seed}] {json.dumps({k: v for k, v in result.items() if k != 'tasks'})}",
          file=sys.stderr, flush=True)  # fmt: skip
    return result


def fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def markdown(results: list[dict[str, Any]], command: str) -> str:
    tasks = list(results[0]["tasks"])
    lines = [f"Command: `{command}`", ""]
    lines += ["| seed | start | wall | CPU (user+sys) | peak RSS | load avg (mean / max) | "
              "warm start built in | steps |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        lines.append(
            f"| {r['seed']} | {r['start']} | {r['wall_s'] / 60:.1f} min | "
            f"{(r['user_s'] + r['sys_s']) / 60:.1f} CPU-min | {r['peak_rss_kib'] / 1e6:.2f} GB | "
            f"{r['load_mean']:.1f} / {r['load_max']:.1f} | "
            f"{fmt(r['warm_start_build_s'], '.0f') + ' s' if r['warm_start_build_s'] else 'cached'}"
            f" | {r['steps']} |"
        )
    lines += ["", "Greedy held-out success (`eval/<task>/success`), step 0 -> last step; sampled "
              "entropy (nats/token) of the first -> last training step:", "",
              "| task | seed | success step 0 | success end | rise | entropy first | "
              "entropy last |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for task in tasks:
        for r in results:
            t = r["tasks"][task]
            rise = None if t["before"] is None or t["after"] is None else t["after"] - t["before"]
            lines.append(
                f"| {task} | {r['seed']} | {fmt(t['before'])} | {fmt(t['after'])} | "
                f"{fmt(rise, '+.3f')} | {fmt(t['entropy_first'])} | {fmt(t['entropy_last'])} |"
            )
        before = [r["tasks"][task]["before"] for r in results]
        after = [r["tasks"][task]["after"] for r in results]
        lines.append(
            f"| {task} | mean | {fmt(sum(before) / len(before))} | {fmt(sum(after) / len(after))}"
            f" | {fmt((sum(after) - sum(before)) / len(after), '+.3f')} | | |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2", help="run seeds, comma-separated (default 0,1,2)")
    p.add_argument("--preset", default="quick")
    p.add_argument("--out", type=Path, required=True, help="a new directory for the runs")
    p.add_argument("--fresh-cache", action="store_true",
                   help="a new ENTROPACE_CACHE under --out: the first run builds the warm start")
    p.add_argument("--markdown", type=Path, default=None, help="write the tables here")
    p.add_argument("overrides", nargs="*", help="config overrides for every run")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=False)
    cache = fresh_cache(args.out) if args.fresh_cache else usual_cache()
    results = [run_one(int(s), args.out, cache, args.preset, args.overrides)
               for s in args.seeds.split(",")]  # fmt: skip
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    command = "python benchmarks/bench_main_job.py " + " ".join(sys.argv[1:])
    table = markdown(results, command)
    print(table)
    if args.markdown is not None:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
