"""``ppo.skip_inert``: trajectories whose advantage is 0 on every token ("inert") are left out of
the update's forward/backward passes where that is exact.

- ``PolicyLoss.row_local`` is pinned for every registered loss and checked by brute force in
  float64: a row-local loss's value, gradient, metrics and flags on a batch equal the sums (min /
  max) of those of its rows evaluated one by one with the same global counts; Clip-Cov and
  KL-Cov fail the same check, so a wrong claim would be caught.
- :func:`update_step` with ``skip_inert`` on equals off (loss, grad norm, parameters, AdamW's
  state, the generator's state and every metric that is not loss-side), for PAPO / EPPO,
  shared prefixes with micro-batches that split groups, 2 epochs x 2 mini-batches, the other
  row-local losses, BAPO; the inert rows really do not run (embedding-layer hook); it falls
  back to every row for Clip-Cov and with a KL or entropy term; a mini-batch of inert rows
  takes a zero-gradient step; the loss-side metrics are those of the rows that ran (brute
  force from the model's log-probs), a task none of whose rows ran has no per-task flag.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import NamedTuple

import pytest
import torch
from tests.test_prefix_stats import _batch_for_update

import entropace.algos as algos
from entropace.algos.aggregation import AGG_MODES, loss_counts
from entropace.algos.policy_losses import POLICY_LOSSES, PPOLossConfig, register_policy_loss
from entropace.rollout import RolloutBatch, sequence_token_stats
from entropace.train.config import ConfigError, load_config
from entropace.train.trainer import build_learner
from entropace.train.update import token_advantages, update_step

#: The built-in losses and whether each is row-local (checked against the code: Clip-Cov and
#: KL-Cov take means / a top-k over every row of the call, Clip-Cov draws random numbers).
ROW_LOCAL = {
    "ppo": True,
    "gspo": True,
    "dcpo": True,
    "ce_gppo": True,
    "clip_cov": False,
    "kl_cov": False,
    "cispo": True,
    "gmpo": True,
    "sapo": True,
    "dppo_tv": True,
    "dppo_kl": True,
    "dro": True,
    "gpg": True,
}

#: Options that make a non-row-local loss act on many tokens (so the brute-force check bites).
AGGRESSIVE = {
    "clip_cov": {"clip_ratio": 0.3, "cov_lower": -100.0, "cov_upper": 100.0},
    "kl_cov": {"kl_ratio": 0.3},
}

#: Rewards of :func:`_batch_for_update`'s groups (rows 0-2 | 3-4 | 5 | 6-7): row 2 sits on its
#: group's mean and groups 1 and 2 are all-equal, so rows 2-5 are inert (GRPO advantage 0).
REWARDS = (1.0, 0.0, 0.5, 1.0, 1.0, 1.0, 0.0, 1.0)
ACTIVE = [0, 1, 6, 7]


@pytest.fixture(scope="module")
def tiny():
    from entropace.models.tiny import build_tiny_model

    model, _ = build_tiny_model(seed=0)
    return model


# ------------------------------------------------------------------------- the registry flag


def test_row_local_of_every_registered_loss_is_pinned() -> None:
    builtin = {n: s for n, s in POLICY_LOSSES.items() if s.fn.__module__.startswith("entropace.")}
    assert {n: s.row_local for n, s in builtin.items()} == ROW_LOCAL
    for name in ("clip_cov", "kl_cov"):
        assert POLICY_LOSSES[name].uses_generator or not POLICY_LOSSES[name].advantage_weighted


def test_a_user_registered_loss_is_not_row_local_unless_it_says_so() -> None:
    @register_policy_loss("_test_skip_inert_default", config=PPOLossConfig, default_bounds=None)
    def loss(inputs: algos.LossInputs, cfg: PPOLossConfig) -> algos.LossOutput:
        return POLICY_LOSSES["ppo"](inputs, cfg)

    try:
        assert POLICY_LOSSES["_test_skip_inert_default"].row_local is False
    finally:
        del POLICY_LOSSES["_test_skip_inert_default"]


def _random_inputs(seed: int, B: int = 6, T: int = 9) -> dict[str, torch.Tensor]:
    """float64 inputs with an inert row (1), a row without loss tokens (4), per-row bounds."""
    g = torch.Generator().manual_seed(seed)
    f64 = {"generator": g, "dtype": torch.float64}
    lp = -3.0 * torch.rand(B, T, **f64)
    adv = torch.randn(B, T, **f64)
    adv[1] = 0.0
    mask = (torch.rand(B, T, generator=g) < 0.7).double()
    mask[4] = 0.0
    mask[:, 0] = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0])  # every other row has tokens
    return {
        "logprobs": lp,
        "old_logprobs": lp + 0.4 * torch.randn(B, T, **f64),
        "advantages": adv,
        "mask": mask,
        "eps_low": 0.05 + 0.25 * torch.rand(B, 1, **f64),
        "eps_high": 0.05 + 0.25 * torch.rand(B, 1, **f64),
    }


def _evaluate(spec, config, x: dict, rows: list[int], agg: str, counts: dict):
    """The loss of ``rows`` of ``x`` with the global ``counts``: (output, d loss / d logprobs)."""
    part = {k: v[rows] for k, v in x.items()}
    lp = part.pop("logprobs").clone().requires_grad_(True)
    gen = torch.Generator().manual_seed(0)
    inputs = algos.LossInputs(lp, **part, agg=agg, seq_norm=7.0, generator=gen, **counts)
    out = spec(inputs, config)
    out.loss.backward()
    return out, lp.grad


def row_decomposition_error(spec, config, x: dict, agg: str) -> float:
    """Largest difference between the whole batch's loss / gradient / metrics / flags and the
    combination of its rows evaluated one by one with the batch's global counts."""
    B = x["logprobs"].shape[0]
    num_tokens, num_seqs = loss_counts(x["mask"])
    counts = {"num_tokens": num_tokens, "num_seqs": num_seqs}
    full, grad = _evaluate(spec, config, x, list(range(B)), agg, counts)
    parts = [_evaluate(spec, config, x, [i], agg, counts) for i in range(B)]
    errors = [abs(float(full.loss.detach()) - sum(float(o.loss.detach()) for o, _ in parts))]
    errors.append(float((grad - torch.cat([g for _, g in parts])).abs().max()))
    for name, value in full.metrics.items():
        values = torch.stack([o.metrics[name] for o, _ in parts])
        if name.endswith("_min"):
            combined = values.min()
        elif name.endswith("_max"):
            combined = values.max()
        else:
            combined = values.sum()
        if math.isinf(float(value)) and float(value) == float(combined):
            continue
        errors.append(abs(float(value) - float(combined)))
    for name, flag in full.flags.items():
        errors.append(float((flag != torch.cat([o.flags[name] for o, _ in parts])).sum()))
    return max(errors)


def _option_sets(name: str) -> list[dict]:
    fields = [f.name for f in dataclasses.fields(POLICY_LOSSES[name].config_cls)]
    extra = [{"dual_clip": None}, {"dual_clip": 1.5}] if "dual_clip" in fields else []
    return [{}, *extra, *([AGGRESSIVE[name]] if name in AGGRESSIVE else [])]


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("name", sorted(n for n, spec in POLICY_LOSSES.items() if spec.row_local))
def test_a_row_local_loss_is_the_sum_of_its_rows(name, agg) -> None:
    """Every loss that claims ``row_local`` (a wrong claim fails here)."""
    spec = POLICY_LOSSES[name]
    for options in _option_sets(name):
        for seed in range(3):
            x = _random_inputs(seed)
            error = row_decomposition_error(spec, spec.make_config(options), x, agg)
            assert error < 1e-12, (name, options, seed, error)


@pytest.mark.parametrize("name", sorted(AGGRESSIVE))
def test_the_row_check_catches_a_non_row_local_loss(name) -> None:
    spec = POLICY_LOSSES[name]
    error = row_decomposition_error(spec, spec.make_config(AGGRESSIVE[name]), _random_inputs(0),
                                    "token-mean")  # fmt: skip
    assert error > 1e-6, (name, error)


# ------------------------------------------------------------------------- the config key


def test_skip_inert_config_key() -> None:
    assert load_config(None, [], check_envs=False).ppo.skip_inert is True
    assert load_config(None, ["ppo.skip_inert=false"], check_envs=False).ppo.skip_inert is False
    with pytest.raises(ConfigError, match="ppo.skip_inert"):
        load_config(None, ["ppo.skip_inert=3"], check_envs=False)


# ------------------------------------------------------------------------- the update


def make_cfg(*overrides: str):
    base = ["tasks=a,b", "algo=eppo+papo", "rollout.max_episode_tokens=64",
            "rollout.temperature=1.0", "ppo.epochs=2", "ppo.num_minibatches=2",
            "ppo.micro_batch_size=3", "optim.lr=1e-3"]  # fmt: skip
    return load_config(None, base + list(overrides), check_envs=False)


def make_batch(model, rewards=REWARDS) -> RolloutBatch:
    batch = _batch_for_update(model)
    batch.rewards = torch.tensor(rewards)
    batch.success = batch.rewards > 0.5
    return batch


class RowCounter:
    """Counts the rows fed to the embedding layer (every forward of the policy)."""

    def __init__(self, model) -> None:
        self.rows = 0
        self.handle = model.get_input_embeddings().register_forward_hook(self)

    def __call__(self, module, args, output) -> None:
        self.rows += args[0].shape[0]


class Run(NamedTuple):
    metrics: dict[str, float]
    params: torch.Tensor  # after the update
    start: torch.Tensor  # before it
    grads: list[torch.Tensor]  # the gradient each optimiser step took
    generator: torch.Tensor  # the generator's state after the update
    rows: int  # rows fed to the policy during the update


def run_update(tiny, batch: RolloutBatch, *overrides: str) -> Run:
    """One update from a copy of ``tiny``, after a first update that builds AdamW's state."""
    model = copy.deepcopy(tiny)
    learner = build_learner(make_cfg(*overrides), model)
    gen = torch.Generator().manual_seed(0)
    update_step(learner, make_batch(tiny, rewards=(1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0)),
                generator=gen)  # fmt: skip
    start = torch.cat([p.detach().flatten() for p in model.parameters()])
    grads: list[torch.Tensor] = []
    hook = learner.optimizer.register_step_pre_hook(
        lambda *_: grads.append(torch.cat([p.grad.flatten() for p in learner.params]))
    )
    counter = RowCounter(model)
    try:
        metrics = update_step(learner, batch, generator=gen)
    finally:
        counter.handle.remove()
        hook.remove()
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    return Run(metrics, params, start, grads, gen.get_state(), counter.rows)


def assert_same_update(on: Run, off: Run) -> None:
    """The same gradients (fp32 round-off: relative 1e-5 of the largest entry) and the same
    parameters: the parameter change differs by < 1e-5 of its norm, and no parameter by more
    than 1e-5 relative or 1e-3 * lr (AdamW turns round-off in a near-zero gradient entry into
    a move of up to ~lr)."""
    assert len(on.grads) == len(off.grads) > 0
    for g_on, g_off in zip(on.grads, off.grads, strict=True):
        torch.testing.assert_close(g_on, g_off, rtol=1e-5, atol=1e-5 * float(g_off.abs().max()))
    moved = float((off.params - off.start).norm())
    assert moved > 0 and float((on.params - off.params).norm()) <= 1e-5 * moved
    torch.testing.assert_close(on.params, off.params, rtol=1e-5, atol=1e-6)
    assert torch.equal(on.generator, off.generator)  # the shuffles consumed the same draws


LOSS_SIDE = ("approx_kl", "clip_frac_low", "clip_frac_high", "loss/", "update/trained_rows_frac",
             "update/active_token_frac")  # fmt: skip


def is_loss_side(key: str) -> bool:
    tail = key.split("/", 2)[-1] if key.startswith("task/") else key
    flags = ("clip_frac_low", "clip_frac_high", "dual_clip_frac", "gate_damped_frac")
    return key.startswith(LOSS_SIDE) or tail in flags


CASES = {
    "eppo+papo, shared prefixes": [],
    "eppo+papo, plain": ["ppo.share_prefix=false"],
    "grpo, 1 row per micro-batch": ["algo=grpo", "ppo.micro_batch_size=1"],
    "dr_grpo, no shuffle": ["algo=dr_grpo", "ppo.shuffle=false"],
    "gspo": ["algo=gspo", "algorithm.eps_low=0.05", "algorithm.eps_high=0.05"],
    "dcpo": ["algo=dcpo"],
    "ce_gppo, 1 mini-batch": ["algo=ce_gppo", "ppo.num_minibatches=1"],
    "bapo": ["algo=bapo"],
    "eppo+sapo": ["algo=eppo+sapo"],
    "gmpo": ["algo=gmpo"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_skip_inert_equals_the_full_passes(tiny, case) -> None:
    batch = make_batch(tiny)
    on = run_update(tiny, batch, *CASES[case], "ppo.skip_inert=true")
    off = run_update(tiny, batch, *CASES[case], "ppo.skip_inert=false")
    assert on.metrics["update/trained_rows_frac"] == len(ACTIVE) / 8
    assert off.metrics["update/trained_rows_frac"] == 1.0
    assert on.metrics["optimizer_steps"] == off.metrics["optimizer_steps"]
    assert on.metrics["skipped_steps"] == off.metrics["skipped_steps"] == 0
    assert on.rows < off.rows  # the inert rows did not run (exact counts: the test below)
    for key in ("loss", "grad_norm"):
        assert on.metrics[key] == pytest.approx(off.metrics[key], rel=1e-5, abs=1e-9), key
    assert_same_update(on, off)
    for key, value in off.metrics.items():  # rollout, advantage, controller metrics: unchanged
        if not is_loss_side(key) and key not in ("loss", "grad_norm"):
            assert on.metrics[key] == pytest.approx(value, rel=1e-6, abs=1e-9, nan_ok=True), key
    # flag fractions over gradient-carrying tokens: inert rows hold none, so they are the same
    active = [k for k in off.metrics if k.endswith("_active")]
    assert active and all(on.metrics[k] == off.metrics[k] for k in active)


def test_inert_rows_do_not_run(tiny) -> None:
    """Plain passes (no shared prefix): every forward feeds its rows to the embedding layer."""
    batch = make_batch(tiny)
    plain = ["ppo.share_prefix=false", "ppo.epochs=2", "ppo.num_minibatches=2"]
    on = run_update(tiny, batch, *plain, "ppo.skip_inert=true")
    off = run_update(tiny, batch, *plain, "ppo.skip_inert=false")
    assert (on.rows, off.rows) == (2 * len(ACTIVE), 2 * 8)  # 2 epochs


@pytest.mark.parametrize(
    "overrides",
    [["algo=clip_cov"], ["algorithm.kl_beta=0.1"], ["algorithm.entropy_coef=0.01"]],
    ids=["clip_cov", "kl", "entropy"],
)
def test_every_row_runs_when_skipping_is_not_exact(tiny, overrides) -> None:
    plain = ["ppo.share_prefix=false", "ppo.epochs=1", "ppo.num_minibatches=1", *overrides]
    batch = make_batch(tiny)
    on = run_update(tiny, batch, *plain, "ppo.skip_inert=true")
    off = run_update(tiny, batch, *plain, "ppo.skip_inert=false")
    assert on.metrics["update/trained_rows_frac"] == 1.0
    assert off.metrics["update/trained_rows_frac"] == 1.0
    assert on.rows == off.rows >= 8
    assert on.metrics["loss"] == off.metrics["loss"] and torch.equal(on.params, off.params)


def test_a_minibatch_of_inert_rows_takes_a_zero_gradient_step(tiny) -> None:
    """No shuffle, 2 mini-batches of 4: rows 3-7 (groups 1-3 all-equal) are inert, so the
    second mini-batch has no active row; AdamW's momentum and weight decay still act."""
    batch = make_batch(tiny, rewards=(1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0))
    common = ["algo=grpo", "ppo.epochs=1", "ppo.shuffle=false", "optim.weight_decay=0.1"]
    on = run_update(tiny, batch, *common, "ppo.skip_inert=true")
    off = run_update(tiny, batch, *common, "ppo.skip_inert=false")
    assert on.metrics["update/trained_rows_frac"] == 3 / 8  # rows 0-2 of the first mini-batch
    assert on.metrics["optimizer_steps"] == off.metrics["optimizer_steps"] == 2
    assert float(on.grads[1].abs().max()) == float(off.grads[1].abs().max()) == 0.0
    for key in ("loss", "grad_norm"):
        assert on.metrics[key] == pytest.approx(off.metrics[key], rel=1e-5), key
    assert_same_update(on, off)
    # loss-side metrics of the first step only: task b (rows 3, 4, 6, 7) never ran
    assert "task/b/clip_frac_low" not in on.metrics and "task/b/clip_frac_low" in off.metrics
    assert "task/a/clip_frac_low" in on.metrics


def test_loss_side_metrics_cover_the_rows_that_ran(tiny) -> None:
    """One optimiser step: the metrics equal a brute-force computation over the active rows'
    tokens from the model's own log-probs; task b (all of its rows inert) has no flags."""
    batch = make_batch(tiny, rewards=(1.0, 0.0, 0.5, 1.0, 1.0, 1.0, 0.0, 0.0))
    one = ["algo=grpo", "ppo.epochs=1", "ppo.num_minibatches=1", "ppo.share_prefix=false"]
    model = copy.deepcopy(tiny)
    learner = build_learner(make_cfg(*one), model)
    with torch.no_grad():
        lp = sequence_token_stats(model, batch.input_ids, batch.attention_mask,
                                  temperature=1.0).logprob.double()  # fmt: skip
    metrics = update_step(learner, batch, generator=torch.Generator().manual_seed(0))
    adv, _ = token_advantages(batch, learner.cfg)
    active = adv.ne(0).any(dim=1)
    assert active.tolist() == [True, True] + [False] * 6  # rows 0, 1: task a
    m = (batch.loss_mask > 0) & active[:, None]
    log_r = (lp - batch.old_logprobs.double())[m]
    r, a = log_r.exp(), adv.double()[m]
    k3 = float((torch.expm1(log_r) - log_r).mean())
    assert metrics["approx_kl"] == pytest.approx(k3, rel=1e-4)
    assert metrics["loss/ratio_mean"] == pytest.approx(float(r.mean()), rel=1e-4)
    assert metrics["loss/ratio_min"] == pytest.approx(float(r.min()), rel=1e-4)
    assert metrics["loss/ratio_max"] == pytest.approx(float(r.max()), rel=1e-4)
    low = float(((a < 0) & (r < 0.8)).double().mean())
    high = float(((a > 0) & (r > 1.2)).double().mean())
    dual = float(((a < 0) & (r > 3)).double().mean())
    assert 0 < low + high  # the check sees clipping
    assert metrics["clip_frac_low"] == pytest.approx(low) == metrics["task/a/clip_frac_low"]
    assert metrics["clip_frac_high"] == pytest.approx(high) == metrics["task/a/clip_frac_high"]
    assert metrics["loss/dual_clip_frac"] == pytest.approx(dual)
    assert not any(k.startswith("task/b/") and "frac" in k and k != "task/b/signal_frac"
                   for k in metrics)  # fmt: skip
    assert metrics["task/b/entropy"] > 0  # the rollout metrics of task b are there
    rows_a = batch.task_ids == 0  # ... with its share of gradient-carrying episodes: none
    assert metrics["task/b/signal_frac"] == 0.0
    assert metrics["task/a/signal_frac"] == pytest.approx(2 / int(rows_a.sum()))


def test_every_row_inert_is_the_zero_update(tiny) -> None:
    flat = make_batch(tiny, rewards=(1.0,) * 8)
    on = run_update(tiny, flat, "ppo.skip_inert=true")
    off = run_update(tiny, flat, "ppo.skip_inert=false")
    for m in (on.metrics, off.metrics):
        assert m["update/zero_advantage"] == 1.0 and m["update/trained_rows_frac"] == 0.0
        assert m["loss"] == 0.0 and m["grad_norm"] == 0.0 and "approx_kl" not in m
    assert on.rows == off.rows == 0
    assert_same_update(on, off)
    assert float((on.params - on.start).abs().max()) > 0  # AdamW's momentum still moves it
