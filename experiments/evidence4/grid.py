"""Run Evidence IV's pilots or grid (``arms.py``), resumable within and across sessions.

    python experiments/evidence4/grid.py pilots [--out DIR] [--jobs 2]
    python experiments/evidence4/grid.py papo-pilots [--out DIR] [--jobs 2]
    python experiments/evidence4/grid.py grid   [--out DIR] [--jobs 2]

Runs are trained by ``entropace``'s grid runner (``entropace.report.grid.run_grid``: one
``entropace train`` subprocess per run, ``--jobs`` at a time, one torch thread each), seed block
by seed block (every arm of a block before the next block), into ``OUT/<arm>/<algo>/seed<k>``
(default ``OUT``: ``/work/evidence4-runs/<set>``). After each block every finished run's
``config.yaml`` and gzipped ``metrics.jsonl`` are archived under
``experiments/evidence4/data/<set>/<arm>/seed<k>/``, the record that is committed and analysed.
A run archived there counts as done and is never trained again, so a grid interrupted at the
end of a session continues in the next from the committed archive (a run interrupted before its
archive is resumed from its checkpoint when ``OUT`` is still there, else trained anew: a run is
deterministic given its seed, one thread, tests/test_trainer.py).
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import arms as A  # noqa: E402

from entropace.report.grid import plan_grid, run_grid, run_state  # noqa: E402

DATA = HERE / "data"


def plan(which: str) -> tuple[tuple[A.Arm, ...], list[list[int]]]:
    """The arms and seed blocks of ``pilots`` or ``grid``."""
    if which == "pilots":
        return A.PILOT_ARMS, [list(A.PILOT_SEEDS)]
    if which == "papo-pilots":
        return A.PAPO_PILOT_ARMS, [list(A.PILOT_SEEDS)]
    if which == "grid":
        return A.GRID_ARMS, [list(b) for b in A.BLOCKS]
    raise SystemExit(f"unknown set {which!r}: pilots | papo-pilots | grid")


def archived(which: str, arm: A.Arm, seed: int) -> Path:
    return DATA / which / arm.name / f"seed{seed}"


def archive(which: str, arm: A.Arm, seed: int, run_dir: Path) -> None:
    """Copy a finished run's config and gzipped metrics into the committed archive (atomic:
    written under a temporary name, then renamed)."""
    dest = archived(which, arm, seed)
    tmp = dest.with_name(dest.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    shutil.copyfile(run_dir / "config.yaml", tmp / "config.yaml")
    with (
        open(run_dir / "metrics.jsonl", "rb") as src,
        gzip.GzipFile(tmp / "metrics.jsonl.gz", "wb", mtime=0) as dst,
    ):
        shutil.copyfileobj(src, dst)
    tmp.rename(dest)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("set", choices=("pilots", "papo-pilots", "grid"))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    arms, blocks = plan(args.set)
    out = args.out or Path("/work/evidence4-runs") / args.set
    for block in blocks:
        runs, where = [], {}
        for arm in arms:
            for seed in block:
                if (archived(args.set, arm, seed) / "metrics.jsonl.gz").exists():
                    continue
                (run,) = plan_grid(A.PRESET, [arm.algo], [seed], list(arm.overrides), out / arm.name)
                runs.append(run)
                where[run.run_dir] = (arm, seed)
        if not runs:
            print(f"block {block}: archived")
            continue
        t0 = time.time()
        print(f"block {block}: {len(runs)} runs to train ({args.jobs} at a time)", flush=True)
        run_grid(runs, A.PRESET, out, jobs=args.jobs, say=lambda s: print(s, flush=True))
        for run in runs:
            arm, seed = where[run.run_dir]
            if run_state(run.run_dir, A.STEPS) == "done":
                archive(args.set, arm, seed, run.run_dir)
            else:
                print(f"not finished: {arm.name} seed {seed} ({run.run_dir})", flush=True)
        print(f"block {block}: {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
