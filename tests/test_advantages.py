"""Advantages: vectorised functions against pure-Python loop references and hand values."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from entropace.algos import (
    dr_grpo_advantages,
    grpo_advantages,
    rloo_advantages,
    task_normalize_advantages,
)


def _groups(rewards: list[float], ids: list[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i, g in enumerate(ids):
        out.setdefault(g, []).append(i)
    return out


def ref_grpo(rewards: list[float], ids: list[int], eps: float = 1e-6) -> list[float]:
    adv = [0.0] * len(rewards)
    for members in _groups(rewards, ids).values():
        vals = [rewards[i] for i in members]
        if len(vals) < 2 or len(set(vals)) == 1:
            continue
        mean, std = statistics.fmean(vals), statistics.stdev(vals)  # stdev: unbiased (n - 1)
        for i in members:
            adv[i] = (rewards[i] - mean) / (std + eps)
    return adv


def ref_dr_grpo(rewards: list[float], ids: list[int]) -> list[float]:
    adv = [0.0] * len(rewards)
    for members in _groups(rewards, ids).values():
        vals = [rewards[i] for i in members]
        if len(set(vals)) == 1:
            continue
        for i in members:
            adv[i] = rewards[i] - statistics.fmean(vals)
    return adv


def ref_rloo(rewards: list[float], ids: list[int]) -> list[float]:
    adv = [0.0] * len(rewards)
    for members in _groups(rewards, ids).values():
        if len(members) < 2:
            continue
        for i in members:
            others = [rewards[j] for j in members if j != i]
            adv[i] = rewards[i] - sum(others) / len(others)
    return adv


def _random_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-contiguous arbitrary ids, singleton groups, an all-equal group, binary and real rewards."""
    g = torch.Generator().manual_seed(seed)
    id_values = torch.tensor([-7, 3, 1000, 42, 5, 2**40, 0])
    ids = id_values[torch.randint(0, len(id_values), (40,), generator=g)]
    ids = torch.cat([ids, torch.tensor([777, 778])])  # two singletons
    rewards = torch.randn(len(ids), generator=g, dtype=torch.float64)
    rewards[ids == 42] = 0.1  # all equal (0.1 is not exact in binary: mean != 0.1 in general)
    rewards[ids == 3] = torch.randint(0, 2, (int((ids == 3).sum()),), generator=g).double()
    perm = torch.randperm(len(ids), generator=g)
    return rewards[perm], ids[perm]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    ("fn", "ref"),
    [(grpo_advantages, ref_grpo), (dr_grpo_advantages, ref_dr_grpo), (rloo_advantages, ref_rloo)],
)
def test_matches_loop_reference(fn, ref, seed: int) -> None:
    rewards, ids = _random_batch(seed)
    got = fn(rewards, ids)
    expected = torch.tensor(ref(rewards.tolist(), ids.tolist()), dtype=torch.float64)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
    # singletons and the all-equal group are exactly zero
    assert (got[(ids == 777) | (ids == 778) | (ids == 42)] == 0).all()


def test_grpo_hand_values_unbiased_std() -> None:
    # group {1, 0, 1, 0}: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735...
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    adv = grpo_advantages(rewards, torch.tensor([5, 5, 5, 5]))
    std = math.sqrt(1.0 / 3.0)
    expected = torch.tensor([0.5, -0.5, 0.5, -0.5]) / (std + 1e-6)
    torch.testing.assert_close(adv, expected)
    assert abs(float(adv[0]) - 0.866025) < 1e-5


def test_rloo_and_dr_grpo_hand_values() -> None:
    rewards = torch.tensor([1.0, 2.0, 3.0, 6.0, 4.0])
    ids = torch.tensor([0, 0, 0, 0, 9])
    # R_0 - mean(2, 3, 6) = 1 - 11/3
    torch.testing.assert_close(
        rloo_advantages(rewards, ids), torch.tensor([-8 / 3, -4 / 3, 0.0, 4.0, 0.0])
    )
    torch.testing.assert_close(
        dr_grpo_advantages(rewards, ids), torch.tensor([-2.0, -1.0, 0.0, 3.0, 0.0])
    )


def test_integer_rewards_and_permutation_equivariance() -> None:
    rewards, ids = _random_batch(3)
    perm = torch.randperm(len(ids), generator=torch.Generator().manual_seed(9))
    for fn in (grpo_advantages, dr_grpo_advantages, rloo_advantages):
        torch.testing.assert_close(fn(rewards, ids)[perm], fn(rewards[perm], ids[perm]))
    out = grpo_advantages(torch.tensor([1, 0, 0, 1]), torch.tensor([0, 0, 1, 1]))
    assert out.dtype == torch.float32
    assert out[0] > 0 > out[1] and out[3] > 0 > out[2]


@pytest.mark.parametrize("fn", [grpo_advantages, dr_grpo_advantages, rloo_advantages])
def test_errors(fn) -> None:
    ids = torch.tensor([0, 0, 1])
    with pytest.raises(ValueError, match="NaN or inf"):
        fn(torch.tensor([1.0, float("nan"), 0.0]), ids)
    with pytest.raises(ValueError, match="NaN or inf"):
        fn(torch.tensor([1.0, float("inf"), 0.0]), ids)
    with pytest.raises(TypeError, match="integer"):
        fn(torch.tensor([1.0, 0.0, 0.0]), ids.float())
    with pytest.raises(ValueError, match="shape"):
        fn(torch.tensor([1.0, 0.0]), ids)
    with pytest.raises(ValueError, match="1-D"):
        fn(torch.zeros(3, 2), ids)


def ref_task_normalize(adv: list[list[float]], mask: list[list[int]], tasks: list[int]):
    out = [[0.0] * len(row) for row in adv]
    for k in set(tasks):
        cells = [(i, t) for i in range(len(adv)) if tasks[i] == k for t in range(len(adv[i]))]
        cells = [(i, t) for i, t in cells if mask[i][t]]
        vals = [adv[i][t] for i, t in cells]
        if len(vals) < 2 or len(set(vals)) == 1:
            continue
        mean, std = statistics.fmean(vals), statistics.stdev(vals)
        for i, t in cells:
            out[i][t] = (adv[i][t] - mean) / (std + 1e-6)
    return out


def test_task_normalize_matches_loop_and_standardises() -> None:
    g = torch.Generator().manual_seed(0)
    B, T = 12, 9
    adv = torch.randn(B, T, generator=g, dtype=torch.float64) * 3 + 1
    mask = (torch.rand(B, T, generator=g) > 0.3).long()
    tasks = torch.tensor([4, 4, 2, 9, 2, 4, 9, 9, 2, 4, 11, 11])
    adv[tasks == 11] = 0.5  # a task whose tokens all carry the same advantage -> 0
    got = task_normalize_advantages(adv, mask, tasks)
    expected = torch.tensor(
        ref_task_normalize(adv.tolist(), mask.tolist(), tasks.tolist()), dtype=torch.float64
    )
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
    assert (got[mask == 0] == 0).all() and (got[tasks == 11] == 0).all()
    for k in (2, 4, 9):  # each task: token mean 0, unbiased std ~1 after normalisation
        vals = got[(tasks == k)[:, None].expand(B, T) & mask.bool()]
        assert abs(float(vals.mean())) < 1e-12
        assert abs(float(vals.std()) - 1.0) < 1e-5


def test_task_normalize_broadcast_and_errors() -> None:
    adv = torch.tensor([1.0, -1.0, 3.0])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    tasks = torch.tensor([0, 0, 1])
    torch.testing.assert_close(
        task_normalize_advantages(adv, mask, tasks),
        task_normalize_advantages(adv[:, None].expand(3, 3), mask, tasks),
    )
    # task 0 tokens: {1, 1, -1}: mean 1/3, unbiased std sqrt(((2/3)^2 * 2 + (4/3)^2) / 2)
    std = math.sqrt((2 * (2 / 3) ** 2 + (4 / 3) ** 2) / 2)
    out = task_normalize_advantages(adv, mask, tasks)
    torch.testing.assert_close(out[0, 0], torch.tensor((2 / 3) / (std + 1e-6)))
    assert (out[2] == 0).all()  # task 1: all-equal advantages
    with pytest.raises(ValueError, match="NaN or inf"):
        task_normalize_advantages(torch.tensor([float("nan"), 0.0, 0.0]), mask, tasks)
    with pytest.raises(ValueError, match="task_ids"):
        task_normalize_advantages(adv, mask, torch.tensor([0, 1]))
    with pytest.raises(TypeError, match="integer"):
        task_normalize_advantages(adv, mask, tasks.float())
    # NaN on an unmasked token is ignored
    adv_t = adv[:, None].expand(3, 3).clone()
    adv_t[0, 2] = float("nan")
    torch.testing.assert_close(task_normalize_advantages(adv_t, mask, tasks), out)
