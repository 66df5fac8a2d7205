"""Shared prompt prefixes in the statistics pass and the update (issue 12, section 2): a group's
common prefix runs once and its KV cache is expanded to the group; values, gradients and every
update metric equal the plain path (fp32, relative 1e-5)."""

from __future__ import annotations

import copy

import pytest
import torch

from entropace.rollout import RolloutBatch, sequence_token_stats
from entropace.train.config import load_config
from entropace.train.trainer import build_learner
from entropace.train.update import update_step

NAMES = ("logprob", "entropy", "t1", "t2")


@pytest.fixture(scope="module")
def tiny():
    from entropace.models.tiny import build_tiny_model

    model, _ = build_tiny_model(seed=0)
    return model


def multi_turn_batch(vocab: int, seed: int = 0):
    """8 right-padded trajectories in groups of 3, 2, 1 and 2 (one group split by the
    micro-batches below): each group shares a 14-token prompt, then two policy turns with an
    observation between them (a hole in the loss mask); lengths differ."""
    g = torch.Generator().manual_seed(seed)
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3])
    lengths = [40, 33, 37, 29, 40, 25, 31, 36]
    prompts = {k: torch.randint(4, vocab, (14,), generator=g) for k in range(4)}
    B, L = len(lengths), max(lengths)
    ids = torch.zeros(B, L, dtype=torch.long)
    attn = torch.zeros(B, L, dtype=torch.long)
    loss_mask = torch.zeros(B, L)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(4, vocab, (n,), generator=g)
        ids[i, :14] = prompts[int(groups[i])]
        attn[i, :n] = 1
        loss_mask[i, 14:n] = 1
        loss_mask[i, 20:24] = 0  # the observation between the two turns
    return ids, attn, loss_mask, groups


def _run(model, ids, attn, loss_mask, groups, micro):
    model.zero_grad(set_to_none=True)
    st = sequence_token_stats(model, ids, attn, temperature=0.7, loss_mask=loss_mask,
                              micro_batch_size=micro, grad=True, groups=groups)  # fmt: skip
    ((st.logprob * loss_mask).sum() + 0.5 * (st.entropy * loss_mask).sum()).backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return st, grads


@pytest.mark.parametrize("micro", [None, 3, 5])
@pytest.mark.parametrize("with_loss_mask", [True, False])
def test_shared_prefix_stats_equal_the_plain_path(tiny, micro, with_loss_mask) -> None:
    ids, attn, loss_mask, groups = multi_turn_batch(tiny.config.vocab_size)
    lm = loss_mask if with_loss_mask else None
    fed: list[int] = []
    hook = tiny.model.embed_tokens.register_forward_hook(lambda m, i, o: fed.append(i[0].numel()))
    try:
        results = []
        for g in (None, groups):
            fed.clear()
            model = tiny
            model.zero_grad(set_to_none=True)
            st = sequence_token_stats(model, ids, attn, temperature=0.7, loss_mask=lm,
                                      micro_batch_size=micro, grad=True, groups=g)  # fmt: skip
            ((st.logprob * loss_mask).sum() + 0.5 * (st.entropy * loss_mask).sum()).backward()
            grads = torch.cat([p.grad.flatten() for p in model.parameters()])
            results.append((st, grads, sum(fed)))
    finally:
        hook.remove()
    (plain, g_plain, n_plain), (shared, g_shared, n_shared) = results
    for name in NAMES:
        a, b = getattr(plain, name), getattr(shared, name)
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5 * float(a.abs().max()))
    torch.testing.assert_close(g_shared, g_plain, rtol=1e-5, atol=1e-5 * float(g_plain.abs().max()))
    assert n_shared < n_plain  # the prefixes really ran once per group and micro-batch


def test_rows_without_a_common_prefix_fall_back(tiny) -> None:
    ids, attn, loss_mask, _ = multi_turn_batch(tiny.config.vocab_size)
    left = torch.zeros_like(ids)  # left padding: the "prefix" is padding, nothing to share
    left_attn = torch.zeros_like(attn)
    for i in range(ids.shape[0]):
        n = int(attn[i].sum())
        left[i, -n:], left_attn[i, -n:] = ids[i, :n], 1
    groups = torch.zeros(ids.shape[0], dtype=torch.long)  # one group with different prompts
    a = sequence_token_stats(tiny, left, left_attn, temperature=0.7)
    b = sequence_token_stats(tiny, left, left_attn, temperature=0.7, groups=groups)
    torch.testing.assert_close(b.logprob, a.logprob, rtol=1e-5, atol=1e-5)


def _batch_for_update(model) -> RolloutBatch:
    ids, attn, loss_mask, groups = multi_turn_batch(model.config.vocab_size, seed=2)
    with torch.no_grad():
        st = sequence_token_stats(model, ids, attn, temperature=1.0, loss_mask=loss_mask)
    B = ids.shape[0]
    g = torch.Generator().manual_seed(3)
    return RolloutBatch(
        input_ids=ids, attention_mask=attn, loss_mask=loss_mask,
        old_logprobs=(st.logprob + 0.2 * torch.randn(st.logprob.shape, generator=g)) * loss_mask,
        entropy=st.entropy * loss_mask, sensitivity=st.sensitivity * loss_mask,
        rewards=torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 1.0, 0.0, 1.0]), group_ids=groups,
        task_ids=torch.tensor([0, 0, 0, 1, 1, 0, 1, 1]), task_names=["a", "b"],
        success=torch.tensor([True, False, False, True, False, True, False, True]),
        abnormal=torch.zeros(B, dtype=torch.bool), num_turns=torch.full((B,), 2),
    )  # fmt: skip


def test_update_with_shared_prefixes_equals_the_plain_update(tiny) -> None:
    batch = _batch_for_update(tiny)
    runs = []
    for share in (False, True):
        model = copy.deepcopy(tiny)
        cfg = load_config(None, ["tasks=a,b", "algo=eppo+papo", "rollout.max_episode_tokens=64",
                                 "rollout.temperature=1.0", "ppo.epochs=2", "ppo.num_minibatches=2",
                                 "ppo.micro_batch_size=3", "optim.lr=1e-3",
                                 f"ppo.share_prefix={str(share).lower()}"],
                          check_envs=False)  # fmt: skip
        learner = build_learner(cfg, model)
        metrics = update_step(learner, batch, generator=torch.Generator().manual_seed(0))
        params = torch.cat([p.detach().flatten() for p in model.parameters()])
        runs.append((metrics, params))
    (m_plain, p_plain), (m_shared, p_shared) = runs
    assert m_plain.keys() == m_shared.keys()
    for key, value in m_plain.items():
        assert m_shared[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    # Adam normalises near-zero gradients, so the weights are compared loosely (as the
    # micro-batching invariance test does); the pre-Adam loss and grad norm above are tight
    torch.testing.assert_close(p_shared, p_plain, rtol=1e-3, atol=1e-4)


@pytest.mark.slow
def test_smollm2_shared_prefix_equals_plain_for_one_micro_batch() -> None:
    from entropace.models import load_model

    torch.manual_seed(0)
    model, _ = load_model("smollm2-135m")
    model.train()
    ids, attn, loss_mask, groups = multi_turn_batch(model.config.vocab_size, seed=4)
    keep = torch.tensor([0, 1, 2])  # one group of three, one micro-batch
    ids, attn, loss_mask, groups = ids[keep], attn[keep], loss_mask[keep], groups[keep]
    a, ga = _run(model, ids, attn, loss_mask, None, None)
    b, gb = _run(model, ids, attn, loss_mask, groups, None)
    for name in NAMES:
        x, y = getattr(a, name).detach(), getattr(b, name).detach()
        # the loss-level sums to 1e-5; single tokens of a 30-layer fp32 model to 1e-4
        assert float((y * loss_mask).sum()) == pytest.approx(float((x * loss_mask).sum()), rel=1e-5)
        torch.testing.assert_close(y, x, rtol=1e-4, atol=1e-4 * float(x.abs().max()))
    # gradients: 30 fp32 layers (RMSNorm in fp32 whatever the dtype) where the tail's attention
    # over a cache runs another SDPA kernel than the causal full pass. Measured: 1.1e-5
    # relative (the plain path against itself with another micro-batching: 5e-7)
    shared = float((gb - ga).norm() / ga.norm())
    print(f"smollm2 gradient relative difference, shared vs plain: {shared:.2e}")
    assert shared < 3e-5


def test_group_micro_batches_partition_rows_and_keep_group_mates_together() -> None:
    from entropace.train.micro_batches import group_micro_batches

    ids = torch.tensor([2, 0, 1, 0, 0, 1, 3, 0, 2])
    for size in (1, 2, 3, 4, 9):
        chunks = [c.tolist() for c in group_micro_batches(ids, size)]
        flat = sorted(r for c in chunks for r in c)
        assert flat == list(range(len(ids))) and all(0 < len(c) <= size for c in chunks)
        for g in ids.unique().tolist():  # a group spans ceil(n_g / size) micro-batches
            n = int((ids == g).sum())
            spans = sum(any(int(ids[r]) == g for r in c) for c in chunks)
            assert spans == -(-n // size), (size, g, chunks)
    assert [c.tolist() for c in group_micro_batches(ids, 2)] == [
        [1, 3],
        [4, 7],
        [2, 5],
        [0, 8],
        [6],
    ]
