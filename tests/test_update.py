"""The update step: accumulation invariance, controller order, PAPO, clip metrics, NaN skips.

A synthetic rollout batch of the tiny model (random token ids, a loss mask with an
"observation" hole, old log-probs recomputed by the model itself) exercises the update without
the rollout engine.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

import entropace.algos as algos
from entropace.algos.policy_losses import POLICY_LOSSES, PPOLossConfig, register_policy_loss
from entropace.control import EntropyPacer, PolarityController, TaskStep
from entropace.rollout import RolloutBatch, sequence_token_stats
from entropace.train.algorithms import PACED_LOSS_RECIPES, RECIPES, effective_bounds
from entropace.train.checkpoint import NonFiniteCheckpointError, save_checkpoint
from entropace.train.config import TrainConfig, load_config
from entropace.train.learner import MiniBatch, accumulate_gradients
from entropace.train.trainer import WarmupSchedule, build_learner
from entropace.train.update import token_advantages, update_step

TEMPERATURE = 0.8
LENGTHS = [24, 20, 16, 22, 18, 24]


@pytest.fixture(scope="module")
def tiny():
    from entropace.models.tiny import build_tiny_model

    model, _ = build_tiny_model(seed=0)
    return model


def make_cfg(*overrides: str) -> TrainConfig:
    base = ["tasks=a,b", f"rollout.temperature={TEMPERATURE}", "rollout.max_episode_tokens=32",
            "ppo.epochs=1", "ppo.num_minibatches=1", "ppo.micro_batch_size=6", "optim.lr=1e-3"]  # fmt: skip
    return load_config(None, base + list(overrides), check_envs=False)


def make_batch(model, rewards=(1.0, 0.0, 0.0, 1.0, 1.0, 0.0), seed: int = 0) -> RolloutBatch:
    """6 trajectories, tasks a (0-2) and b (3-5), groups of 3; response tokens from position 8
    with an observation hole at 12-13; right padding."""
    g = torch.Generator().manual_seed(seed)
    B, L = len(LENGTHS), max(LENGTHS)
    ids = torch.randint(4, model.config.vocab_size, (B, L), generator=g)
    attn = torch.zeros(B, L, dtype=torch.long)
    mask = torch.zeros(B, L)
    for i, n in enumerate(LENGTHS):
        attn[i, :n] = 1
        ids[i, n:] = 3
        mask[i, 8:n] = 1
        mask[i, 12:14] = 0
    stats = sequence_token_stats(model, ids, attn, temperature=TEMPERATURE)
    return RolloutBatch(
        input_ids=ids,
        attention_mask=attn,
        loss_mask=mask,
        old_logprobs=stats.logprob * mask,
        entropy=stats.entropy * mask,
        sensitivity=stats.sensitivity * mask,
        rewards=torch.tensor(rewards),
        group_ids=torch.tensor([0, 0, 0, 1, 1, 1]),
        task_ids=torch.tensor([0, 0, 0, 1, 1, 1]),
        task_names=["a", "b"],
        success=torch.tensor(rewards) > 0,
        abnormal=torch.tensor([False, True, False, False, False, False]),
        num_turns=torch.ones(B, dtype=torch.long),
    )


def as_minibatch(batch: RolloutBatch, adv: torch.Tensor, eps=(0.2, 0.2)) -> MiniBatch:
    """Every trajectory with bounds ``eps``; ``(None, None)``: the loss's default bounds."""
    B = batch.size
    lo, hi = (None, None) if eps[0] is None else (torch.full((B, 1), eps[0]),
                                                   torch.full((B, 1), eps[1]))  # fmt: skip
    return MiniBatch(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask,
        loss_mask=batch.loss_mask, old_logprobs=batch.old_logprobs, advantages=adv,
        eps_low=lo, eps_high=hi,
        task_ids=batch.task_ids,
    )  # fmt: skip


def batch_signals(batch: RolloutBatch):
    """The batch's signals and rollout metrics through a fixed-rule TaskStep (what the update's
    section (a) computes)."""
    step = TaskStep(batch.task_names)
    sums = step.sums(batch.entropy, batch.loss_mask, batch.rewards, batch.success,
                     batch.task_ids, abnormal=batch.abnormal)  # fmt: skip
    out = step.step(sums)
    return out.signals, out.metrics


def polarity_masses(polarity, adv, mask) -> tuple[float, float]:
    """Shares of sum |A| on P > 0 / P < 0 masked tokens (float64 reference)."""
    w = adv.double().abs() * mask
    total = float(w.sum())
    return float((w * (polarity > 0)).sum()) / total, float((w * (polarity < 0)).sum()) / total


def grads(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


# ------------------------------------------------------------------------- rollout statistics


def test_step_signals_and_rollout_metrics_match_loops(tiny) -> None:
    batch = make_batch(tiny)
    sig, m = batch_signals(batch)
    for k, name in enumerate("ab"):
        rows = [i for i in range(6) if batch.task_ids[i] == k]
        ent = [float(batch.entropy[i, t]) for i in rows for t in range(24) if batch.loss_mask[i, t]]
        rew = [float(batch.rewards[i]) for i in rows]
        mean_r = sum(rew) / 3
        assert sig.task_entropy[name] == pytest.approx(sum(ent) / len(ent), rel=1e-6)
        assert sig.task_reward_var[name] == pytest.approx(sum((r - mean_r) ** 2 for r in rew) / 3)
        assert sig.task_success[name] == pytest.approx(sum(r > 0 for r in rew) / 3)
        assert m[f"task/{name}/entropy"] == pytest.approx(sum(ent) / len(ent), rel=1e-6)
        assert m[f"task/{name}/response_tokens"] == len(ent)
        assert m[f"task/{name}/num_episodes"] == 3
        var = sum((r - mean_r) ** 2 for r in rew) / 3
        assert m[f"task/{name}/reward_std"] == pytest.approx(var**0.5, rel=1e-6, abs=1e-9)
    assert m["task/a/abnormal"] == pytest.approx(1 / 3) and m["task/b/abnormal"] == 0
    assert m["abnormal"] == pytest.approx(1 / 6)
    assert m["entropy"] == pytest.approx(
        float((batch.entropy * batch.loss_mask).sum() / batch.loss_mask.sum()), rel=1e-6
    )


def test_absent_task_has_no_metrics(tiny) -> None:
    batch = make_batch(tiny).select(torch.tensor([0, 1, 2]))  # task b absent
    sig, metrics = batch_signals(batch)
    assert "b" not in sig.task_entropy and "b" not in sig.task_success
    assert not any(k.startswith("task/b/") for k in metrics)


# ------------------------------------------------------------------------- advantages


def test_token_advantages_grpo_broadcast_and_dynamic_sampling(tiny) -> None:
    batch = make_batch(tiny, rewards=(1.0, 0.0, 0.0, 1.0, 1.0, 1.0))
    adv, keep = token_advantages(batch, make_cfg("algo=dapo", "algorithm.overlong.enabled=false"))
    # group 0 = (1, 0, 0): mean 1/3, std (GRPO convention of entropace.algos) -> loop reference
    ref = algos.grpo_advantages(batch.rewards, batch.group_ids)
    for i in range(6):
        for t in range(24):
            assert float(adv[i, t]) == pytest.approx(float(ref[i]) * float(batch.loss_mask[i, t]))
    assert keep.tolist() == [True, True, True, False, False, False]  # group 1 all equal


@pytest.mark.parametrize(
    ("algo", "rewards", "expected"),
    [
        # group 0 (task a) has reward variance: all 3 episodes carry gradient; group 1 does not
        ("grpo", (1.0, 0.0, 0.0, 1.0, 1.0, 1.0), {"a": 1.0, "b": 0.0}),
        # (0.5, 1, 0): the episode at the group mean has advantage 0 and carries nothing
        ("grpo", (0.5, 1.0, 0.0, 0.0, 0.0, 0.0), {"a": 2 / 3, "b": 0.0}),
        ("grpo", (0.0,) * 6, {"a": 0.0, "b": 0.0}),
        # DAPO drops the all-equal group (b); a's group is kept
        ("dapo", (1.0, 0.0, 0.0, 1.0, 1.0, 1.0), {"a": 1.0, "b": 0.0}),
    ],
)
def test_signal_frac_counts_the_episodes_that_carry_gradient(tiny, algo, rewards, expected):
    batch = make_batch(tiny, rewards=rewards)
    cfg = make_cfg(f"algo={algo}", "algorithm.overlong.enabled=false")
    learner = build_learner(cfg, copy.deepcopy(tiny))
    metrics = update_step(learner, batch, generator=torch.Generator().manual_seed(0))
    for name, frac in expected.items():
        assert metrics[f"task/{name}/signal_frac"] == pytest.approx(frac)
    if algo == "grpo":  # the rows the update ran (ppo.skip_inert leaves the others out)
        assert metrics["update/trained_rows_frac"] == pytest.approx(sum(expected.values()) / 2)


def test_overlong_penalty_enters_the_rewards(tiny) -> None:
    batch = make_batch(tiny, rewards=(0.0,) * 6)
    cfg = make_cfg("algo=dr_grpo", "algorithm.overlong={enabled: true, max_len: 14, cache_len: 4}")
    adv, _ = token_advantages(batch, cfg)
    lengths = batch.loss_mask.sum(1)  # response tokens: 14, 10, 6, 12, 8, 14
    penalty = [min(0.0, max(-1.0, (10 - n) / 4)) for n in lengths.tolist()]
    for i in range(6):
        group = [j for j in range(6) if batch.group_ids[j] == batch.group_ids[i]]
        expected = penalty[i] - sum(penalty[j] for j in group) / len(group)  # Dr.GRPO
        assert float(adv[i, 8]) == pytest.approx(expected, abs=1e-6)


def test_polarity_masses_match_a_loop() -> None:
    g = torch.Generator().manual_seed(1)
    adv = torch.randn(4, 7, generator=g)
    pol = torch.randn(4, 7, generator=g)
    pol[0, :3] = 0
    mask = (torch.rand(4, 7, generator=g) > 0.3).float()
    step = TaskStep(["a"], polarity=PolarityController())
    _, masses = step.reweight(adv, pol / adv, mask)  # S = P / A, so that A S = P
    pos, neg = masses["polarity/pos_mass"], masses["polarity/neg_mass"]
    total = sum(abs(adv[i, t]) for i in range(4) for t in range(7) if mask[i, t])
    p = sum(abs(adv[i, t]) for i in range(4) for t in range(7) if mask[i, t] and pol[i, t] > 0)
    n = sum(abs(adv[i, t]) for i in range(4) for t in range(7) if mask[i, t] and pol[i, t] < 0)
    assert pos == pytest.approx(float(p / total)) and neg == pytest.approx(float(n / total))


# ------------------------------------------------------------------------- accumulation


@pytest.mark.parametrize("agg", list(algos.AGG_MODES))
def test_gradient_accumulation_leaves_loss_and_gradient_unchanged(tiny, agg) -> None:
    batch = make_batch(tiny)
    adv, _ = token_advantages(batch, make_cfg())
    # off-policy old log-probs so that clipping binds on some tokens
    g = torch.Generator().manual_seed(3)
    batch.old_logprobs = (
        batch.old_logprobs + 0.3 * torch.randn(6, 24, generator=g)
    ) * batch.loss_mask
    results = []
    for micro in (6, 4, 1):
        model = copy.deepcopy(tiny).train()
        learner = build_learner(
            make_cfg(f"algorithm.agg={agg}", f"ppo.micro_batch_size={micro}"), model
        )
        out = accumulate_gradients(learner, as_minibatch(batch, adv))
        results.append((out, grads(model)))
    (full, g_full) = results[0]
    for out, g_micro in results[1:]:
        assert float(out["loss"]) == pytest.approx(float(full["loss"]), rel=1e-5, abs=1e-7)
        torch.testing.assert_close(g_micro, g_full, rtol=1e-4, atol=1e-6)
        for key in ("flag/clip_frac_low", "flag/clip_frac_high", "flag/dual_clip_frac", "tokens"):
            assert out[key].tolist() == full[key].tolist()
    assert float(full["tokens"].sum()) == float(batch.loss_mask.sum())


def test_accumulated_loss_equals_a_float64_token_loop(tiny) -> None:
    """token-mean PPO loss with dual clip over the whole mini-batch, by hand."""
    batch = make_batch(tiny)
    adv, _ = token_advantages(batch, make_cfg())
    shift = torch.linspace(-0.5, 0.5, 24)[None, :].expand(6, 24)
    batch.old_logprobs = (batch.old_logprobs + shift) * batch.loss_mask
    model = copy.deepcopy(tiny)
    learner = build_learner(make_cfg("algorithm.agg=token-mean", "ppo.micro_batch_size=4"), model)
    out = accumulate_gradients(learner, as_minibatch(batch, adv))
    lp = sequence_token_stats(tiny, batch.input_ids, batch.attention_mask,
                              temperature=TEMPERATURE).logprob.double()  # fmt: skip
    total, n = 0.0, 0
    for i in range(6):
        for t in range(24):
            if not batch.loss_mask[i, t]:
                continue
            r = math.exp(float(lp[i, t]) - float(batch.old_logprobs[i, t]))
            a = float(adv[i, t])
            loss = max(-a * r, -a * min(max(r, 0.8), 1.2))
            if a < 0:
                loss = min(loss, -3.0 * a)
            total, n = total + loss, n + 1
    assert float(out["loss"]) == pytest.approx(total / n, rel=1e-5)


def test_per_task_clip_counts_use_each_tasks_bounds(tiny) -> None:
    batch = make_batch(tiny)
    lp = sequence_token_stats(tiny, batch.input_ids, batch.attention_mask,
                              temperature=TEMPERATURE).logprob  # fmt: skip
    # ratio r = exp(lp - old): 1.5 on even columns, 0.5 on odd ones
    log_r = torch.where(torch.arange(24) % 2 == 0, math.log(1.5), math.log(0.5)).expand(6, 24)
    batch.old_logprobs = (lp - log_r) * batch.loss_mask
    adv = torch.where(torch.arange(6)[:, None] % 2 == 0, 1.0, -1.0).expand(6, 24) * batch.loss_mask
    mb = as_minibatch(batch, adv)
    mb.eps_low = torch.tensor([[0.2], [0.2], [0.2], [0.6], [0.6], [0.6]])  # task b: [0.4, 1.6]
    mb.eps_high = mb.eps_low.clone()
    out = accumulate_gradients(build_learner(make_cfg(), copy.deepcopy(tiny)), mb)
    even = torch.arange(24) % 2 == 0
    m = batch.loss_mask > 0
    high = [int((m[i] & even).sum()) if i % 2 == 0 and i < 3 else 0 for i in range(6)]
    low = [int((m[i] & ~even).sum()) if i % 2 == 1 and i < 3 else 0 for i in range(6)]
    assert out["flag/clip_frac_high"].tolist() == [sum(high[:3]), 0.0]
    assert out["flag/clip_frac_low"].tolist() == [sum(low[:3]), 0.0]


@pytest.mark.parametrize("name", ["dcpo", "gspo", "kl_cov"])
def test_clip_fractions_are_the_losses_own(tiny, name) -> None:
    """The logged clip fractions are where the loss's own clip binds: DCPO's probability-
    dependent bounds, GSPO's sequence ratio; KL-Cov has no clip and logs none (a recount at
    1 +- eps would report clipping that never happened)."""
    batch = make_batch(tiny)
    g = torch.Generator().manual_seed(5)
    lp = sequence_token_stats(tiny, batch.input_ids, batch.attention_mask,
                              temperature=TEMPERATURE).logprob.double()  # fmt: skip
    batch.old_logprobs = ((lp + 0.4 * torch.randn(6, 24, generator=g, dtype=torch.float64))
                          .clamp(max=-1e-3) * batch.loss_mask).float()  # fmt: skip
    adv, _ = token_advantages(batch, make_cfg())
    cfg = make_cfg(f"algo={name}", "ppo.micro_batch_size=2")
    metrics_cfg = build_learner(cfg, copy.deepcopy(tiny))
    out = accumulate_gradients(metrics_cfg, as_minibatch(batch, adv, eps=(None, None)))
    m = batch.loss_mask > 0
    old = batch.old_logprobs.double()
    log_r = (lp - old).clamp(-20, 20)
    if name == "kl_cov":
        assert not any(k.startswith("flag/clip") for k in out)
        return
    if name == "dcpo":
        q = torch.exp(old)
        lower = 0.5 + 0.5 * torch.sqrt(torch.clamp(1 - 4 * 0.16 / q, min=0))
        upper = torch.clamp(0.5 + 0.5 * torch.sqrt(1 + 4 * 0.2 / q), max=10.0)
        ratio = torch.exp(log_r)
    else:  # gspo: the sequence's geometric-mean ratio on every token
        seq = (log_r * m).sum(1) / m.sum(1).clamp_min(1)
        ratio = torch.exp(seq)[:, None].expand(6, 24)
        lower, upper = 1 - 3e-4, 1 + 4e-4
    low = m & (adv < 0) & (ratio < lower)
    high = m & (adv > 0) & (ratio > upper)
    per_task = [[int(x[batch.task_ids == k].sum()) for k in range(2)] for x in (low, high)]
    assert out["flag/clip_frac_low"].tolist() == per_task[0]
    assert out["flag/clip_frac_high"].tolist() == per_task[1]
    assert sum(per_task[0]) + sum(per_task[1]) > 0  # the case is not vacuous
    plain = (m & (adv < 0) & (torch.exp(log_r) < 0.8)) | (m & (adv > 0) & (torch.exp(log_r) > 1.2))
    assert int(plain.sum()) != sum(per_task[0]) + sum(per_task[1])  # 1 +- 0.2 would differ


# ------------------------------------------------------------------------- the whole step


def test_micro_batching_does_not_change_the_update(tiny) -> None:
    batch = make_batch(tiny)
    finals = []
    for micro in (6, 2):
        model = copy.deepcopy(tiny)
        cfg = make_cfg("algo=eppo+papo", "ppo.epochs=2", "ppo.num_minibatches=2",
                       f"ppo.micro_batch_size={micro}")  # fmt: skip
        learner = build_learner(cfg, model)
        metrics = update_step(learner, batch, generator=torch.Generator().manual_seed(0))
        assert metrics["optimizer_steps"] == 4
        finals.append((torch.cat([p.detach().flatten() for p in model.parameters()]), metrics))
    # Adam turns round-off in near-zero gradients into up to ~lr-sized moves: compare loosely
    # here; loss and grad_norm below (pre-Adam) catch any scaling error
    torch.testing.assert_close(finals[0][0], finals[1][0], rtol=1e-3, atol=1e-4)
    for key in ("loss", "grad_norm", "task/a/eps_low", "polarity/pos_mass", "clip_frac_high"):
        assert finals[0][1][key] == pytest.approx(finals[1][1][key], rel=1e-4, abs=1e-7)


def spy_loss(calls: list[dict], *, nan_calls: tuple[int, ...] = ()):
    """Register a policy loss that records its inputs and wraps ``ppo`` (NaN on given calls)."""
    name = f"spy-{len(POLICY_LOSSES)}-{id(calls)}"

    @register_policy_loss(name, config=PPOLossConfig, default_bounds=(0.2, 0.2))
    def fn(inputs: algos.LossInputs, cfg: PPOLossConfig):
        calls.append({"advantages": inputs.advantages.detach().clone(),
                      "eps_low": inputs.eps_low, "eps_high": inputs.eps_high})  # fmt: skip
        out = POLICY_LOSSES["ppo"](inputs, cfg)
        if len(calls) - 1 in nan_calls:
            out.loss = out.loss * float("nan")
        return out

    return name


def test_controllers_act_before_the_update_with_this_steps_statistics(tiny) -> None:
    batch = make_batch(tiny)
    calls: list[dict] = []
    cfg = make_cfg("algo=eppo+papo", f"algorithm.policy_loss={spy_loss(calls)}",
                   "ppo.micro_batch_size=6", "ppo.shuffle=false")  # fmt: skip
    learner = build_learner(cfg, copy.deepcopy(tiny))
    # step 1 (warmup) then step 2 with task b's entropy scaled down (collapsing faster)
    update_step(learner, batch)
    batch2 = copy.deepcopy(batch)
    batch2.entropy[3:] *= 0.5
    calls.clear()
    metrics = update_step(learner, batch2)

    # the same controllers fed the same statistics, independently
    pacer, pol = EntropyPacer(), PolarityController()
    for b in (batch, batch2):
        sig, _ = batch_signals(b)
        pacer.update(sig.task_entropy)
        w_plus, w_minus = pol.update(float((b.entropy * b.loss_mask).sum() / b.loss_mask.sum()))
    bounds = pacer.bounds()
    assert bounds["b"][0] < bounds["a"][0]  # the collapsing task gets the tighter range
    eps_low = calls[0]["eps_low"].flatten().tolist()
    assert eps_low == pytest.approx([bounds["a"][0]] * 3 + [bounds["b"][0]] * 3)
    assert metrics["task/b/eps_low"] == pytest.approx(bounds["b"][0])
    assert metrics["task/a/pace_z"] > 0 > metrics["task/b/pace_z"]
    assert metrics["polarity/w_plus"] == pytest.approx(w_plus)

    # PAPO: the loss saw the reweighted advantages, computed from the recorded sensitivities
    adv, _ = token_advantages(batch2, cfg)
    polarity = adv * batch2.sensitivity
    expected = algos.polarity_reweight(adv, polarity, batch2.loss_mask, w_plus=w_plus,
                                       w_minus=w_minus)  # fmt: skip
    torch.testing.assert_close(calls[0]["advantages"], expected)
    pos, neg = polarity_masses(polarity, adv, batch2.loss_mask)
    assert metrics["polarity/pos_mass"] == pytest.approx(pos)
    assert metrics["polarity/neg_mass"] == pytest.approx(neg)


def test_non_finite_loss_skips_the_optimizer_step(tiny, caplog) -> None:
    batch = make_batch(tiny)
    calls: list[dict] = []
    cfg = make_cfg(f"algorithm.policy_loss={spy_loss(calls, nan_calls=(0,))}",
                   "ppo.num_minibatches=2", "ppo.micro_batch_size=6", "ppo.shuffle=false")  # fmt: skip
    model = copy.deepcopy(tiny)
    learner = build_learner(cfg, model)
    metrics = update_step(learner, batch)
    assert metrics["skipped_steps"] == 1 and learner.skipped_steps == 1
    assert "optimiser step skipped (1 skipped so far)" in caplog.text
    assert metrics["optimizer_steps"] == 2
    assert math.isfinite(metrics["loss"])  # the mean over the finite optimiser step
    assert all(p.grad is None for p in model.parameters())
    assert learner.scheduler.last_epoch == 1  # only the finite step advanced the schedule
    # the result equals a run that only took the second mini-batch's step
    ref_model = copy.deepcopy(tiny)
    ref = build_learner(make_cfg("ppo.micro_batch_size=6"), ref_model)
    adv, _ = token_advantages(batch, cfg)
    mb = as_minibatch(batch, adv).select(torch.arange(3, 6))
    out = accumulate_gradients(ref, mb)
    torch.nn.utils.clip_grad_norm_(list(ref_model.parameters()), cfg.optim.max_grad_norm)
    ref.optimizer.step()
    assert float(out["loss"]) == pytest.approx(metrics["loss"], rel=1e-5)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q)


def test_no_checkpoint_with_nan_weights(tiny, tmp_path) -> None:
    model = copy.deepcopy(tiny)
    learner = build_learner(make_cfg(), model)
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan")
    with pytest.raises(NonFiniteCheckpointError, match="non-finite"):
        save_checkpoint(tmp_path, 1, model=model, optimizer=learner.optimizer, state={})
    assert list(tmp_path.iterdir()) == []


def test_kl_term_adds_beta_times_k3_to_a_reference(tiny) -> None:
    from entropace.models.tiny import build_tiny_model

    batch = make_batch(tiny)
    adv, _ = token_advantages(batch, make_cfg())
    other, _ = build_tiny_model(seed=1)
    ref_lp = sequence_token_stats(other, batch.input_ids, batch.attention_mask,
                                  temperature=TEMPERATURE).logprob  # fmt: skip
    mb = as_minibatch(batch, adv)
    mb.ref_logprobs = ref_lp
    plain_cfg = make_cfg("algorithm.agg=token-mean")
    plain = accumulate_gradients(build_learner(plain_cfg, copy.deepcopy(tiny)), mb)
    learner = build_learner(make_cfg("algorithm.kl_beta=0.5", "ppo.micro_batch_size=4",
                                     "algorithm.agg=token-mean"), copy.deepcopy(tiny))  # fmt: skip
    with_kl = accumulate_gradients(learner, mb)
    lp = sequence_token_stats(tiny, batch.input_ids, batch.attention_mask,
                              temperature=TEMPERATURE).logprob.double()  # fmt: skip
    m = batch.loss_mask.double()
    d = (ref_lp.double() - lp).clamp(-20, 20)
    k3 = ((torch.exp(d) - d - 1).clamp(0, 10) * m).sum() / m.sum()  # token-mean, kl_k3's clamps
    assert float(with_kl["kl"]) == pytest.approx(float(k3), rel=1e-5)
    assert float(with_kl["loss"] - plain["loss"]) == pytest.approx(0.5 * float(k3), rel=1e-4)


def test_bapo_bounds_come_from_the_controller_per_optimizer_step(tiny) -> None:
    batch = make_batch(tiny)
    calls: list[dict] = []
    cfg = make_cfg("algo=bapo", f"algorithm.policy_loss={spy_loss(calls)}", "ppo.epochs=2",
                   "ppo.shuffle=false")  # fmt: skip
    learner = build_learner(cfg, copy.deepcopy(tiny))
    metrics = update_step(learner, batch)
    assert len(calls) == 2
    first = calls[0]
    assert (first["eps_low"], first["eps_high"]) == pytest.approx((0.4, 0.2))  # on-policy start
    assert metrics["bapo/c_low"] == pytest.approx(1 - calls[1]["eps_low"])


def record_loss_inputs(learner) -> list:
    """Wrap ``learner.loss`` so that every call's :class:`LossInputs` is recorded."""
    import dataclasses

    calls: list = []
    spec = learner.loss

    def fn(inputs, cfg):
        calls.append(inputs)
        return spec.fn(inputs, cfg)

    learner.loss = dataclasses.replace(spec, fn=fn)
    return calls


G_A = [1.0, 0.0, 0.0]  # rewards of group a (rows 0-2); group b (rows 3-5) is all ones
GRPO_A = (1 - 1 / 3) / (math.sqrt(1 / 3) + 1e-6)  # (R - mean) / (unbiased std + eps), row 0
N_TOK = [n - 10 for n in LENGTHS]  # masked tokens per row (from 8, less the hole at 12-13)


def _whitened_row0(values: list[float]) -> float:
    """Row 0's value whitened over every masked token (REINFORCE++: unbiased, + 1e-8)."""
    tokens = [v for v, n in zip(values, N_TOK, strict=True) for _ in range(n)]
    mean = sum(tokens) / len(tokens)
    var = sum((x - mean) ** 2 for x in tokens) / (len(tokens) - 1)
    return (values[0] - mean) / math.sqrt(var + 1e-8)


#: What each recipe must hand the loss on the first micro-batch (rows 0-2 of the first
#: mini-batch): loss name, aggregation, per-trajectory bounds, row-0 advantage.
FIRST_CALL = {
    "grpo": ("ppo", "token-mean", (0.2, 0.2), GRPO_A),
    "dr_grpo": ("ppo", "seq-mean-token-sum-norm", (0.2, 0.2), 2 / 3),
    "dapo": ("ppo", "token-mean", (0.2, 0.28), GRPO_A),
    "rloo": ("ppo", "token-mean", (0.2, 0.2), 1.0),
    "gspo": ("gspo", "seq-mean-token-mean", (3e-4, 4e-4), GRPO_A),
    "clip_cov": ("clip_cov", "token-mean", (0.2, 0.2), GRPO_A),
    "kl_cov": ("kl_cov", "token-mean", (0.2, 0.2), GRPO_A),
    "dcpo": ("dcpo", "seq-mean-token-mean", (0.16, 0.2), GRPO_A),
    "ce_gppo": ("ce_gppo", "token-mean", (0.2, 0.2), GRPO_A),
    "bapo": ("ppo", "token-mean", (0.4, 0.2), GRPO_A),  # BAPO's on-policy first search
    # verl's trust regions (widths in each loss's own units) and estimators
    "cispo": ("cispo", "token-mean", (10.0, 0.2), GRPO_A),
    "gmpo": ("gmpo", "seq-mean-token-mean", (0.4, 0.4), GRPO_A),
    "sapo": ("sapo", "seq-mean-token-mean", (1.05, 1.0), GRPO_A),  # (tau_neg, tau_pos)
    "dppo_tv": ("dppo_tv", "seq-mean-token-sum-norm", (0.15, 0.15), 2 / 3),  # Dr.GRPO's A
    "dppo_kl": ("dppo_kl", "seq-mean-token-sum-norm", (0.05, 0.05), 2 / 3),
    "dro": ("dro", "token-mean", (1.0, 1.0), 2 / 3),
    "gpg": ("gpg", "token-mean", (0.2, 0.2), 1.5 * (1 - 1 / 3)),  # alpha = 6 / 4 non-zero
    "reinforce_plus_plus": ("ppo", "token-mean", (0.2, 0.2), _whitened_row0([*G_A, 1, 1, 1])),
    "reinforce_plus_plus_baseline": ("ppo", "token-mean", (0.2, 0.2),
                                     _whitened_row0([2 / 3, -1 / 3, -1 / 3, 0, 0, 0])),
    "opo": ("ppo", "token-mean", (0.2, 0.2), 1 - N_TOK[0] / sum(N_TOK[:3])),
    "grpo_passk": ("ppo", "seq-mean-token-mean", (0.2, 0.2), 1 / (math.sqrt(1 / 3) + 1e-6)),
}  # fmt: skip
PACED = {  # the pacer options each EPPO variant must run with
    "eppo": {}, "eppo+papo": {}, "eppo-global": {"task_wise": False},
    "eppo-notrend": {"trend": False}, "eppo-success": {"signal": "success"},
    "eppo-rewardvar": {"signal": "reward_var"}, "eppo-shuffled": {"shuffle": True},
    **{f"eppo+{n}": {} for n in PACED_LOSS_RECIPES},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_feeds_the_loss_its_distinguishing_inputs(tiny, name) -> None:
    """Each recipe's own effect, checked on what its loss receives (not only "it ran")."""
    assert set(FIRST_CALL) | set(PACED) | {"papo"} == set(RECIPES)
    batch = make_batch(tiny, rewards=(*G_A, 1.0, 1.0, 1.0))
    model = copy.deepcopy(tiny)
    # every row reaches the loss (ppo.skip_inert would leave out the all-equal group b)
    cfg = make_cfg(f"algo={name}", "ppo.num_minibatches=2", "ppo.shuffle=false",
                   "ppo.skip_inert=false")  # fmt: skip
    learner = build_learner(cfg, model)
    calls = record_loss_inputs(learner)
    before = torch.cat([p.detach().flatten() for p in model.parameters()])
    metrics = update_step(learner, batch, generator=torch.Generator().manual_seed(0))
    assert metrics["skipped_steps"] == 0 and metrics["optimizer_steps"] == 2
    assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert float((after - before).abs().max()) > 0
    first = calls[0]
    plain, _ = token_advantages(batch, make_cfg())  # GRPO advantages, no reweighting
    m = batch.loss_mask[:3] > 0
    if name in FIRST_CALL:
        loss, agg, (lo, hi), adv0 = FIRST_CALL[name]
        assert learner.loss.name == loss and first.agg == agg
        eps = [(float(torch.as_tensor(first.eps_low).flatten()[0]),
                float(torch.as_tensor(first.eps_high).flatten()[0]))]  # fmt: skip
        assert eps[0] == pytest.approx((lo, hi)), name
        assert float(first.advantages[0][m[0]][0]) == pytest.approx(adv0, rel=1e-5), name
    if name == "dr_grpo":
        assert first.seq_norm == 32.0  # rollout.max_episode_tokens
    if name == "dapo":  # dynamic sampling drops the all-equal group b: one mini-batch of a
        assert metrics["dapo/kept_frac"] == 0.5 and len(calls) == 2
        assert all(c.advantages.shape[0] <= 3 for c in calls)
    if name == "clip_cov":
        assert first.generator is not None and "loss/cov_drop_frac" in metrics
    if name == "kl_cov":  # not A-weighted: all-equal rewards still run the passes
        flat = make_batch(tiny, rewards=(1.0,) * 6)
        assert update_step(learner, flat)["update/zero_advantage"] == 0.0
    if name in ("papo", "eppo+papo"):  # reweighted by polarity, sum |A| preserved
        adv = first.advantages
        assert not torch.allclose(adv, plain[:3])
        torch.testing.assert_close(adv.abs().sum(), plain[:3].abs().sum())
    elif cfg.algorithm.advantage == "grpo" and name != "dapo":  # GRPO advantages, untouched
        assert torch.equal(first.advantages, plain[:3]), name
    if name in PACED:  # step 2 with task b collapsing: bounds from a pacer of those options
        batch2 = copy.deepcopy(batch)
        batch2.entropy[3:] *= 0.5
        calls.clear()
        update_step(learner, batch2)
        pacer = EntropyPacer(**PACED[name])
        for b in (batch, batch2):
            sig, _ = batch_signals(b)
            pacer.update(sig.task_entropy, task_success=sig.task_success,
                         task_reward_var=sig.task_reward_var)  # fmt: skip
        width = learner.loss.width  # the pacer's eps_k as the loss's width (ALGORITHMS.md 3)
        start, eps0 = effective_bounds(cfg.algorithm)[0], pacer.config.eps0
        expected = [pacer.bounds()[t][0] if width.native
                    else start * (pacer.bounds()[t][0] / eps0) ** width.power
                    for t in ("a", "a", "a", "b", "b", "b")]  # fmt: skip
        used = torch.cat([c.eps_low.flatten() for c in calls[:2]]).tolist()
        assert used == pytest.approx(expected), name
        if name in ("eppo", "eppo+papo"):
            assert expected[3] < expected[0]  # the collapsing task gets the tighter range
        if name.startswith("eppo+") and name != "eppo+papo":  # tighter: w ** power smaller
            assert (expected[3] / expected[0]) ** (1 / width.power) < 1, name
            assert expected[0] != start  # paced away from the loss's own width
        if name == "eppo-global":
            assert set(expected) == {0.2}


def test_warmup_schedule_values() -> None:
    s = WarmupSchedule(4, 10, "linear")
    assert [s(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert s(7) == pytest.approx(0.5) and s(10) == 0.0
    c = WarmupSchedule(0, 10, "cosine")
    assert c(0) == 1.0 and c(5) == pytest.approx(0.5) and c(10) == pytest.approx(0.0)
    assert WarmupSchedule(2, 10, "constant")(9) == 1.0


def test_zero_advantage_shortcut_equals_the_full_passes(tiny) -> None:
    """All advantages 0 (every group's rewards equal): the shortcut's zero-gradient optimiser
    steps leave the model, optimiser and metrics exactly as the full forward/backward passes."""
    import dataclasses

    first, flat = make_batch(tiny), make_batch(tiny, rewards=(1.0, 1.0, 1.0, 0.0, 0.0, 0.0))
    results = []
    for shortcut in (True, False):
        model = copy.deepcopy(tiny)
        cfg = make_cfg("algo=eppo", "ppo.num_minibatches=2", "optim.weight_decay=0.1")
        learner = build_learner(cfg, model)
        if not shortcut:  # declare the loss not A-weighted: the passes run
            learner.loss = dataclasses.replace(learner.loss, advantage_weighted=False)
        gen = torch.Generator().manual_seed(0)
        update_step(learner, first, generator=gen)  # builds AdamW momentum
        metrics = update_step(learner, flat, generator=gen)
        assert metrics["update/zero_advantage"] == float(shortcut)
        assert metrics["optimizer_steps"] == 2 and metrics["loss"] == 0.0
        params = torch.cat([p.detach().flatten() for p in model.parameters()])
        results.append((params, gen.get_state()))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])
    moved = (results[0][0] - torch.cat([p.flatten() for p in tiny.parameters()])).abs().max()
    assert moved > 0  # momentum and weight decay still act on the zero-advantage step


def test_approx_kl_is_the_losses_own_estimate_of_kl_old_to_new(tiny) -> None:
    """``approx_kl`` = mean over masked tokens of ``(r - 1) - log r`` (k3 of KL(pi_old || pi)
    from tokens sampled by pi_old), the loss's own metric, not a second estimate."""
    batch = make_batch(tiny)
    g = torch.Generator().manual_seed(9)
    batch.old_logprobs = (batch.old_logprobs + 0.3 * torch.randn(6, 24, generator=g)) * (
        batch.loss_mask
    )
    lp = sequence_token_stats(tiny, batch.input_ids, batch.attention_mask,
                              temperature=TEMPERATURE).logprob.double()  # fmt: skip
    m = batch.loss_mask.double()
    log_r = (lp - batch.old_logprobs.double()) * m
    expected = float(((torch.expm1(log_r) - log_r) * m).sum() / m.sum())
    opposite = float(((torch.expm1(-log_r) + log_r) * m).sum() / m.sum())  # KL(pi || pi_old)
    learner = build_learner(make_cfg("ppo.shuffle=false"), copy.deepcopy(tiny))
    metrics = update_step(learner, batch)
    assert metrics["approx_kl"] == pytest.approx(expected, rel=1e-4)
    assert abs(expected - opposite) > 1e-3 * abs(expected)  # the two directions differ here
    assert "loss/approx_kl" not in metrics
