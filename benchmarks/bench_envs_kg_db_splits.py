"""Content splits of ``kg`` and ``db``: pool sizes, distinct instances and train/test overlap.

    python benchmarks/bench_envs_kg_db_splits.py [--train 20000] [--test 500] [--train-writes 3000]

Issue 20's measurement, repeated on the split families: fingerprint (first observation plus
gold answer, :func:`entropace.envs.splits.fingerprint`) the first ``--test`` seeds of ``test``
and of ``test_unseen`` and count those that occur among the first ``--train`` train seeds; also
the distinct instances among the train seeds, and (kg) the whole pools of each split. ``db``
with every task kind (``kinds=all``) resets a private copy of the database for each write
task, so it runs over ``--train-writes`` train seeds.
"""

from __future__ import annotations

import argparse
import os
import time

from entropace.envs import make
from entropace.envs.splits import SPLITS, fingerprint

DIFFS = ("easy", "medium", "hard")


def _fps(family: str, difficulty: str, split: str, n: int, **options: object) -> set[str]:
    env = make(family, difficulty=difficulty, **options)
    out = set()
    for seed in SPLITS[split][:n]:
        obs, info = env.reset(seed)
        out.add(fingerprint(obs, info["gold"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", type=int, default=20_000)
    ap.add_argument("--test", type=int, default=500)
    ap.add_argument("--train-writes", type=int, default=3000)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}; {args.train} train / {args.test} test seeds")

    from entropace.envs.kg.splits import pool_sizes

    print(
        "\n| family | difficulty | pool train / test / test_unseen | distinct in train seeds "
        "| test in train | test_unseen in train | seconds |"
    )
    print("|---|---|---|---|---|---|---|")
    for family, options in (("kg", {}), ("db", {"kinds": "select"}), ("db", {"kinds": "all"})):
        for d in DIFFS:
            t = time.perf_counter()
            if family == "kg":
                sizes = pool_sizes(d)
                pools = " / ".join(f"{sum(sizes[s].values()):,}" for s in SPLITS)
            else:
                pools = "implicit (parameter space)"
            n_train = args.train_writes if options.get("kinds") == "all" else args.train
            train = _fps(family, d, "train", n_train, **options)
            test = _fps(family, d, "test", args.test, **options)
            unseen = _fps(family, d, "test_unseen", args.test, **options)
            name = family if family == "kg" else f"db ({options['kinds']})"
            print(
                f"| {name} | {d} | {pools} | {len(train):,} of {n_train:,} "
                f"| {len(test & train)}/{len(test)} "
                f"| {len(unseen & train)}/{len(unseen)} | {time.perf_counter() - t:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
