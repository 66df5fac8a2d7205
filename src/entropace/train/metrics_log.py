"""Where a step's metrics go: ``RUN/metrics.jsonl`` and the trackers of ``log.trackers``.

``metrics.jsonl`` holds one flat JSON object per training step (the run-directory contract in
``docs/training.md``): numbers only, NaN/inf written as ``null``, ``"step"`` an int (1-based).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from entropace._files import UnsafeFileError, open_append, read_text, write_atomic
from entropace.train.checkpoint import CheckpointError
from entropace.train.config import MAX_STEPS
from entropace.train.trackers import TrackerSet, failing, start_trackers

if TYPE_CHECKING:
    from entropace.train.config import LogConfig


def clean(metrics: dict[str, Any]) -> dict[str, float | int | None]:
    """Numbers only: bools/ints kept as ints, floats as floats, NaN/inf -> None."""
    out: dict[str, float | int | None] = {}
    for key, value in metrics.items():
        if isinstance(value, bool):
            out[key] = int(value)
        elif isinstance(value, int):
            out[key] = value
        else:
            v = float(value)
            out[key] = v if math.isfinite(v) else None
    return out


class MetricsWriter:
    """Appends each step's row to ``metrics.jsonl`` and fans the same row out to the trackers.

    The row is cleaned once (:func:`clean`); ``metrics.jsonl`` gets it whole (``null`` for
    NaN/inf), every tracker of :mod:`entropace.train.trackers` the same values without the
    ``null`` ones. On resume the jsonl is first truncated to the steps ``<= resume_step`` of
    the checkpoint, so a run that logged past its last checkpoint before being killed has no
    duplicated steps (the trackers' own rule is in :class:`~entropace.train.trackers.TrackerSet`).
    """

    def __init__(
        self, run_dir: Path, *, trackers: TrackerSet | None = None, resume_step: int | None = None
    ) -> None:
        self.path = run_dir / "metrics.jsonl"
        if resume_step is not None and os.path.lexists(self.path):
            keep = [line for step, line in logged_steps(self.path) if step <= resume_step]
            write_atomic(self.path, "".join(line + "\n" for line in keep))
        self._file = open_append(self.path)  # a symbolic link or FIFO there is refused
        self.trackers = trackers

    @classmethod
    def open(
        cls,
        run_dir: Path,
        log: LogConfig,
        *,
        config: dict[str, Any],
        resume_step: int | None = None,
    ) -> MetricsWriter:
        """The writer of a run: starts ``log.trackers`` (before the first rollout) with the
        run's resolved ``config``. Raises :class:`~entropace.train.trackers.TrackerError` if a
        tracker does not start (nothing is written then)."""
        trackers = start_trackers(
            log.trackers, run_dir, project=log.project, run_name=log.run_name, config=config,
            options=log.tracker_options, resume_step=resume_step,
        )  # fmt: skip
        return cls(run_dir, trackers=trackers, resume_step=resume_step)

    def write(self, step: int, metrics: dict[str, Any]) -> dict[str, float | int | None]:
        row = {"step": int(step), **clean({k: v for k, v in metrics.items() if k != "step"})}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self.trackers is not None:
            self.trackers.log(step, row)
        return row

    def close(self, *, failed: bool | None = None) -> None:
        """Close the jsonl and the trackers (``failed``: default, whether an exception is
        propagating, for a call in a ``finally`` block; the trackers mark their run failed)."""
        self._file.close()
        if self.trackers is not None:
            self.trackers.close(failed=failing() if failed is None else failed)


def logged_steps(path: Path) -> list[tuple[int, str]]:
    """``(step, line)`` of each line of the ``metrics.jsonl`` at ``path``, as a resume keeps
    them: a last line that does not decode (a run killed while writing it) is dropped.

    Raises:
        CheckpointError: an earlier line that is not a JSON object with an integer ``"step"``
            in ``[0, MAX_STEPS]`` (the message names the file and line: fix or remove it).
    """
    lines = [(n, line) for n, line in enumerate(_read_lines(path), 1) if line.strip()]
    out = []
    for i, (lineno, line) in enumerate(lines):
        try:
            step = json.loads(line)["step"]
        except (ValueError, RecursionError, KeyError, TypeError) as exc:
            if i == len(lines) - 1:
                continue
            raise CheckpointError(
                f"{path}:{lineno}: not a metrics row with a 'step' ({type(exc).__name__}); "
                "fix or remove the line, then resume"
            ) from None
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEPS:
            raise CheckpointError(
                f"{path}:{lineno}: 'step' must be an integer in [0, {MAX_STEPS}], got "
                f"{str(step)[:40]}; fix or remove the line, then resume"
            )
        out.append((step, line))
    return out


def _read_lines(path: Path) -> list[str]:
    try:
        return read_text(path).splitlines()
    except UnsafeFileError as exc:
        raise CheckpointError(str(exc)) from None


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of ``RUN/metrics.jsonl`` (``null`` read back as NaN)."""
    rows = []
    for line in read_text(run_dir / "metrics.jsonl").splitlines():
        if line.strip():
            row = json.loads(line)
            rows.append({k: math.nan if v is None else v for k, v in row.items()})
    return rows
