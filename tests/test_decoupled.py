"""AReaL's decoupled objective (arXiv 2505.24298): loss vs a float64 loop (value and gradient),
exact equality with plain PPO when behaviour == proximal, the cap, refusals, and the update's
proximal pass (``rollout/behaviour_kl``, the decoupled wiring)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from tests.test_update import as_minibatch, make_batch, make_cfg

import entropace.algos as algos
from entropace.algos.policy_losses import POLICY_LOSSES, LossInputs, PPOLossConfig, get_policy_loss
from entropace.train.config import ConfigError, load_config
from entropace.train.learner import proximal_logprobs
from entropace.train.trainer import build_learner
from entropace.train.update import update_step


@pytest.fixture(scope="module")
def tiny():
    from entropace.models.tiny import build_tiny_model

    model, _ = build_tiny_model(seed=0)
    return model


def _inputs(seed: int = 0, B: int = 4, T: int = 7, spread: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    prox = lp + spread * 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)
    behav = prox + spread * 0.8 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    adv[0, 2] = 0.0
    mask = (torch.rand(B, T, generator=g) > 0.25).double()
    return lp, prox, behav, adv, mask


def _loop_loss_and_grad(lp, prox, behav, adv, mask, eps_l, eps_h, c, cap):
    """Token by token in float64: value and d/d logprobs of the token-mean decoupled loss."""
    B, T = lp.shape
    n = int(mask.sum())
    total = 0.0
    grad = [[0.0] * T for _ in range(B)]
    for i in range(B):
        for t in range(T):
            if not mask[i, t]:
                continue
            w = math.exp(float(prox[i, t]) - float(behav[i, t]))
            if cap is not None and w > cap:
                w = 0.0
            a = float(adv[i, t])
            r = math.exp(float(lp[i, t]) - float(prox[i, t]))
            clipped = min(max(r, 1 - eps_l), 1 + eps_h)
            unclipped_term, clipped_term = -a * r, -a * clipped
            term = max(unclipped_term, clipped_term)
            live = unclipped_term >= clipped_term  # the gradient flows through r
            if c is not None and a < 0 and term > -c * a:
                term, live = -c * a, False
            total += w * term / n
            grad[i][t] = (w * -a * r / n) if live else 0.0
    return total, torch.tensor(grad, dtype=torch.float64)


@pytest.mark.parametrize("cap", [None, 2.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decoupled_ppo_matches_a_float64_loop_value_and_gradient(seed, cap) -> None:
    lp, prox, behav, adv, mask = _inputs(seed)
    weights, capped = algos.behaviour_importance_weights(prox, behav, mask, cap)
    x = lp.clone().requires_grad_(True)
    out = get_policy_loss("ppo")(
        LossInputs(x, prox, adv, mask, eps_low=0.2, eps_high=0.28, behaviour_weights=weights),
        PPOLossConfig(dual_clip=3.0),
    )
    out.loss.backward()
    value, grad = _loop_loss_and_grad(lp, prox, behav, adv, mask, 0.2, 0.28, 3.0, cap)
    assert float(out.loss.detach()) == pytest.approx(value, rel=1e-12, abs=1e-14)
    torch.testing.assert_close(x.grad, grad, rtol=1e-12, atol=1e-14)
    # the cap filtered something in the capped runs, nothing otherwise; capped tokens stay
    # in the token count (AReaL: divided by every masked token)
    n_capped = int(capped.sum())
    assert (n_capped > 0) == (cap is not None)
    frac = float(out.metrics["behaviour_capped_frac"])
    assert frac == pytest.approx(n_capped / float(mask.sum()))


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("name", sorted(n for n, s in POLICY_LOSSES.items() if s.decoupled))
def test_behaviour_equal_to_proximal_is_exactly_the_plain_loss(name, agg) -> None:
    lp, prox, _behav, adv, mask = _inputs(3)
    weights, capped = algos.behaviour_importance_weights(prox, prox, mask, 5.0)
    assert torch.equal(weights, mask) and not capped.any()
    spec = get_policy_loss(name)
    results = []
    for w in (None, weights):
        x = lp.clone().requires_grad_(True)
        out = spec(LossInputs(x, prox, adv, mask, agg=agg, seq_norm=7, behaviour_weights=w))
        out.loss.backward()
        results.append((out, x.grad))
    (plain, g_plain), (dec, g_dec) = results
    assert torch.equal(plain.loss, dec.loss)
    assert torch.equal(g_plain, g_dec)
    for key, flag in plain.flags.items():
        assert torch.equal(flag, dec.flags[key])
    assert float(dec.metrics["behaviour_weight_mean"]) == 1.0


def test_losses_without_decoupled_refuse_behaviour_weights() -> None:
    lp, prox, behav, adv, mask = _inputs(0)
    weights, _ = algos.behaviour_importance_weights(prox, behav, mask, None)
    decoupled = {n for n, s in POLICY_LOSSES.items() if s.decoupled}
    assert decoupled == {"ppo", "ce_gppo", "cispo", "sapo", "dppo_tv", "dppo_kl", "dro", "gpg"}
    for name in ("dcpo", "gspo", "clip_cov", "kl_cov", "gmpo"):
        with pytest.raises(ValueError, match="behaviour importance weights"):
            get_policy_loss(name)(LossInputs(lp, prox, adv, mask, behaviour_weights=weights))


def test_behaviour_kl_k3_is_the_per_token_estimator() -> None:
    lp, _prox, behav, _adv, mask = _inputs(4)
    k3 = algos.behaviour_kl_k3(lp, behav, mask)
    for i in range(lp.shape[0]):
        for t in range(lp.shape[1]):
            log_rho = float(lp[i, t] - behav[i, t])
            expect = (math.exp(log_rho) - 1 - log_rho) if mask[i, t] else 0.0
            assert float(k3[i, t]) == pytest.approx(expect, rel=1e-12, abs=1e-15)


def test_config_refuses_decoupled_with_bapo_and_dcpo_and_bad_caps() -> None:
    assert load_config(None, ["ppo.decoupled.enabled=true"], check_envs=False).ppo.decoupled.enabled
    for extra in (["algo=bapo"], ["algo=dcpo"], ["algo=gspo"]):
        with pytest.raises(ConfigError, match="ppo.decoupled"):
            load_config(None, ["ppo.decoupled.enabled=true", *extra], check_envs=False)
    for cap in ("1.0", "0.5", "true", "inf"):
        with pytest.raises(ConfigError, match="behaviour_weight_cap"):
            load_config(None, [f"ppo.decoupled.behaviour_weight_cap={cap}"], check_envs=False)


# ------------------------------------------------------------------------------ the update


def _weights(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_decoupled_update_with_on_policy_data_equals_the_plain_update(tiny) -> None:
    """Behaviour log-probs = the learner's own proximal pass: every weight is exactly 1 and
    the proximal log-probs equal the behaviour ones, so the decoupled update IS the plain one
    (same weights bit for bit after two mini-batches)."""
    cfg_plain = make_cfg("ppo.num_minibatches=2")
    batch = make_batch(tiny)
    learner = build_learner(cfg_plain, copy.deepcopy(tiny))
    adv = torch.ones_like(batch.old_logprobs) * batch.loss_mask
    batch.old_logprobs = proximal_logprobs(learner, as_minibatch(batch, adv))
    finals, runs = [], []
    for extra in ((), ("ppo.decoupled.enabled=true",)):
        learner = build_learner(make_cfg("ppo.num_minibatches=2", *extra), copy.deepcopy(tiny))
        m = update_step(learner, batch, generator=torch.Generator().manual_seed(0))
        finals.append(_weights(learner.model))
        runs.append(m)
    assert torch.equal(finals[0], finals[1])
    assert runs[0]["loss"] == runs[1]["loss"]
    assert "rollout/behaviour_kl" not in runs[0]
    assert runs[1]["rollout/behaviour_kl"] == 0.0
    assert runs[1]["loss/behaviour_capped_frac"] == 0.0


def test_stale_batch_behaviour_kl_and_decoupled_weights(tiny) -> None:
    """A batch whose behaviour log-probs are off the learner's: ``rollout/behaviour_kl`` is
    the k3 mean over masked tokens against a recomputation, and the decoupled update's loss
    on its first step is the float64 loop's with w = pi_prox / pi_behav."""
    batch = make_batch(tiny)
    g = torch.Generator().manual_seed(5)
    noise = 0.3 * torch.randn(batch.old_logprobs.shape, generator=g)
    on_policy = batch.old_logprobs.clone()
    batch.old_logprobs = (on_policy + noise) * batch.loss_mask
    batch.off_policy = True
    cfg = make_cfg("ppo.decoupled.enabled=true", "ppo.decoupled.behaviour_weight_cap=1.5")
    learner = build_learner(cfg, copy.deepcopy(tiny))
    adv = torch.zeros_like(on_policy)
    prox = proximal_logprobs(learner, as_minibatch(batch, adv))
    m = update_step(learner, batch, generator=torch.Generator().manual_seed(0))
    mask = batch.loss_mask.bool()
    log_rho = (prox - batch.old_logprobs).double()[mask]
    expect_kl = float((log_rho.exp() - 1 - log_rho).mean())
    assert m["rollout/behaviour_kl"] == pytest.approx(expect_kl, rel=1e-5)
    w = (prox - batch.old_logprobs).double().exp()[mask]
    assert m["loss/behaviour_capped_frac"] == pytest.approx(float((w > 1.5).double().mean()))
    # first (only) optimiser step: ratio 1 against the proximal policy, so the loss is the
    # aggregate of -w * A over masked tokens (the cap's tokens at 0; no KL at the reference)
    from entropace.train.update import token_advantages

    a, _ = token_advantages(batch, cfg)
    w_full = (prox - batch.old_logprobs).double().exp()
    w_full = torch.where(mask & (w_full <= 1.5), w_full, torch.zeros_like(w_full))
    expect_loss = float(
        algos.aggregate_loss(-w_full * a.double(), batch.loss_mask.double(), cfg.algorithm.agg,
                             seq_norm=cfg.rollout.max_episode_tokens)
    )  # fmt: skip
    assert m["loss"] == pytest.approx(expect_loss, rel=1e-4, abs=1e-6)
    # with off_policy and no decoupling the metric is there, the ratio stays vs behaviour
    plain = build_learner(make_cfg(), copy.deepcopy(tiny))
    m2 = update_step(plain, batch, generator=torch.Generator().manual_seed(0))
    assert m2["rollout/behaviour_kl"] == pytest.approx(expect_kl, rel=1e-5)
    assert "loss/behaviour_capped_frac" not in m2


def test_clip_fractions_over_gradient_carrying_tokens(tiny) -> None:
    """``clip_frac_*_active`` counts flags over masked tokens with A != 0 only; with one
    all-zero-advantage group the two fractions differ by exactly the token shares."""
    batch = make_batch(tiny, rewards=(1.0, 0.0, 0.0, 1.0, 1.0, 1.0))  # group b inert
    g = torch.Generator().manual_seed(1)
    batch.old_logprobs = (
        batch.old_logprobs + 0.5 * torch.randn(batch.old_logprobs.shape, generator=g)
    ) * batch.loss_mask
    learner = build_learner(make_cfg("ppo.skip_inert=false"), copy.deepcopy(tiny))
    m = update_step(learner, batch, generator=torch.Generator().manual_seed(0))
    mask = batch.loss_mask.bool()
    active = mask.clone()
    active[3:] = False
    n_all, n_active = int(mask.sum()), int(active.sum())
    assert m["update/active_token_frac"] == pytest.approx(n_active / n_all)
    for name in ("clip_frac_low", "clip_frac_high"):
        # flags need A != 0, so every flagged token is gradient-carrying
        assert m[f"{name}_active"] == pytest.approx(m[name] * n_all / n_active)
    assert m["clip_frac_low_active"] + m["clip_frac_high_active"] > 0
    assert "task/b/clip_frac_low_active" not in m and "task/b/clip_frac_low" in m
