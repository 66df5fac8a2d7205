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
import re
import secrets
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from entropace.train.schema import ConfigError, check_in

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


def flat_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optim.lr": 1e-6, "tasks.names": ["db", "kg"], ...}``: nested dicts by dotted key."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(flat_config(value, dotted))
        else:
            out[dotted] = value
    return out


# ---------------------------------------------------------------------------------------------
# Config-load checks
# ---------------------------------------------------------------------------------------------


#: Tracker arguments entropace sets itself, and where to set them.
RESERVED = {"project": "log.project", "name": "log.run_name", "run_name": "log.run_name"}


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


def _check_str(name: str, opts: dict[str, Any], *keys: str) -> None:
    for key in keys:
        if key in opts and not isinstance(opts[key], str):
            raise ConfigError(f"log.tracker_options.{name}.{key}: expected a string")


def _check_str_list(name: str, opts: dict[str, Any], key: str) -> None:
    value = opts.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"log.tracker_options.{name}.{key}: expected a list of strings")


# ---------------------------------------------------------------------------------------------
# TensorBoard
# ---------------------------------------------------------------------------------------------


class _TensorBoard:
    rewinds = True

    def __init__(self, ctx: TrackerContext) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # pragma: no cover (checked at config load)
            raise TrackerError(
                "tensorboard: needs the tensorboard package: pip install 'entropace[train]' "
                "(or drop tensorboard from log.trackers)"
            ) from exc
        import yaml

        resume = ctx.resume_step
        self.writer = SummaryWriter(
            log_dir=str(ctx.run_dir / "events"),
            purge_step=None if resume is None else resume + 1,
        )
        text = yaml.safe_dump(ctx.config, sort_keys=False)
        self.writer.add_text("config", "```yaml\n" + text + "```", global_step=resume or 0)

    def log(self, step: int, row: Row) -> None:
        for key, value in row.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def state(self) -> dict[str, Any]:
        return {}

    def close(self, *, failed: bool) -> None:
        self.writer.close()


register_tracker(
    TrackerSpec(
        name="tensorboard", package="tensorboard", extra="train", options=(), start=_TensorBoard
    )
)


# ---------------------------------------------------------------------------------------------
# Weights & Biases
# ---------------------------------------------------------------------------------------------

WANDB_MODES = ("online", "offline", "disabled", "shared")


def _check_wandb(opts: dict[str, Any]) -> None:
    _check_str("wandb", opts, "entity", "group", "job_type", "notes", "dir", "mode")
    if "tags" in opts:
        _check_str_list("wandb", opts, "tags")
    if "mode" in opts:
        check_in("log.tracker_options.wandb.mode", opts["mode"], WANDB_MODES)


def _preflight_wandb(opts: dict[str, Any]) -> None:
    env = os.environ.get("WANDB_MODE")
    if "mode" not in opts and env is not None and env not in (*WANDB_MODES, "dryrun", "run"):
        raise ConfigError(f"WANDB_MODE={env!r} is not a W&B mode; allowed: {list(WANDB_MODES)}")


class _Wandb:
    rewinds = False

    def __init__(self, ctx: TrackerContext) -> None:
        import wandb

        opts = dict(ctx.options)
        self.id = (ctx.saved or {}).get("id") or secrets.token_hex(4)
        directory = Path(opts.pop("dir", ctx.run_dir))
        directory.mkdir(parents=True, exist_ok=True)
        try:
            self.run = wandb.init(
                project=ctx.project, name=ctx.run_name, id=self.id, resume="allow",
                config=ctx.config, allow_val_change=True, dir=str(directory), **opts,
            )  # fmt: skip
        except Exception as exc:
            raise TrackerError(
                f"wandb: the run did not start ({_reason(exc)}); log in with `wandb login`, or "
                "log offline with WANDB_MODE=offline (or log.tracker_options.wandb.mode=offline)"
            ) from exc

    def log(self, step: int, row: Row) -> None:
        self.run.log(dict(row), step=step)

    def state(self) -> dict[str, Any]:
        return {"id": self.id}

    def close(self, *, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


register_tracker(
    TrackerSpec(
        name="wandb",
        package="wandb",
        extra="wandb",
        options=("entity", "group", "job_type", "tags", "notes", "mode", "dir"),
        start=_Wandb,
        check=_check_wandb,
        preflight=_preflight_wandb,
    )
)


# ---------------------------------------------------------------------------------------------
# MLflow
# ---------------------------------------------------------------------------------------------

#: Characters MLflow refuses in a metric name (it allows alphanumerics, ``_ - . space : /``).
MLFLOW_BAD = re.compile(r"[^\w\-. :/]")


def _check_mlflow(opts: dict[str, Any]) -> None:
    _check_str("mlflow", opts, "tracking_uri", "artifact_location")
    tags = opts.get("tags", {})
    if not isinstance(tags, Mapping):
        raise ConfigError("log.tracker_options.mlflow.tags: expected a mapping of tag: value")


class _Mlflow:
    rewinds = False

    def __init__(self, ctx: TrackerContext) -> None:
        import mlflow
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.tracking import MlflowClient

        self._metric = Metric
        saved = ctx.saved or {}
        self.uri = ctx.options.get("tracking_uri") or saved.get("tracking_uri")
        self.uri = self.uri or mlflow.get_tracking_uri()
        self.renamed: dict[str, str] = {}
        try:
            self.client = MlflowClient(tracking_uri=self.uri)
            if saved.get("run_id"):
                self.run_id = str(saved["run_id"])
                run = self.client.get_run(self.run_id)
                self.client.update_run(self.run_id, status="RUNNING")
                have = run.data.params
            else:
                exp = self.client.get_experiment_by_name(ctx.project)
                exp_id = (
                    exp.experiment_id
                    if exp is not None
                    else self.client.create_experiment(
                        ctx.project, artifact_location=ctx.options.get("artifact_location")
                    )
                )
                tags = {str(k): str(v) for k, v in ctx.options.get("tags", {}).items()}
                run = self.client.create_run(exp_id, run_name=ctx.run_name, tags=tags)
                self.run_id = run.info.run_id
                have = {}
            params = {k: _param(v) for k, v in flat_config(ctx.config).items()}
            new = [Param(k, v) for k, v in params.items() if k not in have]
            for i in range(0, len(new), 100):  # MLflow takes at most 100 params per batch
                self.client.log_batch(self.run_id, params=new[i : i + 100])
            changed = sorted(k for k, v in params.items() if k in have and have[k] != v)
            if changed:  # params cannot change: the resumed config goes in as a tag + artifact
                change = "; ".join(f"{k}: {have[k]} -> {params[k]}" for k in changed)
                tag = f"entropace.config_changes.step_{ctx.resume_step}"
                self.client.log_batch(self.run_id, tags=[RunTag(tag, change[:5000])])
            name = "config.yaml" if ctx.resume_step is None else f"config-{ctx.resume_step}.yaml"
            self.client.log_dict(self.run_id, ctx.config, name)
        except Exception as exc:
            raise TrackerError(
                f"mlflow: the run did not start in the store {self.uri!r} ({_reason(exc)}); set "
                "MLFLOW_TRACKING_URI or log.tracker_options.mlflow.tracking_uri (e.g. "
                "sqlite:///mlflow.db, or http://host:5000 for a server)"
            ) from exc

    def _key(self, key: str) -> str:
        name = self.renamed.get(key)
        if name is None:
            name = self.renamed[key] = MLFLOW_BAD.sub("_", key)
            if name != key:
                logger.warning("mlflow: metric %r is logged as %r (MLflow's names)", key, name)
        return name

    def log(self, step: int, row: Row) -> None:
        now = int(time.time() * 1000)
        metrics = [self._metric(self._key(k), float(v), now, step) for k, v in row.items()]
        for i in range(0, len(metrics), 1000):  # MLflow's batch limit
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def state(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "tracking_uri": self.uri}

    def close(self, *, failed: bool) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


def _param(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, list | dict | bool) or value is None else value
    return str(text)[:6000]  # MLflow's limit on a param value


register_tracker(
    TrackerSpec(
        name="mlflow",
        package="mlflow",
        extra="mlflow",
        options=("tracking_uri", "artifact_location", "tags"),
        start=_Mlflow,
        check=_check_mlflow,
    )
)


# ---------------------------------------------------------------------------------------------
# trackio
# ---------------------------------------------------------------------------------------------


def _check_trackio(opts: dict[str, Any]) -> None:
    _check_str("trackio", opts, "space_id", "server_url", "dataset_id", "group")
    for key in ("auto_log_cpu", "auto_log_gpu"):
        if key in opts and not isinstance(opts[key], bool):
            raise ConfigError(f"log.tracker_options.trackio.{key}: expected true/false")


class _Trackio:
    rewinds = False

    def __init__(self, ctx: TrackerContext) -> None:
        import trackio

        saved = ctx.saved or {}
        self.name = str(saved.get("name") or ctx.run_name)
        try:
            self.run = trackio.init(
                project=ctx.project, name=self.name, config=ctx.config,
                resume="must" if saved else "never", **ctx.options,
            )  # fmt: skip
        except Exception as exc:
            raise TrackerError(f"trackio: the run did not start ({_reason(exc)})") from exc

    def log(self, step: int, row: Row) -> None:
        self.run.log(dict(row), step=step)

    def state(self) -> dict[str, Any]:
        return {"name": self.name}

    def close(self, *, failed: bool) -> None:
        import trackio

        if trackio.context_vars.current_run.get() is self.run:
            trackio.finish()  # also clears trackio's current run (no second finish at exit)
        else:
            self.run.finish()


register_tracker(
    TrackerSpec(
        name="trackio",
        package="trackio",
        extra="trackio",
        options=("space_id", "server_url", "dataset_id", "group", "auto_log_cpu", "auto_log_gpu"),
        start=_Trackio,
        check=_check_trackio,
    )
)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


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
                    "(every row is in metrics.jsonl)", name, step, _reason(exc),
                )  # fmt: skip
                del self.trackers[name]
                self._close_one(name, tracker, failed=True)
                continue
            self.state[name]["last_step"] = step
        self._save()

    def _save(self) -> None:
        if not self.state:
            return
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(self.state, indent=1) + "\n")
        os.replace(tmp, self.path)

    @staticmethod
    def _close_one(name: str, tracker: Tracker, *, failed: bool) -> None:
        try:
            tracker.close(failed=failed)
        except Exception as exc:  # closing must not hide the training's own outcome
            logger.error("tracker %s did not close cleanly (%s)", name, _reason(exc))

    def close(self, *, failed: bool) -> None:
        for name, tracker in self.trackers.items():
            self._close_one(name, tracker, failed=failed)
        self.trackers = {}


def _read_state(path: Path) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TrackerError(f"{path}: not a trackers state file ({_reason(exc)})") from exc
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise TrackerError(f"{path}: expected an object of tracker states")
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
                    f"{name}: {_reason(exc)}; pip install 'entropace[{spec.extra}]'"
                ) from exc
            raise TrackerError(f"{name}: the tracker did not start ({_reason(exc)})") from exc
    return TrackerSet(run_dir, started, state)


def failing() -> bool:
    """Whether an exception is propagating (called from a ``finally`` block)."""
    return sys.exc_info()[0] is not None
