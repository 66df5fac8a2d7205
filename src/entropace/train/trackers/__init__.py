"""Experiment trackers: where each step's metrics row goes besides ``RUN/metrics.jsonl``.

``log.trackers`` names any of the registered trackers (:data:`TRACKERS`):

============  ===============================  ================================================
tracker       extra                            where the rows go
============  ===============================  ================================================
tensorboard   ``entropace[train]``             ``RUN/events`` (``tensorboard --logdir RUN/events``)
wandb         ``entropace[wandb]``             a W&B run (``WANDB_MODE=offline``: ``RUN/wandb``)
mlflow        ``entropace[mlflow]``            an MLflow run (``MLFLOW_TRACKING_URI``, else
                                               MLflow's default local store)
trackio       ``entropace[trackio]``           a trackio run (local SQLite in ``TRACKIO_DIR``)
============  ===============================  ================================================

The trainer computes a step's metrics once; :class:`TrackerSet` hands the same cleaned row
(``metrics.jsonl``'s, ``None`` values left out) to every tracker under our metric names
(``task/<k>/entropy``, ``polarity/w_plus`` ...). Each tracker records the run's resolved config
(TensorBoard: a text summary; W&B: the run config; MLflow: params with dotted keys plus a
``config.yaml`` artifact; trackio: the run config).

Failures: a name that is not registered or a bad ``log.tracker_options`` entry is a
:class:`~entropace.train.schema.ConfigError` when the config loads (:func:`check_trackers`); a
tracker whose package is missing (or a bad ``WANDB_MODE``) one when training starts, before the
model is built (:func:`require_trackers`); a tracker that does not start (W&B online without a login, an
MLflow store that cannot be opened) raises :class:`TrackerError` when training starts, before
the first rollout, and the trackers already started are closed. A tracker that fails *while
logging* is switched off for the rest of the run with an error message (the run goes on; every
row is in ``metrics.jsonl``).

Resume: ``RUN/trackers.json`` keeps each tracker's identity (W&B run id, MLflow run id and
store, trackio run name) and the last step it received, so a resumed run continues the same
tracker run. TensorBoard rewinds (rows after the checkpoint are purged, as in
``metrics.jsonl``); W&B, MLflow and trackio cannot delete rows, so the steps they already
received are not sent again (no duplicated rows; those rows keep the values of the interrupted
run, which an exact resume reproduces except for timings).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from entropace._files import read_text, write_atomic
from entropace.train.schema import ConfigError, check_in
from entropace.train.trackers import builtin as _builtin  # noqa: F401  (registers the four)
from entropace.train.trackers.base import (
    RESERVED,
    TRACKERS,
    Tracker,
    TrackerContext,
    TrackerError,
    TrackerSpec,
    flat_config,
    reason,
    register_tracker,
)

logger = logging.getLogger(__name__)

__all__ = [
    "STATE_FILE",
    "TRACKERS",
    "Tracker",
    "TrackerContext",
    "TrackerError",
    "TrackerSet",
    "TrackerSpec",
    "check_trackers",
    "failing",
    "flat_config",
    "register_tracker",
    "require_trackers",
    "start_trackers",
]

#: Each tracker's identity and last logged step, for resume (``RUN/trackers.json``).
STATE_FILE = "trackers.json"

# ---------------------------------------------------------------------------------------------
# Config-load checks
# ---------------------------------------------------------------------------------------------


def check_trackers(names: Sequence[str], options: Mapping[str, Any]) -> None:
    """``log.trackers`` / ``log.tracker_options`` at config load: known names without
    duplicates, each tracker's package importable (the extra named otherwise), options only for
    listed trackers and only the keys each takes. Raises :class:`ConfigError`."""
    known = sorted(TRACKERS)
    for name in names:
        check_in("log.trackers", name, known)
    if len(set(names)) != len(names):
        raise ConfigError(f"log.trackers has duplicates: {list(names)}")
    for name, opts in options.items():
        if name not in names:
            raise ConfigError(
                f"log.tracker_options.{name}: {name} is not in log.trackers {list(names)}"
            )
        if not isinstance(opts, Mapping):
            raise ConfigError(f"log.tracker_options.{name}: expected a mapping, got {opts!r}")
        spec = TRACKERS[name]
        for key in opts:
            if key not in spec.options:
                extra = f"; use {RESERVED[key]}" if key in RESERVED else ""
                raise ConfigError(
                    f"log.tracker_options.{name}.{key} is not an option of {name}{extra}; "
                    f"allowed: {list(spec.options)}"
                )
    for name in names:  # each tracker's own checks of its options
        check = TRACKERS[name].check
        if check is not None:
            check(dict(options.get(name, {})))


def require_trackers(names: Sequence[str], options: Mapping[str, Any]) -> None:
    """What a run needs of the machine for ``names``, checked when training starts (before the
    model is built; not when a config loads, so ``entropace eval`` of a W&B run works where
    wandb is not installed): each tracker's package importable (the extra named otherwise) and
    the environment it reads (``WANDB_MODE``). Raises :class:`ConfigError`."""
    for name in names:
        spec = TRACKERS[name]
        if importlib.util.find_spec(spec.package) is None:
            raise ConfigError(
                f"log.trackers: {name} needs the {spec.package} package, which is not "
                f"installed: pip install 'entropace[{spec.extra}]' (or drop {name} from "
                "log.trackers)"
            )
        if spec.preflight is not None:
            spec.preflight(dict(options.get(name, {})))


# ---------------------------------------------------------------------------------------------
# The set the writer fans out to
# ---------------------------------------------------------------------------------------------


class TrackerSet:
    """The started trackers of a run: the same row to each, with the resume bookkeeping of
    ``RUN/trackers.json`` (an append-only tracker gets no step it already has)."""

    def __init__(
        self, run_dir: Path, trackers: dict[str, Tracker], state: dict[str, dict[str, Any]]
    ) -> None:
        self.path = run_dir / STATE_FILE
        self.trackers = dict(trackers)
        self.state = state  # name -> {identity..., "last_step": int}; other names kept as is
        for name, tracker in self.trackers.items():
            self.state[name] = {**tracker.state(), "last_step": self._last(name)}
        self._save()

    def _last(self, name: str) -> int:
        return int(self.state.get(name, {}).get("last_step", 0))

    def log(self, step: int, row: Mapping[str, float | int | None]) -> None:
        """Send ``row`` without its ``None`` (NaN/inf) values to every tracker."""
        values = {k: v for k, v in row.items() if k != "step" and v is not None}
        values = {k: v for k, v in values.items() if not isinstance(v, float) or math.isfinite(v)}
        for name, tracker in list(self.trackers.items()):
            if not tracker.rewinds and step <= self._last(name):
                continue  # already has this step (logged before the interruption)
            try:
                tracker.log(step, values)
            except Exception as exc:
                logger.error(
                    "tracker %s failed at step %d (%s); it is off for the rest of this run "
                    "(every row is in metrics.jsonl)", name, step, reason(exc),
                )  # fmt: skip
                del self.trackers[name]
                self._close_one(name, tracker, failed=True)
                continue
            self.state[name]["last_step"] = step
        self._save()

    def _save(self) -> None:
        if not self.state:
            return
        write_atomic(self.path, json.dumps(self.state, indent=1) + "\n")

    @staticmethod
    def _close_one(name: str, tracker: Tracker, *, failed: bool) -> None:
        try:
            tracker.close(failed=failed)
        except Exception as exc:  # closing must not hide the training's own outcome
            logger.error("tracker %s did not close cleanly (%s)", name, reason(exc))

    def close(self, *, failed: bool) -> None:
        for name, tracker in self.trackers.items():
            self._close_one(name, tracker, failed=failed)
        self.trackers = {}


def _read_state(path: Path) -> dict[str, dict[str, Any]]:
    if not os.path.lexists(path):
        return {}
    try:
        data = json.loads(read_text(path, limit=16 << 20))
    except (OSError, ValueError, RecursionError) as exc:
        raise TrackerError(f"{path}: not a trackers state file ({reason(exc)})") from exc
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise TrackerError(f"{path}: expected an object of tracker states")
    for name, state in data.items():
        last = state.get("last_step", 0)
        if isinstance(last, bool) or not isinstance(last, int) or not 0 <= last < 2**31:
            raise TrackerError(
                f"{path}: {name}.last_step must be an integer in [0, 2147483647], got "
                f"{str(last)[:40]}"
            )
    return data


def start_trackers(
    names: Sequence[str],
    run_dir: Path,
    *,
    project: str,
    run_name: str | None,
    config: dict[str, Any],
    options: Mapping[str, Mapping[str, Any]],
    resume_step: int | None = None,
) -> TrackerSet:
    """Start ``names`` in order (a resumed run continues each tracker's run of
    ``RUN/trackers.json``). Raises :class:`TrackerError` naming the tracker that failed, after
    closing the ones already started."""
    state = _read_state(run_dir / STATE_FILE) if resume_step is not None else {}
    started: dict[str, Tracker] = {}
    for name in names:
        spec = TRACKERS[name]
        ctx = TrackerContext(
            run_dir=run_dir, project=project, run_name=run_name or run_dir.resolve().name,
            config=config, options=dict(options.get(name, {})), resume_step=resume_step,
            saved=state.get(name) if resume_step is not None else None,
        )  # fmt: skip
        try:
            started[name] = spec.start(ctx)
        except BaseException as exc:
            for done in reversed(list(started)):
                TrackerSet._close_one(done, started[done], failed=True)
            if isinstance(exc, TrackerError | KeyboardInterrupt):
                raise
            if isinstance(exc, ImportError):
                raise TrackerError(
                    f"{name}: {reason(exc)}; pip install 'entropace[{spec.extra}]'"
                ) from exc
            raise TrackerError(f"{name}: the tracker did not start ({reason(exc)})") from exc
    return TrackerSet(run_dir, started, state)


def failing() -> bool:
    """Whether an exception is propagating (called from a ``finally`` block)."""
    return sys.exc_info()[0] is not None
