"""Per-episode scores from step info (``kg``'s ``f1``) through the rollout to ``task/<k>/f1``."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("transformers")

from entropace.rollout import RolloutConfig, RolloutRequest, collect_rollouts  # noqa: E402
from entropace.rollout.batch import EpisodeRecord, info_scores, task_scores  # noqa: E402

CFG = RolloutConfig(max_new_tokens_per_turn=8, max_episode_tokens=300, temperature=1.0)


class ScoredEnv:
    """Two turns; step 1 reports f1 0.0, step 2 reports f1 = seed / 8 and ends the episode."""

    name = "scored"
    system_prompt = "Say anything."
    max_turns = 5

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.seed, self.turn = seed, 0
        return f"seed {seed}", {"task": self.name, "seed": seed}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.turn += 1
        done = self.turn == 2
        f1 = self.seed / 8 if done else 0.0
        return "ok", 0.0, done, False, {"success": False, "parse_error": False, "f1": f1}


class PlainEnv(ScoredEnv):
    name = "plain"

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, r, done, trunc, info = super().step(action)
        del info["f1"]
        return obs, r, done, trunc, info


def _record(task: str, **scores: float) -> EpisodeRecord:
    return EpisodeRecord(task, 0, [], 0.0, False, "terminated", dict(scores))


def test_info_scores_keeps_finite_numbers_only() -> None:
    assert info_scores({"f1": 0.5, "success": True}) == {"f1": 0.5}
    assert info_scores({"f1": 1}) == {"f1": 1.0}
    for bad in (True, float("nan"), float("inf"), "0.5", None, [1.0]):
        assert info_scores({"f1": bad}) == {}


def test_task_scores_hand_worked() -> None:
    records = [
        _record("kg", f1=1.0),
        _record("kg", f1=0.4),
        _record("kg"),  # ended before its first step: counts as 0
        _record("db"),  # db reports no f1: left out
    ]
    assert task_scores(records) == {"task/kg/f1": pytest.approx((1.0 + 0.4 + 0.0) / 3)}
    assert task_scores([]) == {}


def test_rollout_records_the_last_score(tiny_model_and_tokenizer) -> None:
    model, tok = tiny_model_and_tokenizer
    requests = [RolloutRequest("scored", ScoredEnv, s, s) for s in range(4)]
    requests += [RolloutRequest("plain", PlainEnv, s, 10 + s) for s in range(2)]
    batch = collect_rollouts(
        model, tok, requests, CFG, task_names=["scored", "plain"], seed=0
    ).batch
    for record in batch.episodes:
        if record.task == "scored" and record.end_reason == "terminated":
            assert record.scores == {"f1": record.seed / 8}
        if record.task == "plain":
            assert record.scores == {}
    done = [r for r in batch.episodes if r.task == "scored"]
    expected = sum(r.scores.get("f1", 0.0) for r in done) / len(done)
    assert task_scores(batch.episodes) == {"task/scored/f1": pytest.approx(expected)}
    assert all(r.end_reason == "terminated" for r in done)  # 2 short turns fit the budget
    assert expected == pytest.approx((0 + 1 + 2 + 3) / 8 / 4)


def test_kg_episodes_report_f1_in_the_rollout(tiny_model_and_tokenizer) -> None:
    from entropace.envs import make

    model, tok = tiny_model_and_tokenizer
    requests = [
        RolloutRequest("kg", lambda: make("kg", hide_members=True, max_turns=2), s, s)
        for s in range(2)
    ]
    cfg = RolloutConfig(max_new_tokens_per_turn=8, max_episode_tokens=1600, temperature=1.0)
    batch = collect_rollouts(model, tok, requests, cfg, task_names=["kg"], seed=0).batch
    assert all(r.scores == {"f1": 0.0} for r in batch.episodes)  # random text never answers
    assert task_scores(batch.episodes) == {"task/kg/f1": 0.0}


def test_task_error_rates_hand_worked() -> None:
    from entropace.rollout.types import RolloutResult

    counts = {
        "db": {"turns": 4, "parse_errors": 3, "tool_errors": 2},
        "kg": {"turns": 0, "parse_errors": 0, "tool_errors": 0},  # no step: rates 0, not NaN
    }
    result = RolloutResult(batch=None, timings={}, counts={}, task_counts=counts)  # type: ignore[arg-type]
    assert result.task_error_rates() == {
        "task/db/parse_errors": 0.75,
        "task/db/tool_errors": 0.5,
        "task/kg/parse_errors": 0.0,
        "task/kg/tool_errors": 0.0,
    }


def test_tool_errors_of_random_text_reach_the_rates(tiny_model_and_tokenizer) -> None:
    from entropace.envs import make

    model, tok = tiny_model_and_tokenizer
    requests = [
        RolloutRequest("db", lambda: make("db", interface="tools", max_turns=2), s, s)
        for s in range(2)
    ]
    cfg = RolloutConfig(max_new_tokens_per_turn=8, max_episode_tokens=2400, temperature=1.0)
    result = collect_rollouts(model, tok, requests, cfg, task_names=["db"], seed=0)
    c = result.task_counts["db"]
    # random 8-token text never holds a tool call: every step is a `no_call` tool error
    assert c["turns"] > 0 and c["tool_errors"] == c["parse_errors"] == c["turns"]
    assert result.task_error_rates() == {"task/db/parse_errors": 1.0, "task/db/tool_errors": 1.0}
