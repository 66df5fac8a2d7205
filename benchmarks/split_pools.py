"""Distinct train instances per family and difficulty (issue 20's goal: >= 2,000 each).

Fingerprints the first ``--n`` train seeds of household, shop and os (os through
:func:`entropace.envs.os.splits.draw_task`, the generator ``OsEnv.reset`` calls, without
building sandbox archives) and prints the distinct count per difficulty as a Markdown table.

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/split_pools.py --n 20000
"""

from __future__ import annotations

import argparse
import time

from entropace.envs import make
from entropace.envs.base import DIFFICULTIES
from entropace.envs.os.splits import TRAIN_KINDS, draw_task, task_fingerprint
from entropace.envs.registry import seeds


def distinct(family: str, difficulty: str, n: int) -> int:
    if family == "os":
        kinds = TRAIN_KINDS[difficulty]
        return len(
            {task_fingerprint(draw_task(int(s), difficulty, kinds)[2]) for s in seeds("train", n)}
        )
    env = make(family, difficulty=difficulty)
    return len({env.reset(int(s))[1]["fingerprint"] for s in seeds("train", n)})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--families", default="household,shop,os")
    args = p.parse_args()
    print("| family | difficulty | train seeds | distinct | seconds |\n|---|---|---|---|---|")
    for family in args.families.split(","):
        for difficulty in DIFFICULTIES:
            t0 = time.perf_counter()
            k = distinct(family, difficulty, args.n)
            took = time.perf_counter() - t0
            print(f"| {family} | {difficulty} | {args.n} | {k} | {took:.0f} |", flush=True)


if __name__ == "__main__":
    main()
