"""The ``entropace compare`` grid: one training run per (algorithm, seed), resumable.

Layout: ``OUT/<algo>/seed<k>/`` is an ordinary run directory (``config.yaml``,
``metrics.jsonl``, ``checkpoints/``), ``OUT/grid.json`` records the last grid asked for (preset,
algorithms, seeds, overrides) and ``OUT/logs/<algo>-seed<k>.log`` the output of runs trained in
subprocesses (``--jobs N > 1``). ``OUT`` must be a directory of its own (:func:`check_grid_dir`:
not a file, not a run directory). One process per directory: the ``compare`` process locks
``OUT`` for the whole grid and every run locks its own run directory
(:mod:`entropace.train.rundir`), so a second ``compare`` on ``OUT``, or a ``train`` into one
of its runs, fails at once naming the holder.

Each run's config is ``load_config(preset, [*overrides, f"algo={a}", f"seed={s}"])``. Before
training, a run directory is classified (:func:`run_state`):

- ``done``: the latest complete checkpoint is at step >= ``cfg.steps`` and ``metrics.jsonl``
  has logged that step: skipped;
- ``partial``: a checkpoint exists but the run is not finished (interrupted, or ``steps=``
  raised): resumed (``train(..., resume=True)``), continuing exactly from the checkpoint;
- ``stale``: run files but no checkpoint (killed before its first one): moved aside to
  ``RUN.old-<time>`` by ``train(..., overwrite=True)`` and started anew;
- ``fresh``: nothing there: started.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from entropace._files import open_append, read_bytes, read_text, write_atomic
from entropace.report.runs import MAX_STEP

__all__ = [
    "GRID_FILE",
    "check_grid_dir",
    "GridRun",
    "RunOutcome",
    "plan_grid",
    "run_dir_for",
    "run_grid",
    "run_state",
    "train_command",
]

logger = logging.getLogger(__name__)

GRID_FILE = "grid.json"
STATES = ("done", "partial", "stale", "fresh")


def run_dir_for(out: Path, algo: str, seed: int) -> Path:
    """``out / algo / f"seed{seed}"``."""
    return Path(out) / algo / f"seed{seed}"


@dataclass(frozen=True)
class GridRun:
    """One cell of the grid: its resolved config and the overrides that produced it."""

    algo: str
    seed: int
    run_dir: Path
    overrides: tuple[str, ...]  # user overrides + algo= + seed=, in that order
    cfg: Any  # TrainConfig


@dataclass
class RunOutcome:
    """What the grid did with one run: ``action`` is ``skipped`` / ``resumed`` / ``restarted``
    / ``started``; ``status`` is ``ok``, ``stopped`` (SIGINT/SIGTERM, checkpointed) or
    ``failed`` (``error`` says why); ``warning``: e.g. a skipped run's config differs."""

    algo: str
    seed: int
    run_dir: Path
    action: str
    status: str = "ok"
    error: str | None = None
    seconds: float = 0.0
    warning: str | None = None


def _last_logged_step(run_dir: Path) -> int | None:
    """The largest ``"step"`` in ``RUN/metrics.jsonl`` (undecodable lines, e.g. a last line
    cut by a kill, are ignored); None without a log."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    last = None
    for line in read_text(path).splitlines():
        try:
            step = json.loads(line).get("step") if line.strip() else None
        except (ValueError, RecursionError, AttributeError):
            continue
        if isinstance(step, int) and not isinstance(step, bool) and 0 <= step <= MAX_STEP:
            last = step if last is None else max(last, step)
    return last


def run_state(run_dir: Path, steps: int) -> str:
    """``done`` / ``partial`` / ``stale`` / ``fresh`` (rules in the module docstring)."""
    from entropace.train.checkpoint import PREFIX, latest_checkpoint
    from entropace.train.rundir import RUN_FILES

    run_dir = Path(run_dir)
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    if ckpt is not None:
        ckpt_step = int(ckpt.name[len(PREFIX) :])
        last = _last_logged_step(run_dir)
        if ckpt_step >= steps and last is not None and last >= steps:
            return "done"
        return "partial"
    if any((run_dir / f).exists() for f in RUN_FILES):
        return "stale"
    return "fresh"


def check_grid_dir(out: Path) -> None:
    """Refuse an ``--out`` the grid cannot own: a file, a path under a file, or a run
    directory (it holds ``config.yaml`` / ``metrics.jsonl`` / ``checkpoints``: the grid would
    write its runs and report into that run). A missing directory is fine (it is created).

    Raises:
        ValueError: naming the path and what it is.
    """
    from entropace.train.rundir import RUN_FILES

    out = Path(out)
    for parent in (out, *out.parents):
        if parent.exists() and not parent.is_dir():
            what = "is a file" if parent == out else f"is under {parent}, which is a file"
            raise ValueError(f"--out {out} {what}: give a directory for the grid")
        if parent.exists():
            break
    found = [f for f in RUN_FILES if (out / f).exists()]
    if found:
        raise ValueError(
            f"--out {out} is a run directory (it holds {', '.join(found)}): a grid writes a run "
            "directory per algorithm and seed, and its report, into a directory of its own"
        )


def plan_grid(
    preset: str,
    algos: Sequence[str],
    seeds: Sequence[int],
    overrides: Sequence[str],
    out: Path,
) -> list[GridRun]:
    """Resolve every run's config (so a bad algorithm or override fails before any training).

    Raises:
        ConfigError: an unknown algorithm, a bad override; ValueError: empty or repeated
            algorithms / seeds, or an override setting ``algo`` / ``seed`` (the grid sets them).
    """
    from entropace.train.config import load_config

    if not algos:
        raise ValueError("--algos: give at least one algorithm")
    if not seeds:
        raise ValueError("--seeds: give at least one seed")
    for name, items in (("algorithm", algos), ("seed", seeds)):
        if len(set(items)) != len(items):
            raise ValueError(f"a {name} is listed twice: {list(items)}")
    for o in overrides:
        key = o.split("=", 1)[0].strip()
        if key in ("algo", "algorithm.name", "seed"):
            raise ValueError(f"override {o!r}: the grid sets {key} itself (use --algos/--seeds)")
    runs = []
    for algo in algos:
        for seed in seeds:
            ov = (*overrides, f"algo={algo}", f"seed={seed}")
            cfg = load_config(preset, list(ov))
            runs.append(GridRun(algo, seed, run_dir_for(out, algo, seed), ov, cfg))
    return runs


def write_manifest(
    out: Path, preset: str, algos: Sequence[str], seeds: Sequence[int], overrides: Sequence[str]
) -> Path:
    """``OUT/grid.json``: what the grid was asked to run (the report orders algorithms by it)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / GRID_FILE
    data = {
        "preset": preset,
        "algorithms": list(algos),
        "seeds": list(seeds),
        "overrides": list(overrides),
        "written": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    return write_atomic(path, json.dumps(data, indent=2) + "\n")


_ACTION = {"partial": "resumed", "stale": "restarted", "fresh": "started", "done": "skipped"}


def train_command(run: GridRun, preset: str, state: str) -> list[str]:
    """The ``python -m entropace.cli train ...`` argv that trains ``run`` from ``state``."""
    base = [sys.executable, "-m", "entropace.cli", "train"]
    if state == "partial":  # --resume reads RUN/config.yaml, then the same overrides
        return [*base, "--resume", str(run.run_dir), *run.overrides, "--no-report"]
    cmd = [*base, "--preset", preset, *run.overrides, "--run-dir", str(run.run_dir), "--no-report"]
    return [*cmd, "--overwrite"] if state == "stale" else cmd


def _run_inprocess(run: GridRun, state: str, outcome: RunOutcome) -> None:
    from entropace.train import trainer

    try:
        result = trainer.train(
            run.cfg, run.run_dir, resume=state == "partial", overwrite=state == "stale"
        )
    except Exception as err:  # one failed run must not lose the rest of the grid
        outcome.status, outcome.error = "failed", f"{type(err).__name__}: {err}"
        logger.error("run %s failed: %s", run.run_dir, outcome.error)
        return
    if result.stopped_by:
        outcome.status = "stopped"
        outcome.error = f"stopped by {result.stopped_by} after step {result.last_step}"


@dataclass
class _Child:
    run: GridRun
    outcome: RunOutcome
    proc: subprocess.Popen
    log: Any
    started: float = field(default_factory=time.perf_counter)


def _log_path(logs: Path, run: GridRun) -> Path:
    return logs / f"{run.algo}-seed{run.seed}.log"


def _thread_env(jobs: int) -> dict[str, str]:
    """The children's environment: each run gets ``cpus // jobs`` cores (``ENTROPACE_CPUS``),
    which the trainer splits between its processes by model size
    (:func:`entropace.train.threads.plan_threads`); a user's ``OMP_NUM_THREADS`` still wins."""
    from entropace.train.threads import CPUS_ENV, available_cpus

    env = dict(os.environ)
    env[CPUS_ENV] = str(max(1, available_cpus() // jobs))
    return env


def _run_subprocesses(
    todo: list[tuple[GridRun, str, RunOutcome]], preset: str, out: Path, jobs: int,
    say: Callable[[str], None],
) -> None:  # fmt: skip
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = _thread_env(jobs)
    pending, running = list(todo), []
    previous = None
    if threading.current_thread() is threading.main_thread():  # SIGTERM stops the grid too
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        while pending or running:
            while pending and len(running) < jobs:
                run, state, outcome = pending.pop(0)
                log = open_append(_log_path(logs, run))  # a planted link there is refused
                # own session: a terminal's Ctrl-C reaches only this process, which then
                # sends each child one SIGTERM (a second signal would abort its checkpoint)
                proc = subprocess.Popen(
                    train_command(run, preset, state), stdout=log, stderr=subprocess.STDOUT,
                    env=env, start_new_session=True,
                )  # fmt: skip
                running.append(_Child(run, outcome, proc, log))
            time.sleep(0.2)
            for child in [c for c in running if c.proc.poll() is not None]:
                running.remove(child)
                child.log.close()
                child.outcome.seconds = time.perf_counter() - child.started
                if child.proc.returncode != 0:
                    log_path = _log_path(logs, child.run)
                    last = _last_line(log_path)
                    child.outcome.status = "failed"
                    child.outcome.error = (
                        f"exit code {child.proc.returncode}"
                        + (f": {last}" if last else "")
                        + f"; see {log_path}"
                    )
                elif run_state(child.run.run_dir, child.run.cfg.steps) != "done":
                    child.outcome.status = "stopped"
                    child.outcome.error = "stopped before the last step (checkpointed)"
                say(_line(child.outcome))
    except KeyboardInterrupt:  # children checkpoint on SIGTERM; wait for them
        for child in running:
            child.proc.send_signal(signal.SIGTERM)
        for child in running:
            child.proc.wait()
            child.log.close()
            child.outcome.status, child.outcome.error = "stopped", "interrupted (checkpointed)"
        for _, _, outcome in pending:
            outcome.status, outcome.error = "stopped", "not started (interrupted)"
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _last_line(path: Path) -> str:
    """The last non-empty line of a child's log (its error, e.g. a locked run directory)."""
    try:
        data = read_bytes(path, limit=None)
        lines = data.decode("utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in reversed(lines) if line.strip()), "")[:500]


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _line(o: RunOutcome) -> str:
    text = f"{o.algo} seed {o.seed}: {o.action}, {o.status} ({o.seconds:.1f} s)"
    text += f": {o.error}" if o.error else ""
    return text + (f"\n  WARNING: {o.warning}" if o.warning else "")


def config_drift(run: GridRun) -> list[str]:
    """The settings (``log.*`` aside) where ``RUN/config.yaml`` differs from the config the grid
    asks for now, as ``"key: old -> new"``; a finished run is still skipped, with a warning
    (its numbers are of the old config: use another ``--out`` to compare the new one)."""
    import yaml

    from entropace.train.config import config_changes, to_dict

    path = run.run_dir / "config.yaml"
    try:
        saved = yaml.safe_load(read_text(path, limit=16 << 20))
    except (OSError, ValueError, RecursionError, yaml.YAMLError):
        return [f"{path} is missing or unreadable"]
    if not isinstance(saved, dict):
        return [f"{path} is not a mapping"]
    return [c for c in config_changes(saved, to_dict(run.cfg)) if not c.startswith("log.")]


def run_grid(
    runs: Sequence[GridRun],
    preset: str,
    out: Path,
    *,
    jobs: int = 1,
    say: Callable[[str], None] = lambda text: None,
) -> list[RunOutcome]:
    """Train every run of ``runs`` that is not done (in grid order).

    ``jobs == 1``: in this process, one after the other, with
    ``entropace.train.trainer.train``; a run stopped by SIGINT/SIGTERM stops the grid (the
    rest are reported ``stopped``, not started). ``jobs > 1``: up to ``jobs`` concurrent
    ``python -m entropace.cli train`` subprocesses, each logging to ``OUT/logs/``.
    A failed run is reported and the others still run.
    """
    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    outcomes: list[RunOutcome] = []
    todo: list[tuple[GridRun, str, RunOutcome]] = []
    for run in runs:
        state = run_state(run.run_dir, run.cfg.steps)
        outcome = RunOutcome(run.algo, run.seed, run.run_dir, _ACTION[state])
        outcomes.append(outcome)
        if state == "done":
            changed = config_drift(run)
            if changed:
                outcome.warning = "finished under another config: " + "; ".join(changed)
            say(_line(outcome))
        else:
            todo.append((run, state, outcome))
    if jobs > 1:
        _run_subprocesses(todo, preset, Path(out), jobs, say)
        return outcomes
    for i, (run, state, outcome) in enumerate(todo):
        say(f"{run.algo} seed {run.seed}: {outcome.action} ({i + 1}/{len(todo)} to train)")
        t0 = time.perf_counter()
        _run_inprocess(run, state, outcome)
        outcome.seconds = time.perf_counter() - t0
        say(_line(outcome))
        if outcome.status == "stopped":
            for _, _, rest in todo[i + 1 :]:
                rest.status, rest.error = "stopped", "not started (the grid was stopped)"
            break
    return outcomes
