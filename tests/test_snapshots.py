"""The cross-policy pool on the trainer side: snapshot ages, checkpoint wrappers, a short run."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from tests.test_trainer import OVERRIDES  # noqa: E402

from entropace.models.tiny import build_tiny_model  # noqa: E402
from entropace.rollout.config import CrossPolicyConfig  # noqa: E402
from entropace.train.config import load_config  # noqa: E402
from entropace.train.metrics_log import read_metrics  # noqa: E402
from entropace.train.recompute import checkpoint_mlps  # noqa: E402
from entropace.train.snapshots import PolicyPool  # noqa: E402
from entropace.train.trainer import train  # noqa: E402


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_snapshot_ages_follow_the_updates(single_thread) -> None:
    """Ages 1 and 3: after update u (weights version u), age k is version max(u - k, 0); a
    snapshot of a model with checkpointed MLPs computes with its OWN weights."""
    model, _ = build_tiny_model(seed=0)
    checkpoint_mlps(model)
    model.train()
    pool = PolicyPool.build(CrossPolicyConfig(stale=[1, 3]), load=lambda name: None)
    ids = torch.tensor([[5, 9, 17, 33, 2]])
    versions = [_logits(model, ids)]
    assert all(m is model for m in pool.members(model))  # before any update: the current weights
    for _update in range(5):
        pool.before_update(model)
        with torch.no_grad():  # "the update": a new version of the weights
            for p in model.parameters():
                p.add_(0.01 * torch.randn_like(p))
        versions.append(_logits(model, ids))
        u = len(versions) - 1
        for age, member in zip((1, 3), pool.members(model), strict=True):
            assert member is not model and not member.training
            assert not any(p.requires_grad for p in member.parameters())
            torch.testing.assert_close(_logits(member, ids), versions[max(u - age, 0)])
    assert len(pool._ring) == 3  # max(stale) copies, reused in place


def test_pool_is_off_by_default() -> None:
    assert PolicyPool.build(CrossPolicyConfig(), load=lambda name: None) is None


def test_training_with_a_stale_policy_in_the_pool(tmp_path) -> None:
    """Two steps of the tiny trainer with cross-policy sampling (the current weights and the
    1-stale snapshot, decoupled objective): every step logs rollout/behaviour_kl (>= 0; at
    step 1 the snapshot is the current weights, so it is round-off only) and the decoupled
    weights' metrics."""
    cfg = load_config(
        None,
        [*OVERRIDES, "steps=2", "log.tensorboard=false", "rollout.cross_policy.stale=[1]",
         "ppo.decoupled.enabled=true"],
    )  # fmt: skip
    result = train(cfg, tmp_path / "run")
    assert result.last_step == 2
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["rollout/behaviour_kl"] < 1e-6
    for r in rows:
        assert r["rollout/behaviour_kl"] >= 0
        assert 0 < r["rollout/cross_policy_token_frac"] < 1  # both members acted
        assert 0 <= r["loss/behaviour_capped_frac"] <= 1
