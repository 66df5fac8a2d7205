"""token_stats against a float64 full-softmax reference, gradients, chunking and errors."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from entropace.algos.token_stats import TokenStats, default_chunk_size, token_stats


def naive_stats(logits: Tensor, tokens: Tensor, temperature: float = 1.0) -> dict[str, Tensor]:
    """Float64 full-vocabulary reference, written straight from the formulas (p log p = 0 at p = 0).

    Differentiable (masked_fill, not where, so that -inf entries give zero, not NaN, gradients).
    """
    x = logits.to(torch.float64) / temperature
    logp = torch.log_softmax(x, dim=-1)
    p = logp.exp()
    logp0 = logp.masked_fill(p == 0, 0.0)
    entropy = -(p * logp0).sum(-1)
    idx = tokens.unsqueeze(-1)
    logprob = logp.gather(-1, idx).squeeze(-1)
    p_y = p.gather(-1, idx).squeeze(-1)
    t1 = p_y * (entropy + logprob.masked_fill(p_y == 0, 0.0))
    t2 = (p * p * (entropy.unsqueeze(-1) + logp0)).sum(-1)
    return {"logprob": logprob, "entropy": entropy, "t1": t1, "t2": t2}


def extreme_logits(n: int, vocab: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """Random logits with +1e4 / -1e4 entries, masked (-inf) vocabulary and a -inf sampled token."""
    z = 3.0 * torch.randn(n, vocab, generator=gen)
    y = torch.randint(vocab, (n,), generator=gen)
    z[0, 5] = 1e4  # one-hot row
    y[0] = 5
    z[1, 7] = 1e4  # sampled token is not the dominant one: log p_y ~ -1e4
    y[1] = 3
    z[2, :] = -1e4  # every entry but one at -1e4
    z[2, 11] = 0.0
    z[3, vocab // 2 :] = float("-inf")  # masked half of the vocabulary
    y[3] = 1
    z[4, : vocab - 4] = float("-inf")  # only four tokens allowed, sampled one masked
    y[4] = 0
    return z, y


@pytest.mark.parametrize("vocab", [49_152, 151_936])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_float64_reference(vocab: int, dtype: torch.dtype, temperature: float) -> None:
    gen = torch.Generator().manual_seed(vocab + int(10 * temperature))
    z, y = extreme_logits(8, vocab, gen)
    z = z.to(dtype)
    ref = naive_stats(z, y, temperature)  # reference sees exactly the (rounded) input values
    got = token_stats(z, y, temperature=temperature, chunk_size=3)
    assert got.logprob.dtype == torch.float32
    # float32 arithmetic: log p of the -1e4 entries has ulp ~1e-3, hence relative tolerances;
    # the entropy tolerance also guards the normaliser's precision (torch's fused softmax kernel
    # is off by ~7e-5 in H at V = 151,936 on CPU)
    torch.testing.assert_close(got.logprob.double(), ref["logprob"], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got.entropy.double(), ref["entropy"], rtol=1e-6, atol=5e-6)
    torch.testing.assert_close(got.t1.double(), ref["t1"], rtol=5e-6, atol=1e-9)
    torch.testing.assert_close(got.t2.double(), ref["t2"], rtol=5e-6, atol=1e-7)
    sens_ref = ref["t2"] - ref["t1"]
    torch.testing.assert_close(got.sensitivity.double(), sens_ref, rtol=5e-6, atol=1e-7)
    # the documented conventions at the extremes
    assert got.logprob[4] == float("-inf") and got.t1[4] == 0.0
    assert torch.isfinite(got.entropy).all() and torch.isfinite(got.t2).all()
    assert got.entropy[0] == 0.0 and got.logprob[0] == 0.0


def test_hand_computed_two_token_distribution() -> None:
    # p = (3/4, 1/4): H = -(3/4 log 3/4 + 1/4 log 1/4); y = 0
    z = torch.tensor([[math.log(3.0), 0.0]], dtype=torch.float64)
    got = token_stats(z, torch.tensor([0]))
    p0, p1 = 0.75, 0.25
    lp0, lp1 = math.log(p0), math.log(p1)
    h = -(p0 * lp0 + p1 * lp1)
    t1 = p0 * (h + lp0)
    t2 = p0**2 * (h + lp0) + p1**2 * (h + lp1)
    assert got.entropy.item() == pytest.approx(h, rel=1e-12)
    assert got.logprob.item() == pytest.approx(lp0, rel=1e-12)
    assert got.t1.item() == pytest.approx(t1, rel=1e-12)
    assert got.t2.item() == pytest.approx(t2, rel=1e-12)
    assert got.sensitivity.item() == pytest.approx(t2 - t1, rel=1e-12)
    # uniform distribution: S = 0 exactly (no first-order entropy change)
    flat = token_stats(torch.zeros(1, 16, dtype=torch.float64), torch.tensor([3]))
    assert flat.entropy.item() == pytest.approx(math.log(16.0), rel=1e-14)
    assert abs(flat.sensitivity.item()) < 1e-15


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_chunk_size_does_not_change_result(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    z, y = extreme_logits(7, 1000, gen)
    z = z.to(dtype)  # +-1e4 and -inf are representable in all three
    results = [token_stats(z, y, chunk_size=c, temperature=0.9) for c in (1, 3, 7, 64, None)]
    for other in results[1:]:
        for field in ("logprob", "entropy", "t1", "t2"):
            torch.testing.assert_close(
                getattr(other, field), getattr(results[0], field), rtol=0, atol=0
            )


def test_batched_shape_equals_flattened_and_strided_view() -> None:
    gen = torch.Generator().manual_seed(2)
    full = torch.randn(3, 6, 257, generator=gen)
    tokens = torch.randint(257, (3, 5), generator=gen)
    strided = full[:, :-1]  # not viewable as [N, V] without a copy
    assert not strided.is_contiguous()
    flat = token_stats(strided.contiguous().reshape(15, 257), tokens.reshape(15), chunk_size=4)
    batched = token_stats(strided, tokens, chunk_size=4)
    assert batched.entropy.shape == (3, 5)
    for field in ("logprob", "entropy", "t1", "t2"):
        torch.testing.assert_close(getattr(batched, field).reshape(15), getattr(flat, field))
    # gradients through the strided view land on the right rows of the base tensor
    base = full.clone().requires_grad_(True)
    token_stats(base[:, :-1], tokens, chunk_size=4).entropy.sum().backward()
    ref_base = full.clone().requires_grad_(True)
    naive_stats(ref_base[:, :-1], tokens)["entropy"].sum().backward()
    assert base.grad is not None and ref_base.grad is not None
    torch.testing.assert_close(base.grad, ref_base.grad.float(), rtol=1e-4, atol=1e-6)
    assert torch.all(base.grad[:, -1] == 0)


def test_gradcheck_float64_small_vocab() -> None:
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(2, 3, 9, generator=gen, dtype=torch.float64)
    z[0, 1, 4:6] = float("-inf")  # masked vocabulary (not at a sampled token)
    tokens = torch.tensor([[0, 1, 2], [8, 7, 6]])
    z.requires_grad_(True)

    def fn(logits: Tensor) -> tuple[Tensor, Tensor]:
        s = token_stats(logits, tokens, temperature=0.6, chunk_size=2)
        return s.logprob, s.entropy

    assert torch.autograd.gradcheck(fn, (z,), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_match_naive_autograd_large_vocab(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(4)
    z, y = extreme_logits(6, 49_152, gen)
    z = z.to(dtype)
    g_lp = torch.randn(6, generator=gen, dtype=torch.float64)
    g_h = torch.randn(6, generator=gen, dtype=torch.float64)
    leaf = z.clone().requires_grad_(True)
    s = token_stats(leaf, y, temperature=0.8)
    # row 4 has logprob -inf (masked sampled token): leave it out of the loss here; its gradient
    # is checked on its own in test_gradient_of_minus_inf_sampled_token_is_e_y_minus_p
    loss = (torch.where(torch.isinf(s.logprob), 0.0, s.logprob).double() * g_lp).sum() + (
        s.entropy.double() * g_h
    ).sum()
    loss.backward()
    ref_leaf = z.to(torch.float64).requires_grad_(True)
    r = naive_stats(ref_leaf, y, temperature=0.8)
    ref_loss = (torch.where(torch.isinf(r["logprob"]), 0.0, r["logprob"]) * g_lp).sum() + (
        r["entropy"] * g_h
    ).sum()
    ref_loss.backward()
    assert leaf.grad is not None and ref_leaf.grad is not None
    assert leaf.grad.dtype == dtype
    tol = {"rtol": 1e-4, "atol": 1e-7} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-5}
    torch.testing.assert_close(leaf.grad.double(), ref_leaf.grad, **tol)
    assert torch.isfinite(leaf.grad).all()
    assert not s.t1.requires_grad and not s.t2.requires_grad


def test_gradient_of_minus_inf_sampled_token_is_e_y_minus_p() -> None:
    z = torch.tensor([[0.5, float("-inf"), -0.3, 1.0]], dtype=torch.float64, requires_grad=True)
    s = token_stats(z, torch.tensor([1]), temperature=2.0)
    assert s.logprob.item() == float("-inf") and s.t1.item() == 0.0
    (grad,) = torch.autograd.grad(s.logprob.sum(), z)
    p = torch.softmax(z.detach() / 2.0, dim=-1)
    expected = (torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64) - p) / 2.0
    torch.testing.assert_close(grad, expected)


def test_double_backward_is_refused_not_silently_wrong() -> None:
    z = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    s = token_stats(z, torch.tensor([0, 1]))
    (grad,) = torch.autograd.grad(s.entropy.sum(), z, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|does not require grad"):
        grad.sum().backward()


def test_forward_never_allocates_a_full_batch_float32_copy() -> None:
    n, vocab, chunk = 64, 4096, 4
    z = torch.randn(n, vocab, dtype=torch.bfloat16)
    y = torch.randint(vocab, (n,))
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        token_stats(z, y, chunk_size=chunk)
    biggest = max(evt.cpu_memory_usage for evt in prof.events())
    full_fp32 = n * vocab * 4
    # work buffers: 3 x chunk x V float32 at once
    assert 0 < biggest <= 3 * chunk * vocab * 4 < full_fp32 / 4


def test_one_dim_and_empty_inputs() -> None:
    z = torch.randn(50, dtype=torch.float64)
    one = token_stats(z, torch.tensor(7))
    ref = naive_stats(z, torch.tensor(7))
    assert one.entropy.shape == ()
    torch.testing.assert_close(one.entropy, ref["entropy"])
    empty = token_stats(torch.randn(0, 3, 10), torch.zeros(0, 3, dtype=torch.long))
    assert isinstance(empty, TokenStats) and empty.entropy.shape == (0, 3)


def test_default_chunk_size_bounds_buffer_bytes() -> None:
    assert default_chunk_size(49_152) == 10  # 2 MiB float32 buffers on CPU
    assert default_chunk_size(49_152, "cuda") == 341  # 64 MiB on accelerators
    assert default_chunk_size(151_936) == 3
    assert default_chunk_size(10**9) == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [(float("nan"), "contain NaN"), (float("inf"), r"contain \+inf")],
)
def test_non_finite_logits_raise(value: float, message: str) -> None:
    z = torch.randn(4, 30)
    z[2, 5] = value
    with pytest.raises(ValueError, match=message):
        token_stats(z, torch.zeros(4, dtype=torch.long), chunk_size=3)


def test_all_masked_row_raises() -> None:
    z = torch.randn(2, 3, 30)
    z[1, 2] = float("-inf")
    with pytest.raises(ValueError, match=r"position \(1, 2\) are all -inf"):
        token_stats(z, torch.zeros(2, 3, dtype=torch.long))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tokens": torch.tensor([0, 30])}, r"token ids must lie in \[0, 30\)"),
        ({"tokens": torch.tensor([-1, 0])}, r"token ids must lie in \[0, 30\)"),
        ({"tokens": torch.tensor([0.0, 1.0])}, "integer tensor"),
        ({"tokens": torch.tensor([0, 1, 2])}, "must equal logits.shape"),
        ({"temperature": 0.0}, "temperature must be finite and > 0"),
        ({"temperature": -1.0}, "temperature must be finite and > 0"),
        ({"chunk_size": 0}, "chunk_size must be a positive int"),
        ({"logits": torch.zeros(2, 30, dtype=torch.long)}, "floating tensor"),
    ],
)
def test_bad_arguments_raise(kwargs: dict, message: str) -> None:
    args = {"logits": torch.randn(2, 30), "tokens": torch.tensor([0, 1])} | kwargs
    logits, tokens = args.pop("logits"), args.pop("tokens")
    with pytest.raises(ValueError, match=message):
        token_stats(logits, tokens, **args)
