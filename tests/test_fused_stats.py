"""The fused LM head in the statistics pass and the update (issue 12, section 2): hidden states of
the policy rows only, ``hidden_token_stats`` instead of materialised logits. Values on the loss
columns, every parameter gradient and every update metric equal the materialised path (fp32,
relative 1e-5), with and without shared prefixes; the LM head module never runs."""

from __future__ import annotations

import copy

import pytest
import torch
from tests.test_prefix_stats import _batch_for_update, multi_turn_batch

from entropace.rollout import sequence_token_stats
from entropace.rollout.stats import fused_head_parts
from entropace.train.config import load_config
from entropace.train.trainer import build_learner
from entropace.train.update import update_step

NAMES = ("logprob", "entropy", "t1", "t2")


@pytest.fixture(scope="module")
def tiny():
    from entropace.models.tiny import build_tiny_model

    model, _ = build_tiny_model(seed=0)
    return model


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    scale = float(want.abs().max()) or 1.0
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * scale, msg=what)


def _stats_and_grads(model, ids, attn, loss_mask, *, groups, micro, fused, temperature=0.7):
    model.zero_grad(set_to_none=True)
    calls: list[int] = []
    head_forward = model.lm_head.forward  # counted without a hook (a hook turns fusing off)

    def counted(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[1])
        return head_forward(x)

    model.lm_head.forward = counted
    try:
        st = sequence_token_stats(model, ids, attn, temperature=temperature, loss_mask=loss_mask,
                                  micro_batch_size=micro, grad=True, groups=groups,
                                  fused_head=fused)  # fmt: skip
    finally:
        del model.lm_head.forward
    weight = loss_mask if loss_mask is not None else attn.float()
    ((st.logprob * weight).sum() + 0.5 * (st.entropy * weight).sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return st, grads, calls


@pytest.mark.parametrize("micro", [None, 3])
@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("with_loss_mask", [True, False])
def test_fused_stats_and_gradients_equal_the_materialised_path(
    tiny, micro, share, with_loss_mask
) -> None:
    """Multi-turn rows of uneven length (an observation hole in the loss mask), groups of
    3/2/1/2 split by the micro-batches; the fused path matches on the loss columns, is 0 on
    the others, and never calls the LM head."""
    ids, attn, loss_mask, groups = multi_turn_batch(tiny.config.vocab_size, seed=5)
    lm = loss_mask if with_loss_mask else None
    g = groups if share else None
    ref, ref_grads, ref_calls = _stats_and_grads(tiny, ids, attn, lm, groups=g, micro=micro,
                                                 fused=False)  # fmt: skip
    got, got_grads, got_calls = _stats_and_grads(tiny, ids, attn, lm, groups=g, micro=micro,
                                                 fused=True)  # fmt: skip
    assert ref_calls and not got_calls  # the head module never ran on the fused path
    cols = (attn[:, 1:] * attn[:, :-1]).bool()
    if lm is not None:
        cols &= lm[:, 1:] != 0
    cols = torch.cat([torch.zeros(ids.shape[0], 1, dtype=torch.bool), cols], dim=1)
    for name in NAMES:
        a, b = getattr(ref, name).detach(), getattr(got, name).detach()
        _close(b[cols], a[cols], name)
        assert torch.equal(b[~cols], torch.zeros_like(b[~cols])), name
    assert ref_grads.keys() == got_grads.keys() and len(got_grads) == len(list(tiny.parameters()))
    for name, grad in ref_grads.items():
        _close(got_grads[name], grad, f"grad {name}")


def test_fused_stats_left_padding_and_no_grad(tiny) -> None:
    """Left-padded rows under ``torch.no_grad`` (the rollout's statistics pass): equal to the
    materialised path on every real column after the first."""
    ids, attn, _, _ = multi_turn_batch(tiny.config.vocab_size, seed=6)
    left, left_attn = torch.zeros_like(ids), torch.zeros_like(attn)
    for i in range(ids.shape[0]):
        n = int(attn[i].sum())
        left[i, -n:], left_attn[i, -n:] = ids[i, :n], 1
    with torch.no_grad():
        a = sequence_token_stats(tiny, left, left_attn, temperature=0.9, micro_batch_size=3)
        b = sequence_token_stats(tiny, left, left_attn, temperature=0.9, micro_batch_size=3,
                                 fused_head=True)  # fmt: skip
    for name in NAMES:
        _close(getattr(b, name), getattr(a, name), name)


def test_models_without_a_plain_head_take_the_materialised_path(tiny) -> None:
    """A soft-capped config, a wrapper without a transformers config: ``fused_head_parts`` is
    None and ``fused_head=True`` gives the materialised path's numbers."""
    backbone, weight, bias = fused_head_parts(tiny)
    assert backbone is tiny.model and weight is tiny.lm_head.weight and bias is None
    capped = copy.deepcopy(tiny)
    capped.config.final_logit_softcapping = 30.0
    assert fused_head_parts(capped) is None

    class Wrapper(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, **kwargs):
            return self.inner(**kwargs)

    assert fused_head_parts(Wrapper(tiny)) is None
    hook = tiny.lm_head.register_forward_hook(lambda _m, _i, out: out + 1.0)
    assert fused_head_parts(tiny) is None  # the hook would be skipped
    hook.remove()
    assert fused_head_parts(tiny) is not None
    ids, attn, loss_mask, _ = multi_turn_batch(tiny.config.vocab_size, seed=7)
    with torch.no_grad():
        a = sequence_token_stats(tiny, ids, attn, loss_mask=loss_mask)
        b = sequence_token_stats(Wrapper(tiny), ids, attn, loss_mask=loss_mask, fused_head=True)
    for name in NAMES:
        torch.testing.assert_close(getattr(b, name), getattr(a, name))


@pytest.mark.parametrize("share", [False, True])
def test_update_with_the_fused_head_equals_the_materialised_update(tiny, share) -> None:
    """``update_step`` (eppo+papo, 2 epochs x 2 mini-batches, micro-batches of 3) with
    ``ppo.fused_head`` on vs off: every metric equal to 1e-5."""
    batch = _batch_for_update(tiny)
    runs = []
    for fused in (False, True):
        model = copy.deepcopy(tiny)
        cfg = load_config(None, ["tasks=a,b", "algo=eppo+papo", "rollout.max_episode_tokens=64",
                                 "rollout.temperature=1.0", "ppo.epochs=2", "ppo.num_minibatches=2",
                                 "ppo.micro_batch_size=3", "optim.lr=1e-3",
                                 "algorithm.entropy_coef=0.01",
                                 f"ppo.share_prefix={str(share).lower()}",
                                 f"ppo.fused_head={str(fused).lower()}"],
                          check_envs=False)  # fmt: skip
        learner = build_learner(cfg, model)
        metrics = update_step(learner, batch, generator=torch.Generator().manual_seed(0))
        params = torch.cat([p.detach().flatten() for p in model.parameters()])
        runs.append((metrics, params))
    (m_ref, p_ref), (m_got, p_got) = runs
    assert m_ref.keys() == m_got.keys()
    assert m_ref["update/zero_advantage"] == 0.0 and m_ref["optimizer_steps"] == 4
    for key, value in m_ref.items():
        assert m_got[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    torch.testing.assert_close(p_got, p_ref, rtol=1e-3, atol=1e-4)


def test_rollout_statistics_with_the_fused_head_equal_the_materialised_ones(
    tiny_model_and_tokenizer,
) -> None:
    """``collect_rollouts`` with ``rollout.fused_head`` on vs off: the same samples and the
    same old log-probs, entropies and sensitivities (the statistics are computed after
    generation, so the samples are identical)."""
    from entropace.envs.toy import LetterEnv
    from entropace.rollout import RolloutConfig, collect_rollouts

    model, tok = tiny_model_and_tokenizer
    out = []
    for fused in (False, True):
        cfg = RolloutConfig(max_turns=2, max_new_tokens_per_turn=6, max_episode_tokens=256,
                            micro_batch_size=3, fused_head=fused)  # fmt: skip
        reqs = [("toy", LetterEnv, s, g) for g, s in ((0, 1), (0, 1), (1, 2), (1, 2), (2, 3))]
        out.append(collect_rollouts(model, tok, reqs, cfg=cfg, seed=11).batch)
    a, b = out
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
    for name in ("old_logprobs", "entropy", "sensitivity"):
        _close(getattr(b, name), getattr(a, name), name)


@pytest.mark.slow
def test_smollm2_fused_head_equals_the_materialised_head_for_one_micro_batch() -> None:
    """SmolLM2-135M (tied embedding head, V = 49,152), one group of three in one micro-batch
    with shared prefixes on both sides: the loss columns and every gradient agree."""
    from entropace.models import load_model

    torch.manual_seed(0)
    model, _ = load_model("smollm2-135m")
    model.train()
    assert fused_head_parts(model) is not None
    ids, attn, loss_mask, groups = multi_turn_batch(model.config.vocab_size, seed=4)
    keep = torch.tensor([0, 1, 2])
    ids, attn, loss_mask, groups = ids[keep], attn[keep], loss_mask[keep], groups[keep]
    ref, ref_grads, _ = _stats_and_grads(model, ids, attn, loss_mask, groups=groups, micro=None,
                                         fused=False, temperature=1.0)  # fmt: skip
    got, got_grads, calls = _stats_and_grads(model, ids, attn, loss_mask, groups=groups,
                                             micro=None, fused=True, temperature=1.0)  # fmt: skip
    assert not calls
    cols = loss_mask.bool()
    for name in NAMES:
        a, b = getattr(ref, name).detach(), getattr(got, name).detach()
        assert float(b[cols].sum()) == pytest.approx(float(a[cols].sum()), rel=1e-5)
        _close(b[cols], a[cols], name)
    flat_ref = torch.cat([g.flatten() for g in ref_grads.values()])
    flat_got = torch.cat([got_grads[n].flatten() for n in ref_grads])
    rel = float((flat_got - flat_ref).norm() / flat_ref.norm())
    print(f"smollm2 gradient relative difference, fused vs materialised head: {rel:.2e}")
    assert rel < 1e-5
