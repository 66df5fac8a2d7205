"""Reading a run directory's ``metrics.jsonl`` into per-key series.

Contract (shared with the trainer): one JSON object per training step, a flat dict of numbers
with ``"step"`` (int, 1-based); NaN is written as ``null``; per-task keys are
``task/<k>/<field>``; a key missing from a line (a task absent from a step, no PAPO in the run) is
simply absent. See the README's run-directory section.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from entropace._files import read_text
from entropace._text import printable

__all__ = ["METRICS_FILE", "RunData", "Series", "load_run"]

METRICS_FILE = "metrics.jsonl"


@dataclass(frozen=True)
class Series:
    """One metric over a run: ``steps [n]`` (int64, increasing) and ``values [n]`` (float64,
    NaN where the line had ``null``). Steps where the key was absent are not in the series."""

    steps: np.ndarray
    values: np.ndarray

    def finite(self) -> Series:
        """The sub-series of finite values."""
        keep = np.isfinite(self.values)
        return Series(self.steps[keep], self.values[keep])

    def __len__(self) -> int:
        return int(self.steps.size)


@dataclass
class RunData:
    """A parsed run: ``series[key]`` for every numeric key, plus notes about what was skipped."""

    path: Path
    name: str
    series: dict[str, Series]
    num_records: int
    notes: list[str] = field(default_factory=list)

    def get(self, key: str) -> Series | None:
        return self.series.get(key)

    @property
    def tasks(self) -> list[str]:
        """Task names found in ``task/<k>/<field>`` keys, sorted."""
        names = {key[5:].rsplit("/", 1)[0] for key in self.series if key.startswith("task/")}
        return sorted(n for n in names if n)

    def task_series(self, task: str, name: str) -> Series | None:
        return self.series.get(f"task/{task}/{name}")

    @property
    def steps(self) -> np.ndarray:
        """Every step with a record."""
        all_steps = [s.steps for s in self.series.values()]
        return np.unique(np.concatenate(all_steps)) if all_steps else np.zeros(0, np.int64)


def _is_number(v: object) -> bool:
    return v is None or (isinstance(v, int | float) and not isinstance(v, bool))


#: The largest ``"step"`` read (every step is exact as a float64 up to 2**53).
MAX_STEP = 2**53


def _value(v: int | float | None) -> float:
    """A logged number as float64: NaN for ``null``, and for a value outside float64 (an
    integer past ~1.8e308; ``Infinity``, which the trainer never writes: it logs ``null``)."""
    if v is None:
        return math.nan
    try:
        x = float(v)
    except OverflowError:
        return math.nan
    return x if math.isfinite(x) else math.nan


def load_run(run_dir: str | Path) -> RunData:
    """Parse ``run_dir/metrics.jsonl``.

    Rules: blank lines are skipped; a record without ``"step"`` gets its 1-based line order; a
    step logged twice (a resumed run) keeps its last record; non-numeric values are skipped and
    listed in ``notes``; a number outside float64 or non-finite is read as NaN and listed in
    ``notes``; an undecodable *last* line (a run killed mid-write) is skipped with a note, an
    undecodable earlier line is an error. Metric keys and the run's name (its directory's) are
    escaped (:func:`entropace._text.printable`: a received run's control characters never
    reach a plot, a report or the terminal); escaped keys are listed in ``notes``.

    Raises:
        FileNotFoundError: no ``metrics.jsonl`` in ``run_dir``.
        ValueError: a malformed line (with its line number: not JSON, nested too deeply, not
            an object, a ``"step"`` that is not an integer in ``[0, 2**53]``), or a file that
            is not UTF-8.
        OSError: ``metrics.jsonl`` is not a regular file (a FIFO, a device, a symbolic link:
            :class:`entropace._files.UnsafeFileError`, never waited on).
    """
    run_dir = Path(run_dir)
    path = run_dir / METRICS_FILE
    if not os.path.lexists(path):
        raise FileNotFoundError(f"{path}: no such file (is {run_dir} an entropace run directory?)")
    notes: list[str] = []
    lines = read_text(path).splitlines()
    numbered = [(i + 1, ln) for i, ln in enumerate(lines) if ln.strip()]
    by_step: dict[int, dict[str, float]] = {}
    skipped: set[str] = set()
    nan_read: set[str] = set()
    escaped: set[str] = set()
    for order, (lineno, line) in enumerate(numbered, start=1):
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as err:  # JSONDecodeError is a ValueError
            if order == len(numbered):
                notes.append(f"{path.name}: last line {lineno} is truncated and was skipped")
                continue
            why = err.msg if isinstance(err, json.JSONDecodeError) else str(err)
            if isinstance(err, RecursionError):
                why = "nested too deeply"
            raise ValueError(f"{path}:{lineno}: not valid JSON ({why[:200]})") from None
        if not isinstance(record, dict):
            raise ValueError(
                f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}"
            )
        step = record.get("step", order)
        if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
            shown = repr(step) if len(repr(step)) <= 40 else repr(step)[:40] + "..."
            raise ValueError(f"{path}:{lineno}: 'step' must be an int in [0, 2**53], got {shown}")
        if step in by_step:
            notes.append(f"step {step} is logged more than once; the last record is used")
        values: dict[str, float] = {}
        for raw, v in record.items():
            if raw == "step":
                continue
            key = printable(raw)
            if key != raw:
                escaped.add(key)
            if not _is_number(v):
                skipped.add(key)
                continue
            values[key] = _value(v)
            if v is not None and math.isnan(values[key]):
                nan_read.add(key)
        by_step[step] = values
    if skipped:
        notes.append("non-numeric keys skipped: " + ", ".join(sorted(skipped)))
    if escaped:
        notes.append(
            "control characters in metric keys, shown escaped: " + ", ".join(sorted(escaped))
        )
    if nan_read:
        notes.append(
            "values outside float64 or not finite, read as NaN: " + ", ".join(sorted(nan_read))
        )

    collected: dict[str, tuple[list[int], list[float]]] = {}
    for step in sorted(by_step):
        for key, v in by_step[step].items():
            s, vals = collected.setdefault(key, ([], []))
            s.append(step)
            vals.append(v)
    series = {
        k: Series(np.asarray(s, dtype=np.int64), np.asarray(v, dtype=np.float64))
        for k, (s, v) in sorted(collected.items())
    }
    return RunData(
        path=run_dir,
        name=printable(run_dir.resolve().name),
        series=series,
        num_records=len(by_step),
        notes=notes,
    )
