"""The update's activation memory (issue 12): ``ppo.checkpoint_mlp`` recomputes each decoder
layer's MLP in the backward pass. Exact (bitwise-equal statistics, gradients and update
metrics), compatible with shared prefixes, and the tensors kept for the backward shrink by
exactly the MLP's four ``[tokens, d_ff]`` activations per layer. HF's whole-layer gradient
checkpointing (``model.gradient_checkpointing``) is exact too."""

from __future__ import annotations

import copy

import pytest
import torch
from tests.test_prefix_stats import _batch_for_update, multi_turn_batch

from entropace.rollout import sequence_token_stats
from entropace.train.config import load_config
from entropace.train.recompute import checkpoint_mlps, checkpoint_norms
from entropace.train.trainer import build_learner
from entropace.train.update import update_step


@pytest.fixture
def tiny():
    from entropace.models.tiny import build_tiny_model

    model, _ = build_tiny_model(seed=0)
    model.train()
    return model


def _grads(model, ids, attn, loss_mask, groups, fused=True):
    model.zero_grad(set_to_none=True)
    saved: dict[int, int] = {}
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        st = sequence_token_stats(model, ids, attn, temperature=0.7, loss_mask=loss_mask,
                                  grad=True, groups=groups, fused_head=fused)  # fmt: skip
    ((st.logprob * loss_mask).sum() + 0.5 * (st.entropy * loss_mask).sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return st, grads, sum(saved.values())


def _assert_bitwise_equal(got, ref, got_grads, ref_grads) -> None:
    for name in ("logprob", "entropy", "t1", "t2"):
        assert torch.equal(getattr(got, name), getattr(ref, name)), name
    for name, grad in ref_grads.items():
        assert torch.equal(got_grads[name], grad), name


def _positions(model, module, ids, attn, loss_mask, groups) -> int:
    """Token positions ``module`` runs in one no-grad pass (every real token once, minus
    the shared prefixes)."""
    fed: list[int] = []
    hook = module.register_forward_hook(
        lambda _m, inp, _o: fed.append(inp[0].shape[0] * inp[0].shape[1])
    )
    with torch.no_grad():
        sequence_token_stats(model, ids, attn, loss_mask=loss_mask, groups=groups, fused_head=True)
    hook.remove()
    return sum(fed)


@pytest.mark.parametrize("share", [False, True])
def test_checkpointed_mlps_give_bitwise_equal_gradients_and_keep_less(tiny, share) -> None:
    ids, attn, loss_mask, groups = multi_turn_batch(tiny.config.vocab_size, seed=8)
    g = groups if share else None
    ref, ref_grads, ref_saved = _grads(tiny, ids, attn, loss_mask, g)
    state = {k: v.clone() for k, v in tiny.state_dict().items()}
    assert checkpoint_mlps(tiny) == tiny.config.num_hidden_layers
    assert checkpoint_mlps(tiny) == tiny.config.num_hidden_layers  # idempotent
    assert tiny.state_dict().keys() == state.keys()  # checkpoints load as before
    got, got_grads, got_saved = _grads(tiny, ids, attn, loss_mask, g)
    _assert_bitwise_equal(got, ref, got_grads, ref_grads)
    # the MLP's gate, act(gate), up and product ([tokens, d_ff] fp32 each) are no longer kept
    positions = _positions(tiny, tiny.model.layers[0].mlp, ids, attn, loss_mask, g)
    d_ff, layers = tiny.config.intermediate_size, tiny.config.num_hidden_layers
    assert ref_saved - got_saved == 4 * d_ff * 4 * layers * positions


def test_checkpoint_mlp_rejects_a_model_without_decoder_layers() -> None:
    with pytest.raises(ValueError, match="ppo.checkpoint_mlp"):
        checkpoint_mlps(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_update_with_checkpointed_mlps_equals_the_plain_update(tiny) -> None:
    """``update_step`` (eppo+papo, 2 epochs x 2 mini-batches, shared prefixes, fused head) with
    ``ppo.checkpoint_mlp`` (and ``ppo.checkpoint_norms``) on vs off: every metric and every
    weight after the update bitwise equal."""
    batch = _batch_for_update(tiny)
    runs = []
    for mlp, norms in ((False, False), (True, False), (True, True)):
        model = copy.deepcopy(tiny)
        cfg = load_config(None, ["tasks=a,b", "algo=eppo+papo", "rollout.max_episode_tokens=64",
                                 "rollout.temperature=1.0", "ppo.epochs=2", "ppo.num_minibatches=2",
                                 "ppo.micro_batch_size=3", "optim.lr=1e-3",
                                 f"ppo.checkpoint_mlp={str(mlp).lower()}",
                                 f"ppo.checkpoint_norms={str(norms).lower()}"],
                          check_envs=False)  # fmt: skip
        learner = build_learner(cfg, model)
        metrics = update_step(learner, batch, generator=torch.Generator().manual_seed(0))
        runs.append((metrics, [p.detach().clone() for p in model.parameters()]))
    (m_ref, p_ref), *others = runs
    for m_got, p_got in others:  # the MLPs recomputed, then the norms too
        assert m_got == m_ref
        assert all(torch.equal(a, b) for a, b in zip(p_got, p_ref, strict=True))


def test_hf_gradient_checkpointing_is_exact(tiny) -> None:
    """``model.gradient_checkpointing`` (HF, whole layers; the shared-prefix path is off under
    it): the same statistics and gradients as without it."""
    ids, attn, loss_mask, _ = multi_turn_batch(tiny.config.vocab_size, seed=9)
    ref, ref_grads, ref_saved = _grads(tiny, ids, attn, loss_mask, None)
    tiny.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    got, got_grads, got_saved = _grads(tiny, ids, attn, loss_mask, None)
    for name in ("logprob", "entropy"):
        torch.testing.assert_close(getattr(got, name), getattr(ref, name), rtol=1e-6, atol=1e-6)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-6, atol=1e-7, msg=name)
    assert got_saved < ref_saved / 2


@pytest.mark.parametrize("share", [False, True])
def test_checkpointed_norms_give_bitwise_equal_gradients_and_keep_less(tiny, share) -> None:
    """``ppo.checkpoint_norms``: bitwise-equal statistics and gradients (also on top of the
    checkpointed MLPs); each RMSNorm no longer keeps its normalised ``[tokens, d]``
    intermediate and its ``[tokens, 1]`` rsqrt (fp32): the kept bytes fall by exactly
    ``norms x positions x (d + 1) x 4``."""
    ids, attn, loss_mask, groups = multi_turn_batch(tiny.config.vocab_size, seed=8)
    g = groups if share else None
    checkpoint_mlps(tiny)
    ref, ref_grads, ref_saved = _grads(tiny, ids, attn, loss_mask, g)
    layers = tiny.config.num_hidden_layers
    assert checkpoint_norms(tiny) == 2 * layers + 1  # two per layer and the final norm
    assert checkpoint_norms(tiny) == 2 * layers + 1  # idempotent
    got, got_grads, got_saved = _grads(tiny, ids, attn, loss_mask, g)
    _assert_bitwise_equal(got, ref, got_grads, ref_grads)
    # each norm no longer keeps x * rsqrt(mean(x^2) + eps) ([tokens, d]) nor the rsqrt
    # ([tokens, 1]), fp32; every norm (the final one too) runs the same positions
    positions = _positions(tiny, tiny.model.layers[0].input_layernorm, ids, attn, loss_mask, g)
    d = tiny.config.hidden_size
    assert ref_saved - got_saved == (2 * layers + 1) * positions * (d + 1) * 4


def test_checkpoint_norms_rejects_a_model_without_rmsnorm() -> None:
    with pytest.raises(ValueError, match="ppo.checkpoint_norms"):
        checkpoint_norms(torch.nn.Sequential(torch.nn.LayerNorm(2)))
