"""Per-token statistics of a policy over whole trajectories (one forward per micro-batch).

Used twice: by the rollout engine (``grad=False``, the sampling policy's ``old_logprobs``,
entropy and PAPO sensitivity) and by the update (``grad=True``, the current policy's log-probs
on a micro-batch).

Shared prompt prefixes (``groups=``): the trajectories of a GRPO group start with the same
prompt. Within a micro-batch, the longest common prefix of each group's rows (identical ids,
all real) is run once, its key/value cache is expanded to the group (``repeat_interleave``, so
under autograd every member's gradient flows back into the one prefix pass and sums there,
exactly as the separate passes' gradients would) and only the rows' own tails are run on it
(PrefixGrouper, arXiv 2506.05433, does the same with a grouped attention). The function
computed is the same; values and gradients equal the plain path up to float round-off of
differently shaped matmuls (tested to 1e-5 relative in fp32).

Fused LM head (``fused_head=True``): for causal LMs whose logits are exactly
``lm_head(backbone(...).last_hidden_state)`` (:func:`fused_head_parts`), the backbone's hidden
states are taken only on the rows whose next token is trained on (the loss mask; every real
token without one) and :func:`entropace.algos.hidden_token_stats` turns them into the
statistics chunk by chunk, with its own backward: no LM head on observation or prompt tokens,
no ``[b, L, V]`` logits (fp32 or otherwise), ``[chunk, V]`` work buffers only. Same values and
gradients as the materialised path on the loss-mask columns (tested to 1e-5 relative in fp32).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from entropace.models.compat import cache_kwarg, takes_logits_to_keep

if TYPE_CHECKING:
    from entropace.algos.token_stats import TokenStats


def sequence_token_stats(
    model: Any,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    micro_batch_size: int | None = None,
    grad: bool = False,
    loss_mask: Tensor | None = None,
    groups: Tensor | None = None,
    fused_head: bool = False,
) -> TokenStats:
    """Log-prob, entropy and PAPO terms of every token of ``input_ids`` under ``model``.

    For each real token ``y_t`` (``t >= 1``) with prefix ``y_<t``, from the temperature-scaled
    next-token distribution ``p = softmax(logits(y_<t) / temperature)`` (ALGORITHMS.md §4):
    ``logprob_t = log p(y_t)``, ``entropy_t = -sum_v p_v log p_v``, ``t1``, ``t2`` and
    ``sensitivity_t = t2 - t1``, computed by :func:`entropace.algos.token_stats` in chunks.

    Alignment (``rollout/batch.py``): column ``t`` describes token ``t``; column 0 and padding
    columns are 0. Any padding side works: positions are ``cumsum(attention_mask) - 1``, and
    columns that are padding in every row of a micro-batch are not computed, so the result for
    one trajectory does not depend on the other trajectories in the batch (up to float
    round-off of batched matmuls).

    Args:
        model: a causal LM returning ``.logits`` of shape ``[b, L, V]``.
        input_ids: ``[B, L]`` long.
        attention_mask: ``[B, L]``, 1 on real tokens.
        temperature: divides the logits (> 0).
        chunk_size: rows per chunk of the vocabulary-sized computation (``None``: the
            default of :func:`entropace.algos.token_stats`, about 2 MiB of float32 per buffer on CPU).
        micro_batch_size: rows per forward pass (``None``: all ``B`` at once).
        grad: keep the autograd graph (the update); otherwise runs under ``torch.no_grad``.
        loss_mask: optional ``[B, L]``; when given, the vocabulary-sized work (LM head and
            statistics) is done only from the first column that any row of the micro-batch
            has in its loss mask (models whose ``forward`` takes ``logits_to_keep``, as
            transformers' causal LMs do): the shared prompt prefix costs no logits. Columns
            before it are 0; the columns from it on are exactly as without ``loss_mask``.
        groups: optional ``[B]`` group ids: rows of a group that share a common prefix in a
            micro-batch run it once (module docstring). Ignored (the plain path) for models
            whose cache is not a plain full-attention ``DynamicCache`` and under gradient
            checkpointing (which disables the cache).
        fused_head: the LM head fused with the statistics on the policy rows only (module
            docstring): columns outside ``loss_mask`` (when given) are then 0 too. Ignored
            (the materialised path) for models :func:`fused_head_parts` does not accept.

    Returns:
        ``TokenStats`` (``logprob``, ``entropy``, ``t1``, ``t2``; ``sensitivity`` derived), each
        ``[B, L]`` float32 (float64 for a float64 model); gradients flow through ``logprob``
        and ``entropy`` when ``grad``.
    """
    from entropace.algos.token_stats import TokenStats, token_stats

    if input_ids.dim() != 2 or input_ids.shape != attention_mask.shape:
        raise ValueError(
            f"input_ids and attention_mask must both be [B, L]; got {tuple(input_ids.shape)} "
            f"and {tuple(attention_mask.shape)}"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if micro_batch_size is not None and micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    batch, length = input_ids.shape
    step = micro_batch_size or max(batch, 1)
    names = ("logprob", "entropy", "t1", "t2")  # sensitivity = t2 - t1 is a property
    param = next(model.parameters())
    dtype = torch.float64 if param.dtype == torch.float64 else torch.float32
    parts: dict[str, list[Tensor]] = {name: [] for name in names}
    fused = fused_head_parts(model) if fused_head else None
    with torch.set_grad_enabled(grad):
        for start in range(0, batch, step):
            ids = input_ids[start : start + step]
            mask = attention_mask[start : start + step].long()
            rows = ids.shape[0]
            # Drop trailing columns that are padding in every row of this micro-batch.
            real_cols = mask.any(dim=0).nonzero()
            used = int(real_cols.max()) + 1 if real_cols.numel() else 0
            if used < 2:  # no token has a real prefix
                for name in names:
                    parts[name].append(ids.new_zeros((rows, length), dtype=dtype))
                continue
            ids_u, mask_u = ids[:, :used], mask[:, :used]
            # First column whose statistics are needed (1 without a loss mask).
            first = 1
            if loss_mask is not None:
                loss_cols = loss_mask[start : start + step, :used].any(dim=0).nonzero()
                if loss_cols.numel():
                    first = max(1, int(loss_cols.min()))
            position_ids = (mask_u.cumsum(dim=-1) - 1).clamp(min=0)
            if fused is not None:
                values = _fused_stats(
                    model, fused, ids_u, mask_u, position_ids,
                    None if groups is None else groups[start : start + step],
                    None if loss_mask is None else loss_mask[start : start + step, :used],
                    temperature=temperature, chunk_size=chunk_size,
                )  # fmt: skip
                pad = ids.new_zeros((rows, length - used), dtype=dtype)
                for name in names:
                    parts[name].append(torch.cat([values[name].to(dtype), pad], dim=1))
                continue
            if groups is not None and _prefix_sharing_applies(model):
                values = _shared_prefix_stats(
                    model, ids_u, mask_u, position_ids, groups[start : start + step], first,
                    temperature=temperature, chunk_size=chunk_size,
                )  # fmt: skip
                valid = (mask_u[:, 1:] * mask_u[:, :-1]).bool()
                valid[:, : first - 1] = False
                zero = ids.new_zeros((rows, 1), dtype=dtype)
                pad = ids.new_zeros((rows, length - used), dtype=dtype)
                for name in names:
                    value = torch.where(valid, values[name].to(dtype), 0.0)
                    parts[name].append(torch.cat([zero, value, pad], dim=1))
                continue
            extra = (
                {"logits_to_keep": used - first + 1}
                if first > 1 and takes_logits_to_keep(model)
                else {}
            )
            logits = model(
                input_ids=ids_u,
                attention_mask=mask_u,
                position_ids=position_ids,
                use_cache=False,
                **extra,
            ).logits
            logits = logits[
                :, logits.shape[1] - (used - first + 1) :
            ]  # positions first-1 .. used-1
            stats = token_stats(
                logits[:, :-1], ids_u[:, first:], temperature=temperature, chunk_size=chunk_size
            )
            # Column t (t >= 1) is the state before token t: real only if tokens t-1, t are.
            valid = (mask_u[:, first:] * mask_u[:, first - 1 : -1]).bool()
            zero = ids.new_zeros((rows, first), dtype=dtype)
            pad = ids.new_zeros((rows, length - used), dtype=dtype)
            for name in names:
                # where, not a product: a -inf logprob at a padded position must not become NaN
                value = torch.where(valid, getattr(stats, name).to(dtype), 0.0)
                parts[name].append(torch.cat([zero, value, pad], dim=1))
    return TokenStats(**{name: torch.cat(parts[name], dim=0) for name in names})


def _prefix_sharing_applies(model: Any) -> bool:
    from entropace.rollout.kvcache import kv_reuse_support

    flag = "is_activation_checkpointing"
    checkpointing = getattr(model, flag if hasattr(model, flag) else "is_gradient_checkpointing")
    if checkpointing and model.training:
        return False
    return kv_reuse_support(model) is None


def _forward_logits(model: Any, **kwargs: Any) -> Tensor:
    return model(**kwargs).logits


def _shared_prefix_stats(
    model: Any,
    ids: Tensor,
    mask: Tensor,
    position_ids: Tensor,
    groups: Tensor,
    first: int,
    *,
    temperature: float,
    chunk_size: int | None,
) -> dict[str, Tensor]:
    """Statistics of columns ``1 .. used-1`` (``[rows, used - 1]`` per name) of one
    micro-batch, each group's common prefix run once. Columns before ``first`` hold anything
    (the caller zeroes them)."""
    from transformers import DynamicCache

    from entropace.algos.token_stats import token_stats

    rows, used = ids.shape
    names = ("logprob", "entropy", "t1", "t2")
    out: dict[str, list[tuple[Tensor, Tensor]]] = {n: [] for n in names}
    order = []
    for g in torch.unique(groups, sorted=False).tolist():
        order.append((groups == g).nonzero().flatten())
    for index in order:
        g_ids, g_mask, g_pos = ids[index], mask[index], position_ids[index]
        prefix = _common_prefix(g_ids, g_mask, used)
        keep_from = max(first - 1, 0)  # first logits position needed
        if len(index) < 2 or prefix < 2:  # nothing to share: one plain pass for these rows
            logits = _forward_logits(
                model, input_ids=g_ids, attention_mask=g_mask, position_ids=g_pos,
                use_cache=False,
            )[:, :-1]  # fmt: skip
            stats = token_stats(logits, g_ids[:, 1:], temperature=temperature,
                                chunk_size=chunk_size)  # fmt: skip
            for n in names:
                out[n].append((index, getattr(stats, n)))
            continue
        cache = DynamicCache(config=model.config.get_text_config(decoder=True))
        need_prefix = max(prefix - keep_from, 1)  # prefix positions whose logits are needed
        head = model(
            input_ids=g_ids[:1, :prefix],
            attention_mask=g_mask[:1, :prefix],
            position_ids=g_pos[:1, :prefix],
            **{cache_kwarg(model): cache},
            use_cache=True,
            logits_to_keep=need_prefix,
        ).logits  # [1, need_prefix, V]: positions prefix-need_prefix .. prefix-1
        cache.batch_repeat_interleave(len(index))
        tail = model(
            input_ids=g_ids[:, prefix:],
            attention_mask=g_mask,
            position_ids=g_pos[:, prefix:],
            **{cache_kwarg(model): cache},
            use_cache=True,
        ).logits  # [n, used - prefix, V]: positions prefix .. used-1
        # positions prefix-need_prefix .. used-2 predict tokens prefix-need_prefix+1 .. used-1
        head = head.expand(len(index), -1, -1)
        logits = torch.cat([head, tail[:, :-1]], dim=1)
        tokens = g_ids[:, prefix - need_prefix + 1 :]
        stats = token_stats(logits, tokens, temperature=temperature, chunk_size=chunk_size)
        skipped = prefix - need_prefix  # columns 1 .. skipped are not computed (before first)
        for n in names:
            value = getattr(stats, n)
            if skipped:
                value = torch.cat([value.new_zeros(len(index), skipped), value], dim=1)
            out[n].append((index, value))
    result = {}
    for n in names:
        sample = out[n][0][1]
        full = sample.new_zeros((rows, used - 1))
        pieces = [(index, value) for index, value in out[n]]
        perm = torch.cat([index for index, _ in pieces])
        stacked = torch.cat([value for _, value in pieces])
        full = full.index_copy(0, perm.to(full.device), stacked)
        result[n] = full
    return result


#: ``config.model_type`` of the causal LMs whose ``forward`` computes exactly
#: ``logits = lm_head(base_model(...).last_hidden_state)`` (no scaling, soft-capping or
#: multiplier between the final norm and the head) in transformers 5.x.
PLAIN_HEAD_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "smollm3", "phi3"})

_SCALED_LOGIT_ATTRS = (
    "logit_scale", "final_logit_softcapping", "output_multiplier", "lm_head_multiplier",
    "logits_scaling",
)  # fmt: skip


def fused_head_parts(model: Any) -> tuple[Any, Tensor, Tensor | None] | None:
    """``(backbone, head_weight, head_bias)`` when ``model``'s logits are exactly
    ``head_weight @ backbone(...).last_hidden_state + head_bias`` (a transformers causal LM of
    :data:`PLAIN_HEAD_MODEL_TYPES`, possibly PEFT-wrapped, whose output embedding is a plain
    ``nn.Linear``: a tied input embedding counts, a LoRA-wrapped head does not) and no
    forward hook on the model or its head (the fused path would skip it), else ``None``
    (the caller then takes the materialised path)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(inner, "config", None)
    if config is None or not hasattr(config, "get_text_config"):
        return None
    text = config.get_text_config()
    if getattr(text, "model_type", None) not in PLAIN_HEAD_MODEL_TYPES:
        return None
    if any(getattr(text, attr, None) not in (None, 1, 1.0) for attr in _SCALED_LOGIT_ATTRS):
        return None
    get_head = getattr(inner, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    backbone = getattr(inner, "base_model", None)
    if type(head) is not torch.nn.Linear or backbone is None or backbone is inner:
        return None
    if any(m._forward_hooks or m._forward_pre_hooks for m in (model, inner, head)):
        return None  # a hook may change the logits, and the fused path never calls them
    return backbone, head.weight, head.bias


def _common_prefix(g_ids: Tensor, g_mask: Tensor, used: int) -> int:
    """Length of the longest common prefix of a group's rows (identical ids, all real),
    leaving at least one tail column per row."""
    same = (g_ids == g_ids[:1]).all(dim=0) & g_mask.bool().all(dim=0)
    diff = (~same).nonzero()
    prefix = int(diff.min()) if diff.numel() else used
    return min(prefix, used - 1)


def _backbone_hidden(backbone: Any, ids: Tensor, mask: Tensor, position_ids: Tensor) -> Tensor:
    return backbone(
        input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=False
    ).last_hidden_state


def _shared_prefix_hidden(
    model: Any, backbone: Any, ids: Tensor, mask: Tensor, position_ids: Tensor, groups: Tensor
) -> Tensor:
    """The backbone's last hidden states ``[rows, used, d]`` of one micro-batch, each group's
    common prefix run once and its KV cache expanded to the group (module docstring).

    Each group runs only up to its own longest row (rows are right-padded): a micro-batch
    that holds a short group next to a long one does not pad the short group's tails to the
    long one's length; its hidden states are zero-padded to ``used`` afterwards (those columns
    are padding of every row of the group, never read)."""
    from transformers import DynamicCache

    used = ids.shape[1]
    indices, hiddens = [], []
    for g in torch.unique(groups, sorted=False).tolist():
        index = (groups == g).nonzero().flatten()
        cols = mask[index].any(dim=0).nonzero()
        g_used = int(cols.max()) + 1 if cols.numel() else 1
        g_ids, g_mask = ids[index, :g_used], mask[index, :g_used]
        g_pos = position_ids[index, :g_used]
        prefix = _common_prefix(g_ids, g_mask, g_used)
        if len(index) < 2 or prefix < 2:  # nothing to share: one plain pass for these rows
            hidden = _backbone_hidden(backbone, g_ids, g_mask, g_pos)
        else:
            cache = DynamicCache(config=model.config.get_text_config(decoder=True))
            head = backbone(
                input_ids=g_ids[:1, :prefix], attention_mask=g_mask[:1, :prefix],
                position_ids=g_pos[:1, :prefix], **{cache_kwarg(model): cache}, use_cache=True,
            ).last_hidden_state  # fmt: skip
            cache.batch_repeat_interleave(len(index))
            tail = backbone(
                input_ids=g_ids[:, prefix:], attention_mask=g_mask,
                position_ids=g_pos[:, prefix:], **{cache_kwarg(model): cache}, use_cache=True,
            ).last_hidden_state  # fmt: skip
            hidden = torch.cat([head.expand(len(index), -1, -1), tail], dim=1)
        if g_used < used:
            hidden = torch.nn.functional.pad(hidden, (0, 0, 0, used - g_used))
        indices.append(index)
        hiddens.append(hidden)
    order = torch.cat(indices).to(ids.device)
    return torch.cat(hiddens)[torch.argsort(order)]


def _fused_stats(
    model: Any,
    fused: tuple[Any, Tensor, Tensor | None],
    ids: Tensor,
    mask: Tensor,
    position_ids: Tensor,
    groups: Tensor | None,
    loss_mask: Tensor | None,
    *,
    temperature: float,
    chunk_size: int | None,
) -> dict[str, Tensor]:
    """Statistics ``[rows, used]`` per name of one micro-batch (``ids`` ``[rows, used]``),
    from the hidden states of the policy rows only: column ``t`` is computed when tokens
    ``t-1`` and ``t`` are real and (with ``loss_mask``) ``t`` is in the loss mask, else 0."""
    from entropace.algos.fused_head import hidden_token_stats

    backbone, weight, bias = fused
    if groups is not None and _prefix_sharing_applies(model):
        hidden = _shared_prefix_hidden(model, backbone, ids, mask, position_ids, groups)
    else:
        hidden = _backbone_hidden(backbone, ids, mask, position_ids)
    # position t-1 predicts token t: column t is the state before token t
    sel = (mask[:, 1:] * mask[:, :-1]).bool()
    if loss_mask is not None:
        sel &= loss_mask[:, 1:] != 0
    stats = hidden_token_stats(
        hidden[:, :-1][sel].to(weight.dtype), weight, ids[:, 1:][sel], bias=bias,
        temperature=temperature, chunk_size=chunk_size,
    )  # fmt: skip
    rows, used = ids.shape
    sel = torch.cat([sel.new_zeros(rows, 1), sel], dim=1)
    out = {}
    for name in ("logprob", "entropy", "t1", "t2"):
        value = getattr(stats, name)
        out[name] = value.new_zeros(rows, used).index_put((sel,), value)
    return out

