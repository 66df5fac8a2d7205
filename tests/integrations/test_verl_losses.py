"""entropace's policy losses inside verl 0.9.1: entry-point registration and exact equalities.

- ``import verl`` in a fresh process registers the losses through the ``verl.plugins`` entry point;
- ``eppo`` without per-token bounds equals verl's own ``compute_policy_loss_vanilla`` (loss,
  gradient and metrics) for every verl aggregation mode, with and without global-batch counts
  and rollout-correction weights;
- with per-token bounds it equals ``entropace.algos.clipped_surrogate_loss`` with those bounds;
- ``dcpo`` / ``ce_gppo`` equal the entropace registry losses;
- the actor's loss wrapper reads the bounds from the micro-batch's nested fields.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

pytest.importorskip("verl", reason="verl is not installed (pip install 'entropace[verl]')")

from verl.trainer.ppo.core_algos import (  # noqa: E402
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
)
from verl.workers.config.actor import ActorConfig, PolicyLossConfig  # noqa: E402

from entropace import algos  # noqa: E402
from entropace.integrations.verl import losses as vl  # noqa: E402
from entropace.integrations.verl import plugin  # noqa: E402, F401  (registers, as import verl does)

AGG_MODES = [
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
]


def _config(loss_mode: str = "eppo", agg: str = "token-mean", **kw: object) -> ActorConfig:
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=0.2,
        clip_ratio_low=kw.pop("low", 0.2),
        clip_ratio_high=kw.pop("high", 0.28),
        clip_ratio_c=3.0,
        loss_agg_mode=agg,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode),
        **kw,
    )


def _batch(seed: int = 0, b: int = 5, t: int = 7) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    # log-ratios in [-1.5, 1.5]: ratios from 0.22 to 4.5 cross both clip bounds and the dual clip
    new = old + (torch.rand(b, t, generator=g, dtype=torch.float64) - 0.5) * 3
    adv = torch.randn(b, 1, generator=g, dtype=torch.float64).expand(b, t).clone()
    adv[0, 2] = 0.0
    mask = (torch.rand(b, t, generator=g) > 0.25).to(torch.float64)
    mask[-1] = 0.0  # a fully masked row neither contributes nor dilutes
    mask[0, 0] = 1.0
    adv[1] = -adv[1].abs() - 0.1  # row 1: A < 0 with a ratio above the dual-clip constant 3
    new[1, 1] = old[1, 1] + 1.3
    mask[1, 1] = 1.0
    weights = torch.rand(b, t, generator=g, dtype=torch.float64) * 2
    return {"old": old, "new": new, "adv": adv, "mask": mask, "w": weights}


def _loss_and_grad(fn, d, cfg, agg, weights=None):
    new = d["new"].clone().requires_grad_(True)
    loss, metrics = fn(d["old"], new, d["adv"], d["mask"], agg, cfg, weights)
    loss.backward()
    return loss.detach(), new.grad, metrics


def test_import_verl_registers_losses_in_a_fresh_process() -> None:
    code = (
        "import json, sys\n"
        "import verl\n"
        "from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY as R\n"
        "from entropace.integrations.verl import plugin\n"
        "from verl.workers.engine import EngineRegistry\n"
        "engines = [EngineRegistry.get_engine_cls('language_model', b) for b in ('fsdp', 'fsdp2')]\n"
        "print(json.dumps({'names': sorted(R), 'mod': R['eppo'].__module__,"
        " 'registered': plugin.REGISTERED,"
        " 'engines': [f'{c.__module__}.{c.__name__}' for c in engines]}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
        env={
            **__import__("os").environ,
            "VERL_USE_EXTERNAL_PLUGINS": "auto",
            "VERL_ENGINE_DEVICE": "cuda",  # the lookup a plain verl run on NVIDIA GPUs makes
            "VERL_ENGINE_VENDOR": "nvidia",
        },
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for name in ("eppo", "papo", "eppo_papo", "dcpo", "ce_gppo", "vanilla"):
        assert name in result["names"]
    assert result["mod"] == "entropace.integrations.verl.losses"
    assert result["registered"]["losses"] == [
        "eppo", "papo", "eppo_papo", "dcpo", "ce_gppo", "eppo_cispo", "eppo_gmpo", "eppo_sapo",
        "eppo_dppo_tv", "eppo_dppo_kl", "eppo_dro",
    ]  # fmt: skip
    # with the `verl` extra's light dependencies, every part registers in every process
    assert result["registered"]["trainer"] == ["entropace", "entropace_colocate_async"]
    assert result["registered"]["agent_loop"] == ["entropace"]
    # ... but never our engine: a plain verl run in this environment keeps verl's
    assert "engine" not in result["registered"]
    assert (
        result["engines"] == ["verl.workers.engine.fsdp.transformer_impl.FSDPEngineWithLMHead"] * 2
    )


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("case", ["local", "global", "weights"])
def test_eppo_without_bounds_equals_verl_vanilla(agg: str, case: str) -> None:
    d = _batch(seed=AGG_MODES.index(agg))
    kw: dict[str, object] = {}
    if case == "global":
        kw["loss_scale_factor"] = 11
    cfg_ours, cfg_verl = _config("eppo", agg, **dict(kw)), _config("vanilla", agg, **dict(kw))
    if case == "global":  # two ranks: the global counts of a batch twice this one's
        info = {
            "dp_size": 2,
            "batch_num_tokens": float(d["mask"].sum() * 2 + 3),
            "global_batch_size": 9,
            "loss_scale_factor": 11,
        }
        cfg_ours.global_batch_info.update(info)
        cfg_verl.global_batch_info.update(info)
    weights = d["w"] if case == "weights" else None
    eppo = get_policy_loss_fn("eppo")
    assert eppo is vl.VERL_LOSSES["eppo"]
    loss, grad, metrics = _loss_and_grad(eppo, d, cfg_ours, agg, weights)
    ref_loss, ref_grad, ref_metrics = _loss_and_grad(
        compute_policy_loss_vanilla, d, cfg_verl, agg, weights
    )
    torch.testing.assert_close(loss, ref_loss, rtol=1e-7, atol=1e-12)  # verl: n + 1e-8
    torch.testing.assert_close(grad, ref_grad, rtol=1e-7, atol=1e-12)
    assert loss.abs() > 1e-3 and grad.abs().sum() > 1e-3
    for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert metrics[key] == pytest.approx(ref_metrics[key], rel=1e-9, abs=1e-12), key
    assert ref_metrics["actor/pg_clipfrac"] > 0 and ref_metrics["actor/pg_clipfrac_lower"] > 0


@pytest.mark.parametrize("name", ["papo", "eppo_papo"])
def test_papo_names_are_the_same_loss(name: str) -> None:
    d = _batch(seed=3)
    cfg = _config(name, "token-mean")
    loss, grad, _ = _loss_and_grad(get_policy_loss_fn(name), d, cfg, "token-mean")
    ref, ref_grad, _ = _loss_and_grad(compute_policy_loss_vanilla, d, cfg, "token-mean")
    torch.testing.assert_close(loss, ref, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-9, atol=1e-12)


OUR_AGG = {
    "token-mean": ("token-mean", None),
    "seq-mean-token-mean": ("seq-mean-token-mean", None),
    "seq-mean-token-sum-norm": ("seq-mean-token-sum-norm", 7),  # verl's default norm: T
}


@pytest.mark.parametrize("agg", list(OUR_AGG))
def test_eppo_with_token_bounds_equals_clipped_surrogate(agg: str) -> None:
    d = _batch(seed=7)
    g = torch.Generator().manual_seed(1)
    low = 0.1 + 0.2 * torch.rand(5, 1, generator=g, dtype=torch.float64).expand(5, 7)
    high = 0.15 + 0.2 * torch.rand(5, 7, generator=g, dtype=torch.float64)
    cfg = _config("eppo", agg)
    with vl.token_bounds(vl.TokenBounds(eps_low=low, eps_high=high, options={})):
        loss, grad, metrics = _loss_and_grad(get_policy_loss_fn("eppo"), d, cfg, agg)
    assert vl.current_bounds() is None
    our_agg, seq_norm = OUR_AGG[agg]
    new = d["new"].clone().requires_grad_(True)
    ref = algos.clipped_surrogate_loss(
        new, d["old"], d["adv"], d["mask"], eps_low=low, eps_high=high, dual_clip=3.0,
        agg=our_agg, seq_norm=seq_norm,
    )  # fmt: skip
    ref.loss.backward()
    torch.testing.assert_close(loss, ref.loss.detach(), rtol=1e-7, atol=1e-12)
    torch.testing.assert_close(grad, new.grad, rtol=1e-7, atol=1e-12)
    # and the bounds matter: the config's bounds give a different loss
    plain, _, _ = _loss_and_grad(get_policy_loss_fn("eppo"), d, cfg, agg)
    assert not torch.allclose(plain, loss)
    m = d["mask"].bool()
    assert metrics["entropace/eps_low_mean"] == pytest.approx(float(low[m].mean()))
    assert metrics["entropace/eps_high_mean"] == pytest.approx(float(high[m].mean()))


@pytest.mark.parametrize("name", ["dcpo", "ce_gppo"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_baselines_equal_the_entropace_registry(name: str, agg: str) -> None:
    d = _batch(seed=11)
    cfg = _config(name, agg, low=0.16, high=0.2)
    options = {"r_max": 4.0} if name == "dcpo" else {"beta1": 0.5}
    with vl.token_bounds(vl.TokenBounds(eps_low=None, eps_high=None, options=options)):
        loss, grad, metrics = _loss_and_grad(get_policy_loss_fn(name), d, cfg, agg)
    spec = algos.get_policy_loss(name)
    new = d["new"].clone().requires_grad_(True)
    inputs = algos.LossInputs(
        new, d["old"], d["adv"], d["mask"], eps_low=0.16, eps_high=0.2, agg=agg
    )
    ref = spec(inputs, spec.make_config({**options, "dual_clip": 3.0}))
    ref.loss.backward()
    torch.testing.assert_close(loss, ref.loss.detach(), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grad, new.grad, rtol=1e-9, atol=1e-12)
    # verl's clip-fraction metric counts where THIS loss's clip binds (DCPO: its own bounds)
    clipped = ref.flags["clip_frac_low"] | ref.flags["clip_frac_high"]
    m = d["mask"].bool()
    assert metrics["actor/pg_clipfrac"] == pytest.approx(float(clipped[m].double().mean()))


def test_verl_agg_factor_rejects_missing_global_counts() -> None:
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match="batch_num_tokens"):
        vl.verl_agg_factor("token-mean", mask, {"dp_size": 2})
    with pytest.raises(ValueError, match="global_batch_size"):
        vl.verl_agg_factor("seq-mean-token-mean", mask, {"dp_size": 2})
    with pytest.raises(ValueError, match="unknown loss_agg_mode"):
        vl.verl_agg_factor("sum", mask, {})


def test_bounds_of_the_wrong_shape_are_refused() -> None:
    d = _batch()
    bad = torch.full((5, 3), 0.2, dtype=torch.float64)
    with vl.token_bounds(vl.TokenBounds(eps_low=bad, eps_high=None, options={})):
        with pytest.raises(ValueError, match="response-aligned"):
            _loss_and_grad(get_policy_loss_fn("eppo"), d, _config(), "token-mean")


def test_loss_wrapper_reads_nested_bounds_from_the_micro_batch() -> None:
    from tensordict import TensorDict

    lens = [3, 1, 2]
    low = torch.nested.as_nested_tensor(
        [torch.full((n,), 0.1 * (i + 1)) for i, n in enumerate(lens)], layout=torch.jagged
    )
    high = torch.nested.as_nested_tensor([torch.full((n,), 0.3) for n in lens], layout=torch.jagged)
    data = TensorDict({"entropace_eps_low": low, "entropace_eps_high": high}, batch_size=[3])
    seen = {}

    def inner(model_output, data, dp_group=None):
        seen["bounds"] = vl.current_bounds()
        return torch.tensor(0.0), {}

    vl.EntropaceLossFn(inner)(model_output={}, data=data, dp_group=None)
    b = seen["bounds"]
    expected_low = torch.tensor([[0.1, 0.1, 0.1], [0.2, 0, 0], [0.3, 0.3, 0]])
    torch.testing.assert_close(b.eps_low, expected_low)
    assert b.eps_high.shape == (3, 3) and float(b.eps_high[0, 0]) == pytest.approx(0.3)
    assert vl.current_bounds() is None
    # no entropace fields: nothing is made current
    vl.EntropaceLossFn(inner)(model_output={}, data=TensorDict({}, batch_size=[3]), dp_group=None)
    assert seen["bounds"] is None


def test_wrapped_verl_ppo_loss_on_a_nested_micro_batch_equals_clipped_surrogate() -> None:
    """The worker path end to end: verl's own ``ppo_loss`` (wrapped) on a micro-batch laid out
    as verl's engine passes it (nested full-sequence log-probs, nested response fields)."""
    from functools import partial

    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    g = torch.Generator().manual_seed(5)
    prompt_lens, resp_lens = [3, 2, 4], [4, 2, 3]
    seq_vals = [
        -torch.rand(p + r, generator=g) * 2 for p, r in zip(prompt_lens, resp_lens, strict=True)
    ]
    values = torch.cat(seq_vals).requires_grad_(True)
    offsets = torch.tensor([0] + list(torch.cumsum(torch.tensor([len(v) for v in seq_vals]), 0)))
    log_probs = torch.nested.nested_tensor_from_jagged(values, offsets)

    def nested(rows):
        return torch.nested.as_nested_tensor(rows, layout=torch.jagged)

    old = [-torch.rand(r, generator=g) * 2 for r in resp_lens]
    adv = [torch.full((r,), a) for r, a in zip(resp_lens, [1.0, -2.0, 0.5], strict=True)]
    masks = [torch.ones(r, dtype=torch.int64) for r in resp_lens]
    masks[0][1] = 0
    low = [torch.full((r,), e) for r, e in zip(resp_lens, [0.1, 0.3, 0.15], strict=True)]
    high = [torch.full((r,), e) for r, e in zip(resp_lens, [0.12, 0.25, 0.4], strict=True)]
    n_tokens = int(sum(int(m.sum()) for m in masks))
    data = tu.get_tensordict(
        {
            "prompts": nested([torch.zeros(p, dtype=torch.int64) for p in prompt_lens]),
            "responses": nested([torch.zeros(r, dtype=torch.int64) for r in resp_lens]),
            "response_mask": nested(masks),
            "old_log_probs": nested(old),
            "advantages": nested(adv),
            "entropace_eps_low": nested(low),
            "entropace_eps_high": nested(high),
        }
    )
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=n_tokens, global_batch_size=3)
    cfg = _config("eppo", "token-mean")
    loss, metrics = vl.EntropaceLossFn(partial(ppo_loss, config=cfg))(
        model_output={"log_probs": log_probs}, data=data, dp_group=None
    )
    loss.backward()
    # the same by hand: response log-probs are the left-shifted tail of each sequence
    width = max(resp_lens)

    def pad(rows):
        return torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])

    ref_values = values.detach().clone().requires_grad_(True)
    chunks = torch.split(ref_values, [p + r for p, r in zip(prompt_lens, resp_lens, strict=True)])
    resp = [c[p - 1 : p - 1 + r] for c, p, r in zip(chunks, prompt_lens, resp_lens, strict=True)]
    ref = algos.clipped_surrogate_loss(
        pad(resp), pad(old), pad(adv), pad(masks), eps_low=pad(low), eps_high=pad(high),
        dual_clip=3.0, agg="token-mean",
    )  # fmt: skip
    ref.loss.backward()
    torch.testing.assert_close(loss, ref.loss.detach())
    torch.testing.assert_close(values.grad, ref_values.grad)
    assert {"actor/pg_loss", "actor/pg_clipfrac", "entropace/eps_low_mean"} <= set(metrics)
