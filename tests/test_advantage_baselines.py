"""REINFORCE++ (with and without baseline), ReMax, OPO, GRPO pass@k, GPG: the vectorised
estimators against float64 loops written from their papers' formulas (as verl computes them:
``tests/integrations/test_verl_trust_regions.py`` checks equality with verl's functions), hand
values, and the registry's declared inputs and options."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from entropace.algos import ADVANTAGE_ESTIMATORS, get_advantage, register_advantage
from entropace.algos.advantage_baselines import masked_whiten


def _batch(seed: int, B: int = 15, T: int = 9):
    """Groups of 3 with arbitrary ids (one all-equal group), a singleton, masks with holes."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.tensor([5, 5, 5, -2, -2, -2, 40, 40, 40, 7, 7, 7, 2**33, 2**33, 99])
    rewards = torch.randint(0, 3, (B,), generator=g).double() / 2 + 0.1 * torch.randn(
        B, generator=g, dtype=torch.float64
    )
    rewards[6:9] = 0.5  # all equal
    mask = (torch.rand(B, T, generator=g) > 0.3).double()
    mask[:, 0] = 1.0
    return rewards, ids, mask


def _members(ids: torch.Tensor) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i, g in enumerate(ids.tolist()):
        out.setdefault(g, []).append(i)
    return out


def _whiten(values: dict[tuple[int, int], float], shape) -> torch.Tensor:
    n = len(values)
    mean = math.fsum(values.values()) / n
    var = math.fsum((v - mean) ** 2 for v in values.values()) / (n - 1)
    out = torch.zeros(shape, dtype=torch.float64)
    for (i, t), v in values.items():
        out[i, t] = (v - mean) / math.sqrt(var + 1e-8)
    return out


def ref_reinforce_pp(rewards, mask, gamma):
    """Returns by the reverse loop of REINFORCE++ (reward on the last masked token; unmasked
    tokens carry the running return through unchanged), whitened over the masked tokens."""
    B, T = mask.shape
    values = {}
    for i in range(B):
        last = max(t for t in range(T) if mask[i, t])
        running = 0.0
        for t in reversed(range(T)):
            r = float(rewards[i]) if t == last else 0.0
            if mask[i, t]:
                running = r + gamma * running
                values[(i, t)] = running
    return _whiten(values, mask.shape)


def ref_reinforce_pp_baseline(rewards, ids, mask):
    B, T = mask.shape
    score = {}
    for members in _members(ids).values():
        mean = statistics.fmean(float(rewards[j]) for j in members) if len(members) > 1 else 0.0
        for j in members:
            score[j] = float(rewards[j]) - mean
    values = {(i, t): score[i] for i in range(B) for t in range(T) if mask[i, t]}
    return _whiten(values, mask.shape)


def ref_opo(rewards, ids, mask):
    out = [0.0] * len(rewards)
    for members in _members(ids).values():
        lengths = [float(mask[j].sum()) for j in members]
        base = (
            sum(n * float(rewards[j]) for n, j in zip(lengths, members, strict=True)) / sum(lengths)
            if len(members) > 1
            else 0.0
        )
        for j in members:
            out[j] = float(rewards[j]) - base
    return torch.tensor(out, dtype=torch.float64)


def ref_passk(rewards, ids, norm_by_std, eps=1e-6):
    out = [0.0] * len(rewards)
    for members in _members(ids).values():
        vals = [float(rewards[j]) for j in members]
        order = sorted(range(len(vals)), key=lambda k: (-vals[k], k))
        gap = vals[order[0]] - vals[order[1]]
        if norm_by_std:
            gap /= statistics.stdev(vals) + eps
        out[members[order[0]]] = gap
    return torch.tensor(out, dtype=torch.float64)


def ref_gpg(rewards, ids):
    B = len(rewards)
    alpha = B / max(sum(1 for r in rewards.tolist() if r != 0), 1)
    out = [0.0] * B
    for members in _members(ids).values():
        mean = statistics.fmean(float(rewards[j]) for j in members) if len(members) > 1 else 0.0
        for j in members:
            out[j] = alpha * (float(rewards[j]) - mean)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("seed", [0, 1])
def test_estimators_equal_their_loops(seed: int) -> None:
    rewards, ids, mask = _batch(seed)
    ok = dict(rtol=1e-12, atol=1e-12)
    rpp = get_advantage("reinforce_plus_plus")
    for gamma in (1.0, 0.9, 0.0):
        got = rpp(rewards, ids, mask=mask, config=rpp.make_config({"gamma": gamma}))
        torch.testing.assert_close(got, ref_reinforce_pp(rewards, mask, gamma), **ok)
    got = get_advantage("reinforce_plus_plus_baseline")(rewards, ids, mask=mask)
    torch.testing.assert_close(got, ref_reinforce_pp_baseline(rewards, ids, mask), **ok)
    torch.testing.assert_close(get_advantage("opo")(rewards, ids, mask=mask),
                               ref_opo(rewards, ids, mask), **ok)  # fmt: skip
    pairs = ids != 99  # pass@k needs two responses per group
    passk = get_advantage("grpo_passk")
    for norm in (True, False):
        got = passk(rewards[pairs], ids[pairs], config=passk.make_config({"norm_by_std": norm}))
        torch.testing.assert_close(got, ref_passk(rewards[pairs], ids[pairs], norm), **ok)
    torch.testing.assert_close(get_advantage("gpg")(rewards, ids), ref_gpg(rewards, ids), **ok)
    base = torch.linspace(-1, 1, len(rewards), dtype=torch.float64)
    torch.testing.assert_close(get_advantage("remax")(rewards, ids, baselines=base),
                               rewards - base, **ok)  # fmt: skip


def test_hand_values() -> None:
    ids = torch.tensor([0, 0, 0, 0])
    r = torch.tensor([1.0, 0.0, 1.0, 0.5])
    # pass@k: a tie at the top gives 0 to everyone; a unique best gets r_max - r_second
    assert get_advantage("grpo_passk")(r, ids).tolist() == [0.0] * 4
    r2 = torch.tensor([0.0, 1.0, 0.25, 0.5])
    std = statistics.stdev([0.0, 1.0, 0.25, 0.5])
    assert get_advantage("grpo_passk")(r2, ids).tolist() == pytest.approx(
        [0, 0.5 / (std + 1e-6), 0, 0]
    )
    # OPO: lengths 1 and 3, rewards 1 and 0: baseline 1/4
    mask = torch.tensor([[1.0, 0, 0], [1, 1, 1]])
    opo = get_advantage("opo")(torch.tensor([1.0, 0.0]), torch.tensor([3, 3]), mask=mask)
    assert opo.tolist() == [0.75, -0.25]
    # GPG: 2 of 4 rewards non-zero: alpha = 2
    gpg = get_advantage("gpg")(torch.tensor([1.0, 0, 1, 0]), torch.tensor([0, 0, 1, 1]))
    assert gpg.tolist() == [1.0, -1.0, 1.0, -1.0]
    # REINFORCE++, gamma 0.5, one row of 3 masked tokens: returns 0.25, 0.5, 1 before whitening
    one = get_advantage("reinforce_plus_plus")
    got = one(torch.tensor([1.0]), torch.tensor([0]), mask=torch.ones(1, 3),
              config=one.make_config({"gamma": 0.5}))  # fmt: skip
    x = [0.25, 0.5, 1.0]
    m, s = statistics.fmean(x), statistics.stdev(x)
    assert got[0].tolist() == pytest.approx([(v - m) / math.sqrt(s * s + 1e-8) for v in x])


def test_reinforce_pp_is_whitened_over_the_masked_tokens() -> None:
    rewards, ids, mask = _batch(3)
    adv = get_advantage("reinforce_plus_plus_baseline")(rewards, ids, mask=mask).double()
    m = mask.bool()
    assert float(adv[m].mean()) == pytest.approx(0.0, abs=1e-12)
    assert float(adv[m].std()) == pytest.approx(1.0, abs=1e-6)
    assert (adv[~m] == 0).all()
    assert masked_whiten(torch.ones(2, 2), torch.tensor([[1.0, 0], [0, 0]])).abs().sum() == 0


def test_registry_declares_inputs_and_options() -> None:
    spec = ADVANTAGE_ESTIMATORS
    assert {"reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "opo",
            "grpo_passk", "gpg"} <= set(spec)  # fmt: skip
    assert spec["reinforce_plus_plus"].per_token and spec["reinforce_plus_plus"].needs == ("mask",)
    assert spec["remax"].needs == ("baselines",) and not spec["remax"].per_token
    assert spec["grpo"].needs == () and spec["grpo"].make_config().eps == 1e-6
    r, ids = torch.tensor([1.0, 0.0]), torch.tensor([0, 0])
    with pytest.raises(ValueError, match="'remax' needs baselines="):
        spec["remax"](r, ids)
    with pytest.raises(ValueError, match="'opo' needs mask="):
        spec["opo"](r, ids)
    with pytest.raises(ValueError, match=r"gamma must be a number in \[0, 1\]"):
        spec["reinforce_plus_plus"].make_config({"gamma": 1.5})
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['gamma'\]"):
        spec["grpo"].make_config({"gamma": 1.0})
    with pytest.raises(ValueError, match="at least 2 responses per group"):
        spec["grpo_passk"](torch.tensor([1.0, 0.0]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="NaN or inf"):
        spec["opo"](torch.tensor([1.0, math.nan]), ids, mask=torch.ones(2, 2))
    # the old call form still works, and a custom estimator registers with its needs
    assert spec["grpo"](torch.tensor([1.0, 0.0]), ids).tolist() == pytest.approx(
        [0.7071, -0.7071], abs=1e-3
    )

    @register_advantage("_test_len", needs=("mask",))
    def by_length(rewards, group_ids, *, mask):
        return mask.sum(-1)

    try:
        assert spec["_test_len"](r, ids, mask=torch.ones(2, 3)).tolist() == [3.0, 3.0]
        with pytest.raises(ValueError, match="already registered"):
            register_advantage("_test_len")(by_length)
    finally:
        del ADVANTAGE_ESTIMATORS["_test_len"]
    with pytest.raises(ValueError, match="unknown needs"):
        register_advantage("_bad", needs=("values",))
