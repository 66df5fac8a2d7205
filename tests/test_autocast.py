"""``ppo.autocast`` / ``rollout.autocast`` (bf16 autocast, fp32 master weights): the options
reach the passes, keep the weights and gradients fp32, and stay close to the fp32 values."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers")

from tests.test_cross_policy import cfg as rollout_cfg  # noqa: E402
from tests.test_cross_policy import three_turn_env  # noqa: E402
from tests.test_rollout import requests  # noqa: E402
from tests.test_update import as_minibatch, make_batch, make_cfg  # noqa: E402

from entropace.models.tiny import build_tiny_model  # noqa: E402
from entropace.rollout import collect_rollouts  # noqa: E402
from entropace.train.learner import accumulate_gradients, proximal_statistics  # noqa: E402
from entropace.train.trainer import build_learner  # noqa: E402


@pytest.mark.filterwarnings("ignore:rollout.autocast=none")  # fp32 behaviour on purpose
def test_update_autocast_bf16_is_close_to_fp32_and_keeps_fp32_gradients(single_thread) -> None:
    model, _ = build_tiny_model(seed=0)
    batch = make_batch(model)
    adv = (1.0 + torch.arange(batch.size, dtype=torch.float32)[:, None]) * batch.loss_mask
    out = {}
    for mode in ("none", "bf16"):
        learner = build_learner(make_cfg(f"ppo.autocast={mode}"), copy.deepcopy(model))
        mb = as_minibatch(batch, adv)
        lp = proximal_statistics(learner, mb).logprob
        res = accumulate_gradients(learner, mb)
        grads = [p.grad for p in learner.model.parameters()]
        assert all(g.dtype == torch.float32 for g in grads)
        out[mode] = (lp, res["loss"], torch.cat([g.flatten() for g in grads]).double())
    (lp32, loss32, g32), (lp16, loss16, g16) = out["none"], out["bf16"]
    assert not torch.equal(lp32, lp16)  # bf16 matmuls did run
    torch.testing.assert_close(lp16, lp32, atol=0.1, rtol=0.05)
    assert float(loss16) == pytest.approx(float(loss32), rel=0.05, abs=1e-3)
    assert float(g16 @ g32 / (g16.norm() * g32.norm())) > 0.98


def test_rollout_autocast_bf16_records_bf16_statistics(single_thread) -> None:
    model, tok = build_tiny_model(seed=0)
    reqs = requests(4, env=three_turn_env)
    b32 = collect_rollouts(model, tok, reqs, rollout_cfg(), seed=1).batch
    b16 = collect_rollouts(model, tok, reqs, rollout_cfg(autocast="bf16"), seed=1).batch
    assert b16.old_logprobs.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert not torch.equal(b16.old_logprobs, b32.old_logprobs)
    # a bf16 statistics pass on the same tokens is within bf16 round-off of the fp32 one
    with torch.autocast("cpu", dtype=torch.bfloat16):
        from entropace.rollout import sequence_token_stats

        s16 = sequence_token_stats(
            model, b32.input_ids, b32.attention_mask, temperature=0.8, loss_mask=b32.loss_mask
        )
    mask = b32.loss_mask > 0
    assert (s16.logprob[mask] - b32.old_logprobs[mask]).abs().max() < 0.15


def test_config_warns_on_autocast_settings_that_move_the_on_policy_ratio() -> None:
    from entropace.train.config import load_config

    for extra in (["ppo.autocast=bf16"], ["rollout.autocast=bf16", "ppo.autocast=bf16",
                                           "rollout.stats_from_generation=true"]):  # fmt: skip
        with pytest.warns(UserWarning, match="autocast"):
            load_config(None, extra, check_envs=False)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config(None, ["rollout.autocast=bf16", "ppo.autocast=bf16"], check_envs=False)
