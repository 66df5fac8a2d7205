"""Token statistics straight from hidden states: a fused LM head + :func:`token_stats`.

For hidden states ``h`` (``[N, d]``), an LM head ``W`` (``[V, d]``, optional bias ``b``), the
logits of row ``n`` are ``z_n = W h_n + b`` and, at temperature ``T``, ``p_n = softmax(z_n / T)``.
:func:`hidden_token_stats` returns exactly what ``token_stats(h @ W.T + b, tokens)`` returns
(``logprob``, ``entropy``, and the PAPO polarity terms ``t1``, ``t2``; ``shared/docs/ALGORITHMS.md``
section 4) without ever holding the ``[N, V]`` logits:

- **forward**: ``chunk_size`` rows at a time, ``z = h_chunk W^T + b`` goes into one reused
  ``[chunk_size, V]`` buffer (float32; the input dtype with ``upcast=False``), and :func:`token_stats` reduces it to the four statistics. Only two
  numbers per row are kept for backward: the log-normaliser ``lse = logsumexp(z / T)`` (computed
  as ``z_y / T - logprob``; directly for a row whose sampled token is masked) and the entropy ``H``.
- **backward** (gradients flow through ``logprob`` and ``entropy``; ``t1`` and ``t2`` are detached,
  as in :func:`token_stats`): with ``lse`` and ``H`` saved, the logit gradient of every
  ``(row, vocabulary entry)`` is known without a row-wise reduction::

      log p = z / T - lse,   p = exp(log p)
      dL/dz = (g_l e_y - p (g_l + g_H (log p + H))) / T

  so backward walks vocabulary blocks (outer) and token chunks (inner): each ``[rows, block]``
  tile (two float32 buffers holding together about as much as one forward chunk) recomputes its
  logits, forms ``G = dL/dz``, and accumulates ``dL/dh += G W_block`` and
  ``dL/dW_block = G^T h`` (``dL/db_block = sum_rows G``). ``dL/dW`` is written block by block in the
  weight's dtype, so no float32 ``[V, d]`` accumulator is needed even for bfloat16 weights.

Precision: logits are formed in float32 (float64 for float64 inputs). For bfloat16 / float16
inputs (``upcast=True``, the default) the weight is up-cast one vocabulary block at a time
(``vocab_block`` rows) and the matmuls run in float32, so the logits are the float32 products of
the low-precision values, not logits rounded to bfloat16 as a plain ``lm_head`` returns them; the
gradients are accumulated in float32 and rounded once to the input dtype. ``upcast=False`` runs
the matmuls in the input dtype instead and reproduces the plain head's rounded logits (faster on
hardware with fast bfloat16 matmuls; float32 matmuls on a GPU run without tensor cores unless
TF32 is enabled).

Cost: the forward does one ``N x d x V`` matmul (as the plain head), the backward three (the
plain head's backward does two), in exchange for ``O(chunk_size * V)`` memory instead of
``O(N * V)`` (measured in ``benchmarks/results/fused_head.md``).

TRL's and Liger's fused linear heads (log-probs and entropy from hidden states) follow the same
idea; none computes ``t2``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from entropace.algos.token_stats import TokenStats, token_stats

__all__ = ["hidden_token_stats", "default_head_chunk_size"]

# Rows per forward chunk: the float32 [rows, V] logits buffer holds about this many bytes, and at
# least _MIN_ROWS rows. The forward's matmul re-reads all of W (V x d) once per chunk: with rows
# well below d that traffic exceeds the logits' own, and the fused forward falls behind the
# unfused one (CPU, d = 576, V = 151,936: 1.47x its time at 64 rows, 1.35x at 128, 1.05x from
# 256; benchmarks/results/fused_head.md). token_stats still walks each chunk in cache-sized pieces.
# Accelerators: a bound, not a measured optimum.
_CHUNK_BYTES: dict[str, int] = {"cpu": 32 * 2**20}
_CHUNK_BYTES_ACCELERATOR = 256 * 2**20
_MIN_ROWS = 256
# Vocabulary rows per block of the backward tiles (and of the forward's up-cast of low-precision
# weights).
_VOCAB_BLOCK = 4096

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def default_head_chunk_size(vocab_size: int, device: torch.device | str = "cpu") -> int:
    """Rows per chunk: a float32 ``[rows, vocab_size]`` buffer of ~32 MiB on CPU, ~256 MiB on
    accelerators, and at least 256 rows (so the matmul is not dominated by re-reading ``W``:
    at V = 151,936 the CPU chunk is 256 rows, 148 MiB)."""
    budget = _CHUNK_BYTES.get(torch.device(device).type, _CHUNK_BYTES_ACCELERATOR)
    return max(_MIN_ROWS, budget // (4 * max(1, vocab_size)))


def _project(
    h: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor, wbuf: Tensor | None
) -> None:
    """``out = h W^T + b`` in ``out.dtype``. ``h``: ``[n, d]`` already in the compute dtype;
    ``weight``: ``[k, d]`` (any float dtype); ``bias``: ``[k]`` compute dtype or ``None``;
    ``out``: ``[n, k]`` (a column slice of a wider buffer is fine). ``wbuf``: a ``[>= block, d]``
    compute-dtype buffer for up-casting the weight block by block; ``None`` when ``weight``
    already has the compute dtype."""
    if wbuf is None:
        if bias is None:
            torch.mm(h, weight.t(), out=out)
        else:
            torch.addmm(bias, h, weight.t(), out=out)
        return
    block = wbuf.shape[0]
    for v0 in range(0, weight.shape[0], block):
        v1 = min(v0 + block, weight.shape[0])
        wb = wbuf[: v1 - v0]
        wb.copy_(weight[v0:v1])
        _project(h, wb, None if bias is None else bias[v0:v1], out[:, v0:v1], None)


class _HiddenTokenStatsFn(torch.autograd.Function):
    """Chunked fused head. Saves ``h``, ``W``, ``b``, the tokens, and ``lse``, ``H`` per row.

    ``mm_dtype`` is the dtype the matmuls run in: the compute dtype (float32 / float64), or the
    low-precision input dtype when ``upcast=False``.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        tokens: Tensor,
        temperature: float,
        chunk_size: int,
        vocab_block: int,
        upcast: bool,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        n_rows, vocab = hidden.shape[0], weight.shape[0]
        cdt = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        mm_dtype = cdt if upcast else weight.dtype
        dev = hidden.device
        outs = [torch.empty(n_rows, dtype=cdt, device=dev) for _ in range(4)]
        lse = torch.empty(n_rows, dtype=cdt, device=dev)
        bias_mm = None if bias is None else bias.to(mm_dtype)
        wbuf = (
            torch.empty(min(vocab_block, vocab), weight.shape[1], dtype=cdt, device=dev)
            if weight.dtype != mm_dtype
            else None
        )
        buf = torch.empty(min(chunk_size, max(n_rows, 1)), vocab, dtype=mm_dtype, device=dev)
        for start in range(0, n_rows, chunk_size):
            stop = min(start + chunk_size, n_rows)
            z = buf[: stop - start]
            _project(hidden[start:stop].to(mm_dtype), weight, bias_mm, z, wbuf)
            y = tokens[start:stop]
            try:
                stats = token_stats(z, y, temperature=temperature)
            except ValueError as err:
                raise ValueError(
                    f"hidden_token_stats: non-finite logits in the token chunk starting at row "
                    f"{start} (positions are relative to the chunk): {err}"
                ) from err
            for out, value in zip(outs, (stats.logprob, stats.entropy, stats.t1, stats.t2)):
                out[start:stop] = value
            z_y = z.gather(1, y[:, None]).squeeze(1).to(cdt)
            lse_c = (z_y / temperature if temperature != 1.0 else z_y) - stats.logprob
            masked = ~torch.isfinite(lse_c)  # the sampled token is masked (-inf bias)
            if bool(masked.any()):
                lse_c[masked] = torch.logsumexp(z[masked].to(cdt) / temperature, dim=1)
            lse[start:stop] = lse_c
        del buf, wbuf
        logprob, entropy, t1, t2 = outs
        ctx.save_for_backward(hidden, weight, bias, tokens, lse, entropy)
        ctx.config = (temperature, chunk_size, vocab_block, mm_dtype)
        ctx.mark_non_differentiable(t1, t2)
        return logprob, entropy, t1, t2

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        grad_logprob: Tensor | None,
        grad_entropy: Tensor | None,
        _grad_t1: Tensor | None,
        _grad_t2: Tensor | None,
    ) -> tuple[Tensor | None, ...]:
        hidden, weight, bias, tokens, lse, entropy = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        temperature, chunk_size, vocab_block, mm_dtype = ctx.config
        n_rows, d = hidden.shape
        vocab = weight.shape[0]
        cdt, dev = lse.dtype, lse.device
        grad_h = torch.zeros(n_rows, d, dtype=cdt, device=dev) if need_h else None
        grad_w = torch.zeros_like(weight) if need_w else None
        grad_b = torch.zeros(vocab, dtype=cdt, device=dev) if need_b else None
        if n_rows == 0 or not (need_h or need_w or need_b):
            return _grads_out(grad_h, grad_w, grad_b, hidden, bias)
        # Per-row coefficients, 1/T folded in: G = a e_y - p (a + c (log p + H)), a = g_l / T,
        # c = g_H / T.
        a = torch.zeros_like(lse) if grad_logprob is None else grad_logprob.to(cdt) / temperature
        c = torch.zeros_like(lse) if grad_entropy is None else grad_entropy.to(cdt) / temperature
        h_mm = hidden.to(mm_dtype)  # [N, d]: a no-op unless up-casting
        bias_mm = None if bias is None else bias.to(mm_dtype)
        # Tiles of [rows, block]; their two float32 buffers together hold about as much as one
        # forward chunk (chunk_size x V), and at least chunk_size rows.
        block = min(vocab_block, vocab)
        rows = min(n_rows, max(chunk_size, chunk_size * vocab // (2 * block)))
        logp_buf = torch.empty(rows, block, dtype=cdt, device=dev)
        p_buf = torch.empty(rows, block, dtype=cdt, device=dev)
        # Matmuls in a low-precision dtype read and write this copy of the tile.
        low_buf = torch.empty(rows, block, dtype=mm_dtype, device=dev) if mm_dtype != cdt else None
        wb_buf = torch.empty(block, d, dtype=cdt, device=dev) if weight.dtype != mm_dtype else None
        # Weight gradients of several token chunks, or of an up-cast weight, are summed in float32
        # (one token chunk in the weight's dtype: its block of dW is written directly).
        gw_acc = (
            torch.empty(block, d, dtype=cdt, device=dev)
            if need_w and (n_rows > rows or weight.dtype != mm_dtype)
            else None
        )
        # Low-precision matmul outputs, before they are added to the float32 accumulators.
        low_h = torch.empty(rows, d, dtype=mm_dtype, device=dev) if low_buf is not None else None
        low_w = (
            torch.empty(block, d, dtype=mm_dtype, device=dev)
            if low_buf is not None and gw_acc is not None
            else None
        )
        inv_t = 1.0 / temperature
        offset = -(a + c * entropy)  # [N]
        # -inf bias entries (masked vocabulary): log p = -inf there (one host sync per call)
        masked_vocab = bias is not None and not bool(torch.isfinite(bias).all())
        for v0 in range(0, vocab, block):
            v1 = min(v0 + block, vocab)
            k = v1 - v0
            if wb_buf is None:
                wb = weight[v0:v1]
            else:
                wb = wb_buf[:k]
                wb.copy_(weight[v0:v1])
            bb = None if bias_mm is None else bias_mm[v0:v1]
            if gw_acc is not None:
                gw_acc[:k].zero_()
            for t0 in range(0, n_rows, rows):
                sl = slice(t0, min(t0 + rows, n_rows))
                n = sl.stop - t0
                g, p = logp_buf[:n, :k], p_buf[:n, :k]
                g_mm = g if low_buf is None else low_buf[:n, :k]
                _log_probs_tile(h_mm[sl], wb, bb, lse[sl], inv_t, g, low_buf, n, k)
                torch.exp(g, out=p)
                if masked_vocab:  # p = 0 there already; keeps c log p finite (no 0 * inf)
                    g.clamp_(min=-1e4)
                # G = -p (a + c (log p + H)) = p (log p (-c) - (a + c H))
                torch.addcmul(offset[sl, None], g, -c[sl, None], out=g)
                g.mul_(p)
                # + a e_y for the rows whose token lies in this block (others add 0)
                idx = tokens[sl] - v0
                inside = (idx >= 0) & (idx < k)
                g.scatter_add_(1, idx.clamp(0, k - 1)[:, None], (a[sl] * inside)[:, None])
                if low_buf is not None:
                    g_mm.copy_(g)  # rounded to the input dtype, as a plain head's logit grad
                _accumulate(g_mm, wb, h_mm[sl], grad_h, sl, grad_w, gw_acc, v0, v1, low_h, low_w)
                if grad_b is not None:
                    grad_b[v0:v1] += g.sum(0)
            if grad_w is not None and gw_acc is not None:
                grad_w[v0:v1].copy_(gw_acc[:k])
        return _grads_out(grad_h, grad_w, grad_b, hidden, bias)


def _log_probs_tile(
    h: Tensor,
    wb: Tensor,
    bb: Tensor | None,
    lse: Tensor,
    inv_t: float,
    out: Tensor,
    low_buf: Tensor | None,
    n: int,
    k: int,
) -> None:
    """``out = (h wb^T + bb) / T - lse[:, None]`` (``log p`` of a ``[n, k]`` tile) in ``out.dtype``.

    In the compute dtype the matmul accumulates straight onto ``bb / T - lse`` (one BLAS call,
    one extra pass). With a low-precision ``mm_dtype`` the logits are first rounded to it in
    ``low_buf`` (as the forward's), then up-cast, scaled and shifted into ``out``."""
    if low_buf is None:
        if bb is None:
            out.copy_(lse[:, None].neg().expand(n, k))
        else:
            torch.sub(bb[None, :] * inv_t, lse[:, None], out=out)
        out.addmm_(h, wb.t(), alpha=inv_t)
        return
    z = low_buf[:n, :k]
    _project(h, wb, bb, z, None)
    out.copy_(z)
    if inv_t != 1.0:
        out.mul_(inv_t)
    out.sub_(lse[:, None])


def _accumulate(
    g: Tensor,
    wb: Tensor,
    h: Tensor,
    grad_h: Tensor | None,
    sl: slice,
    grad_w: Tensor | None,
    gw_acc: Tensor | None,
    v0: int,
    v1: int,
    low_h: Tensor | None,
    low_w: Tensor | None,
) -> None:
    """Add one tile's contributions: ``grad_h[sl] += G W_block``, ``dW_block (+)= G^T h``.

    ``g`` (``[n, k]``), ``wb`` (``[k, d]``), ``h`` (``[n, d]``) share the matmul dtype;
    ``grad_h`` and ``gw_acc`` are float32 (float64) accumulators; without ``gw_acc`` the block
    of ``grad_w`` is written directly. ``low_h`` / ``low_w``: buffers for low-precision matmul
    outputs (``None`` when the matmuls run in the accumulators' dtype)."""
    n, k = g.shape
    if grad_h is not None:
        if low_h is None:
            grad_h[sl].addmm_(g, wb)
        else:
            grad_h[sl] += torch.mm(g, wb, out=low_h[:n])
    if grad_w is None:
        return
    if gw_acc is None:
        torch.mm(g.t(), h, out=grad_w[v0:v1])
    elif low_w is None:
        gw_acc[:k].addmm_(g.t(), h)
    else:
        gw_acc[:k] += torch.mm(g.t(), h, out=low_w[:k])


def _grads_out(
    grad_h: Tensor | None,
    grad_w: Tensor | None,
    grad_b: Tensor | None,
    hidden: Tensor,
    bias: Tensor | None,
) -> tuple[Tensor | None, ...]:
    """Cast the float32 accumulators to the input dtypes; ``None`` for the non-tensor inputs."""
    gh = None if grad_h is None else grad_h.to(hidden.dtype)
    gb = None if grad_b is None or bias is None else grad_b.to(bias.dtype)
    return gh, grad_w, gb, None, None, None, None, None


def _check_inputs(
    hidden: Tensor, weight: Tensor, tokens: Tensor, bias: Tensor | None, temperature: float
) -> None:
    """Raise ``ValueError`` with the offending shape / dtype / value for any bad input."""
    name = "hidden_token_stats"
    if not isinstance(hidden, Tensor) or hidden.dim() < 1:
        raise ValueError(f"{name}: hidden must be a tensor of shape [..., d]")
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        shape = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(f"{name}: weight must be a [V, d] tensor, got {shape}")
    if hidden.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name}: hidden must be a floating tensor, got dtype {hidden.dtype}")
    if weight.dtype != hidden.dtype:
        raise ValueError(
            f"{name}: weight dtype {weight.dtype} must equal hidden dtype {hidden.dtype}"
        )
    if weight.shape[0] == 0:
        raise ValueError(f"{name}: the vocabulary dimension of weight is empty")
    if hidden.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"{name}: hidden size {hidden.shape[-1]} (hidden.shape[-1]) must equal "
            f"weight.shape[1] = {weight.shape[1]}"
        )
    if weight.device != hidden.device:
        raise ValueError(f"{name}: weight on {weight.device} but hidden on {hidden.device}")
    if bias is not None:
        if not isinstance(bias, Tensor) or tuple(bias.shape) != (weight.shape[0],):
            shape = tuple(bias.shape) if isinstance(bias, Tensor) else type(bias).__name__
            raise ValueError(f"{name}: bias must be [V] = [{weight.shape[0]}], got {shape}")
        if bias.dtype != hidden.dtype or bias.device != hidden.device:
            raise ValueError(
                f"{name}: bias must match hidden's dtype and device ({hidden.dtype}, "
                f"{hidden.device}), got ({bias.dtype}, {bias.device})"
            )
    if not isinstance(tokens, Tensor) or tokens.dtype.is_floating_point or tokens.is_complex():
        raise ValueError(f"{name}: tokens must be an integer tensor")
    if tokens.dtype == torch.bool:
        raise ValueError(f"{name}: tokens must be an integer tensor, got bool")
    if tuple(tokens.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(
            f"{name}: tokens shape {tuple(tokens.shape)} must equal hidden.shape[:-1] = "
            f"{tuple(hidden.shape[:-1])}"
        )
    if tokens.device != hidden.device:
        raise ValueError(f"{name}: tokens on {tokens.device} but hidden on {hidden.device}")
    if not float(temperature) > 0.0 or temperature == float("inf"):
        raise ValueError(f"{name}: temperature must be finite and > 0, got {temperature}")


def hidden_token_stats(
    hidden: Tensor,
    weight: Tensor,
    tokens: Tensor,
    *,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    vocab_block: int | None = None,
    upcast: bool = True,
) -> TokenStats:
    """``token_stats(hidden @ weight.T + bias, tokens)`` without materialising the logits.

    Args:
        hidden: ``[..., d]`` hidden states (the LM head's input: after the model's final norm),
            float16 / bfloat16 / float32 / float64.
        weight: ``[V, d]`` LM-head weight (e.g. ``model.lm_head.weight``; a tied input embedding
            works the same way, its gradient adds to the embedding's), same dtype as ``hidden``.
        tokens: ``hidden.shape[:-1]`` integer ids in ``[0, V)``: the token whose statistics each
            row gives (the *next* token of the position the hidden state belongs to).
        bias: optional ``[V]`` head bias, same dtype; ``-inf`` entries mask vocabulary entries.
        temperature: ``T > 0``; the statistics are those of ``softmax(logits / T)``.
        chunk_size: token rows per chunk (``None``: :func:`default_head_chunk_size`). The result
            does not depend on it (up to matmul round-off); the work buffers hold about
            ``chunk_size * V * 4`` bytes in forward and in backward, besides the outputs and the
            gradients (``dW`` is ``V x d``, as in the unfused path).
        vocab_block: vocabulary rows per backward tile and per up-cast block of a low-precision
            weight (``None``: 4096).
        upcast: for float16 / bfloat16 inputs, form the logits in float32 (the weight up-cast
            one block at a time, float32 matmuls). ``False``: run the matmuls in the input dtype
            (float32 accumulation inside the kernel, output rounded to it) and take the
            statistics of those rounded logits, exactly as a plain ``lm_head`` + ``token_stats``
            does; faster where low-precision matmuls are (CPUs with AVX512-BF16, GPU tensor
            cores), less precise (each logit off by up to ``2^-9 |z|`` in bfloat16). Ignored for
            float32 / float64.

    Returns:
        :class:`~entropace.algos.token_stats.TokenStats` with fields shaped ``hidden.shape[:-1]``,
        float32 (float64 for float64 inputs). Gradients flow into ``hidden``, ``weight`` and
        ``bias`` through ``logprob`` and ``entropy``; ``t1`` and ``t2`` are detached.

    Raises:
        ValueError: bad shapes, dtypes or devices, token ids out of range, ``temperature <= 0``,
            ``chunk_size`` / ``vocab_block < 1``, or non-finite logits (NaN / inf in the inputs).
    """
    _check_inputs(hidden, weight, tokens, bias, temperature)
    vocab = weight.shape[0]
    for label, value in (("chunk_size", chunk_size), ("vocab_block", vocab_block)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(
                f"hidden_token_stats: {label} must be a positive int or None, got {value}"
            )
    if chunk_size is None:
        chunk_size = default_head_chunk_size(vocab, hidden.device)
    if vocab_block is None:
        vocab_block = _VOCAB_BLOCK
    if tokens.numel() > 0:
        lo, hi = torch.aminmax(tokens)
        if bool(lo < 0) or bool(hi >= vocab):
            raise ValueError(
                f"hidden_token_stats: token ids must lie in [0, {vocab}), got min {int(lo)}, "
                f"max {int(hi)}"
            )
    shape = tokens.shape
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    outs = _HiddenTokenStatsFn.apply(
        flat_hidden,
        weight,
        bias,
        tokens.reshape(-1).long(),
        float(temperature),
        chunk_size,
        vocab_block,
        bool(upcast),
    )
    logprob, entropy, t1, t2 = (out.view(shape) for out in outs)
    return TokenStats(logprob=logprob, entropy=entropy, t1=t1, t2=t2)
