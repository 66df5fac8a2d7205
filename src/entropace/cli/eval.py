"""``entropace eval RUN``: per-task success of a run's checkpoint on held-out seeds."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from entropace._text import printable


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "eval",
        help="per-task success of a run's checkpoint on held-out (test, test_unseen) seeds",
        description=(
            "Evaluate RUN's latest checkpoint; writes RUN/eval.json and prints a table. Cost: one "
            "greedy episode per task, seed and split, with the run's rollout limits. Measured on "
            "the quiet 2-core machine with the main job's checkpoint (quick preset, SmolLM2-135M "
            "warm start plus its LoRA adapter, 2 threads): --n 20 runs 80 episodes (db and kg, "
            "test and test_unseen) in 1 min 33 s (145 s of CPU time), peak RSS 3.8 GB. --split test "
            "or a smaller --n costs proportionally less."
        ),
    )
    p.add_argument("run", type=Path, metavar="RUN", help="run directory")
    p.add_argument("--tasks", default=None, help="comma-separated tasks (default: the run's)")
    p.add_argument("--n", type=int, default=50, help="seeds per task and split (default 50)")
    p.add_argument(
        "--split",
        default="held_out",
        choices=["held_out", "test", "test_unseen", "train"],
        help="held_out (default): test and test_unseen (n/a for a task without held-out "
        "units); or one split",
    )
    p.add_argument("--checkpoint", type=Path, default=None, help="default: the latest")
    p.add_argument(
        "--sample", action="store_true", help="sample at the run's temperature (default greedy)"
    )
    p.add_argument("--batch-size", type=int, default=64, help="episodes per rollout call")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (with --sample)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from entropace.train.checkpoint import CheckpointError
    from entropace.train.config import ConfigError
    from entropace.train.evaluation import evaluate, format_table

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None
    try:
        result = evaluate(
            args.run, tasks=tasks, n=args.n, split=args.split, checkpoint=args.checkpoint,
            do_sample=args.sample, batch_size=args.batch_size, seed=args.seed,
        )  # fmt: skip
    except (ConfigError, CheckpointError, OSError, KeyError, ValueError) as err:
        # a damaged checkpoint file (named, with the reason), a run file that is a FIFO, a
        # device or a symbolic link (refused, never waited on), a missing checkpoint
        print(f"entropace eval: error: {printable(str(err).splitlines()[0])}", file=sys.stderr)
        return 2
    mode = "sampled" if args.sample else "greedy"
    splits = ", ".join(result["splits"])
    print(f"{args.run} step {result['step']}, splits {splits}, n={args.n} per task, {mode}")
    print(format_table(result))
    print(f"written: {args.run / 'eval.json'}")
    return 0
