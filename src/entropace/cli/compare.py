"""``entropace compare``: train a grid of algorithms x seeds, then compare them with CIs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from entropace.report.grid import GridRun

from entropace._text import printable
from entropace.cli import shipped_presets

EPILOG = """\
examples:
  entropace compare --preset quick --algos grpo,eppo,eppo-success --seeds 5 steps=50 --out cmp/
  entropace compare --preset quick --algos grpo,eppo --seeds 3 --out cmp/ --jobs 2
  entropace compare --report cmp/ --baseline grpo --last-k 10    # the report only
  entropace compare --report cmp/ --entropy-window 1:60 --half-life-fraction 0.25

runs go to OUT/<algo>/seed<k>/ (ordinary run directories). Running the same command again
skips finished runs, resumes interrupted ones from their last checkpoint and starts missing
ones; then the report is written into OUT: compare.md, compare.html, compare.json and PNGs.
overrides are key.sub=value as for `entropace train` (algo= and seed= are set by the grid).
OUT is the grid's own directory (not a file, not a run directory); one process at a time
trains into it (a second compare on OUT fails at once, naming the first).

exit status: 0 every run finished and the report is written; 1 a run failed; 2 a usage,
config or --out error; 130 the grid was stopped (Ctrl-C / SIGTERM) with runs unfinished
(the report covers what finished: run the same command again to continue).
"""

#: The exit status of a grid stopped with runs unfinished (128 + SIGINT, as a shell reports).
EXIT_STOPPED = 130


def _algos(text: str) -> list[str]:
    names = [a.strip() for a in text.split(",") if a.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give a comma-separated list, e.g. grpo,eppo")
    return names


def _int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


_positive = _int_at_least(1)
_non_negative = _int_at_least(0)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {value}")
    return value


def _window(text: str) -> tuple[int | None, int | None]:
    """``"A:B"``, ``"A:"`` or ``":B"`` (steps, inclusive) -> ``(A or None, B or None)``."""
    lo, sep, hi = text.partition(":")
    try:
        bounds = tuple(int(x) if x.strip() else None for x in (lo, hi))
    except ValueError:
        bounds = ()
    if not sep or len(bounds) != 2:
        raise argparse.ArgumentTypeError(f"expected FIRST:LAST steps, e.g. 1:60, got {text!r}")
    first, last = bounds
    if first is not None and last is not None and first > last:
        raise argparse.ArgumentTypeError(f"empty window {text!r} (FIRST > LAST)")
    return first, last


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "compare",
        help="train algorithms x seeds and compare them with confidence intervals",
        description=(
            "Train every (algorithm, seed) of a grid with the same preset and overrides "
            "(resumable), then write a comparison: per-task final success, pace diagnostics "
            "and measures (pace_spread, entropy half-lives and pace_gap, held-out success), "
            "eps_k and polarity summaries as mean ± 95% Student-t CI over seeds, and each "
            "algorithm's paired difference to a baseline."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    p.add_argument(
        "--preset",
        default=None,
        help=f"a shipped preset ({shipped_presets()}) or a YAML file",
    )
    p.add_argument("--algos", type=_algos, default=None, metavar="A,B,...", help="algorithms")
    p.add_argument(
        "--seeds", type=_positive, default=3, metavar="N",
        help="number of seeds per algorithm (default 3): seeds S..S+N-1",
    )  # fmt: skip
    p.add_argument("--seed-start", type=int, default=0, metavar="S", help="first seed (default 0)")
    p.add_argument("--out", type=Path, default=None, metavar="DIR", help="grid directory")
    p.add_argument(
        "--jobs", type=_positive, default=1, metavar="N",
        help="runs trained at once, each in a subprocess (default 1: in this process, in order)",
    )  # fmt: skip
    p.add_argument(
        "--report", type=Path, default=None, metavar="DIR",
        help="only write the comparison report of the grid in DIR (no training)",
    )  # fmt: skip
    p.add_argument(
        "--baseline", default="grpo",
        help="algorithm the paired differences are taken against (default grpo)",
    )  # fmt: skip
    p.add_argument(
        "--last-k", type=_positive, default=5, metavar="K",
        help="final success = mean of the last K logged steps (default 5; fewer if shorter)",
    )  # fmt: skip
    p.add_argument(
        "--level", type=float, default=0.95, help="confidence level of the intervals (0.95)"
    )
    p.add_argument(
        "--crossover-ema", type=float, default=0.9,
        help="EMA beta smoothing entropy curves before counting crossovers; 0: none (0.9)",
    )  # fmt: skip
    p.add_argument(
        "--half-life-fraction", type=_fraction, default=0.5, metavar="F",
        help="entropy half-life = the step at which task/<k>/entropy first falls to F of its "
             "value at the first logged step (interpolated; default 0.5)",
    )  # fmt: skip
    p.add_argument(
        "--half-life-hold", type=_non_negative, default=1, metavar="N",
        help="the half-life's crossing must hold for the next N logged steps, so a one-step "
             "dip does not count (default 1; 0: the raw first crossing)",
    )  # fmt: skip
    p.add_argument(
        "--entropy-window", type=_window, default=(None, None), metavar="FIRST:LAST",
        help="steps (inclusive) of the per-task mean entropy entropy_mean/<k>, e.g. 1:60 or 21: "
             "(default: the whole run)",
    )  # fmt: skip
    p.set_defaults(func=run)


def _error(text: str) -> int:
    print(f"entropace compare: error: {printable(text)}", file=sys.stderr)
    return 2


def _report(args: argparse.Namespace, root: Path) -> int:
    from entropace.report.compare import write_compare

    ema = args.crossover_ema if args.crossover_ema else None
    try:
        md = write_compare(
            root, baseline=args.baseline, last_k=args.last_k, level=args.level,
            crossover_ema=ema,
            measures={
                "half_life_fraction": args.half_life_fraction,
                "half_life_hold": args.half_life_hold,
                "entropy_from": args.entropy_window[0],
                "entropy_to": args.entropy_window[1],
            },
        )  # fmt: skip
    except (OSError, ValueError, ImportError) as err:
        return _error(str(err))
    print(f"comparison written to {md.parent} ({md.name}, compare.html, compare.json, PNGs)")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.report is not None:
        if args.preset or args.algos or args.out or args.overrides:
            return _error("--report DIR only reports; it takes no --preset/--algos/--out/overrides")
        return _report(args, args.report)
    missing = [n for n, v in (("--preset", args.preset), ("--algos", args.algos),
                              ("--out", args.out)) if not v]  # fmt: skip
    if missing:
        return _error(f"training a grid needs {', '.join(missing)} (or --report DIR)")

    from entropace.report.grid import check_grid_dir, plan_grid
    from entropace.train.config import ConfigError
    from entropace.train.rundir import RunDirError, lock_run_dir

    seeds = list(range(args.seed_start, args.seed_start + args.seeds))
    try:
        check_grid_dir(args.out)
        runs = plan_grid(args.preset, args.algos, seeds, args.overrides, args.out)
        lock = lock_run_dir(args.out, what="grid directory")  # held until the report is written
    except (ConfigError, ValueError, FileNotFoundError, RunDirError) as err:
        return _error(str(err))
    with lock:
        return _train_grid(args, runs, seeds)


def _train_grid(args: argparse.Namespace, runs: list[GridRun], seeds: list[int]) -> int:
    from entropace.report.grid import run_grid, write_manifest

    write_manifest(args.out, args.preset, args.algos, seeds, args.overrides)
    cfg = runs[0].cfg
    print(
        f"grid {args.out}: {len(args.algos)} algorithms x {len(seeds)} seeds on "
        f"{','.join(cfg.tasks.names)} with {cfg.model.name}, {cfg.steps} steps, "
        f"{args.jobs} at a time",
        file=sys.stderr,
    )

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    try:
        outcomes = run_grid(runs, args.preset, args.out, jobs=args.jobs, say=say)
    except KeyboardInterrupt:
        say(f"interrupted; run the same command again to continue the grid in {args.out}")
        return EXIT_STOPPED
    failed = [o for o in outcomes if o.status == "failed"]
    stopped = [o for o in outcomes if o.status == "stopped"]
    for o in failed:
        say(f"FAILED {o.algo} seed {o.seed}: {o.error}")
    if stopped:
        say(f"{len(stopped)} runs stopped or not started; run the same command again to continue")
    code = _report(args, args.out)
    if failed:
        return 1
    return EXIT_STOPPED if stopped else code
