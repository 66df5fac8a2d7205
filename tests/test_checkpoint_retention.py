"""What a run keeps on disk: ``log.keep_last`` checkpoints, and with
``log.optimizer_state=last`` the optimiser state (twice the weights for AdamW) in the newest one
only; resuming from it is exact, resuming from a checkpoint without it is a clear error."""

from __future__ import annotations

import math
import os
import signal

import pytest
import torch

from entropace.cli import main
from entropace.envs.toy import register_letter_envs
from entropace.train import trainer as trainer_module
from entropace.train.checkpoint import (
    OPTIM_FILE,
    CheckpointError,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from entropace.train.config import ConfigError, load_config
from entropace.train.metrics_log import read_metrics
from entropace.train.trainer import build_learner, train

register_letter_envs("letter", "letter2")

OVERRIDES = [
    "model=tiny", "tasks=letter,letter2", "steps=3", "algo=eppo+papo", "P=1", "G=3",
    "rollout.max_new_tokens_per_turn=6", "rollout.max_episode_tokens=96",
    "rollout.temperature=1.0", "optim.lr=3e-3", "ppo.epochs=1", "ppo.num_minibatches=2",
    "ppo.micro_batch_size=2", "log.checkpoint_every=1", "log.keep_last=3", "log.progress=false",
    "log.trackers=[]", "log.report=false", "seed=4",
]  # fmt: skip
TIMING = ("time/", "tokens_per_s", "memory/")


def untimed(rows: list[dict]) -> list[dict]:
    return [
        {k: v for k, v in r.items() if not k.startswith(TIMING) and not math.isnan(v)} for r in rows
    ]


def stepped_learner():
    cfg = load_config(None, OVERRIDES)
    model, _, _ = trainer_module.build_model(cfg.model)
    learner = build_learner(cfg, model)
    for p in learner.params:  # one AdamW step: moments to save
        p.grad = torch.randn_like(p)
    learner.optimizer.step()
    return cfg, model, learner


def test_optimizer_state_last_keeps_it_in_the_newest_checkpoint_only(tmp_path) -> None:
    cfg, model, learner = stepped_learner()
    for step in (1, 2, 3, 4):
        save_checkpoint(
            tmp_path, step, model=model, optimizer=learner.optimizer, state={},
            keep_last=3, optimizer_state="last",
        )  # fmt: skip
        kept = list_checkpoints(tmp_path)
        assert [(p / OPTIM_FILE).exists() for p in kept] == [False] * (len(kept) - 1) + [True]
    assert [p.name for p in kept] == ["step_00000002", "step_00000003", "step_00000004"]
    # an older checkpoint still loads its weights (eval, reports) ...
    other, _, _ = trainer_module.build_model(cfg.model)
    assert load_checkpoint(kept[0], model=other, restore_rng=False)["step"] == 2
    for p, q in zip(model.parameters(), other.parameters()):
        assert torch.equal(p, q)
    # ... but resuming from it (with an optimiser) is refused, saying why
    with pytest.raises(CheckpointError, match=r"step_00000002: has no optimiser state \(optim"):
        load_checkpoint(kept[0], model=other, optimizer=build_learner(cfg, other).optimizer)
    # the default keeps it in every checkpoint it writes (and removes none)
    save_checkpoint(tmp_path, 5, model=model, optimizer=learner.optimizer, state={}, keep_last=3)
    assert [(p / OPTIM_FILE).exists() for p in list_checkpoints(tmp_path)] == [False, True, True]
    with pytest.raises(ConfigError, match="log.optimizer_state: 'first' is not allowed"):
        load_config(None, [*OVERRIDES, "log.optimizer_state=first"])


def test_resume_with_optimizer_state_last_equals_an_uninterrupted_run(
    tmp_path, monkeypatch, capsys
) -> None:
    full = tmp_path / "full"
    train(load_config(None, OVERRIDES), full)  # optimizer_state=all, 3 steps

    cfg = load_config(None, [*OVERRIDES, "log.optimizer_state=last"])
    calls, original = [], trainer_module.update_step

    def update_then_signal(learner, batch, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # SIGTERM in step 2: checkpoint after it, stop
            os.kill(os.getpid(), signal.SIGTERM)
        return original(learner, batch, **kwargs)

    monkeypatch.setattr(trainer_module, "update_step", update_then_signal)
    run = tmp_path / "last"
    assert train(cfg, run).last_step == 2
    monkeypatch.setattr(trainer_module, "update_step", original)
    kept = list_checkpoints(run / "checkpoints")
    assert [(p.name, (p / OPTIM_FILE).exists()) for p in kept] == [
        ("step_00000001", False), ("step_00000002", True),
    ]  # fmt: skip
    assert main(["train", "--resume", str(run)]) == 0

    assert untimed(read_metrics(run)) == untimed(read_metrics(full))
    a, _, _ = trainer_module.build_model(cfg.model)
    b, _, _ = trainer_module.build_model(cfg.model)
    load_checkpoint(full / "checkpoints" / "step_00000003", model=a, restore_rng=False)
    load_checkpoint(run / "checkpoints" / "step_00000003", model=b, restore_rng=False)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    assert [(p / OPTIM_FILE).exists() for p in list_checkpoints(run / "checkpoints")] == [
        False, False, True,
    ]  # fmt: skip

    # a newest checkpoint without optimiser state (e.g. deleted by hand): a clear error
    (run / "checkpoints" / "step_00000003" / OPTIM_FILE).unlink()
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "steps=4"]) == 2
    assert "step_00000003: has no optimiser state" in capsys.readouterr().err
