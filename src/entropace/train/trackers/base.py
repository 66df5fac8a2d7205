"""The tracker interface and registry (:mod:`entropace.train.trackers`): what a tracker is, what it
starts from, and the helpers the built-in trackers share."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from entropace.train.schema import ConfigError, flat_config  # noqa: F401 (re-export)

Row = Mapping[str, float | int]


class TrackerError(RuntimeError):
    """A tracker that could not start or resume: the message names it and what to change."""


class Tracker(Protocol):
    """One destination of the metrics rows.

    Attributes:
        rewinds: True when a resumed run replaces the rows after the checkpoint (TensorBoard's
            ``purge_step``); False for append-only trackers, which are not sent a step twice.
    """

    rewinds: bool

    def log(self, step: int, row: Row) -> None:
        """Record ``row`` (finite numbers and ints; no ``None``) at ``step`` (1-based)."""

    def state(self) -> dict[str, Any]:
        """JSON identity to continue the same tracker run on resume (ids, store)."""

    def close(self, *, failed: bool) -> None:
        """Flush and finish (``failed``: the training raised)."""


@dataclass(frozen=True)
class TrackerContext:
    """What a tracker starts from.

    Attributes:
        run_dir: the run directory.
        project: ``log.project`` (W&B project, MLflow experiment, trackio project).
        run_name: ``log.run_name``, else the run directory's name.
        config: the run's resolved config (:func:`entropace.train.config.to_dict`).
        options: ``log.tracker_options[<name>]``.
        resume_step: the checkpoint's step when resuming, else None.
        saved: this tracker's entry of ``RUN/trackers.json`` when resuming (None: a new
            tracker run).
    """

    run_dir: Path
    project: str
    run_name: str
    config: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)
    resume_step: int | None = None
    saved: dict[str, Any] | None = None


@dataclass(frozen=True)
class TrackerSpec:
    """A registered tracker.

    Attributes:
        name: its ``log.trackers`` name.
        package: the importable module it needs (checked when the config loads, not imported).
        extra: the pip extra that installs it.
        options: the ``log.tracker_options.<name>`` keys it takes.
        start: builds the tracker (imports its package).
        check: further checks of its options at config load (raises ``ConfigError``).
        preflight: checks of the environment at train start, given its options (raises
            ``ConfigError``).
    """

    name: str
    package: str
    extra: str
    options: tuple[str, ...]
    start: Callable[[TrackerContext], Tracker]
    check: Callable[[dict[str, Any]], None] | None = None
    preflight: Callable[[dict[str, Any]], None] | None = None


TRACKERS: dict[str, TrackerSpec] = {}


def register_tracker(spec: TrackerSpec) -> TrackerSpec:
    """Add ``spec`` to :data:`TRACKERS` (``log.trackers`` then accepts ``spec.name``)."""
    TRACKERS[spec.name] = spec
    return spec


#: Tracker arguments entropace sets itself, and where to set them.
RESERVED = {"project": "log.project", "name": "log.run_name", "run_name": "log.run_name"}


def check_str(name: str, opts: dict[str, Any], *keys: str) -> None:
    for key in keys:
        if key in opts and not isinstance(opts[key], str):
            raise ConfigError(f"log.tracker_options.{name}.{key}: expected a string")


def check_str_list(name: str, opts: dict[str, Any], key: str) -> None:
    value = opts.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"log.tracker_options.{name}.{key}: expected a list of strings")


def reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
