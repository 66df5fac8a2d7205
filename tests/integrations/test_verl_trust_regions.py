"""verl 0.9.1's trust regions and advantage estimators against entropace's, in the verl venv.

- every loss (``cispo``, ``geo_mean`` = our ``gmpo``, ``sapo``, ``dppo_tv``, ``dppo_kl``, ``dro``,
  ``gpg``) of entropace's registry equals verl's own ``compute_policy_loss_<name>`` in value and
  gradient, at several widths, in every aggregation the verl function supports (its
  ``loss_agg_mode``s mapped onto ours; SAPO's and GMPO's fixed ones);
- the verl-facing ``eppo_<name>`` losses (what the entropace trainer runs, registered by the
  plug-in) equal verl's in all five ``loss_agg_mode``s, with 2-rank global counts and with
  rollout-correction weights, and take per-token widths from the batch;
- the defaults are verl's stock ``ActorConfig``'s;
- REINFORCE++ (with and without baseline), ReMax, OPO, GRPO pass@k and GPG equal verl's
  estimators;
- the verl trainer hook paces each loss's own width.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl", reason="verl is not installed (pip install 'entropace[verl]')")

from omegaconf import OmegaConf  # noqa: E402
from test_verl_losses import AGG_MODES  # noqa: E402  (verl's five modes, a sibling file)
from verl.trainer.config.algorithm import AlgoConfig  # noqa: E402
from verl.trainer.ppo import core_algos as ca  # noqa: E402
from verl.workers.config.actor import ActorConfig, PolicyLossConfig  # noqa: E402

from entropace import algos  # noqa: E402
from entropace.integrations.verl import losses as vl  # noqa: E402
from entropace.integrations.verl import plugin  # noqa: E402, F401  (registers, as import verl does)
from entropace.integrations.verl.hooks import settings_from_config  # noqa: E402

#: verl loss_mode -> (entropace registry loss, the verl-facing loss of the plug-in)
LOSSES = {
    "cispo": ("cispo", "eppo_cispo"),
    "geo_mean": ("gmpo", "eppo_gmpo"),
    "sapo": ("sapo", "eppo_sapo"),
    "dppo_tv": ("dppo_tv", "eppo_dppo_tv"),
    "dppo_kl": ("dppo_kl", "eppo_dppo_kl"),
    "dro": ("dro", None),
    "gpg": ("gpg", None),
}
#: the widths tested per verl loss: (clip_ratio_low, clip_ratio_high) or SAPO's (tau_neg,
#: tau_pos) or DRO's beta; several each, so that bounds bind on both sides.
WIDTHS = {
    "cispo": [(0.2, 0.2), (0.1, 0.3), (10.0, 0.25)],
    "geo_mean": [(0.2, 0.2), (0.4, 0.1), (0.05, 0.5)],
    "sapo": [(1.05, 1.0), (3.0, 0.5), (0.3, 6.0)],
    "dppo_tv": [(0.2, 0.2), (0.02, 0.05), (0.1, 0.01)],
    "dppo_kl": [(0.2, 0.2), (0.005, 0.02), (0.05, 0.001)],
    "dro": [(1.0, 1.0), (0.2, 0.2), (5.0, 5.0)],
    "gpg": [(0.2, 0.2)],
}
#: our aggregation + seq_norm for each verl mode, where the registry loss takes it directly
OUR_AGG = {
    "token-mean": ("token-mean", None),
    "seq-mean-token-mean": ("seq-mean-token-mean", None),
    "seq-mean-token-sum-norm": ("seq-mean-token-sum-norm", 7.0),  # verl's default norm: T
}
#: the largest |difference| seen, per (test, loss): printed by -s, quoted in the issue note
DIFFS: dict[str, float] = {}


def _config(mode: str, agg: str, low: float, high: float, **kw: object) -> ActorConfig:
    extra: dict[str, object] = {}
    kind = mode.removeprefix("eppo_")  # verl's loss or our verl-facing one: the same config
    if kind == "sapo":
        extra = {"tau_neg": low, "tau_pos": high}
        low = high = 0.2
    beta = low if kind == "dro" else None
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=0.2,
        clip_ratio_low=low,
        clip_ratio_high=high,
        clip_ratio_c=kw.pop("clip_ratio_c", 3.0),
        loss_agg_mode=agg,
        policy_loss=PolicyLossConfig(loss_mode=mode, dro_beta=beta),
        **extra,
        **kw,
    )


def _batch(seed: int, b: int = 6, t: int = 7) -> dict[str, torch.Tensor]:
    """float64; per-token advantages of both signs and a zero; every row has a token."""
    g = torch.Generator().manual_seed(seed)
    old = (-torch.rand(b, t, generator=g, dtype=torch.float64) * 3).clamp(max=-0.02)
    new = (old + (torch.rand(b, t, generator=g, dtype=torch.float64) - 0.5) * 2.4).clamp(max=-1e-3)
    adv = torch.randn(b, 1, generator=g, dtype=torch.float64) + 0.3 * torch.randn(
        b, t, generator=g, dtype=torch.float64
    )
    adv[0, 2] = 0.0
    mask = (torch.rand(b, t, generator=g) > 0.25).to(torch.float64)
    mask[:, 0] = 1.0
    weights = torch.rand(b, t, generator=g, dtype=torch.float64) * 2
    return {"old": old, "new": new, "adv": adv, "mask": mask, "w": weights}


def _run(fn, d, cfg, agg, weights=None):
    new = d["new"].clone().requires_grad_(True)
    loss, metrics = fn(d["old"], new, d["adv"], d["mask"].bool(), agg, cfg, weights)
    loss.backward()
    return loss.detach(), new.grad, metrics


def _note(key: str, *diffs: torch.Tensor) -> None:
    DIFFS[key] = max(DIFFS.get(key, 0.0), *(float(x.abs().max()) for x in diffs))


@pytest.mark.parametrize("mode", sorted(LOSSES))
def test_registry_loss_equals_verls_function(mode: str) -> None:
    """entropace.algos loss vs verl's compute_policy_loss_<mode>: value and gradient, for
    each width and each aggregation both support directly."""
    ours, _ = LOSSES[mode]
    spec = algos.get_policy_loss(ours)
    verl_fn = ca.get_policy_loss_fn(mode)
    for seed, (low, high) in enumerate(WIDTHS[mode]):
        d = _batch(seed)
        for verl_agg, (agg, seq_norm) in OUR_AGG.items():
            if mode in ("sapo", "geo_mean"):  # verl fixes theirs; ours is a choice
                agg, seq_norm = "seq-mean-token-mean", None
            cfg = _config(mode, verl_agg, low, high)
            ref, ref_grad, _ = _run(verl_fn, d, cfg, verl_agg)
            x = d["new"].clone().requires_grad_(True)
            options = {"ratio_cap": 3.0} if mode.startswith("dppo") else {}
            widths = {} if mode == "gpg" else {"eps_low": low, "eps_high": high}
            inputs = algos.LossInputs(
                x, d["old"], d["adv"], d["mask"], agg=agg, seq_norm=seq_norm, **widths
            )
            out = spec(inputs, spec.make_config(options))
            out.loss.backward()
            torch.testing.assert_close(out.loss.detach(), ref, rtol=1e-7, atol=1e-12)
            torch.testing.assert_close(x.grad, ref_grad, rtol=1e-7, atol=1e-12)
            assert float(ref_grad.abs().sum()) > 1e-3
            _note(f"registry/{mode}", out.loss.detach() - ref, x.grad - ref_grad)


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("case", ["local", "global", "weights"])
@pytest.mark.parametrize("mode", [m for m, (_, v) in LOSSES.items() if v is not None] + ["dro"])
def test_eppo_losses_without_widths_equal_verl(mode: str, case: str, agg: str) -> None:
    """The plug-in's eppo_<mode> with verl's own widths is verl's <mode>: all five
    aggregations, 2-rank global counts, rollout-correction weights (GMPO refuses them)."""
    name = LOSSES[mode][1] or f"eppo_{mode}"
    low, high = WIDTHS[mode][1]
    d = _batch(AGG_MODES.index(agg) + 10)
    cfg_ours = _config(name, agg, low, high, loss_scale_factor=11 if case == "global" else None)
    cfg_verl = _config(mode, agg, low, high, loss_scale_factor=11 if case == "global" else None)
    if case == "global":
        info = {"dp_size": 2, "batch_num_tokens": float(d["mask"].sum() * 2 + 3),
                "global_batch_size": 13, "loss_scale_factor": 11}  # fmt: skip
        cfg_ours.global_batch_info.update(info)
        cfg_verl.global_batch_info.update(info)
    weights = d["w"] if case == "weights" else None
    fn = ca.get_policy_loss_fn(name)
    assert fn is vl.VERL_LOSSES[name]
    if case == "weights" and mode == "geo_mean":
        with pytest.raises(ValueError, match="rollout-correction weights"):
            _run(fn, d, cfg_ours, agg, weights)
        return
    loss, grad, metrics = _run(fn, d, cfg_ours, agg, weights)
    ref, ref_grad, ref_metrics = _run(ca.get_policy_loss_fn(mode), d, cfg_verl, agg, weights)
    if mode == "geo_mean" and case == "global":
        # deliberate: verl's geo_mean ignores the global counts (a plain mean over the
        # micro-batch's rows); ours divides the sequence sum by global_batch_size x dp_size
        scale = d["mask"].shape[0] * 2 / 13
        ref, ref_grad = ref * scale, ref_grad * scale
    torch.testing.assert_close(loss, ref, rtol=1e-7, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-7, atol=1e-12)
    assert float(grad.abs().sum()) > 1e-3
    _note(f"plug-in/{mode}", loss - ref, grad - ref_grad)
    assert metrics["actor/ppo_kl"] == pytest.approx(ref_metrics["actor/ppo_kl"], rel=1e-6)
    if mode in ("cispo", "dppo_tv", "dppo_kl"):  # the same clip / truncation counts as verl
        for key in ("actor/pg_clipfrac", "actor/pg_clipfrac_lower"):
            assert metrics[key] == pytest.approx(ref_metrics[key], rel=1e-6, abs=1e-12), key  # f32
        assert ref_metrics["actor/pg_clipfrac"] > 0


@pytest.mark.parametrize("name", ["eppo_cispo", "eppo_gmpo", "eppo_sapo", "eppo_dppo_kl"])
def test_eppo_losses_take_per_token_widths(name: str) -> None:
    """Per-token widths from the batch (what the pacer writes) == the registry loss with
    those widths; they change the loss."""
    d = _batch(3)
    b, t = d["mask"].shape
    g = torch.Generator().manual_seed(1)
    scale = 0.5 + torch.rand(b, 1, generator=g, dtype=torch.float64).expand(b, t)
    mode = vl.VERL_LOSS_MODES[name]
    base = {"cispo": (0.1, 0.3), "gmpo": (0.2, 0.2), "sapo": (2.0, 1.0), "dppo_kl": (0.01, 0.02)}
    lo, hi = base[mode.loss]
    low, high = lo * scale, hi * scale
    cfg = _config(name, "token-mean", 0.2, 0.2)
    with vl.token_bounds(vl.TokenBounds(eps_low=low, eps_high=high, options={})):
        loss, grad, metrics = _run(ca.get_policy_loss_fn(name), d, cfg, "token-mean")
    spec = algos.get_policy_loss(mode.loss)
    x = d["new"].clone().requires_grad_(True)
    agg = mode.agg or "token-mean"
    ref = spec(
        algos.LossInputs(x, d["old"], d["adv"], d["mask"], eps_low=low, eps_high=high, agg=agg),
        spec.make_config(mode.options(cfg)),
    )
    ref.loss.backward()
    torch.testing.assert_close(loss, ref.loss.detach(), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grad, x.grad, rtol=1e-9, atol=1e-12)
    plain, _, _ = _run(ca.get_policy_loss_fn(name), d, cfg, "token-mean")
    assert not torch.allclose(plain, loss)
    m = d["mask"].bool()
    assert metrics["entropace/eps_low_mean"] == pytest.approx(float(low[m].mean()))


def test_defaults_are_verls_stock_actor_config() -> None:
    stock = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1)
    assert (stock.clip_ratio_low, stock.clip_ratio_high) == (0.2, 0.2)
    for ours in ("cispo", "gmpo", "dppo_tv", "dppo_kl"):
        assert algos.POLICY_LOSSES[ours].default_bounds == (stock.clip_ratio_low,
                                                            stock.clip_ratio_high)  # fmt: skip
    sapo = algos.get_policy_loss("sapo").make_config()
    assert (sapo.tau_pos, sapo.tau_neg) == (stock.tau_pos, stock.tau_neg) == (1.0, 1.05)
    # verl's dppo reads config.get("clip_ratio_c", 20.0): the stock config has 3.0
    assert stock.get("clip_ratio_c", 20.0) == 3.0
    assert algos.get_policy_loss("dppo_tv").make_config().ratio_cap == 3.0
    assert stock.policy_loss.dro_beta is None  # verl has no DRO default (ours: 1.0, Tinker's)
    # and a stock config through verl's functions equals our defaults
    d = _batch(5)
    for mode, (ours, _) in LOSSES.items():
        if mode == "dro":
            continue
        ref, ref_grad, _ = _run(ca.get_policy_loss_fn(mode), d, stock, "token-mean")
        x = d["new"].clone().requires_grad_(True)
        agg = "seq-mean-token-mean" if mode in ("sapo", "geo_mean") else "token-mean"
        out = algos.get_policy_loss(ours)(algos.LossInputs(x, d["old"], d["adv"], d["mask"],
                                                           agg=agg))  # fmt: skip
        out.loss.backward()
        torch.testing.assert_close(out.loss.detach(), ref, rtol=1e-7, atol=1e-12)
        torch.testing.assert_close(x.grad, ref_grad, rtol=1e-7, atol=1e-12)


# ------------------------------------------------------------------------------ estimators


def _outcome(seed: int):
    """Groups of 3 (one all-equal) and a pair; the reward on the last masked token."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.tensor([4, 4, 4, 9, 9, 9, 2, 2, 2, 7, 7])
    b, t = len(ids), 8
    rewards = torch.randint(0, 3, (b,), generator=g).double() / 2
    rewards[6:9] = 0.5
    mask = (torch.rand(b, t, generator=g) > 0.3).double()
    mask[:, 0] = 1.0
    last = (mask * torch.arange(t)).argmax(-1)
    scores = torch.zeros(b, t, dtype=torch.float64)
    scores[torch.arange(b), last] = rewards
    return rewards, ids, mask, scores


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_estimators_equal_verls(seed: int) -> None:
    rewards, ids, mask, scores = _outcome(seed)
    index = ids.numpy()
    checks = []
    for gamma in (1.0, 0.9):
        ref, _ = ca.compute_reinforce_plus_plus_outcome_advantage(
            scores.clone(), mask, config=AlgoConfig(gamma=gamma)
        )
        spec = algos.get_advantage("reinforce_plus_plus")
        ours = spec(rewards, ids, mask=mask, config=spec.make_config({"gamma": gamma}))
        checks.append((f"reinforce_plus_plus/gamma={gamma}", ours, ref * mask, 1e-8))
    ref, _ = ca.compute_reinforce_plus_plus_baseline_outcome_advantage(
        scores.clone(), mask, index, config=AlgoConfig()
    )
    ours = algos.get_advantage("reinforce_plus_plus_baseline")(rewards, ids, mask=mask)
    checks.append(("reinforce_plus_plus_baseline", ours, ref * mask, 1e-8))
    baselines = torch.rand(len(ids), generator=torch.Generator().manual_seed(seed)).double()
    ref, _ = ca.compute_remax_outcome_advantage(
        scores.clone(), baselines, mask, config=AlgoConfig()
    )
    ours = algos.get_advantage("remax")(rewards, ids, baselines=baselines)
    checks.append(("remax", ours[:, None] * mask, ref * mask, 0.0))
    ref, _ = ca.compute_opo_outcome_advantage(scores.clone(), mask, index, config=AlgoConfig())
    ours = algos.get_advantage("opo")(rewards, ids, mask=mask)
    checks.append(("opo", ours[:, None] * mask, ref * mask, 0.0))
    spec = algos.get_advantage("grpo_passk")
    for norm in (True, False):
        ref, _ = ca.compute_grpo_passk_outcome_advantage(
            scores.clone(), mask, index, config=AlgoConfig(norm_adv_by_std_in_grpo=norm)
        )
        ours = spec(rewards, ids, config=spec.make_config({"norm_by_std": norm}))
        checks.append((f"grpo_passk/norm={norm}", ours[:, None] * mask, ref * mask, 0.0))
    ref, _ = ca.compute_gpg_outcome_advantage(scores.clone(), mask, index, config=AlgoConfig())
    ours = algos.get_advantage("gpg")(rewards, ids)
    # verl's alpha = B / count is a float32 tensor: relative rounding up to 6e-8
    checks.append(("gpg", ours[:, None] * mask, ref * mask, 1e-7 * float(ref.abs().max())))
    for name, got, want, atol in checks:
        torch.testing.assert_close(got.double(), want.double(), rtol=0, atol=max(atol, 1e-15))
        _note(f"estimator/{name}", got.double() - want.double())
    assert float(checks[0][2].abs().max()) > 0.5  # non-trivial advantages


# ------------------------------------------------------------------------------ the hook


def _hook_config(loss_mode: str, **actor: object):
    cfg = {
        "actor_rollout_ref": {
            "actor": {
                "clip_ratio": 0.2,
                "clip_ratio_low": actor.pop("low", 0.2),
                "clip_ratio_high": actor.pop("high", 0.2),
                "policy_loss": {"loss_mode": loss_mode, "dro_beta": actor.pop("dro_beta", None)},
                **actor,
            }
        }
    }
    return OmegaConf.create(cfg)


def test_hook_paces_each_losss_own_width_from_verls_config() -> None:
    s = settings_from_config(_hook_config("eppo_gmpo", low=0.4, high=0.3))
    assert (s.recipe, s.clip_rule) == ("eppo+gmpo", "pacer")
    assert (s.clip.eps_low, s.clip.eps_high) == (
        0.4,
        0.3,
    ) and s.clip.width.unit == "log-ratio bound"
    s = settings_from_config(_hook_config("eppo_sapo", tau_neg=2.0, tau_pos=1.5))
    assert (s.clip.eps_low, s.clip.eps_high) == (2.0, 1.5) and s.clip.width.power == -1.0
    s = settings_from_config(_hook_config("eppo_dro", dro_beta=0.5))
    assert (s.clip.eps_low, s.clip.eps_high) == (0.5, 0.5)
    with pytest.raises(ValueError, match="dro_beta must be a positive value"):
        settings_from_config(_hook_config("eppo_dro"))
    # CISPO's weight bound may leave the lower side open (verl's example: clip_ratio_low 10)
    s = settings_from_config(_hook_config("eppo_cispo", low=10.0, high=0.2))
    assert s.clip.eps_low == 10.0
    # the pacer's widths on the batch: scaled from the loss's own by each task's pace
    from entropace.integrations.verl.hooks import EntropaceHook

    hook = EntropaceHook(settings_from_config(_hook_config("eppo_dppo_kl", low=0.05, high=0.04)))
    assert hook.writes_bounds and hook.step.default_bounds == (0.05, 0.04)


def test_plugin_registers_every_mode() -> None:
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    for name in vl.VERL_LOSS_MODES:
        assert POLICY_LOSS_REGISTRY[name] is vl.VERL_LOSSES[name], name
    # verl's own names are left to verl
    for mode in LOSSES:
        assert POLICY_LOSS_REGISTRY[mode].__module__ == "verl.trainer.ppo.core_algos"


def test_report_the_largest_differences(capsys) -> None:
    """Runs last in this file: the largest |ours - verl| seen above (the issue's evidence)."""
    with capsys.disabled():
        for key in sorted(DIFFS):
            print(f"max |diff| {key}: {DIFFS[key]:.3g}")
    assert DIFFS and max(DIFFS.values()) < 1e-6
