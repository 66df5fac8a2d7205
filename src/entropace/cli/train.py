"""``entropace train``: train a policy with a preset and overrides, or resume a run."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from entropace._text import printable
from entropace.cli import shipped_presets

EPILOG = """\
examples:
  entropace train --preset quick
  entropace train --preset quick algo=grpo steps=20
  entropace train --preset my.yaml optim.lr=1e-5 --run-dir runs/try1
  entropace train --resume runs/try1 steps=40     # continue (and extend) a run
  entropace train --preset quick --run-dir runs/try1 --overwrite   # move the old run aside

overrides are key.sub=value (YAML values); shortcuts: algo, tasks, model, lr, P, G.
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a policy (EPPO, PAPO, GRPO family) on a task mix",
        description="Train a causal LM with RL on a mixture of environment tasks.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--preset",
        default="quick",
        help=f"a shipped preset ({shipped_presets()}) or a YAML file (default: quick)",
    )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    p.add_argument("--run-dir", type=Path, default=None, help="default: runs/<algo>-<time>")
    p.add_argument(
        "--resume", type=Path, default=None, metavar="RUN",
        help="continue RUN from its latest checkpoint (its config.yaml + overrides)",
    )  # fmt: skip
    p.add_argument(
        "--overwrite", action="store_true",
        help="the run directory holds a run: move it aside to RUN.old-<time> and start anew "
        "(without it, such a directory is refused)",
    )  # fmt: skip
    p.add_argument("--no-report", action="store_true", help="skip writing RUN/report")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from entropace.rollout.worker import RolloutWorkerError
    from entropace.train.checkpoint import CheckpointError, latest_checkpoint
    from entropace.train.config import ConfigError, load_config, load_config_file
    from entropace.train.demos import DemoError
    from entropace.train.learner import NonFiniteTrainingError
    from entropace.train.sft import SFTError
    from entropace.train.trackers import TrackerError, require_trackers
    from entropace.train.trainer import check_run_dir, train
    from entropace.train.warm_start import WarmStartError

    if args.resume is not None and args.overwrite:
        print(
            "entropace train: error: --resume and --overwrite exclude each other", file=sys.stderr
        )
        return 2
    try:
        if args.resume is not None:
            config = args.resume / "config.yaml"
            if not config.exists():
                raise FileNotFoundError(f"--resume {args.resume}: no config.yaml there")
            cfg = load_config_file(config, args.overrides)
            run_dir = args.resume
        else:
            cfg = load_config(args.preset, args.overrides)
            stamp = time.strftime("%Y%m%d-%H%M%S")
            run_dir = args.run_dir or Path("runs") / f"{cfg.algorithm.name}-{stamp}"
        # a refused directory or a missing tracker package is said before the run is announced
        check_run_dir(run_dir, resume=args.resume is not None, overwrite=args.overwrite)
        require_trackers(cfg.log.trackers, cfg.log.tracker_options)
    except (ConfigError, FileNotFoundError, FileExistsError) as err:
        print(f"entropace train: error: {printable(err)}", file=sys.stderr)
        return 2

    announce = (  # config.yaml of a received run directory: its strings escaped
        f"run {run_dir}: {cfg.algorithm.name} on {','.join(cfg.tasks.names)} with "
        f"{cfg.model.name}, {cfg.steps} steps" + (" (resuming)" if args.resume is not None else "")
    )
    print(printable(announce), file=sys.stderr)
    try:
        result = train(cfg, run_dir, resume=args.resume is not None, overwrite=args.overwrite)
    except RolloutWorkerError as err:  # the async worker died or failed, or no /dev/shm room
        if err.worker_traceback:  # its own exception: the traceback is the diagnosis
            print(err.worker_traceback.rstrip(), file=sys.stderr)
        line = str(err).splitlines()[0]
        if latest_checkpoint(run_dir / "checkpoints") is not None:
            line += f"; the checkpoints are kept: continue with entropace train --resume {run_dir}"
        print(f"entropace train: error: {printable(line)}", file=sys.stderr)
        return 2
    except NonFiniteTrainingError as err:  # its checkpoint is written: say how to go on
        print(
            f"entropace train: error: {printable(err)}; continue (after changing them) with "
            f"entropace train --resume {printable(run_dir)} KEY=VALUE ...",
            file=sys.stderr,
        )
        return 2
    except (
        OSError, ImportError, CheckpointError, ConfigError, TrackerError, WarmStartError,
        DemoError, SFTError,
    ) as err:
        # OSError: a missing checkpoint, a run directory that holds another run or cannot be
        # written, a run file that is not a regular file; ConfigError: e.g. a device this
        # machine lacks; TrackerError: a tracker of log.trackers that did not start (before
        # the first rollout); WarmStartError / DemoError / SFTError: the warm start could not
        # be built (before the first rollout)
        print(f"entropace train: error: {printable(err)}", file=sys.stderr)
        return 2
    if result.stopped_by:
        print(
            f"stopped by {result.stopped_by} after step {result.last_step} (checkpoint "
            f"written); continue with: entropace train --resume {run_dir}",
            file=sys.stderr,
        )
        return 0
    print(f"done: {run_dir}", file=sys.stderr)
    summary = None
    if cfg.log.report and not args.no_report:
        try:
            summary = write_report(run_dir)
        except Exception as err:  # training is done and saved; say what failed
            print(f"entropace train: the report failed: {err!r}", file=sys.stderr)
            return 1
    try:
        screen = end_screen(run_dir, summary)
    except Exception as err:  # training is done and saved; say what failed
        print(f"entropace train: the end-of-run summary failed: {err!r}", file=sys.stderr)
        return 1
    print("\n" + printable(screen, keep="\n"))
    return 0


def write_report(run_dir: Path) -> Path | None:
    """``entropace.report.write_report([run_dir], run_dir / "report")`` when available."""
    try:
        import matplotlib  # noqa: F401

        from entropace.report import write_report as _write
    except ImportError as err:
        print(f"no report: {err} (pip install 'entropace[train]')", file=sys.stderr)
        return None
    from entropace._files import make_dir

    summary = _write([run_dir], make_dir(run_dir / "report"))  # RUN/report: not a symlink
    print(f"report: {summary}", file=sys.stderr)
    return summary


def end_screen(run_dir: Path, summary: Path | None) -> str:
    """What the run did, per task, and what to do next
    (:func:`entropace.report.overview.format_screen`): from the ``overview`` the report wrote
    into ``summary.json`` (the same numbers as the report), or computed from the run's
    ``metrics.jsonl`` when no report was written."""
    import json

    from entropace.report.overview import RunOverview, format_screen
    from entropace.report.runs import load_run
    from entropace.report.summary import overview_of

    if summary is not None:
        machine = json.loads((summary.parent / "summary.json").read_text(encoding="utf-8"))
        (entry,) = machine["runs"].values()
        overview = RunOverview.from_dict(entry["overview"])
        return format_screen(overview, report_dir=summary.parent, figures=machine["figures"])
    return format_screen(overview_of(load_run(run_dir)), report_dir=None)
