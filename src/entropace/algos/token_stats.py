"""Per-token statistics of the next-token distribution, in one chunked pass over the logits.

For logits ``z`` of one position, temperature ``T``, ``x = z / T`` and ``p = softmax(x)``, and the
sampled token ``y`` (PAPO, "entropy polarity"; see ``shared/docs/ALGORITHMS.md`` section 4):

- ``logprob = log p_y``
- ``entropy = H = -sum_v p_v log p_v``
- ``t1 = p_y (H + log p_y)``                  (the sampled-token term)
- ``t2 = sum_v p_v^2 (H + log p_v) = H sum_v p_v^2 + sum_v p_v^2 log p_v``   (state-wise correction)
- ``sensitivity S = t2 - t1``, the first-order entropy change (``dH/dx_v = -p_v (log p_v + H)``):
  a step in the tempered logits ``x <- x + eta A (e_y - p)`` changes the entropy by
  ``eta A S + O(eta^2)``; the same step on the raw logits, ``z <- z + eta A (e_y - p)``, moves
  ``x`` by ``1/T`` of it and changes the entropy by ``eta A S / T``; a gradient-ascent step on
  ``A log p_y`` in raw logit space, ``z <- z + eta A d(log p_y)/dz = z + eta A (e_y - p) / T``,
  changes it by ``eta A S / T^2`` (PAPO's first-order statement, with the temperature made
  explicit; at ``T = 1`` all three coincide).

Memory: the logits are processed ``chunk_size`` rows at a time; only one chunk of full-vocabulary
float32 work buffers exists at any moment (a few of them, each ``chunk_size x V``), never a float32
copy of the whole batch. Autograd goes through :class:`_TokenStatsFn`, whose forward saves only the
input logits, the tokens and the per-row entropy, and whose backward recomputes ``p`` chunk by chunk.

Conventions (``p log p = 0`` where ``p = 0``):

- ``-inf`` logits (masked vocabulary) are allowed: those entries get ``p = 0`` and contribute
  nothing. If the *sampled* token's logit is ``-inf``, ``logprob = -inf`` and ``t1 = 0`` (the limit
  ``p log p -> 0``); the entropy, ``t2`` and every gradient stay finite (the gradient of ``logprob``
  is still ``(e_y - p) / T``).
- NaN or ``+inf`` logits, or a row whose logits are all ``-inf``, raise ``ValueError``. The check is a
  single reduction over the per-row entropies (finite for every valid row), done once per call.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["TokenStats", "token_stats", "default_chunk_size"]

# Rows per chunk are chosen so that one float32 work buffer (rows x V) holds about this many bytes.
# CPU: small enough that the chunk's three work buffers stay in cache; measured fastest at 1.5-3 MiB
# per buffer (benchmarks/results/token_stats.md). Accelerators: large chunks, to amortise kernel
# launches (the passes are memory-bound there anyway); 64 MiB is a bound, not a measured optimum.
_CHUNK_BYTES: dict[str, int] = {"cpu": 2 * 2**20}
_CHUNK_BYTES_ACCELERATOR = 64 * 2**20

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class TokenStats:
    """Per-token statistics, every field shaped ``logits.shape[:-1]`` (e.g. ``[N]`` or ``[B, T]``).

    Attributes:
        logprob: ``log p_y`` (differentiable w.r.t. the logits).
        entropy: ``H = -sum_v p_v log p_v`` (differentiable w.r.t. the logits).
        t1: ``p_y (H + log p_y)`` (detached).
        t2: ``sum_v p_v^2 (H + log p_v)`` (detached).

    All are float32 (float64 when the logits are float64).
    """

    logprob: Tensor
    entropy: Tensor
    t1: Tensor
    t2: Tensor

    @property
    def sensitivity(self) -> Tensor:
        """``S = t2 - t1``, the first-order entropy change per unit of ``eta * A`` (PAPO)."""
        return self.t2 - self.t1


def default_chunk_size(vocab_size: int, device: torch.device | str = "cpu") -> int:
    """Rows per chunk: a float32 ``[rows, vocab_size]`` buffer of ~2 MiB on CPU, ~64 MiB elsewhere."""
    budget = _CHUNK_BYTES.get(torch.device(device).type, _CHUNK_BYTES_ACCELERATOR)
    return max(1, budget // (4 * max(1, vocab_size)))


def _row_blocks(x: Tensor) -> list[Tensor]:
    """Split ``[..., V]`` into 2-D ``[n_i, V]`` views that cover its rows in order, without copying.

    ``x.view(-1, V)`` works for contiguous inputs; a strided input such as ``logits[:, :-1]`` cannot
    be flattened without a copy, so it is split along its leading dimension instead.
    """
    if x.dim() == 2:
        return [x]
    try:
        return [x.view(-1, x.shape[-1])]
    except RuntimeError:
        return [block for i in range(x.shape[0]) for block in _row_blocks(x[i])]


def _chunks(blocks: list[Tensor], chunk_size: int) -> Iterator[tuple[int, Tensor]]:
    """Yield ``(first_row, rows)`` with at most ``chunk_size`` rows, walking the blocks in order."""
    offset = 0
    for block in blocks:
        for start in range(0, block.shape[0], chunk_size):
            rows = block[start : start + chunk_size]
            yield offset + start, rows
        offset += block.shape[0]


def _load_scaled(rows: Tensor, temperature: float, buf: Tensor) -> Tensor:
    """``x = rows / T`` in the compute dtype; reuses ``buf`` unless ``rows`` can be read directly."""
    if rows.dtype == buf.dtype and temperature == 1.0:
        return rows
    x = buf[: rows.shape[0]]
    x.copy_(rows)
    if temperature != 1.0:
        x.div_(temperature)
    return x


def _log_probs(x: Tensor, logp: Tensor, e: Tensor) -> Tensor:
    """Write ``log softmax(x)`` into ``logp`` and ``exp(x - max x)`` into ``e``; return the row sums
    ``s = sum_v e_v`` (``[n, 1]``), so that ``p = e / s``. All work tensors are ``[n, V]``.

    Hand-rolled rather than ``torch.log_softmax`` / ``torch.softmax``: their fused CPU kernels
    accumulate the normaliser in a way that loses ~1e-5 relative precision at V ~ 150k, while
    ``Tensor.sum`` (cascade summation) keeps ~1e-7; and one ``exp`` serves both ``log p`` and ``p``.
    ``p`` itself is never materialised: callers fold ``1 / s`` into per-row scalars. (Here ``e``
    is this exponential, not the one-hot ``e_y`` of the gradient formulas.)
    NaN / +inf inputs and all ``-inf`` rows come out as NaN rows (caught by ``_check_finite``).
    """
    m = x.amax(dim=-1, keepdim=True)
    torch.sub(x, m, out=logp)  # u = x - max <= 0
    torch.exp(logp, out=e)  # e = exp(u), max_v e_v = 1
    s = e.sum(dim=-1, keepdim=True)  # in [1, V]
    logp.sub_(s.log())  # log p = u - log s
    return s


def _forward_chunk(x: Tensor, y: Tensor, bufs: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Statistics of one chunk. ``x``: ``[n, V]`` scaled logits (may alias ``bufs[0]``); ``y``:
    ``[n, 1]``; ``bufs``: ``[3, >= n, V]`` work buffers. Returns ``(logprob, entropy, t1, t2)``.

    With ``p = e / s``: ``H = -(sum e log p) / s``, ``sum p^2 = (sum e^2) / s^2``,
    ``sum p^2 log p = (sum e^2 log p) / s^2``, ``t2 = H sum p^2 + sum p^2 log p``.
    """
    n = x.shape[0]
    logp, e = bufs[1, :n], bufs[2, :n]
    s = _log_probs(x, logp, e).squeeze(1)
    tmp = bufs[0, :n]  # x is no longer needed
    logprob = logp.gather(1, y).squeeze(1)
    p_y = e.gather(1, y).squeeze(1) / s
    lowest = torch.finfo(logp.dtype).min
    # -inf entries (masked vocabulary) have e = 0: clamping makes e * log p = 0 there, not NaN.
    logp.clamp_(min=lowest)
    elogp = torch.mul(e, logp, out=tmp)
    entropy = -elogp.sum(-1) / s  # H = -sum p log p
    s2 = s * s
    sum_p2_logp = elogp.mul_(e).sum(-1) / s2  # sum p^2 log p
    sum_p2 = torch.mul(e, e, out=tmp).sum(-1) / s2  # sum p^2
    t2 = entropy * sum_p2 + sum_p2_logp  # = sum p^2 (H + log p)
    t1 = p_y * (entropy + logprob.clamp(min=lowest))  # log p_y = -inf: p_y = 0, t1 = 0
    return logprob, entropy, t1, t2


def _check_finite(entropy: Tensor, logits: Tensor) -> None:
    """Raise ``ValueError`` if a row had NaN / +inf logits or only -inf ones (one host sync)."""
    if entropy.numel() == 0 or bool(torch.isfinite(entropy).all()):
        return
    flat_index = int((~torch.isfinite(entropy.reshape(-1))).nonzero()[0, 0])
    position = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat_index), entropy.shape))
    row = logits[position]  # a view: no copy, even for strided logits
    if bool(torch.isnan(row).any()):
        reason = "contain NaN"
    elif bool(torch.isposinf(row).any()):
        reason = "contain +inf"
    else:
        reason = "are all -inf (no token has positive probability)"
    raise ValueError(
        f"token_stats: the logits at position {position} {reason}; logits must be finite or "
        "-inf (masked vocabulary), with at least one finite entry per row"
    )


class _TokenStatsFn(torch.autograd.Function):
    """Chunked forward / backward. Saves the logits, the tokens and ``H`` per row, nothing of size V.

    Backward, per row (``g_l``, ``g_H``: upstream gradients of ``logprob`` and ``entropy``)::

        d logprob / dz = (e_y - p) / T
        d H / dz       = -p (log p + H) / T
        dL / dz        = (g_l e_y - p (g_l + g_H (log p + H))) / T
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        logits: Tensor,
        tokens: Tensor,
        temperature: float,
        chunk_size: int,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        vocab = logits.shape[-1]
        compute_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        n_rows = tokens.numel()
        flat_tokens = tokens.reshape(-1, 1)
        shape = tokens.shape
        outs = [torch.empty(shape, dtype=compute_dtype, device=logits.device) for _ in range(4)]
        flat_outs = [out.view(-1) for out in outs]
        width = min(chunk_size, max(n_rows, 1))
        bufs = torch.empty(3, width, vocab, dtype=compute_dtype, device=logits.device)
        for start, rows in _chunks(_row_blocks(logits), chunk_size):
            n = rows.shape[0]
            x = _load_scaled(rows, temperature, bufs[0])
            stats = _forward_chunk(x, flat_tokens[start : start + n], bufs)
            for out, value in zip(flat_outs, stats):
                out[start : start + n] = value
        del bufs
        logprob, entropy, t1, t2 = outs
        _check_finite(entropy, logits)
        ctx.save_for_backward(logits, tokens, entropy)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
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
    ) -> tuple[Tensor | None, None, None, None]:
        logits, tokens, entropy = ctx.saved_tensors
        entropy = entropy.reshape(-1)
        temperature: float = ctx.temperature
        vocab = logits.shape[-1]
        compute_dtype = entropy.dtype
        g_l = (
            torch.zeros_like(entropy)
            if grad_logprob is None
            else grad_logprob.reshape(-1).to(compute_dtype)
        )
        g_h = (
            torch.zeros_like(entropy)
            if grad_entropy is None
            else grad_entropy.reshape(-1).to(compute_dtype)
        )
        flat_tokens = tokens.reshape(-1, 1)
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        grad_rows = grad.view(-1, vocab)
        width = min(ctx.chunk_size, max(entropy.numel(), 1))
        bufs = torch.empty(3, width, vocab, dtype=compute_dtype, device=logits.device)
        for start, rows in _chunks(_row_blocks(logits), ctx.chunk_size):
            n = rows.shape[0]
            sl = slice(start, start + n)
            x = _load_scaled(rows, temperature, bufs[0])
            g, e = bufs[1, :n], bufs[2, :n]
            inv_st = 1.0 / (_log_probs(x, g, e).squeeze(1) * temperature)  # p / T = e * inv_st
            g.clamp_(min=torch.finfo(g.dtype).min)  # masked entries: e = 0, so e log p = 0
            # dL/dz = (g_l e_y - p (g_l + g_H (log p + H))) / T, in an order that keeps every
            # intermediate finite: log p is clamped, and multiplied by e (0 there) first.
            g.mul_(e)  # e log p
            g.addcmul_(e, entropy[sl, None])  # e (log p + H)
            g.mul_((-g_h[sl] * inv_st)[:, None])
            g.addcmul_(e, (-g_l[sl] * inv_st)[:, None])
            g.scatter_add_(1, flat_tokens[sl], g_l[sl, None] / temperature)
            grad_rows[sl].copy_(g)
        return grad, None, None, None


def token_stats(
    logits: Tensor,
    tokens: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> TokenStats:
    """Log-probability, entropy and the PAPO polarity terms of the sampled tokens.

    Args:
        logits: ``[..., V]`` (e.g. ``[N, V]`` or ``[B, T, V]``), float16 / bfloat16 / float32 /
            float64. Computed in float32 (float64 stays float64). Strided views such as
            ``logits[:, :-1]`` are read in place, never copied whole.
        tokens: ``logits.shape[:-1]`` integer token ids in ``[0, V)``.
        temperature: ``T > 0``; the statistics are those of ``softmax(logits / T)``.
        chunk_size: rows processed at once (``None``: :func:`default_chunk_size` of ``V`` and the
            device). The result does not depend on it; peak extra memory is about
            ``3 * chunk_size * V * 4`` bytes (float32 work buffers) plus the ``[..., 4]`` outputs.

    Returns:
        :class:`TokenStats` with fields shaped ``logits.shape[:-1]``. Gradients flow into
        ``logits`` through ``logprob`` and ``entropy``; ``t1`` and ``t2`` are detached.

    Raises:
        ValueError: bad shapes or dtypes, token ids out of range, ``temperature <= 0``,
            ``chunk_size < 1``, NaN / +inf logits, or a row whose logits are all ``-inf``.
    """
    if not isinstance(logits, Tensor) or logits.dim() < 1:
        raise ValueError("token_stats: logits must be a tensor of shape [..., V]")
    if logits.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"token_stats: logits must be a floating tensor, got dtype {logits.dtype}")
    if logits.shape[-1] == 0:
        raise ValueError("token_stats: the vocabulary dimension of logits is empty")
    if not isinstance(tokens, Tensor) or tokens.dtype.is_floating_point or tokens.is_complex():
        raise ValueError("token_stats: tokens must be an integer tensor")
    if tokens.dtype == torch.bool:
        raise ValueError("token_stats: tokens must be an integer tensor, got bool")
    if tuple(tokens.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"token_stats: tokens shape {tuple(tokens.shape)} must equal logits.shape[:-1] = "
            f"{tuple(logits.shape[:-1])}"
        )
    if tokens.device != logits.device:
        raise ValueError(f"token_stats: tokens on {tokens.device} but logits on {logits.device}")
    if not float(temperature) > 0.0 or temperature == float("inf"):
        raise ValueError(f"token_stats: temperature must be finite and > 0, got {temperature}")
    if chunk_size is None:
        chunk_size = default_chunk_size(logits.shape[-1], logits.device)
    elif isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(
            f"token_stats: chunk_size must be a positive int or None, got {chunk_size}"
        )
    vocab = logits.shape[-1]
    if tokens.numel() > 0:
        lo, hi = torch.aminmax(tokens)
        if bool(lo < 0) or bool(hi >= vocab):
            raise ValueError(
                f"token_stats: token ids must lie in [0, {vocab}), got min {int(lo)}, max {int(hi)}"
            )
    logprob, entropy, t1, t2 = _TokenStatsFn.apply(
        logits, tokens.long(), float(temperature), chunk_size
    )
    return TokenStats(logprob=logprob, entropy=entropy, t1=t1, t2=t2)
