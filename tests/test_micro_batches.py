"""Micro-batch planning (``entropace.train.micro_batches``, ``ppo.micro_batch_tokens``).

- The cost model, by hand, and against the positions the model's forward really runs
  (embedding-layer hook) in the shared-prefix path, where a short group next to a long one runs
  only to its own longest row.
- :func:`token_micro_batches` is a partition within the caps (random cases), keeps a group in one
  micro-batch whenever it fits in one, and gives a too-long row a micro-batch of its own.
- :func:`update_step` with a token cap equals the update without it (loss, metrics, weights).
"""

from __future__ import annotations

import copy
import random

import pytest
import torch
from tests.test_prefix_stats import _batch_for_update

from entropace.rollout import sequence_token_stats
from entropace.train.config import ConfigError, load_config
from entropace.train.learner import MiniBatch, plan_micro_batches
from entropace.train.micro_batches import (
    micro_batch_cost,
    shared_prefix_lengths,
    token_micro_batches,
)
from entropace.train.trainer import build_learner
from entropace.train.update import update_step


@pytest.fixture(scope="module")
def tiny():
    from entropace.models.tiny import build_tiny_model

    model, _ = build_tiny_model(seed=0)
    return model


def test_cost_by_hand() -> None:
    # rows 0,1: group 0, prefix 100, lengths 150 and 130; row 2: group 1 alone, length 40
    lengths, groups, prefixes = [150, 130, 40], [0, 0, 1], [100, 100, 0]
    assert micro_batch_cost([0, 1], lengths, groups, prefixes, share=True) == 100 + 2 * 50
    assert micro_batch_cost([0, 1, 2], lengths, groups, prefixes, share=True) == 200 + 40
    assert micro_batch_cost([0, 1, 2], lengths, groups, prefixes, share=False) == 3 * 150
    assert micro_batch_cost([1], lengths, groups, prefixes, share=True) == 130  # alone: no share
    assert micro_batch_cost([], lengths, groups, prefixes, share=True) == 0


def test_shared_prefix_lengths() -> None:
    ids = torch.tensor([[5, 6, 7, 8, 0], [5, 6, 7, 9, 9], [5, 6, 1, 0, 0], [3, 3, 3, 3, 3]])
    attn = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    groups = torch.tensor([0, 0, 0, 1])
    assert shared_prefix_lengths(ids, attn, groups).tolist() == [2, 2, 2, 0]
    assert shared_prefix_lengths(ids, attn, torch.tensor([0, 0, 1, 2])).tolist() == [3, 3, 0, 0]


def test_the_cost_is_what_the_forward_runs(tiny) -> None:
    """Positions through the embedding layer == micro_batch_cost, for a micro-batch holding
    a long group and a short one (the short one is not padded to the long one's length)."""
    batch = _batch_for_update(tiny)
    ids, attn, groups = batch.input_ids, batch.attention_mask, batch.group_ids
    lengths = attn.sum(1)
    prefixes = shared_prefix_lengths(ids, attn, groups)
    seen: list[int] = []
    hook = tiny.get_input_embeddings().register_forward_hook(
        lambda m, inp, out: seen.append(inp[0].numel())
    )
    try:
        for rows in ([0, 1, 2], [0, 1, 2, 5], [3, 4, 6, 7], [5], list(range(8))):
            index = torch.tensor(rows)
            used = int(attn[index].sum(1).max())
            seen.clear()
            with torch.no_grad():
                sequence_token_stats(
                    tiny, ids[index, :used], attn[index, :used], temperature=1.0,
                    loss_mask=batch.loss_mask[index, :used], groups=groups[index], fused_head=True,
                )  # fmt: skip
            want = micro_batch_cost(
                rows, lengths.tolist(), groups.tolist(), prefixes.tolist(), share=True
            )
            assert sum(seen) == want, rows
    finally:
        hook.remove()
    assert len(set(lengths.tolist())) > 2  # uneven rows: the padding rule is exercised


def _check_partition(chunks, n, groups, lengths, prefixes, max_rows, max_tokens, share) -> None:
    flat = sorted(r for c in chunks for r in c.tolist())
    assert flat == list(range(n))
    for c in chunks:
        rows = c.tolist()
        assert len(rows) <= max_rows
        cost = micro_batch_cost(rows, lengths, groups, prefixes, share=share)
        assert cost <= max_tokens or len(rows) == 1
    for g in set(groups):  # a group that fits in one micro-batch is never split
        mates = [r for r in range(n) if groups[r] == g]
        fits = len(mates) <= max_rows and (
            micro_batch_cost(mates, lengths, groups, prefixes, share=share) <= max_tokens
        )
        holders = [c for c in chunks if set(c.tolist()) & set(mates)]
        if fits:
            assert len(holders) == 1, (g, mates, [c.tolist() for c in chunks])


@pytest.mark.parametrize("share", [True, False])
def test_token_micro_batches_partition_within_the_caps(share: bool) -> None:
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 24)
        groups = sorted(rng.randrange(max(1, n // 3)) for _ in range(n))
        rng.shuffle(groups)
        base = {g: rng.randint(5, 400) for g in set(groups)}
        lengths = [base[g] + rng.randint(1, 200) for g in groups]
        prefixes = [0] * n
        for g in set(groups):
            mates = [r for r in range(n) if groups[r] == g]
            for r in mates:
                prefixes[r] = base[g] if len(mates) > 1 else 0
        max_rows, max_tokens = rng.randint(1, 8), rng.randint(50, 2000)
        chunks = token_micro_batches(
            torch.tensor(groups), torch.tensor(lengths), torch.tensor(prefixes),
            max_rows=max_rows, max_tokens=max_tokens, share=share,
        )  # fmt: skip
        _check_partition(chunks, n, groups, lengths, prefixes, max_rows, max_tokens, share)


def test_a_row_longer_than_the_cap_runs_alone() -> None:
    chunks = token_micro_batches(
        torch.tensor([0, 0, 1]), torch.tensor([900, 100, 50]), torch.tensor([40, 40, 0]),
        max_rows=4, max_tokens=500, share=True,
    )  # fmt: skip
    assert [c.tolist() for c in chunks] == [[0], [1, 2]]
    with pytest.raises(ValueError, match="max_tokens"):
        token_micro_batches(
            torch.tensor([0]), torch.tensor([3]), torch.tensor([0]), max_rows=1, max_tokens=0,
            share=True,
        )  # fmt: skip


def test_a_group_that_fits_starts_a_new_micro_batch() -> None:
    # group 0 (2 rows, prefix 300, +20 each) fills 340 of 500; group 1 (prefix 200, 2 x +50 =
    # 300) does not fit next to it but fits alone: it starts a new micro-batch, unsplit
    chunks = token_micro_batches(
        torch.tensor([0, 0, 1, 1]), torch.tensor([320, 320, 250, 250]),
        torch.tensor([300, 300, 200, 200]), max_rows=8, max_tokens=500, share=True,
    )  # fmt: skip
    assert [c.tolist() for c in chunks] == [[0, 1], [2, 3]]


def test_plan_uses_the_token_cap(tiny) -> None:
    batch = _batch_for_update(tiny)
    mb = MiniBatch(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask,
        loss_mask=batch.loss_mask, old_logprobs=batch.old_logprobs,
        advantages=batch.loss_mask, eps_low=torch.zeros(8, 1), eps_high=torch.zeros(8, 1),
        task_ids=batch.task_ids, group_ids=batch.group_ids,
    )  # fmt: skip
    lengths = batch.attention_mask.sum(1).tolist()
    prefixes = shared_prefix_lengths(batch.input_ids, batch.attention_mask, batch.group_ids)
    for cap in (None, 1, 60, 120):
        overrides = ["tasks=a,b", "ppo.micro_batch_size=4"]
        if cap is not None:
            overrides.append(f"ppo.micro_batch_tokens={cap}")
        cfg = load_config(None, overrides, check_envs=False)
        chunks = plan_micro_batches(mb, cfg)
        if cap is None:
            assert all(len(c) <= 4 for c in chunks)
            continue
        _check_partition(
            chunks, 8, batch.group_ids.tolist(), lengths, prefixes.tolist(), 4, cap, True
        )
        if cap == 1:
            assert len(chunks) == 8


def test_update_with_a_token_cap_equals_the_update_without(tiny) -> None:
    batch = _batch_for_update(tiny)
    runs = []
    for cap in (None, 40):
        model = copy.deepcopy(tiny)
        overrides = ["tasks=a,b", "algo=eppo+papo", "rollout.max_episode_tokens=64",
                     "ppo.epochs=2", "ppo.num_minibatches=2", "ppo.micro_batch_size=4",
                     "optim.lr=1e-3"]  # fmt: skip
        if cap is not None:
            overrides.append(f"ppo.micro_batch_tokens={cap}")
        learner = build_learner(load_config(None, overrides, check_envs=False), model)
        metrics = update_step(learner, batch, generator=torch.Generator().manual_seed(0))
        runs.append((metrics, torch.cat([p.detach().flatten() for p in model.parameters()])))
    (m_a, p_a), (m_b, p_b) = runs
    assert m_a.keys() == m_b.keys()
    for key, value in m_a.items():
        assert m_b[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    torch.testing.assert_close(p_b, p_a, rtol=1e-3, atol=1e-4)


def test_a_bad_token_cap_is_refused_when_the_config_loads() -> None:
    with pytest.raises(ConfigError, match="micro_batch_tokens"):
        load_config(None, ["tasks=a,b", "ppo.micro_batch_tokens=0"], check_envs=False)
