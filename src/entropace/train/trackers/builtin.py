"""The built-in trackers: TensorBoard, Weights & Biases, MLflow, trackio (each imports its package
only when it starts; :mod:`entropace.train.trackers` documents what each records)."""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from entropace.train.schema import ConfigError, check_in
from entropace.train.trackers.base import (
    Row,
    TrackerContext,
    TrackerError,
    TrackerSpec,
    check_str,
    check_str_list,
    flat_config,
    reason,
    register_tracker,
)

logger = logging.getLogger(__name__)


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
    check_str("wandb", opts, "entity", "group", "job_type", "notes", "dir", "mode")
    if "tags" in opts:
        check_str_list("wandb", opts, "tags")
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
                f"wandb: the run did not start ({reason(exc)}); log in with `wandb login`, or "
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
    check_str("mlflow", opts, "tracking_uri", "artifact_location")
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
                f"mlflow: the run did not start in the store {self.uri!r} ({reason(exc)}); set "
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
    check_str("trackio", opts, "space_id", "server_url", "dataset_id", "group")
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
            raise TrackerError(f"trackio: the run did not start ({reason(exc)})") from exc

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
