"""DAPO dynamic sampling and soft overlong penalty: loop reference and hand values."""

from __future__ import annotations

import pytest
import torch

from entropace.algos import dynamic_sampling_mask, overlong_penalty


def test_dynamic_sampling_matches_loop() -> None:
    g = torch.Generator().manual_seed(0)
    ids = torch.tensor([9, -3, 9, 500, -3, 500, 7, 9, 500, 12, 12, 9])
    rewards = torch.randint(0, 2, (len(ids),), generator=g).float()
    rewards[ids == 12] = torch.tensor([0.3, 0.3])  # all equal
    rewards[ids == 500] = torch.tensor([0.0, 1.0, 0.0])  # mixed
    got = dynamic_sampling_mask(rewards, ids)
    expected = [
        len({float(rewards[j]) for j in range(len(ids)) if ids[j] == ids[i]}) > 1
        for i in range(len(ids))
    ]
    assert got.dtype == torch.bool and got.tolist() == expected
    assert not got[ids == 7].any()  # singleton dropped
    assert not got[ids == 12].any() and got[ids == 500].all()


def test_dynamic_sampling_errors() -> None:
    with pytest.raises(ValueError, match="NaN or inf"):
        dynamic_sampling_mask(torch.tensor([0.0, float("nan")]), torch.tensor([0, 0]))
    with pytest.raises(TypeError, match="integer"):
        dynamic_sampling_mask(torch.tensor([0.0, 1.0]), torch.tensor([0.0, 0.0]))


def test_overlong_penalty_hand_values() -> None:
    # max_len 20, cache 5: free up to 15, then -1/5 per token, -1 beyond 20
    lengths = torch.tensor([0, 10, 15, 16, 18, 20, 21, 1000])
    got = overlong_penalty(lengths, max_len=20, cache_len=5)
    expected = torch.tensor([0.0, 0.0, 0.0, -0.2, -0.6, -1.0, -1.0, -1.0])
    torch.testing.assert_close(got, expected)
    assert got.dtype == torch.float32
    # cache_len == max_len: the ramp starts at 0
    torch.testing.assert_close(
        overlong_penalty(torch.tensor([0, 2, 4]), max_len=4, cache_len=4),
        torch.tensor([0.0, -0.5, -1.0]),
    )


def test_overlong_penalty_errors() -> None:
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(torch.tensor([1]), max_len=10, cache_len=0)
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(torch.tensor([1]), max_len=10, cache_len=11)
    with pytest.raises(ValueError, match=">= 0"):
        overlong_penalty(torch.tensor([-1]), max_len=10, cache_len=2)
    with pytest.raises(ValueError, match="1-D"):
        overlong_penalty(torch.tensor([[1]]), max_len=10, cache_len=2)
