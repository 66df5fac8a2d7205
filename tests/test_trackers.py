"""``log.trackers``: one metrics row fanned out to TensorBoard, W&B, MLflow and trackio under our
names, the run's config recorded in each, resume without duplicated rows, and a tracker that
cannot start refused before the first rollout (at config load where it can be seen there).

The real trackers run offline (``WANDB_MODE=offline``, a local MLflow store, trackio's local
SQLite) in a subprocess, so their process-wide state (W&B's service, trackio's data directory)
never reaches the other tests; the failure paths use registered fake trackers and a patched
package lookup, so they run without any tracker installed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import sqlite3
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from entropace.cli import main
from entropace.envs.toy import register_letter_envs
from entropace.train import trackers as trackers_module
from entropace.train import trainer as trainer_module
from entropace.train.checkpoint import list_checkpoints
from entropace.train.config import ConfigError, load_config, load_config_file
from entropace.train.metrics_log import read_metrics
from entropace.train.trackers import (
    TRACKERS,
    TrackerError,
    TrackerSpec,
    require_trackers,
    start_trackers,
)
from entropace.train.trainer import train

register_letter_envs("letter", "letter2")

BASE = [  # the command's default preset (quick) on the tiny model: no SmolLM2 adapter or warm start
    "model=tiny", "model.lora=false", "warm_start.source=none", "eval.every=0",
    "tasks=letter,letter2", "steps=2", "algo=eppo+papo", "P=1", "G=3",
    "rollout.max_new_tokens_per_turn=6", "rollout.max_episode_tokens=96", "optim.lr=3e-3",
    "ppo.epochs=1", "ppo.num_minibatches=1", "ppo.micro_batch_size=3",
    "log.checkpoint_every=1", "log.keep_last=2", "log.progress=false", "log.report=false",
]  # fmt: skip
TIMING = ("time/", "tokens_per_s", "memory/")


def untimed(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not k.startswith(TIMING) and k != "step"}


def finite(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics.jsonl row as the trackers get it: no step, no NaN (``null``) values."""
    return {k: v for k, v in row.items() if k != "step" and not math.isnan(v)}


# ---------------------------------------------------------------------------------------------
# Fake trackers (registered for one test)
# ---------------------------------------------------------------------------------------------


class Recorder:
    """Records what it is given; ``rewinds`` like TensorBoard or append-only like W&B."""

    def __init__(self, ctx: Any, *, rewinds: bool, log: list, fail_at: int | None = None):
        self.rewinds, self.rows, self.fail_at = rewinds, log, fail_at
        self.ctx = ctx
        self.rows.append(("start", ctx.resume_step, ctx.saved, ctx.config["seed"]))

    def log(self, step: int, row: dict[str, Any]) -> None:
        if step == self.fail_at:
            raise ConnectionError("the tracker's server went away")
        self.rows.append((step, dict(row)))

    def state(self) -> dict[str, Any]:
        return {"id": f"fake-{self.ctx.run_name}"}

    def close(self, *, failed: bool) -> None:
        self.rows.append(("close", failed))


def fake(monkeypatch: pytest.MonkeyPatch, name: str, log: list, **kwargs: Any) -> None:
    spec = TrackerSpec(
        name=name,
        package="json",  # always importable
        extra=name,
        options=(),
        start=lambda ctx: Recorder(ctx, log=log, **kwargs),
    )
    monkeypatch.setitem(TRACKERS, name, spec)


# ---------------------------------------------------------------------------------------------
# Config-load errors (no tracker package needed)
# ---------------------------------------------------------------------------------------------


def test_unknown_tracker_and_bad_options_are_refused_when_the_config_loads(monkeypatch) -> None:
    with pytest.raises(ConfigError, match=r"log.trackers: 'wandbb'.*did you mean 'wandb'"):
        load_config(None, ["log.trackers=[wandbb]"], check_envs=False)
    with pytest.raises(ConfigError, match="duplicates"):
        load_config(None, ["log.trackers=[tensorboard,tensorboard]"], check_envs=False)
    # as if wandb were installed (the options are checked without importing it)
    monkeypatch.setitem(TRACKERS, "wandb", dataclasses.replace(TRACKERS["wandb"], package="json"))
    cases = {
        "log.tracker_options.wandb.entity=me": "wandb is not in log.trackers",
        "log.tracker_options.wandb.project=x": r"wandb.project is not an option.*use log.project",
        "log.tracker_options.wandb.mode=sometimes": r"'sometimes' is not allowed.*'offline'",
        "log.tracker_options.wandb.tags=7": "expected a list of strings",
        "log.tracker_options.tensorboard.flush=1": "tensorboard.flush is not an option",
        "log.project=' '": "log.project must not be empty",
    }
    for override, message in cases.items():
        listed = [] if "not in log.trackers" in message else ["log.trackers=[tensorboard,wandb]"]
        with pytest.raises(ConfigError, match=message):
            load_config(None, [*listed, override], check_envs=False)
    monkeypatch.setenv("WANDB_MODE", "offlien")  # the environment: checked at train start
    cfg = load_config(None, ["log.trackers=[wandb]"], check_envs=False)
    with pytest.raises(ConfigError, match="WANDB_MODE='offlien' is not a W&B mode"):
        require_trackers(cfg.log.trackers, cfg.log.tracker_options)


def test_a_missing_tracker_package_is_an_error_naming_the_extra_before_the_model(
    monkeypatch, tmp_path, capsys
) -> None:
    real = importlib.util.find_spec
    missing = {"wandb", "mlflow", "trackio", "tensorboard"}
    monkeypatch.setattr(
        trackers_module.importlib.util, "find_spec", lambda n, *a: None if n in missing else real(n)
    )
    for name, extra in [("wandb", "wandb"), ("mlflow", "mlflow"), ("trackio", "trackio"),
                        ("tensorboard", "train")]:  # fmt: skip
        # the config loads (``entropace eval`` of such a run works without the package) ...
        cfg = load_config(None, [*BASE, f"log.trackers=[{name}]"])
        # ... training does not start: refused before the model is built
        monkeypatch.setattr(trainer_module, "build_model", lambda *a: pytest.fail("built"))
        with pytest.raises(ConfigError, match=rf"{name} needs the {name} package.*\[{extra}\]"):
            train(cfg, tmp_path / name)
        assert not (tmp_path / name).exists()
    # through the CLI: exit 2, the message, no run announced, nothing written
    run = tmp_path / "run"
    assert main(["train", *BASE, "log.trackers=[wandb]", "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert "pip install 'entropace[wandb]'" in err
    assert not any(line.startswith("run ") for line in err.splitlines())
    assert not run.exists()


def test_legacy_log_tensorboard_key_maps_onto_trackers_layer_by_layer(tmp_path) -> None:
    def trackers(preset: dict | None, cli: list[str]) -> list[str]:
        path = tmp_path / "p.yaml"
        path.write_text(json.dumps(preset or {}))
        return load_config(path, cli, check_envs=False).log.trackers

    assert trackers(None, []) == ["tensorboard"]  # the default
    assert trackers(None, ["log.tensorboard=false"]) == []
    assert trackers({"log": {"trackers": ["tensorboard", "mlflow"]}},
                    ["log.tensorboard=false"]) == ["mlflow"]  # fmt: skip
    assert trackers({"log": {"tensorboard": False}}, ["log.trackers=[tensorboard]"]) == [
        "tensorboard"
    ]  # the command line's later key wins over the preset's legacy one
    assert trackers({"log": {"tensorboard": True, "trackers": ["mlflow"]}}, []) == [
        "tensorboard", "mlflow",
    ]  # fmt: skip
    # an old run's config.yaml (log.tensorboard, no log.trackers) loads; the config written
    # from it has log.trackers only
    old = tmp_path / "old.yaml"
    old.write_text("log:\n  tensorboard: false\n  keep_last: 3\n")
    cfg = load_config_file(old, check_envs=False)
    assert cfg.log.trackers == [] and cfg.log.keep_last == 3
    assert not hasattr(cfg.log, "tensorboard")
    with pytest.raises(ConfigError, match="log.tensorboard: expected true/false"):
        load_config(None, ["log.tensorboard=maybe"], check_envs=False)


# ---------------------------------------------------------------------------------------------
# Start failures, fan-out, resume bookkeeping (fake trackers, the real training loop)
# ---------------------------------------------------------------------------------------------


def test_a_tracker_that_does_not_start_fails_before_the_first_rollout(
    monkeypatch, tmp_path, capsys
) -> None:
    log: list = []
    fake(monkeypatch, "first", log, rewinds=False)

    def boom(ctx: Any) -> Any:
        raise PermissionError("token rejected")

    monkeypatch.setitem(TRACKERS, "boom", TrackerSpec("boom", "json", "boom", (), boom))
    import entropace.rollout

    def no_rollout(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a rollout ran before the trackers started")

    monkeypatch.setattr(entropace.rollout, "collect_rollouts", no_rollout)
    cfg = load_config(None, [*BASE, "log.trackers=[first,boom]"])
    with pytest.raises(TrackerError, match=r"boom: the tracker did not start \(PermissionError"):
        train(cfg, tmp_path / "run")
    assert log[-1] == ("close", True)  # the tracker already started is closed, as failed
    # nothing marks the directory as holding a run: the same command runs once fixed
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    assert not (tmp_path / "run" / "config.yaml").exists()
    assert main(["train", *BASE, "log.trackers=[boom]", "--run-dir", str(tmp_path / "b")]) == 2
    assert "entropace train: error: boom: the tracker did not start" in capsys.readouterr().err


def test_a_training_that_raises_closes_its_trackers_as_failed(monkeypatch, tmp_path) -> None:
    log: list = []
    fake(monkeypatch, "first", log, rewinds=False)

    def broken_update(*args: Any, **kwargs: Any) -> Any:
        raise FloatingPointError("NaN in the batch")

    monkeypatch.setattr(trainer_module, "update_step", broken_update)
    with pytest.raises(FloatingPointError):
        train(load_config(None, [*BASE, "log.trackers=[first]"]), tmp_path / "run")
    assert [entry[0] for entry in log] == ["start", "close"] and log[-1] == ("close", True)


def test_rows_fan_out_unchanged_and_resume_sends_no_step_twice(monkeypatch, tmp_path) -> None:
    """2 steps, the step-2 checkpoint lost (a kill after the row was logged), resume: the
    append-only tracker keeps its step-2 row and is not sent step 2 again, the rewinding one
    gets it again (as metrics.jsonl), and a tracker failing while logging is switched off."""
    rewinding, append, flaky = [], [], []
    fake(monkeypatch, "rewinding", rewinding, rewinds=True)
    fake(monkeypatch, "append", append, rewinds=False)
    fake(monkeypatch, "flaky", flaky, rewinds=False, fail_at=2)
    run = tmp_path / "run"
    cfg = load_config(None, [*BASE, "log.trackers=[rewinding,append,flaky]", "seed=5"])
    train(cfg, run)
    first = read_metrics(run)
    assert [r["step"] for r in first] == [1, 2]
    for got in (rewinding, append):
        assert got[0] == ("start", None, None, 5) and got[-1] == ("close", False)
        assert [s for s, _ in got[1:-1]] == [1, 2]
        for (_, row), expected in zip(got[1:-1], first):
            assert row == finite(expected)  # the same numbers under the same names
    assert [s for s, *_ in flaky] == ["start", 1, "close"] and flaky[-1] == ("close", True)
    state = json.loads((run / "trackers.json").read_text())
    assert state["append"] == {"id": "fake-run", "last_step": 2}
    assert state["flaky"]["last_step"] == 1

    import shutil

    shutil.rmtree(list_checkpoints(run / "checkpoints")[-1])  # as if killed before saving it
    rewinding.clear(), append.clear(), flaky.clear()
    fake(monkeypatch, "flaky", flaky, rewinds=False)  # its server is back
    train(load_config_file(run / "config.yaml"), run, resume=True)
    resumed = read_metrics(run)
    assert [r["step"] for r in resumed] == [1, 2]
    assert untimed(finite(resumed[1])) == untimed(finite(first[1]))  # exact resume
    assert append[0] == ("start", 1, {"id": "fake-run", "last_step": 2}, 5)
    assert append[1:] == [("close", False)]  # step 2 not sent twice
    assert [s for s, *_ in rewinding[1:]] == [2, "close"]
    assert rewinding[1][1] == finite(resumed[1])
    assert [s for s, *_ in flaky[1:]] == [2, "close"]  # steps it lacks are sent


# ---------------------------------------------------------------------------------------------
# The real trackers, offline
# ---------------------------------------------------------------------------------------------

REAL = [n for n in ("tensorboard", "wandb", "mlflow", "trackio") if importlib.util.find_spec(n)]

SCRIPT = textwrap.dedent(
    """
    import shutil, sys
    from entropace.cli import main
    from entropace.envs.toy import register_letter_envs
    from entropace.train.checkpoint import list_checkpoints
    register_letter_envs("letter", "letter2")
    run, args = sys.argv[1], sys.argv[2:]
    assert main(["train", *args, "--run-dir", run]) == 0
    shutil.rmtree(list_checkpoints(__import__("pathlib").Path(run) / "checkpoints")[-1])
    assert main(["train", "--resume", run]) == 0
    """
)


def wandb_records(path: Path) -> list[Any]:
    """The protobuf records of a W&B ``.wandb`` file (LevelDB log format: 32 KiB blocks,
    7-byte chunk headers ``crc32 u32, length u16, type u8``; 1 full, 2 first, 3 middle, 4
    last), after its 7-byte ``:W&B`` header."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, out, pos, pending = path.read_bytes(), [], 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # block trailer padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            break
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


@pytest.mark.slow  # 2 CLI runs (2 steps, resume) + 4 trackers: ~20 s CPU; 80-120 s wall at load 15
@pytest.mark.skipif(REAL == ["tensorboard"] or not REAL, reason="no tracker package installed")
def test_real_trackers_offline_get_our_rows_and_config_once_across_a_resume(tmp_path) -> None:
    run = tmp_path / "run"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))},
        "WANDB_MODE": "offline", "WANDB_SILENT": "true",
        "TRACKIO_DIR": str(tmp_path / "trackio"),
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"), *sys.path]),
        "OMP_NUM_THREADS": "1",
    }  # fmt: skip
    args = [*BASE, f"log.trackers=[{','.join(REAL)}]", "log.project=entropace-test"]
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(run), *args],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_metrics(run)  # step 1 of the first run, step 2 of the resumed run
    assert [r["step"] for r in rows] == [1, 2]
    state = json.loads((run / "trackers.json").read_text())
    assert sorted(state) == sorted(REAL) and all(s["last_step"] == 2 for s in state.values())

    def same_rows(got: dict[int, dict[str, float]], name: str) -> None:
        """Steps 1 and 2 once each; step 1 equal to metrics.jsonl's, step 2 (the interrupted
        run's row, kept) equal except timings (the resume is exact)."""
        assert sorted(got) == [1, 2], name
        assert got[1] == pytest.approx(finite(rows[0]), rel=1e-12), name
        assert untimed(got[2]) == pytest.approx(untimed(finite(rows[1])), rel=1e-12), name

    if "tensorboard" in REAL:  # rewinds: step 2 is the resumed run's
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(run / "events"), size_guidance={"scalars": 0, "tensors": 0})
        acc.Reload()
        ent = acc.Scalars("task/letter/entropy")
        assert [e.step for e in ent] == [1, 2]
        assert [e.value for e in ent] == pytest.approx(
            [r["task/letter/entropy"] for r in rows], rel=1e-6
        )
        assert "config/text_summary" in acc.Tags()["tensors"]
    if "wandb" in REAL:
        files = sorted((run / "wandb").glob(f"offline-run-*-{state['wandb']['id']}/*.wandb"))
        assert len(files) == 2  # the run and its resume, one W&B run id
        got, config = {}, {}
        for f in files:
            for rec in wandb_records(f):
                kind = rec.WhichOneof("record_type")
                if kind == "history":
                    items = {
                        i.key or "/".join(i.nested_key): json.loads(i.value_json)
                        for i in rec.history.item
                    }
                    step = items.pop("_step")
                    assert step not in got, f"W&B got step {step} twice"
                    got[step] = {k: v for k, v in items.items() if not k.startswith("_")}
                elif kind == "run":
                    config = {i.key: json.loads(i.value_json) for i in rec.run.config.update}
        same_rows(got, "wandb")
        assert config["algorithm"]["name"] == "eppo+papo" and config["log"]["trackers"] == REAL
    if "mlflow" in REAL:
        from mlflow.tracking import MlflowClient

        # MLflow's default store (MLflow 3: sqlite:///mlflow.db in the working directory),
        # kept with its absolute path, so a resume from elsewhere finds the same run
        uri = state["mlflow"]["tracking_uri"]
        assert uri == f"sqlite:///{tmp_path / 'mlflow.db'}"
        client = MlflowClient(tracking_uri=uri)
        run_id = state["mlflow"]["run_id"]
        data = client.get_run(run_id).data
        got = {}
        for key in data.metrics:
            for m in client.get_metric_history(run_id, key):
                assert key not in got.get(m.step, {}), f"MLflow got {key}@{m.step} twice"
                got.setdefault(m.step, {})[key] = m.value
        same_rows(got, "mlflow")
        assert data.params["algorithm.name"] == "eppo+papo"
        assert data.params["log.trackers"] == json.dumps(REAL)
        assert client.get_run(run_id).info.status == "FINISHED"
        names = {a.path for a in client.list_artifacts(run_id)}
        assert {"config.yaml", "config-1.yaml"} <= names
    if "trackio" in REAL:  # trackio 0.43's local store: one SQLite file per project
        db = sqlite3.connect(tmp_path / "trackio" / "entropace-test.db")
        got = {}
        for step, metrics in db.execute("select step, metrics from metrics"):
            assert step not in got, f"trackio got step {step} twice"
            got[step] = json.loads(metrics)
        same_rows(got, "trackio")
        configs = [json.loads(c) for (c,) in db.execute("select config from configs")]
        assert configs[0]["algorithm"]["name"] == "eppo+papo"


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="mlflow not installed")
def test_mlflow_file_store_and_names_it_refuses(tmp_path, monkeypatch) -> None:
    """A local MLflow file store (MLflow 3 wants ``MLFLOW_ALLOW_FILE_STORE=true`` for it); a
    metric name with characters MLflow refuses is logged under a sanitised name."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    config = {"seed": 1, "tasks": {"names": ["db"]}}
    got = start_trackers(
        ["mlflow"], tmp_path, project="p", run_name="r", config=config,
        options={"mlflow": {"tracking_uri": uri}},
    )  # fmt: skip
    got.log(1, {"step": 1, "task/db/success": 0.5, "clip[db]": 0.2, "loss": None})
    got.close(failed=True)
    run = MlflowClient(tracking_uri=uri).get_run(json.loads((tmp_path / "trackers.json")
                                                            .read_text())["mlflow"]["run_id"])  # fmt: skip
    assert run.data.metrics == {"task/db/success": 0.5, "clip_db_": 0.2}
    assert run.data.params == {"seed": "1", "tasks.names": '["db"]'}
    assert run.info.status == "FAILED" and run.info.run_name == "r"
