"""Cross-policy sampling (AgentRL): a pool of two different tiny models acting turn by turn.

Asserts that every generated token's behaviour log-prob (and entropy, sensitivity) is the one
of the policy that sampled it, recomputed in float64 (and not the other policy's), that a whole
turn comes from one policy as the seeded chooser says, that the batch is deterministic and the
per-model key/value caches change nothing, and that the engine's recorded log-probs equal the
learner's recomputation under the weights that generated them (the snapshot test of issue 19).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from tests.test_rollout import CounterEnv, reference_stats, requests  # noqa: E402

from entropace.models.tiny import build_tiny_model  # noqa: E402
from entropace.rollout import RolloutConfig, collect_rollouts  # noqa: E402
from entropace.rollout.cross_policy import TurnChooser  # noqa: E402
from entropace.train.config import load_config  # noqa: E402
from entropace.train.learner import MiniBatch, proximal_logprobs  # noqa: E402
from entropace.train.trainer import build_learner  # noqa: E402

TEMPERATURE = 0.8


def three_turn_env() -> CounterEnv:
    return CounterEnv(max_turns=4, stop_at=3)


def cfg(**kw: Any) -> RolloutConfig:
    base = dict(max_new_tokens_per_turn=8, max_episode_tokens=400, temperature=TEMPERATURE)
    return RolloutConfig(**{**base, **kw})


@pytest.fixture
def pool(single_thread: None) -> tuple[Any, Any, Any]:
    m0, tok = build_tiny_model(seed=0)
    m1, _ = build_tiny_model(seed=1)  # same vocabulary and tokenizer, other weights
    return m0, m1, tok


def turns_of(mask_row: torch.Tensor) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of generated tokens (one assistant turn each)."""
    out, start = [], None
    for t, v in enumerate(mask_row.tolist() + [0]):
        if v and start is None:
            start = t
        elif not v and start is not None:
            out.append((start, t))
            start = None
    return out


def test_each_token_trains_with_the_log_prob_of_the_policy_that_sampled_it(pool) -> None:
    m0, m1, tok = pool
    result = collect_rollouts(
        m0, tok, requests(6, env=three_turn_env), cfg(), seed=7, policies=[m1]
    )
    batch = result.batch
    chooser = TurnChooser.uniform(2, 7)
    assert batch.off_policy and batch.behaviour_policy is not None
    policy = batch.behaviour_policy
    assert set(policy[batch.loss_mask > 0].tolist()) == {0, 1}  # both policies acted
    assert (policy[batch.loss_mask == 0] == -1).all()
    refs = [copy.deepcopy(m).double() for m in (m0, m1)]
    for i in range(batch.size):
        length = int(batch.attention_mask[i].sum())
        ids = batch.input_ids[i, :length].tolist()
        stats = [reference_stats(r, ids, TEMPERATURE) for r in refs]
        for turn, (a, b) in enumerate(turns_of(batch.loss_mask[i, :length])):
            p = chooser(i, turn)
            assert (policy[i, a:b] == p).all()  # a whole turn, from the chooser's policy
            for name, got in [("logprob", batch.old_logprobs), ("entropy", batch.entropy),
                              ("sensitivity", batch.sensitivity)]:  # fmt: skip
                torch.testing.assert_close(
                    got[i, a:b].double(), stats[p][name][a:b], atol=2e-5, rtol=1e-4
                )
            # the other policy's log-probs are far off: the test can tell them apart
            other = stats[1 - p]["logprob"][a:b]
            assert (batch.old_logprobs[i, a:b].double() - other).abs().max() > 1e-2


def test_cross_policy_is_deterministic_and_caches_change_nothing(pool) -> None:
    m0, m1, tok = pool
    reqs = requests(6, env=three_turn_env)
    runs = [
        collect_rollouts(m0, tok, reqs, cfg(reuse_kv=kv, share_prefix=kv), seed=3, policies=[m1])
        for kv in (True, True, False)
    ]
    a, b, plain = (r.batch for r in runs)
    for other in (b, plain):
        assert torch.equal(a.input_ids, other.input_ids)
        assert torch.equal(a.behaviour_policy, other.behaviour_policy)
        torch.testing.assert_close(a.old_logprobs, other.old_logprobs, atol=1e-5, rtol=1e-5)
    # the generation statistics of each turn come from its own sampler too
    gen = collect_rollouts(
        m0, tok, reqs, cfg(stats_from_generation=True), seed=3, policies=[m1]
    ).batch
    assert torch.equal(gen.input_ids, a.input_ids)
    torch.testing.assert_close(gen.old_logprobs, a.old_logprobs, atol=1e-5, rtol=1e-4)


def test_turn_chooser_is_a_seeded_draw_with_the_given_weights() -> None:
    c = TurnChooser((3.0, 1.0, 0.0), seed=11)
    draws = [c(e, t) for e in range(400) for t in range(10)]
    assert draws == [TurnChooser((3.0, 1.0, 0.0), seed=11)(e, t) for e in range(400)
                     for t in range(10)]  # fmt: skip
    assert 2 not in draws
    assert abs(draws.count(0) / len(draws) - 0.75) < 0.03
    assert draws != [TurnChooser((3.0, 1.0, 0.0), seed=12)(e, t) for e in range(400)
                     for t in range(10)]  # fmt: skip
    with pytest.raises(ValueError):
        TurnChooser((0.0, 0.0), seed=0)


def test_pool_members_must_share_the_vocabulary(pool) -> None:
    m0, _m1, tok = pool
    other, _ = build_tiny_model(seed=2, vocab=600)
    with pytest.raises(ValueError, match="vocabulary"):
        collect_rollouts(m0, tok, requests(2), cfg(), seed=0, policies=[other])


def test_behaviour_log_probs_equal_the_learners_recomputation_under_the_snapshot(pool) -> None:
    """The engine's recorded log-probs (the behaviour policy's) equal the learner's own
    recomputation (training-side micro-batching, shared prefixes, fused head) under the same
    weights at the sampling temperature: for the current weights, and, in a cross-policy
    batch, for the snapshot that sampled each token."""
    m0, m1, tok = pool
    tcfg = load_config(
        None,
        [
            "tasks=counter",
            f"rollout.temperature={TEMPERATURE}",
            "ppo.micro_batch_size=2",
            "rollout.max_new_tokens_per_turn=8",
            "rollout.max_episode_tokens=400",
        ],
        check_envs=False,
    )
    batch = collect_rollouts(
        m0, tok, requests(6, env=three_turn_env), tcfg.rollout, task_names=["counter"], seed=5,
        policies=[m1],
    ).batch  # fmt: skip
    mb = MiniBatch(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask,
        loss_mask=batch.loss_mask, old_logprobs=batch.old_logprobs,
        advantages=torch.zeros_like(batch.old_logprobs), eps_low=torch.zeros(batch.size, 1),
        eps_high=torch.zeros(batch.size, 1), task_ids=batch.task_ids, group_ids=batch.group_ids,
    )  # fmt: skip
    for p, model in enumerate((m0, m1)):
        learner = build_learner(tcfg, copy.deepcopy(model))
        recomputed = proximal_logprobs(learner, mb)
        here = batch.behaviour_policy == p
        assert here.any()
        torch.testing.assert_close(batch.old_logprobs[here], recomputed[here], atol=2e-5, rtol=1e-5)
