"""The training progress bar: the step, the phase within it, per-task numbers, one legend.

The loop drives it with three calls (``train/trainer.py``)::

    progress = Progress(total=cfg.steps, start=start, tasks=cfg.tasks.names,
                        enabled=cfg.log.progress)
    progress.phase("rollout", step)   # the bar reads "step 3/10 rollout 0:42"
    ...
    progress.step_done(row)           # "step 3: db R -0.20 H 1.23 | ... | 61 s/step"
    progress.close()

When enabled it prints :data:`LEGEND` once, above the bar. On a terminal a daemon thread
redraws the bar every ``tick`` seconds, so the phase's clock moves during a long rollout; to a
file or pipe the bar is drawn only when the phase or the step changes (no line per second in
a log).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, TextIO

__all__ = ["LEGEND", "PHASES", "Progress", "task_postfix"]

#: The phases of a training step and what each does (docs/training.md).
PHASES: dict[str, str] = {
    "rollout": "sample the step's episodes and their token statistics (async: wait for the "
    "worker's batch)",
    "update": "advantages, controllers, optimiser steps",
    "eval": "greedy episodes on held-out seeds (eval.every)",
    "checkpoint": "write RUN/checkpoints",
}

LEGEND = (
    "progress: step k/N, the phase it is in (" + ", ".join(PHASES) + ") and for how long; "
    "then the last finished step's numbers per task: R = mean episode reward, H = mean "
    "sampling entropy of its tokens (nats); s/step = its seconds."
)


def _clock(seconds: float) -> str:
    minutes, sec = divmod(int(seconds), 60)
    return f"{minutes}:{sec:02d}"


def _num(value: Any) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return "n/a"
    return f"{value:.2f}"


def task_postfix(row: Mapping[str, Any], tasks: list[str]) -> str:
    """``"step 3: db R -0.20 H 1.23 | kg R 0.00 H 0.98 | 61 s/step"`` from a ``metrics.jsonl``
    row: its step, ``task/<k>/reward`` and ``task/<k>/entropy`` of each task present, then
    ``time/step`` (the bar shows the finished step's numbers while the next one runs)."""
    parts = [
        f"{t} R {_num(row[f'task/{t}/reward'])} H {_num(row.get(f'task/{t}/entropy'))}"
        for t in tasks
        if f"task/{t}/reward" in row
    ]
    step_s = row.get("time/step")
    if isinstance(step_s, int | float) and math.isfinite(step_s):
        parts.append(f"{step_s:.3g} s/step")
    head = f"step {row['step']}: " if "step" in row else ""
    return head + " | ".join(parts)


class Progress:
    """The bar of one training run (module docstring). ``enabled=False`` draws and prints
    nothing; the calls stay cheap."""

    def __init__(
        self,
        *,
        total: int,
        start: int,
        tasks: list[str],
        enabled: bool = True,
        file: TextIO | None = None,
        tick: float = 1.0,
    ) -> None:
        from tqdm.auto import tqdm

        self.total, self.done, self.tasks = total, start, list(tasks)
        self.step, self.name, self.since = start, "", time.perf_counter()
        self.enabled = enabled
        stream = file if file is not None else sys.stderr
        if enabled:
            print(LEGEND, file=stream, flush=True)
        self.bar = tqdm(
            total=total, initial=start, disable=not enabled, unit="step", file=stream,
            dynamic_ncols=True, bar_format="{desc} |{bar}| {elapsed}<{remaining}{postfix}",
            desc=f"step {start}/{total}",
        )  # fmt: skip
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if enabled and tick > 0 and getattr(stream, "isatty", lambda: False)():
            self._ticker = threading.Thread(target=self._tick, args=(tick,), daemon=True)
            self._ticker.start()

    def describe(self) -> str:
        """The bar's description: ``step 3/10 rollout 0:42`` (``done`` once closed)."""
        if not self.name:
            return "done" if self.done >= self.total else f"step {self.step}/{self.total}"
        clock = _clock(time.perf_counter() - self.since)
        return f"step {self.step}/{self.total} {self.name} {clock}"

    def phase(self, name: str, step: int) -> None:
        """Training step ``step`` (1-based; 0: before the first) enters phase ``name`` (one of
        :data:`PHASES`)."""
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; phases: {', '.join(PHASES)}")
        self.step, self.name, self.since = step, name, time.perf_counter()
        self.bar.set_description_str(self.describe(), refresh=True)

    def step_done(self, row: Mapping[str, Any]) -> None:
        """The step of ``row`` (its ``metrics.jsonl`` row) is done: its per-task numbers."""
        self.done += 1
        self.bar.set_postfix_str(task_postfix(row, self.tasks), refresh=False)
        self.bar.update(1)

    def _tick(self, every: float) -> None:
        while not self._stop.wait(every):
            self.bar.set_description_str(self.describe(), refresh=True)

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        self.name = ""
        self.bar.set_description_str(self.describe())
        self.bar.close()
