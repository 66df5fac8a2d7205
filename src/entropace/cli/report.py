"""``entropace report RUN [RUN ...] [--out DIR]``: figures and pace diagnostics of runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from entropace._text import printable


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="plot and summarise one or several run directories",
        description=(
            "Write PNG figures (one column per run) and summary.md / summary.html / "
            "summary.json with the pace diagnostics (crossovers, trend R^2, spike amplitude)."
        ),
    )
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run directories")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default: RUN/report for one run, ./report for several)",
    )
    p.add_argument(
        "--crossover-ema",
        type=float,
        default=0.9,
        help="EMA beta smoothing the entropy curves before counting crossovers; "
        "0 for none (default 0.9)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from entropace._files import make_dir
    from entropace.report import write_report

    out = args.out
    ema = args.crossover_ema if args.crossover_ema else None
    try:
        if out is None and len(args.runs) == 1:  # RUN/report: refused if a symbolic link
            out = make_dir(args.runs[0] / "report")
        summary = write_report(args.runs, out or Path("report"), crossover_ema=ema)
    except (OSError, ValueError, ImportError) as err:
        # a missing or malformed metrics.jsonl (file and line named), one that is not a
        # regular file (refused, never waited on)
        print(f"entropace report: error: {printable(err)}", file=sys.stderr)
        return 2
    print(f"report written to {summary.parent} ({summary.name}, summary.html, figures)")
    return 0
