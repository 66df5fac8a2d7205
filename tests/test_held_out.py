"""The trainer's periodic held-out evaluation (``eval.every``, train/held_out.py): it never
changes the run, it logs at the right steps, and it equals ``entropace eval`` at a checkpoint."""

from __future__ import annotations

import pytest

from entropace.envs.toy import register_letter_envs
from entropace.train.checkpoint import list_checkpoints
from entropace.train.config import ConfigError, load_config
from entropace.train.evaluation import evaluate
from entropace.train.metrics_log import read_metrics
from entropace.train.trainer import train

register_letter_envs("letter", "letter2")

OVERRIDES = [
    "model=tiny", "tasks=letter,letter2", "steps=3", "algo=grpo", "P=1", "G=3",
    "rollout.max_new_tokens_per_turn=6", "rollout.max_episode_tokens=96",
    "optim.lr=3e-3", "ppo.micro_batch_size=3", "log.checkpoint_every=1", "log.keep_last=3",
    "log.progress=false", "log.tensorboard=false", "log.report=false",
]  # fmt: skip
SKIP = ("time/", "tokens_per_s", "memory/", "eval/")


def test_periodic_eval_changes_nothing_and_equals_entropace_eval(tmp_path, single_thread) -> None:
    plain = train(load_config(None, OVERRIDES), tmp_path / "plain")
    evald = train(load_config(None, [*OVERRIDES, "eval.every=2", "eval.n=4"]), tmp_path / "eval")
    assert plain.last_step == evald.last_step == 3
    a, b = read_metrics(tmp_path / "plain"), read_metrics(tmp_path / "eval")
    strip = [{k: v for k, v in r.items() if not k.startswith(SKIP)} for r in a]
    trained = [r for r in b if r["step"] > 0]
    assert strip == [{k: v for k, v in r.items() if not k.startswith(SKIP)} for r in trained]
    assert not any(k.startswith("eval/") for r in a for k in r)
    logged = {r["step"]: r for r in b if "eval/success" in r}
    assert sorted(logged) == [0, 2, 3]  # before the first step, every 2nd step, the last one
    assert set(b[0]) == {"step", "time/eval"} | {k for k in b[0] if k.startswith("eval/")}
    # step 0: the initial policy (the tiny model's fixed weights) on the same held-out seeds
    from entropace.train.held_out import held_out_metrics
    from entropace.train.trainer import build_model

    cfg = load_config(None, [*OVERRIDES, "eval.every=2", "eval.n=4"])
    model, tokenizer, _ = build_model(cfg.model)
    assert held_out_metrics(model, tokenizer, cfg) == {
        k: v for k, v in logged[0].items() if k.startswith("eval/")
    }
    # the same numbers as `entropace eval` on the checkpoint of that step
    for step in (2, 3):
        ckpts = list_checkpoints(tmp_path / "eval" / "checkpoints")
        ckpt = next(c for c in ckpts if int(c.name.removeprefix("step_")) == step)
        res = evaluate(tmp_path / "eval", n=4, split="test", checkpoint=ckpt, write=False)
        for task in ("letter", "letter2"):
            assert logged[step][f"eval/{task}/success"] == res["tasks"][task]["success"]
            assert logged[step][f"eval/{task}/reward"] == pytest.approx(
                res["tasks"][task]["reward"], abs=1e-12
            )


@pytest.mark.parametrize(
    "override",
    ["eval.every=-1", "eval.n=0", "eval.split=train", "eval.split=dev", "eval.batch_size=0"],
)
def test_bad_eval_settings_are_refused_at_load(override: str) -> None:
    with pytest.raises(ConfigError, match="eval"):
        load_config(None, [*OVERRIDES, override])


def test_evaluation_runs_no_statistics_pass_and_its_episodes_are_unchanged(
    monkeypatch, single_thread
) -> None:
    """The held-out episodes take the (unused) token statistics from generation's logits: no
    second forward pass over the trajectories, also when the run recomputes them
    (``rollout.stats_from_generation=false``); greedy episodes are the same either way."""
    import dataclasses

    import entropace.rollout.engine as engine
    from entropace.models.tiny import build_tiny_model
    from entropace.rollout import RolloutRequest, collect_rollouts
    from entropace.train.held_out import held_out_episodes

    cfg = load_config(None, OVERRIDES)
    assert cfg.rollout.stats_from_generation is False
    model, tokenizer = build_tiny_model(seed=0)
    factories = {t: cfg.tasks.env_factory(t) for t in cfg.tasks.names}
    greedy = dataclasses.replace(cfg.rollout, do_sample=False)
    requests = [RolloutRequest(task=t, env=factories[t], seed=s, group_id=i)
                for i, (t, s) in enumerate((t, s) for t in factories for s in (0, 1, 2))]  # fmt: skip
    reference = collect_rollouts(model, tokenizer, requests, greedy, task_names=list(factories))

    def no_pass(*args, **kwargs):
        raise AssertionError("an evaluation ran the statistics pass")

    monkeypatch.setattr(engine, "_sampling_stats", no_pass)
    records = held_out_episodes(model, tokenizer, cfg.rollout, factories, [0, 1, 2])
    assert [r["actions"] for r in records] == [
        [m["content"] for m in ep.messages if m["role"] == "assistant"]
        for ep in reference.batch.episodes
    ]
    assert [r["reward"] for r in records] == reference.batch.rewards.tolist()
