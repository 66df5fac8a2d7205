"""``rollout.stats_from_generation`` (issue 12): the sampling statistics taken from generation's
own logits equal the recomputed statistics pass (fp32, 1e-5), with the same samples, on every
generation path (shared prefixes, KV reuse, split generate calls, turns cut by the episode
budget), and no statistics forward pass runs."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from tests.test_rollout import CounterEnv, add_eot_bias
from tests.test_rollout_kv import PATHS, grouped_requests

import entropace.rollout.engine as engine_mod
from entropace.rollout import RolloutConfig, RolloutRequest, collect_rollouts
from entropace.rollout.gen_stats import GenerationRecorder, assemble_generation_stats


def _both(model: Any, tok: Any, reqs: list[Any], cfg: RolloutConfig, seed: int) -> tuple:
    ref = collect_rollouts(model, tok, reqs, cfg, seed=seed)
    calls: list[int] = []
    original = engine_mod.sequence_token_stats
    engine_mod.sequence_token_stats = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        got = collect_rollouts(model, tok, reqs, dataclasses.replace(cfg, stats_from_generation=True),
                               seed=seed)  # fmt: skip
    finally:
        engine_mod.sequence_token_stats = original
    assert not calls  # no second pass over the trajectories
    return ref.batch, got.batch


def _assert_equal_stats(a: Any, b: Any) -> None:
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
    assert [e.messages for e in a.episodes] == [e.messages for e in b.episodes]
    for name in ("old_logprobs", "entropy", "sensitivity"):
        x, y = getattr(a, name), getattr(b, name)
        torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-5, msg=name)
        assert torch.equal(y[a.loss_mask == 0], torch.zeros_like(y[a.loss_mask == 0]))
    assert float(a.loss_mask.sum()) > 0


@pytest.mark.parametrize("path", ["old", "fast"])  # the other two: tests/test_rollout_kv.py
@pytest.mark.parametrize(
    ("do_sample", "top_p", "gen_batch"), [(False, 1.0, None), (True, 1.0, 4), (True, 0.8, None)]
)
def test_generation_stats_equal_the_statistics_pass(
    tiny_model_and_tokenizer: tuple[Any, Any], path: str, do_sample: bool, top_p: float,
    gen_batch: int | None,
) -> None:  # fmt: skip
    """Groups of 3, episodes ending after 1-3 turns, temperature 0.9 (the statistics are those
    of the full temperature-scaled distribution, also under top-p)."""
    model, tok = tiny_model_and_tokenizer
    add_eot_bias(model, tok, 3.0)
    cfg = RolloutConfig(max_new_tokens_per_turn=10, max_episode_tokens=400, temperature=0.9,
                        top_p=top_p, do_sample=do_sample, generation_batch_size=gen_batch,
                        micro_batch_size=4, **PATHS[path])  # fmt: skip
    a, b = _both(model, tok, grouped_requests([0, 1, 5], 3), cfg, seed=7)
    _assert_equal_stats(a, b)


def test_generation_stats_with_turns_cut_by_the_episode_budget(
    tiny_model_and_tokenizer: tuple[Any, Any],
) -> None:
    """Rows whose budget is below the call's: the tokens generated past a row's budget are
    dropped with their statistics."""
    model, tok = tiny_model_and_tokenizer
    env = lambda: CounterEnv(max_turns=10, stop_at=99)  # noqa: E731
    cfg = RolloutConfig(max_new_tokens_per_turn=15, max_episode_tokens=75)
    reqs = [RolloutRequest("counter", env, s, s) for s in (1, 22, 333, 4444)]
    a, b = _both(model, tok, reqs, cfg, seed=4)
    assert {e.end_reason for e in a.episodes} == {"length"}
    _assert_equal_stats(a, b)


def test_recorder_rejects_tokens_it_did_not_see() -> None:
    rec = GenerationRecorder(1.0)
    scores = torch.randn(2, 5)
    rec(torch.zeros(2, 3, dtype=torch.long), scores)
    rec.finish(torch.tensor([[0, 0, 0, 4], [0, 0, 0, 1]]))
    rows = rec.rows([[4], [1]])
    lp = torch.log_softmax(scores, -1)
    assert torch.allclose(rows[0][:, 0], lp[0, 4:5]) and torch.allclose(rows[1][:, 0], lp[1, 1:2])
    with pytest.raises(RuntimeError, match="stats_from_generation"):
        rec.rows([[3], [1]])
    with pytest.raises(RuntimeError, match="loss tokens"):
        assemble_generation_stats([[rows[0]]], torch.tensor([[0.0, 1.0, 1.0]]))
