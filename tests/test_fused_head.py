"""hidden_token_stats (fused LM head + token statistics) against token_stats on materialised
logits, a float64 brute force, finite differences, and a real (tiny, tied) transformers model."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from entropace.algos.fused_head import default_head_chunk_size, hidden_token_stats
from entropace.algos.token_stats import token_stats

FIELDS = ("logprob", "entropy", "t1", "t2")


def brute_force(
    hidden: Tensor, weight: Tensor, tokens: Tensor, bias: Tensor | None, temperature: float
) -> dict[str, Tensor]:
    """Float64, straight from the formulas on the full ``[N, V]`` logits (differentiable)."""
    z = hidden.double() @ weight.double().T
    if bias is not None:
        z = z + bias.double()
    logp = torch.log_softmax(z / temperature, dim=-1)
    p = logp.exp()
    entropy = -(p * logp).sum(-1)
    idx = tokens[..., None]
    logprob = logp.gather(-1, idx)[..., 0]
    p_y = p.gather(-1, idx)[..., 0]
    return {
        "logprob": logprob,
        "entropy": entropy,
        "t1": p_y * (entropy + logprob),
        "t2": (p * p * (entropy[..., None] + logp)).sum(-1),
    }


def make(
    n: int, d: int, vocab: int, *, seed: int, dtype: torch.dtype = torch.float32, scale: float = 1.0
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Hidden ``[n, d]``, weight ``[V, d]``, bias ``[V]`` (logits of std ~2*scale), tokens ``[n]``."""
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=gen)
    w = torch.randn(vocab, d, generator=gen) * (2.0 * scale / d**0.5)
    b = 0.5 * torch.randn(vocab, generator=gen)
    y = torch.randint(vocab, (n,), generator=gen)
    return h.to(dtype), w.to(dtype), b.to(dtype), y


def run_with_grads(
    fn: object,
    h: Tensor,
    w: Tensor,
    b: Tensor | None,
    g_l: Tensor,
    g_h: Tensor,
) -> tuple[dict[str, Tensor], list[Tensor | None]]:
    """Stats of ``fn(h, w, b)`` and the gradients of ``sum(g_l logprob + g_h entropy)``."""
    leaves = [h.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)]
    leaves.append(None if b is None else b.detach().clone().requires_grad_(True))
    stats = fn(*leaves)  # type: ignore[operator]
    ((g_l * stats["logprob"]).sum() + (g_h * stats["entropy"]).sum()).backward()
    values = {k: v.detach() for k, v in stats.items()}
    return values, [None if x is None else x.grad for x in leaves]


def fused(y: Tensor, temperature: float = 1.0, **kw: object) -> object:
    def fn(h: Tensor, w: Tensor, b: Tensor | None) -> dict[str, Tensor]:
        s = hidden_token_stats(h, w, y, bias=b, temperature=temperature, **kw)  # type: ignore[arg-type]
        return {k: getattr(s, k) for k in FIELDS}

    return fn


def materialised(y: Tensor, temperature: float = 1.0, upcast: bool = False) -> object:
    """The unfused path: logits = h W^T + b in full, then token_stats (``upcast``: in float32)."""

    def fn(h: Tensor, w: Tensor, b: Tensor | None) -> dict[str, Tensor]:
        if upcast:
            h, w, b = h.float(), w.float(), None if b is None else b.float()
        z = h @ w.T if b is None else torch.addmm(b, h, w.T)
        s = token_stats(z, y, temperature=temperature)
        return {k: getattr(s, k) for k in FIELDS}

    return fn


def assert_rel(got: Tensor, ref: Tensor, rtol: float, what: str) -> None:
    """``|got - ref| <= rtol * max|ref|`` elementwise (a scale-relative tolerance)."""
    got, ref = got.double(), ref.double()
    scale = ref.abs().max().clamp(min=1e-30)
    err = (got - ref).abs().max()
    assert err <= rtol * scale, f"{what}: max error {err:.3e} > {rtol:.1e} * {scale:.3e}"


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
@pytest.mark.parametrize("with_bias", [False, True])
def test_float32_matches_materialised_values_and_grads(temperature: float, with_bias: bool) -> None:
    h, w, b, y = make(29, 24, 700, seed=int(10 * temperature) + with_bias)
    b = b if with_bias else None
    gen = torch.Generator().manual_seed(1)
    g_l, g_h = torch.randn(29, generator=gen), torch.randn(29, generator=gen)
    # chunk 6 (29 = 4 * 6 + 5) and vocab block 128 (700 = 5 * 128 + 60): ragged last tiles
    got, got_g = run_with_grads(
        fused(y, temperature, chunk_size=6, vocab_block=128), h, w, b, g_l, g_h
    )
    ref, ref_g = run_with_grads(materialised(y, temperature), h, w, b, g_l, g_h)
    exact = brute_force(h, w, y, b, temperature)
    for k in FIELDS:
        assert got[k].dtype == torch.float32
        assert_rel(got[k], ref[k], 1e-5, k)
        assert_rel(got[k], exact[k], 1e-5, f"{k} vs float64")
    for name, g, r in zip(("hidden", "weight", "bias"), got_g, ref_g):
        if r is None:
            assert g is None
            continue
        assert g is not None and g.dtype == torch.float32
        assert_rel(g, r, 1e-5, f"grad {name}")


def test_float64_brute_force_and_finite_differences() -> None:
    h, w, b, y = make(7, 5, 11, seed=3, dtype=torch.float64, scale=2.0)
    got = hidden_token_stats(h, w, y, bias=b, temperature=0.8, chunk_size=3, vocab_block=4)
    exact = brute_force(h, w, y, b, 0.8)
    for k in FIELDS:
        assert getattr(got, k).dtype == torch.float64
        torch.testing.assert_close(getattr(got, k), exact[k], rtol=1e-12, atol=1e-14)

    def outputs(hh: Tensor, ww: Tensor, bb: Tensor) -> tuple[Tensor, Tensor]:
        s = hidden_token_stats(hh, ww, y, bias=bb, temperature=0.8, chunk_size=3, vocab_block=4)
        return s.logprob, s.entropy

    leaves = tuple(x.clone().requires_grad_(True) for x in (h, w, b))
    assert torch.autograd.gradcheck(outputs, leaves, eps=1e-6, atol=1e-8, rtol=1e-6)


def test_hand_derived_uniform_distribution() -> None:
    """Zero weight and bias: p uniform over V, so log p_y = -log V, H = log V, t1 = t2 = 0; the
    entropy gradient vanishes at its maximum and d logprob / dz = e_y - 1/V."""
    vocab, d = 8, 3
    h = torch.randn(4, d, dtype=torch.float64)
    w = torch.zeros(vocab, d, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(vocab, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 3, 3, 7])
    s = hidden_token_stats(h, w, y, bias=b, chunk_size=3, vocab_block=3)
    log_v = torch.log(torch.tensor(float(vocab), dtype=torch.float64))
    torch.testing.assert_close(s.logprob, -log_v.expand(4))
    torch.testing.assert_close(s.entropy, log_v.expand(4))
    torch.testing.assert_close(s.t1, torch.zeros(4, dtype=torch.float64), atol=1e-15, rtol=0)
    torch.testing.assert_close(s.t2, torch.zeros(4, dtype=torch.float64), atol=1e-15, rtol=0)
    (s.logprob.sum() + s.entropy.sum()).backward()
    counts = torch.bincount(y, minlength=vocab).double()
    torch.testing.assert_close(b.grad, counts - 4.0 / vocab)  # sum_n (e_{y_n} - 1/V)
    torch.testing.assert_close(
        w.grad, (torch.nn.functional.one_hot(y, vocab).double() - 1 / vocab).T @ h
    )


def test_bfloat16_equals_float32_products_and_is_within_rounding_of_plain_head() -> None:
    """bf16 inputs: the fused head forms float32 logits from the bf16 values, so it equals
    token_stats on ``h.float() @ w.float().T`` to float32 round-off (gradients to one bf16
    rounding). The plain bf16 head rounds each logit to bf16 (relative 2^-9), which moves every
    logit by at most ``delta = 2^-9 max|z| / T``: ``|d logprob| <= 2 delta`` and, to first
    order, ``|d H| <= delta * sum_v p_v |log p_v + H|`` (the L1 norm of dH/dz)."""
    n, d, vocab, temperature = 33, 64, 4096, 0.9
    h, w, b, y = make(n, d, vocab, seed=5, dtype=torch.bfloat16, scale=2.0)
    gen = torch.Generator().manual_seed(2)
    g_l, g_h = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    got, got_g = run_with_grads(
        fused(y, temperature, chunk_size=8, vocab_block=1000), h, w, None, g_l, g_h
    )
    up, up_g = run_with_grads(materialised(y, temperature, upcast=True), h, w, None, g_l, g_h)
    for k in FIELDS:
        assert got[k].dtype == torch.float32
        assert_rel(got[k], up[k], 1e-5, k)
    for name, g, r in zip(("hidden", "weight"), got_g, up_g):
        assert g is not None and r is not None and g.dtype == torch.bfloat16
        assert_rel(g, r, 2**-7, f"grad {name}")  # one bf16 rounding of float32 values
    plain, plain_g = run_with_grads(materialised(y, temperature), h, w, None, g_l, g_h)
    z = h.double() @ w.double().T
    delta = 2**-9 * float(z.abs().max()) / temperature
    assert (got["logprob"] - plain["logprob"]).abs().max() <= 2 * delta
    exact = brute_force(h, w, y, None, temperature)
    logp = torch.log_softmax(z / temperature, -1)
    l1 = (logp.exp() * (logp + exact["entropy"][:, None]).abs()).sum(-1)
    assert ((got["entropy"] - plain["entropy"]).abs() <= 1.5 * delta * l1.float()).all()
    # and the plain head is measurably worse than the fused one against the float64 truth
    assert (plain["logprob"] - exact["logprob"]).abs().max() > 10 * (
        got["logprob"] - exact["logprob"]
    ).abs().max()
    for g, r in zip(got_g[:2], plain_g[:2]):  # gradients: the same up to bf16 logit rounding
        assert g is not None and r is not None
        assert_rel(g, r, 0.05, "grad vs plain bf16 head")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("chunk", [8, 64])
def test_no_upcast_reproduces_plain_low_precision_head(dtype: torch.dtype, chunk: int) -> None:
    """``upcast=False``: matmuls in the input dtype, statistics of the rounded logits, as a
    plain ``lm_head`` + token_stats computes them. The values agree to float32 round-off (the
    matmul kernels round each logit the same way whatever the number of rows); the gradients to
    one rounding in the input dtype (the plain head rounds its ``[N, d]`` gradient once after a
    full-vocabulary matmul, the fused one per vocabulary block, then sums in float32)."""
    n, d, vocab, temperature = 33, 64, 4096, 0.9
    h, w, b, y = make(n, d, vocab, seed=7, dtype=dtype, scale=2.0)
    gen = torch.Generator().manual_seed(3)
    g_l, g_h = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    got, got_g = run_with_grads(
        fused(y, temperature, chunk_size=chunk, vocab_block=1000, upcast=False), h, w, b, g_l, g_h
    )
    ref, ref_g = run_with_grads(materialised(y, temperature), h, w, b, g_l, g_h)
    for k in FIELDS:
        assert_rel(got[k], ref[k], 1e-6, k)
    ulp = 2.0 ** -(7 if dtype == torch.bfloat16 else 10)
    for name, g, r in zip(("hidden", "weight", "bias"), got_g, ref_g):
        assert g is not None and r is not None and g.dtype == dtype
        assert_rel(g, r, ulp, f"grad {name}")


@pytest.mark.parametrize("vocab", [49_152, 151_936])
def test_real_vocab_sizes(vocab: int) -> None:
    h, w, b, y = make(5, 16, vocab, seed=vocab % 97, scale=3.0)
    got = hidden_token_stats(h, w, y, bias=b)  # default chunk sizes: a single chunk here
    ref = token_stats(torch.addmm(b, h, w.T), y)
    exact = brute_force(h, w, y, b, 1.0)
    for k in FIELDS:
        assert_rel(getattr(got, k), getattr(ref, k), 1e-5, k)
        assert_rel(getattr(got, k), exact[k], 1e-5, f"{k} vs float64")


def test_chunk_and_block_invariance() -> None:
    """Float64: every chunking (1 row, ragged, exactly N, beyond N) gives the same values and
    gradients, to float64 round-off."""
    n, vocab = 13, 50
    h, w, b, y = make(n, 6, vocab, seed=11, dtype=torch.float64)
    g_l, g_h = torch.randn(n, dtype=torch.float64), torch.randn(n, dtype=torch.float64)
    base, base_g = run_with_grads(fused(y, 1.3, chunk_size=n, vocab_block=vocab), h, w, b, g_l, g_h)
    for chunk, block in [(1, 1), (3, 7), (5, 50), (13, 9), (40, 64), (4, 17)]:
        got, got_g = run_with_grads(
            fused(y, 1.3, chunk_size=chunk, vocab_block=block), h, w, b, g_l, g_h
        )
        for k in FIELDS:
            torch.testing.assert_close(got[k], base[k], rtol=1e-12, atol=1e-14)
        for g, r in zip(got_g, base_g):
            torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-14)


def test_tied_embedding_head_gradients_add_up() -> None:
    """A tied head: the weight is also the input embedding, so its gradient is the sum of the
    head's and the embedding's; compare with the materialised path through the same graph."""
    vocab, d = 97, 12
    gen = torch.Generator().manual_seed(4)
    emb0 = torch.randn(vocab, d, generator=gen)
    mix0 = torch.randn(d, d, generator=gen) / d**0.5
    ids = torch.randint(vocab, (3, 9), generator=gen)
    targets = torch.randint(vocab, (3, 9), generator=gen)

    def grads(use_fused: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        emb = emb0.clone().requires_grad_(True)
        mix = mix0.clone().requires_grad_(True)
        hidden = torch.tanh(emb[ids] @ mix)  # [3, 9, d]
        if use_fused:
            s = hidden_token_stats(hidden, emb, targets, chunk_size=4, vocab_block=10)
        else:
            s = token_stats(hidden @ emb.T, targets)
        (s.logprob.sum() - 0.3 * s.entropy.sum()).backward()
        assert s.logprob.shape == (3, 9)
        return s.logprob.detach(), s.entropy.detach(), emb.grad, mix.grad  # type: ignore[return-value]

    for got, ref in zip(grads(True), grads(False)):
        assert_rel(got, ref, 1e-5, "tied")


def test_tiny_transformers_model_tied_head(single_thread: None) -> None:
    """A real HF causal LM with a tied head (as SmolLM2): statistics from
    ``model.model(...).last_hidden_state`` (after the final norm) and ``model.lm_head.weight``
    equal token_stats on ``model(...).logits``, and so does every parameter's gradient."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
        initializer_range=0.2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = torch.randint(300, (2, 10))

    def run(use_fused: bool) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        model.zero_grad(set_to_none=True)
        if use_fused:
            hidden = model.model(input_ids=ids).last_hidden_state[:, :-1]
            s = hidden_token_stats(hidden, model.lm_head.weight, ids[:, 1:], temperature=0.9)
        else:
            logits = model(input_ids=ids).logits[:, :-1]
            s = token_stats(logits, ids[:, 1:], temperature=0.9)
        (s.logprob.mean() + 0.1 * s.entropy.mean()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return s.logprob.detach(), s.entropy.detach(), grads

    lp, ent, g = run(True)
    lp_ref, ent_ref, g_ref = run(False)
    assert_rel(lp, lp_ref, 1e-5, "logprob")
    assert_rel(ent, ent_ref, 1e-5, "entropy")
    assert g.keys() == g_ref.keys() and len(g) > 5
    for name in g:
        assert_rel(g[name], g_ref[name], 1e-5, f"grad {name}")


def test_partial_upstream_grads_and_frozen_weight() -> None:
    h, w, b, y = make(10, 8, 90, seed=6)
    ref_h = h.clone().requires_grad_(True)
    ref_s = token_stats(ref_h @ w.T, y)
    ref_s.entropy.sum().backward()  # only the entropy is used: grad_logprob is None
    hh = h.clone().requires_grad_(True)
    s = hidden_token_stats(hh, w, y, chunk_size=3, vocab_block=20)  # w needs no grad
    s.entropy.sum().backward()
    assert_rel(hh.grad, ref_h.grad, 1e-5, "entropy-only grad")  # type: ignore[arg-type]
    hh.grad = None
    ww = w.clone().requires_grad_(True)
    s = hidden_token_stats(hh, ww, y, chunk_size=3, vocab_block=20)
    s.logprob.sum().backward()  # only the log-prob is used: grad_entropy is None
    ref_h.grad = None
    ref_w = w.clone().requires_grad_(True)
    token_stats(ref_h @ ref_w.T, y).logprob.sum().backward()
    assert_rel(hh.grad, ref_h.grad, 1e-5, "logprob-only grad hidden")  # type: ignore[arg-type]
    assert_rel(ww.grad, ref_w.grad, 1e-5, "logprob-only grad weight")  # type: ignore[arg-type]
    assert not s.t1.requires_grad and not s.t2.requires_grad
    with torch.no_grad():
        s = hidden_token_stats(hh, ww, y)
    assert not s.logprob.requires_grad
    assert_rel(s.t2, ref_s.t2, 1e-5, "t2 under no_grad")


def test_masked_vocabulary_through_minus_inf_bias() -> None:
    h, w, b, y = make(6, 8, 40, seed=8)
    b[20:] = float("-inf")
    y = y % 20
    y[0] = 25  # the sampled token itself is masked: logprob = -inf, t1 = 0, gradients finite
    got, got_g = run_with_grads(
        fused(y, chunk_size=4, vocab_block=16), h, w, b, torch.ones(6), torch.ones(6)
    )
    ref, ref_g = run_with_grads(materialised(y), h, w, b, torch.ones(6), torch.ones(6))
    assert got["logprob"][0] == float("-inf") and got["t1"][0] == 0.0
    for k in FIELDS:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-5, atol=1e-6)
    for g, r in zip(got_g, ref_g):
        assert g is not None and r is not None and bool(torch.isfinite(g).all())
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)


def test_empty_and_batched_shapes() -> None:
    w = torch.randn(30, 4, requires_grad=True)
    h = torch.zeros(0, 4, requires_grad=True)
    s = hidden_token_stats(h, w, torch.zeros(0, dtype=torch.long))
    assert all(getattr(s, k).shape == (0,) for k in FIELDS)
    (s.logprob.sum() + s.entropy.sum()).backward()
    assert h.grad is not None and h.grad.shape == (0, 4)
    assert w.grad is not None and bool((w.grad == 0).all())
    h3 = torch.randn(2, 0, 4)
    assert hidden_token_stats(h3, w, torch.zeros(2, 0, dtype=torch.long)).t2.shape == (2, 0)
    # a strided [B, T, d] view (hidden[:, :-1]) and [B, T] tokens
    full = torch.randn(3, 6, 4)
    y = torch.randint(30, (3, 5))
    s = hidden_token_stats(full[:, :-1], w, y, chunk_size=4)
    ref = token_stats(full[:, :-1] @ w.T, y)
    assert s.entropy.shape == (3, 5)
    for k in FIELDS:
        assert_rel(getattr(s, k), getattr(ref, k), 1e-5, k)


def test_default_chunk_size() -> None:
    assert default_head_chunk_size(8_192) == 1024  # 32 MiB / (4 * 8,192)
    assert default_head_chunk_size(49_152) == 256  # floor (170 by the byte budget)
    assert default_head_chunk_size(151_936) == 256
    assert default_head_chunk_size(49_152, "cuda") == 1365  # 256 MiB on accelerators
    assert default_head_chunk_size(151_936, "cuda") == 441


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"hidden": torch.zeros(3, 4, dtype=torch.long)}, "floating"),
        ({"weight": torch.zeros(5, 4, dtype=torch.float64)}, "weight dtype"),
        ({"weight": torch.zeros(5, 4, 1)}, r"\[V, d\]"),
        ({"weight": torch.zeros(5, 3)}, "hidden size 4"),
        ({"weight": torch.zeros(0, 4)}, "vocabulary"),
        ({"tokens": torch.zeros(4, dtype=torch.long)}, "tokens shape"),
        ({"tokens": torch.zeros(3)}, "integer"),
        ({"tokens": torch.zeros(3, dtype=torch.bool)}, "bool"),
        ({"tokens": torch.tensor([0, 5, 1])}, r"\[0, 5\)"),
        ({"tokens": torch.tensor([0, -1, 1])}, "min -1"),
        ({"bias": torch.zeros(4)}, r"bias must be \[V\]"),
        ({"bias": torch.zeros(5, dtype=torch.float64)}, "bias must match"),
        ({"temperature": 0.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"vocab_block": 1.5}, "vocab_block"),
        ({"weight": torch.full((5, 4), float("nan"))}, "non-finite logits"),
    ],
)
def test_errors(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {
        "hidden": torch.ones(3, 4),
        "weight": torch.zeros(5, 4),
        "tokens": torch.tensor([0, 1, 4]),
    }
    args.update(kwargs)
    extra = {
        k: args.pop(k) for k in ("bias", "temperature", "chunk_size", "vocab_block") if k in args
    }
    with pytest.raises(ValueError, match=match):
        hidden_token_stats(args["hidden"], args["weight"], args["tokens"], **extra)  # type: ignore[arg-type]


def test_policy_rows_recipe_matches_sequence_token_stats(tiny_model_and_tokenizer: tuple) -> None:
    """The recipe for ``rollout.sequence_token_stats`` (see the report of issue 12): hidden
    states from the decoder (``model.model``, final norm included), only the rows whose next
    token is in the loss mask, the LM head fused with the statistics. Same values and the same
    parameter gradients as the materialised path, on left-padded rows."""
    from entropace.rollout import sequence_token_stats

    model, _ = tiny_model_and_tokenizer
    gen = torch.Generator().manual_seed(9)
    vocab = model.lm_head.weight.shape[0]
    ids = torch.randint(4, vocab, (3, 12), generator=gen)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    mask[2, :5] = 0
    loss_mask = torch.zeros(3, 12, dtype=torch.long)
    loss_mask[:, 7:] = 1
    loss_mask[0, 4:6] = 1  # an earlier policy turn
    loss_mask *= mask
    ref = sequence_token_stats(model, ids, mask, temperature=0.8, loss_mask=loss_mask, grad=True)
    (ref.logprob * loss_mask).sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    hidden = model.model(
        input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=False
    ).last_hidden_state  # [B, L, d]
    # column t >= 1 is the state before token t: trained on when t is in the loss mask
    sel = loss_mask[:, 1:].bool() & mask[:, :-1].bool()
    stats = hidden_token_stats(
        hidden[:, :-1][sel], model.lm_head.weight, ids[:, 1:][sel], temperature=0.8
    )
    stats.logprob.sum().backward()
    for k in FIELDS:
        assert_rel(getattr(stats, k), getattr(ref, k)[:, 1:][sel], 1e-5, k)
    for name, p in model.named_parameters():
        assert p.grad is not None
        assert_rel(p.grad, ref_grads[name], 1e-5, f"grad {name}")
