"""Sync vs async rollouts (``rollout.mode``, ``rollout.max_staleness``) side by side.

Runs ``entropace train`` on one preset (default ``quick``: SmolLM2-135M on db + kg +
reasoning) for the same steps in each mode, one after the other, each in a fresh process, and
reports per mode: the steps' wall time (sum of ``time/step``) and the process's wall time
(model load and worker start included), mean generation / update / learner-wait / overlap
seconds per step, the staleness, the clip fractions, and the peak RSS of all the run's
processes together (learner + worker, sampled every 0.2 s with psutil over the process tree).

Threads: the trainer's plan (``entropace.train.threads``) unless ``--threads`` pins them (then
``threads.learner`` / ``threads.rollout``); ``OMP_NUM_THREADS`` is removed from the children's
environment so that the plan, not an inherited setting, decides.

Usage::

    python benchmarks/bench_async.py --steps 3 --modes sync,async1,async2 --out benchmarks/results/async.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

MODES = {
    "sync": ["rollout.mode=sync"],
    "async0": ["rollout.mode=async", "rollout.max_staleness=0"],
    "async1": ["rollout.mode=async", "rollout.max_staleness=1"],
    "async2": ["rollout.mode=async", "rollout.max_staleness=2"],
}


class TreeRSS:
    """Peak of the summed RSS of a process and its descendants, sampled on a thread."""

    def __init__(self, pid: int, every: float = 0.2) -> None:
        self.root, self.every, self.peak = psutil.Process(pid), every, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
                total = 0
                for p in procs:
                    try:
                        total += p.memory_info().rss
                    except psutil.NoSuchProcess:
                        pass
                self.peak = max(self.peak, total)
            except psutil.NoSuchProcess:
                return
            time.sleep(self.every)

    def stop(self) -> int:
        self.done.set()
        self.thread.join()
        return self.peak


def run_mode(preset: str, mode: str, steps: int, overrides: list[str], threads: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    extra = []
    if threads:
        learner, rollout = threads.split(",")
        extra = [f"threads.learner={learner}", f"threads.rollout={rollout}"]
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        cmd = [
            sys.executable, "-m", "entropace.cli", "train", "--preset", preset, f"steps={steps}",
            "log.progress=false", "log.tensorboard=false", *MODES[mode], *extra, *overrides,
            "--run-dir", str(run), "--no-report",
        ]  # fmt: skip
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        rss = TreeRSS(proc.pid)
        log = proc.communicate()[0].decode()
        wall = time.perf_counter() - t0
        peak = rss.stop()
        if proc.returncode != 0:
            raise RuntimeError(f"{mode} failed:\n{log[-3000:]}")
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]

    def mean(key: str) -> float | None:
        vals = [r[key] for r in rows if isinstance(r.get(key), int | float)]
        return statistics.mean(vals) if vals else None

    clip = sorted({k for r in rows for k in r if k.startswith("clip_frac") and "/" not in k})
    return {
        "mode": mode,
        "steps_wall_s": sum(r["time/step"] for r in rows),
        "process_wall_s": wall,
        "per_step": {
            k: mean(k)
            for k in (
                "time/step",
                "time/generation",
                "time/update",
                "time/learner_wait",
                "time/overlap",
                "time/publish",
                "rollout/staleness_mean",
                "rollout/staleness_max",
                "update/trained_rows_frac",
                *clip,
            )
        },  # fmt: skip
        "step_times": [round(r["time/step"], 2) for r in rows],
        "threads": (rows[0].get("threads/learner"), rows[0].get("threads/rollout")),
        "peak_rss_all_mib": peak / 2**20,
        "peak_rss_learner_mib": max(r["memory/peak_rss_mib"] for r in rows),
        "peak_rss_worker_mib": max((r.get("memory/worker_peak_rss_mib") or 0) for r in rows),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="quick")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--modes", default="sync,async1,async2")
    p.add_argument("--threads", default=None, help="'LEARNER,ROLLOUT' (default: the plan)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    report: dict = {"load_before": os.getloadavg(), "cpus": os.cpu_count(), "runs": []}
    for mode in args.modes.split(","):
        result = run_mode(args.preset, mode, args.steps, args.overrides, args.threads)
        result["load_after"] = os.getloadavg()
        report["runs"].append(result)
        print(json.dumps(result), flush=True)
    sync = next((r for r in report["runs"] if r["mode"] == "sync"), None)
    if sync:
        for r in report["runs"]:
            r["steps_wall_over_sync"] = r["steps_wall_s"] / sync["steps_wall_s"]
    report["load_after"] = os.getloadavg()
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
