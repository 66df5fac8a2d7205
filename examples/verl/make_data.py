"""Write verl dataset files for the ``entropace`` agent loop (one row per task instance).

    python examples/verl/make_data.py --out data/entropace --families household,db,kg,os,shop \
        --train 400 --val 40

Rows come from :func:`entropace.integrations.verl.agent_loop.dataset_rows`: ``data_source`` is
the family (the task key of EPPO's pacer), ``agent_name`` is ``entropace``, and
``extra_info.entropace`` names the family, the seed and its options. Train seeds come from the
``train`` split, validation seeds from the disjoint ``test`` split.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("data/entropace"))
    parser.add_argument("--families", default="household,db,kg,os,shop")
    parser.add_argument("--train", type=int, default=400, help="train instances per family")
    parser.add_argument("--val", type=int, default=40, help="validation instances per family")
    parser.add_argument("--difficulty", default=None, help="easy | medium | hard (all families)")
    args = parser.parse_args(argv)

    import pandas as pd

    from entropace.integrations.verl.agent_loop import dataset_rows

    families = [f.strip() for f in args.families.split(",") if f.strip()]
    options = {f: {"difficulty": args.difficulty} for f in families} if args.difficulty else None
    args.out.mkdir(parents=True, exist_ok=True)
    for name, split, n in (("train", "train", args.train), ("val", "test", args.val)):
        rows = dataset_rows(families, n, split=split, options=options)
        path = args.out / f"{name}.parquet"
        pd.DataFrame(rows).to_parquet(path)
        print(f"{path}: {len(rows)} rows ({', '.join(families)})")


if __name__ == "__main__":
    main()
