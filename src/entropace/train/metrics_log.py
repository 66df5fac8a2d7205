"""Where a step's metrics go: ``RUN/metrics.jsonl``, TensorBoard ``RUN/events/``.

``metrics.jsonl`` holds one flat JSON object per training step (the run-directory contract in
``docs/training.md``): numbers only, NaN/inf written as ``null``, ``"step"`` an int (1-based).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


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
    """Appends to ``metrics.jsonl`` and (optionally) TensorBoard.

    On resume the jsonl is first truncated to the steps ``<= step`` of the checkpoint, so a
    run that logged past its last checkpoint before being killed has no duplicated steps.
    """

    def __init__(self, run_dir: Path, *, tensorboard: bool, resume_step: int | None = None):
        self.path = run_dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            keep = [
                line
                for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] <= resume_step
            ]
            self.path.write_text("".join(line + "\n" for line in keep))
        self._file = self.path.open("a")
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise ImportError(
                    "TensorBoard logging needs tensorboard: pip install 'entropace[train]' "
                    "(or set log.tensorboard=false)"
                ) from exc
            self._tb = SummaryWriter(
                log_dir=str(run_dir / "events"),
                purge_step=None if resume_step is None else resume_step + 1,
            )

    def write(self, step: int, metrics: dict[str, Any]) -> dict[str, float | int | None]:
        row = {"step": int(step), **clean({k: v for k, v in metrics.items() if k != "step"})}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in row.items():
                if key != "step" and value is not None:
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()
        return row

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of ``RUN/metrics.jsonl`` (``null`` read back as NaN)."""
    rows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows.append({k: math.nan if v is None else v for k, v in row.items()})
    return rows
