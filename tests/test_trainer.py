"""The training loop end to end on the tiny model and a tiny deterministic environment:
exact resume, SIGTERM checkpointing, the metrics contract, checkpoints, ``train``/``eval`` CLIs.
"""

from __future__ import annotations

import json
import math
import os
import signal

import pytest
import torch

from entropace.cli import main
from entropace.envs import make, seeds
from entropace.envs.toy import register_letter_envs
from entropace.train import trainer as trainer_module
from entropace.train.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from entropace.train.config import load_config, load_config_file, to_dict
from entropace.train.metrics_log import clean, read_metrics
from entropace.train.trainer import build_learner, train

register_letter_envs("letter", "letter2")

OVERRIDES = [
    "model=tiny", "tasks=letter,letter2", "steps=4", "algo=eppo+papo", "P=1", "G=3",
    "rollout.max_new_tokens_per_turn=6", "rollout.max_episode_tokens=96",
    "rollout.temperature=1.0", "optim.lr=3e-3", "ppo.epochs=2", "ppo.num_minibatches=2",
    "ppo.micro_batch_size=2", "log.checkpoint_every=1", "log.keep_last=2", "log.progress=false",
    # the update's memory paths on (exact; resume must stay exact with them)
    "ppo.micro_batch_tokens=48", "ppo.checkpoint_mlp=true", "ppo.checkpoint_norms=true",
]  # fmt: skip
TIMING = ("time/", "tokens_per_s", "memory/")


def untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """4 uninterrupted steps through the CLI (with a preset file and overrides)."""
    root = tmp_path_factory.mktemp("full")
    preset = root / "preset.yaml"
    preset.write_text("seed: 3\nlog:\n  tensorboard: true\n")
    run_dir = root / "run"
    code = main(["train", "--preset", str(preset), *OVERRIDES, "--run-dir", str(run_dir)])
    assert code == 0
    return run_dir


def test_stop_and_resume_equals_an_uninterrupted_run(full_run, tmp_path, monkeypatch) -> None:
    # run B: the same config; SIGTERM arrives in the middle of step 2
    cfg = load_config(None, [*OVERRIDES, "seed=3"])
    calls = []
    original = trainer_module.update_step

    def update_then_signal(learner, batch, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(learner, batch, **kwargs)

    monkeypatch.setattr(trainer_module, "update_step", update_then_signal)
    run_b = tmp_path / "b"
    result = train(cfg, run_b)
    assert result.stopped_by == "SIGTERM" and result.last_step == 2
    assert [p.name for p in list_checkpoints(run_b / "checkpoints")] == [
        "step_00000001",
        "step_00000002",
    ]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored
    monkeypatch.setattr(trainer_module, "update_step", original)

    # a row logged after the last checkpoint (killed before it was saved) is dropped on resume
    with (run_b / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 3, "reward": 123.0}) + "\n")
    assert main(["train", "--resume", str(run_b), "--no-report"]) == 0

    full, resumed = read_metrics(full_run), read_metrics(run_b)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    a, b = untimed(full), untimed(resumed)
    for row_a, row_b in zip(a, b):
        assert row_a.keys() == row_b.keys()
        for key in row_a:  # identical, NaN included
            va, vb = row_a[key], row_b[key]
            assert va == vb or (math.isnan(va) and math.isnan(vb)), (row_a["step"], key, va, vb)
    # and so are the final weights
    model_a, _, _ = trainer_module.build_model(cfg.model)
    model_b, _, _ = trainer_module.build_model(cfg.model)
    load_checkpoint(full_run / "checkpoints" / "step_00000004", model=model_a, restore_rng=False)
    load_checkpoint(run_b / "checkpoints" / "step_00000004", model=model_b, restore_rng=False)
    for p, q in zip(model_a.parameters(), model_b.parameters()):
        assert torch.equal(p, q)


def test_metrics_follow_the_run_directory_contract(full_run) -> None:
    rows = read_metrics(full_run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    per_task = ["success", "reward", "entropy", "eps_low", "eps_high", "pace_m", "pace_z",
                "clip_frac_low", "clip_frac_high", "abnormal", "num_episodes", "response_tokens"]  # fmt: skip
    glob = ["entropy", "reward", "success", "loss", "approx_kl", "grad_norm", "lr",
            "clip_frac_low", "clip_frac_high", "polarity/pos_mass", "polarity/neg_mass",
            "polarity/w_plus", "polarity/w_minus", "polarity/u", "polarity/rho",
            "time/generation", "time/stats", "time/update", "time/step", "tokens_per_s",
            "memory/rss_mib", "memory/peak_rss_mib", "skipped_steps", "abnormal"]  # fmt: skip
    for row in rows:
        for task in ("letter", "letter2"):
            for key in per_task:
                # ppo.skip_inert: a task none of whose trajectories ran has no clip fractions
                skippable = key.startswith("clip_frac") and row["update/trained_rows_frac"] < 1
                assert f"task/{task}/{key}" in row or skippable, (task, key)
            assert row[f"task/{task}/num_episodes"] == 3  # P=1 prompt x G=3
        for key in glob:
            assert key in row, key
        for key, value in row.items():
            assert isinstance(value, int | float), key
        # values that follow from the other values of the row
        ep = [row[f"task/{t}/num_episodes"] for t in ("letter", "letter2")]
        succ = [row[f"task/{t}/success"] for t in ("letter", "letter2")]
        assert row["success"] == pytest.approx(sum(s * n for s, n in zip(succ, ep)) / sum(ep))
        assert row["polarity/w_plus"] + row["polarity/w_minus"] == pytest.approx(2.0)
        for t in ("letter", "letter2"):
            assert 0.15 <= row[f"task/{t}/eps_low"] <= 0.30
        assert row["skipped_steps"] == 0 and row["optimizer_steps"] == 4
    assert rows[0]["task/letter/eps_low"] == 0.2  # EPPO warmup step: eps0
    # the config saved in the run reproduces the run's config
    saved = load_config_file(full_run / "config.yaml")
    assert to_dict(saved) == to_dict(load_config(None, [*OVERRIDES, "seed=3"]))
    # TensorBoard events, keep-last-2 checkpoints, the report (entropace.report)
    assert any((full_run / "events").iterdir())
    assert [p.name for p in list_checkpoints(full_run / "checkpoints")] == [
        "step_00000003",
        "step_00000004",
    ]
    assert (full_run / "report").is_dir()


def test_checkpoint_round_trip_and_nan_as_null(tmp_path) -> None:
    cfg = load_config(None, OVERRIDES)
    model, _, _ = trainer_module.build_model(cfg.model)
    learner = build_learner(cfg, model)
    for p in learner.params:  # one AdamW step, so that the optimiser has moments to save
        p.grad = torch.randn_like(p)
    learner.optimizer.step()
    state = {"sampler": {"position": {"letter": 5}}, "x": [1, 2]}
    path = save_checkpoint(tmp_path, 7, model=model, optimizer=learner.optimizer, state=state)
    assert path.name == "step_00000007" and not list(tmp_path.glob(".tmp-*"))
    # load into a fresh model AND a fresh optimiser (not the objects that saved them)
    other, _, _ = trainer_module.build_model(cfg.model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    fresh = build_learner(cfg, other)
    assert not fresh.optimizer.state
    loaded = load_checkpoint(path, model=other, optimizer=fresh.optimizer)
    assert loaded == {"step": 7, **state}
    for p, q in zip(model.parameters(), other.parameters()):
        assert torch.equal(p, q)
    saved_state, loaded_state = learner.optimizer.state_dict(), fresh.optimizer.state_dict()
    assert saved_state["state"].keys() == loaded_state["state"].keys()
    for key, moments in saved_state["state"].items():
        for name, value in moments.items():
            assert torch.equal(value, loaded_state["state"][key][name]), (key, name)
    assert clean({"a": math.nan, "b": math.inf, "c": 2, "d": True, "e": 0.5}) == {
        "a": None, "b": None, "c": 2, "d": 1, "e": 0.5,
    }  # fmt: skip


def test_resume_rebuilds_the_schedule_from_the_new_config(tmp_path, caplog) -> None:
    """2 steps of a linear schedule, then ``--resume RUN steps=4``: the LR logged at steps 3-4 is
    a 4-step linear schedule's at those optimiser steps (the old horizon would give 0), a
    changed ``optim.weight_decay`` is honoured, and a warning names the changed keys."""
    run = tmp_path / "run"
    base = [*OVERRIDES, "steps=2", "optim.schedule=linear", "log.tensorboard=false",
            "log.report=false", "ppo.epochs=1"]  # fmt: skip
    preset = tmp_path / "p.yaml"
    preset.write_text("seed: 3\n")
    assert (
        main(["train", "--preset", str(preset), *base, "--run-dir", str(run), "--no-report"]) == 0
    )
    caplog.set_level("WARNING")
    assert main(["train", "--resume", str(run), "steps=4", "optim.weight_decay=0.01",
                 "--no-report"]) == 0  # fmt: skip
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    per_step = 2  # ppo.epochs=1 x ppo.num_minibatches=2 optimiser steps per training step
    total = 4 * per_step
    for r in rows[2:]:
        done = r["step"] * per_step
        assert r["lr"] == pytest.approx(3e-3 * (1 - done / total)), r["step"]
    assert rows[2]["lr"] > 0  # the old 2-step horizon would have reached 0 at step 2
    assert "steps: 2 -> 4" in caplog.text and "optim.weight_decay: 0.0 -> 0.01" in caplog.text
    cfg = load_config_file(run / "config.yaml")
    assert cfg.steps == 4 and cfg.optim.weight_decay == 0.01
    state = json.loads((run / "checkpoints" / "step_00000004" / "state.json").read_text())
    assert state["scheduler_steps"] == total and state["config"]["steps"] == 4
    # the step-2 optimiser state (weight decay 0) was loaded, then run under the new value
    optim = torch.load(run / "checkpoints" / "step_00000004" / "optim.pt", weights_only=True)
    assert {g["weight_decay"] for g in optim["optimizer"]["param_groups"]} == {0.01}


def test_sampler_takes_the_next_seeds_of_each_task() -> None:
    from entropace.train.data import TaskSampler

    cfg = load_config(None, [*OVERRIDES, "P=2", "tasks.mix={letter2: 0.5}", "tasks.seed_offset=10"])
    sampler = TaskSampler(cfg.tasks)
    first, second = sampler.next_prompts(), sampler.next_prompts()
    assert [(p.task, p.seed, p.group) for p in first] == [
        ("letter", 10, 0), ("letter", 11, 1), ("letter2", 10, 2),
    ]  # fmt: skip
    assert [(p.task, p.seed) for p in second] == [("letter", 12), ("letter", 13), ("letter2", 11)]
    restored = TaskSampler(cfg.tasks)
    restored.load_state_dict(sampler.state_dict())
    assert restored.next_prompts() == sampler.next_prompts()


def test_eval_cli_scores_held_out_seeds(full_run, capsys) -> None:
    code = main(["eval", str(full_run), "--tasks", "letter", "--n", "4"])
    assert code == 0
    out = capsys.readouterr().out
    result = json.loads((full_run / "eval.json").read_text())
    assert result["step"] == 4 and result["split"] == "held_out" and not result["do_sample"]
    # letter has no held-out units: test_unseen is n/a, shown as such
    assert result["splits"] == ["test", "test_unseen"]
    assert result["by_split"]["test_unseen"] == {"tasks": {"letter": None}, "mean_success": None}
    assert "n/a" in out
    episodes = result["episodes"]
    assert [e["seed"] for e in episodes] == list(seeds("test", 4))
    assert {e["split"] for e in episodes} == {"test"}
    # every success is the environment's verdict on the actions taken, replayed
    for e in episodes:
        env = make("letter")
        env.reset(e["seed"])
        verdict = False
        for action in e["actions"]:
            _, _, terminated, truncated, info = env.step(action)
            verdict = info["success"]
            if terminated or truncated:
                break
        assert e["success"] == verdict, e
    assert result["tasks"]["letter"]["success"] == sum(e["success"] for e in episodes) / 4
    assert "letter" in out and f"{result['tasks']['letter']['success']:.3f}" in out


def test_cli_errors_name_the_problem(tmp_path, capsys) -> None:
    assert main(["train", "--preset", "quick", "algo=nope"]) == 2
    assert "algorithm.name" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert "no config.yaml" in capsys.readouterr().err
    assert main(["eval", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_lora_checkpoints_hold_the_adapter_and_the_reference_is_the_base(tmp_path) -> None:
    pytest.importorskip("peft")
    from entropace.rollout import sequence_token_stats

    cfg = load_config(
        None, [*OVERRIDES, "model.lora=true", "model.lora_r=4", "algorithm.kl_beta=0.1"]
    )
    model, _, _ = trainer_module.build_model(cfg.model)
    learner = build_learner(cfg, model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    with torch.no_grad():  # move the adapter away from its zero init
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    ids = torch.randint(4, 400, (2, 12))
    attn = torch.ones_like(ids)
    base, _, _ = trainer_module.build_model(load_config(None, OVERRIDES).model)
    expected = sequence_token_stats(base, ids, attn, temperature=1.0).logprob
    torch.testing.assert_close(learner.reference(ids, attn), expected)
    path = save_checkpoint(tmp_path, 1, model=model, optimizer=learner.optimizer, state={})
    from safetensors.torch import load_file

    saved = load_file(str(path / "model.safetensors"))
    assert saved and all("lora_" in k for k in saved)
    fresh, _, _ = trainer_module.build_model(cfg.model)
    load_checkpoint(path, model=fresh, restore_rng=False)
    for (n, p), (_, q) in zip(model.named_parameters(), fresh.named_parameters()):
        assert torch.equal(p, q), n
