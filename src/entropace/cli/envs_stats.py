"""``entropace envs stats FAM``: pool sizes, distinct instances and measured split overlap.

For each difficulty it resets ``--n`` seeds of ``train`` and ``--n-test`` seeds of each test
split the family offers (:attr:`~entropace.envs.registry.EnvSpec.splits`), fingerprints each
instance (``info["fingerprint"]`` where the family puts one, else
:func:`entropace.envs.splits.fingerprint` of the first observation and ``info["gold"]``) and
prints, per split, the distinct fingerprints and how many of the split's instances occur in
the measured ``train`` sample (and, for ``test_unseen``, in ``test``). The overlap it prints
is measured, not assumed: an instance counted as overlapping shares its fingerprint with one
of the ``--n`` train instances.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, TextIO

from entropace.envs.base import DIFFICULTIES
from entropace.envs.registry import make, seeds, spec
from entropace.envs.splits import SplitUnavailable, fingerprint

__all__ = ["add_parser", "measure", "split_stats"]


def _fingerprints(env: Any, split: str, n: int) -> list[str]:
    out = []
    for seed in seeds(split, n):  # type: ignore[arg-type]
        obs, info = env.reset(int(seed))
        out.append(info.get("fingerprint") or fingerprint(obs, info.get("gold")))
    return out


def split_stats(name: str, difficulty: str | None, n: int, n_test: int, **options: Any) -> dict:
    """``{"pools": {...}, "splits": {split: {"seeds", "distinct", "in_train", ...}}}`` for one
    difficulty (``None``: the family's default) of family ``name`` (``options`` go to
    :func:`~entropace.envs.make`: family options, ``interface``, ``profile``)."""
    s = spec(name)
    if difficulty is not None:
        options = {"difficulty": difficulty, **options}
    env = make(name, **options)
    train = _fingerprints(env, "train", n)
    train_set = set(train)
    result: dict[str, Any] = {
        "pools": s.pools(difficulty or "easy") if s.pools is not None else {},
        "splits": {"train": {"seeds": n, "distinct": len(train_set)}},
    }
    test_set: set[str] = set()
    for split in ("test", "test_unseen"):
        if split not in s.splits:
            result["splits"][split] = None
            continue
        try:
            prints = _fingerprints(env, split, n_test)
        except SplitUnavailable:
            result["splits"][split] = None
            continue
        row = {
            "seeds": n_test,
            "distinct": len(set(prints)),
            "in_train": sum(p in train_set for p in prints),
        }
        if split == "test":
            test_set = set(prints)
        else:
            row["in_test"] = sum(p in test_set for p in prints)
        result["splits"][split] = row
    close = getattr(env, "close", None)
    if callable(close):
        close()
    return result


def measure(args: argparse.Namespace, out: TextIO) -> int:
    levels = [args.difficulty] if args.difficulty else list(DIFFICULTIES)
    if "difficulty" not in spec(args.name).options:
        levels = [None]  # type: ignore[list-item]
    options = {**dict(args.opt or []), "interface": args.interface, "profile": args.profile}
    options.pop("difficulty", None)
    for level in levels:
        t0 = time.perf_counter()
        r = split_stats(args.name, level, args.n, args.n_test, **options)
        took = time.perf_counter() - t0
        print(f"=== {args.name} difficulty={level or 'default'} ({took:.1f} s)", file=out)
        for key, value in r["pools"].items():
            print(f"pool  {key}: {value}", file=out)
        print(f"{'split':<12}{'seeds':>8}{'distinct':>10}{'in train':>10}{'in test':>9}", file=out)
        for split, row in r["splits"].items():
            if row is None:
                print(f"{split:<12}{'n/a':>8}", file=out)
                continue
            in_train = "-" if split == "train" else str(row["in_train"])
            in_test = str(row["in_test"]) if "in_test" in row else "-"
            print(
                f"{split:<12}{row['seeds']:>8}{row['distinct']:>10}{in_train:>10}{in_test:>9}",
                file=out,
            )
    return 0


def add_parser(sub: argparse._SubParsersAction, env_args: Any, guarded: Any) -> None:
    """Register ``envs stats`` (called from :mod:`entropace.cli.envs`)."""
    p = sub.add_parser(
        "stats",
        help="pool sizes, distinct instances and measured train/test overlap of a family",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    env_args(p)
    p.add_argument("--n", type=int, default=2000, help="train seeds to fingerprint (2000)")
    p.add_argument(
        "--n-test", type=int, default=500, help="seeds of each test split to fingerprint (500)"
    )
    p.set_defaults(func=guarded(lambda args: measure(args, sys.stdout)))
