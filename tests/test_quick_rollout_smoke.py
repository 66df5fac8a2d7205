"""A quick-shaped rollout on the real engine (issue 36): the quick preset's rollout settings and
tasks (db and kg, 2 prompts x G = 8, up to 3 turns of 40 tokens, shared prefixes, KV reuse,
statistics from generation) with the tiny model. Part of the suite, and run by .ci/run in the
venvs with the lowest declared transformers and with verl's newest allowed one, where a cache
keyword or cache class that the installed transformers does not take fails it."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from entropace.rollout import collect_rollouts  # noqa: E402
from entropace.rollout.kvcache import kv_reuse_support  # noqa: E402
from entropace.train.config import load_config  # noqa: E402
from entropace.train.data import TaskSampler  # noqa: E402
from entropace.train.trainer import rollout_requests  # noqa: E402


def test_quick_rollout_with_kv_reuse_equals_the_plain_path_and_the_statistics_pass(
    tiny_model_and_tokenizer: tuple[Any, Any],
) -> None:
    """Three rollouts with the same seed: quick's (shared prefixes, KV reuse, statistics
    from generation), the same with the statistics recomputed by the statistics pass, and
    the plain path (every turn re-encoded, no shared prefix). Same tokens in all three
    (the cached keys/values are those of the same positions); statistics equal to fp32
    round-off (1e-5); the cache really served: cached positions > 0 and prefilled
    positions fewer than the plain path's; episodes of more than one turn."""
    model, tok = tiny_model_and_tokenizer
    cfg = load_config("quick", ["model=tiny"])
    rollout = cfg.rollout
    assert (rollout.share_prefix, rollout.reuse_kv, rollout.stats_from_generation) == (
        True, True, True,
    )  # fmt: skip
    assert kv_reuse_support(model) is None
    requests = rollout_requests(TaskSampler(cfg.tasks).next_prompts(), cfg)
    assert len(requests) == 32 and {r.task for r in requests} == {"db", "kg"}
    runs = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to the plain path, no deprecated keyword
        for name, changes in {
            "quick": {},
            "recomputed": {"stats_from_generation": False},
            "plain": {"share_prefix": False, "reuse_kv": False},
        }.items():
            runs[name] = collect_rollouts(
                model, tok, requests, dataclasses.replace(rollout, **changes), seed=11
            )
    quick, recomputed, plain = runs["quick"], runs["recomputed"], runs["plain"]
    for other in (recomputed, plain):
        assert torch.equal(other.batch.input_ids, quick.batch.input_ids)
        assert torch.equal(other.batch.loss_mask, quick.batch.loss_mask)
        for field in ("old_logprobs", "entropy", "sensitivity"):
            torch.testing.assert_close(
                getattr(quick.batch, field), getattr(other.batch, field),
                rtol=1e-5, atol=1e-5, msg=field,
            )  # fmt: skip
    assert quick.counts["cached_tokens"] > 0 and plain.counts["cached_tokens"] == 0
    assert quick.counts["prefill_tokens"] < plain.counts["prefill_tokens"]
    assert quick.counts["turns"] > quick.counts["episodes"]  # multi-turn
    assert float(quick.batch.loss_mask.sum()) == quick.counts["generated_tokens"]
