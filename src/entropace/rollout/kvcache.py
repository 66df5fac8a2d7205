"""Key/value caches kept per episode: shared prompt prefixes and cross-turn reuse.

The old path re-encodes each episode's whole token list at every turn: ``generate`` receives
the left-padded ``[b, W]`` ids of every live episode and prefills all ``b * W`` positions. The
fast path hands ``generate`` the *same* ids and attention mask, plus a :class:`DynamicCache`
whose first ``C`` columns already hold the keys and values of those positions, so that only
the last ``U = W - C`` columns are prefilled. Because the ids, mask and position ids
(``cumsum(mask) - 1``) are exactly the old ones, the model computes the same function: the
logits differ from the old path only by the float round-off of differently shaped matmuls
(~1e-7 relative in fp32). Greedy decoding therefore picks the same tokens (barring exact
ties), and sampling with the same seed draws the same tokens too: the RNG is consumed only by
the same ``generate`` calls with the same batch shapes (the prefix prefill draws nothing), so a
sample can change only if a draw falls within round-off of a category boundary.

Layout of one ``generate`` call over episodes ``i`` with ``n_i`` tokens, ``c_i`` of them cached
(:class:`PrefixKV`, keys/values of ``ids[:c_i]``)::

    W = max_i n_i                  # left-padded width, as in the old path
    U = max_i (n_i - c_i)          # columns every row prefills (>= 1)
    C = W - U                      # cache columns
    row i, columns [0, W):  [pad * (W - n_i)][ids_i]
    row i, cache [0, C):    [zeros * (W - n_i)][KV of ids_i[: n_i - U]]   (mask 0 on the zeros)

A row with fewer uncached tokens than ``U`` recomputes a few of its cached ones; that costs
nothing extra, since the batched prefill runs ``b * U`` positions either way.

Sources of cached prefixes:

* **shared prompt prefix** (:func:`prefill_prefixes`): the ``G`` episodes of a group start from
  the same first prompt; its first ``n - 1`` tokens are run once and every episode of the
  group gets a view of the result (the copy into the batch happens in :func:`batch_cache`).
  Distinct prompts that share at least :data:`MIN_SHARED_PREFIX` leading tokens (the system
  prompt and tool descriptions of one task's instances) run that common prefix once too
  (:func:`shared_roots`, :func:`extend_prefixes`);
* **cross-turn reuse** (:func:`kept_prefixes`): after ``generate`` the batch's cache holds every
  row's input and generated tokens; each live episode keeps views of its own real columns, the
  tokens it will keep (generated tokens past its stop token or budget are excluded). The next
  turn prefills only the uncached tail: the last generated token, the template tokens that
  close the turn and the new observation with its user/assistant headers. Finished episodes
  drop their views, so their rows leave the next batch (and memory).

The batch cache is made of :class:`GrowingLayer` s: ``DynamicLayer`` grows by ``torch.cat``,
which copies the whole cache of every layer at every decoding step (on CPU each copy is a fresh
multi-megabyte allocation, page faults included); a growing layer writes each step into room
reserved for the call (``U + max_new_tokens`` columns).

Only models whose cache is a plain full-attention :class:`DynamicCache` are supported
(:func:`kv_reuse_support`); sliding-window or linear-attention layers keep the old path.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from entropace.models.compat import cache_kwarg, takes_logits_to_keep


@dataclass
class PrefixKV:
    """Keys and values of the first ``length`` tokens of one sequence.

    Attributes:
        layers: per decoder layer ``(keys, values)``, each ``[H_kv, length, D]`` (usually views
            into a batched cache; shared between the episodes of a group).
    """

    layers: list[tuple[Tensor, Tensor]]

    @property
    def length(self) -> int:
        return int(self.layers[0][0].shape[-2]) if self.layers else 0


def _growing_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A full-attention ``DynamicLayer`` that appends into a preallocated buffer.

        ``keys`` / ``values`` are views ``buffer[:, :, :length]`` (``[b, H_kv, length, D]``);
        ``update`` copies only the new columns, and reallocates (with ``reserve`` spare
        columns) only when the buffer is full. Anything that replaces ``keys`` from outside
        (``crop``, ``batch_select_indices``, ...) is adopted at the next ``update``.
        """

        def __init__(self, reserve: int = 0) -> None:
            super().__init__()
            self.reserve = int(reserve)
            self._buffers: tuple[Tensor, Tensor] | None = None

        @classmethod
        def from_buffers(cls, keys: Tensor, values: Tensor, length: int) -> Any:
            layer = cls(0)
            layer.device = keys.device
            layer.is_initialized = True
            layer._buffers = (keys, values)
            layer.keys, layer.values = keys[:, :, :length], values[:, :, :length]
            return layer

        def update(
            self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any
        ) -> tuple[Tensor, Tensor]:
            if not self.is_initialized:
                self.device = key_states.device
                self.is_initialized = True
            buffers = self._buffers
            adopted = buffers is not None and self.keys is not None and (
                self.keys.data_ptr() == buffers[0].data_ptr()
            )  # fmt: skip
            old = self.keys.shape[-2] if self.keys is not None and self.keys.numel() else 0
            new = old + key_states.shape[-2]
            if not adopted or buffers is None or new > buffers[0].shape[-2]:
                shape = (*key_states.shape[:2], new + self.reserve, key_states.shape[-1])
                fresh = (key_states.new_empty(shape), value_states.new_empty(shape))
                if old:
                    fresh[0][:, :, :old] = self.keys
                    fresh[1][:, :, :old] = self.values
                buffers = self._buffers = fresh
            buffers[0][:, :, old:new] = key_states
            buffers[1][:, :, old:new] = value_states
            self.keys, self.values = buffers[0][:, :, :new], buffers[1][:, :, :new]
            return self.keys, self.values

    return GrowingLayer


@functools.cache
def growing_layer_class() -> type:
    """The :class:`GrowingLayer` class (built on first use: transformers is imported lazily)."""
    return _growing_layer_class()


def _fixed_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class FixedLayer(DynamicLayer):
        """A full-attention layer of fixed shape (``rollout.cache=static``).

        The buffers ``[b, H_kv, K, D]`` (``K`` columns: the whole ``generate`` call) are
        allocated once and zeroed (masked columns must be finite); ``update`` writes the new
        columns at ``cursor`` (a device tensor ``[1]`` the decoding loop advances, so no host
        value is read) and returns the whole buffers: every decoding step has the same
        shapes, which CUDA graphs need. The attention mask (4D, from the caller) hides the
        columns not written yet. :meth:`settle` turns the layer back into views of its
        ``length`` first columns, as a :class:`GrowingLayer` would hold them.
        """

        def __init__(self, columns: int, cursor: Tensor) -> None:
            super().__init__()
            self.columns = int(columns)
            self.cursor = cursor
            self._buffers: tuple[Tensor, Tensor] | None = None

        @classmethod
        def from_buffers(cls, keys: Tensor, values: Tensor, length: int, cursor: Tensor) -> Any:
            layer = cls(keys.shape[-2], cursor)
            layer.device = keys.device
            layer.is_initialized = True
            layer._buffers = (keys, values)
            layer.settle(length)
            return layer

        def update(
            self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any
        ) -> tuple[Tensor, Tensor]:
            if self._buffers is None:
                shape = (*key_states.shape[:2], self.columns, key_states.shape[-1])
                self._buffers = (key_states.new_zeros(shape), value_states.new_zeros(shape))
                self.device = key_states.device
                self.is_initialized = True
            keys, values = self._buffers
            q = key_states.shape[-2]
            where = self.cursor if q == 1 else self.cursor + torch.arange(q, device=keys.device)
            keys.index_copy_(2, where, key_states)
            values.index_copy_(2, where, value_states)
            self.keys, self.values = keys, values
            return keys, values

        def settle(self, length: int) -> None:
            """Keep views of the first ``length`` columns (``get_seq_length`` == ``length``)."""
            if self._buffers is not None:
                self.keys = self._buffers[0][:, :, :length]
                self.values = self._buffers[1][:, :, :length]

    return FixedLayer


@functools.cache
def fixed_layer_class() -> type:
    """The :class:`FixedLayer` class (built on first use)."""
    return _fixed_layer_class()


def kv_reuse_support(model: Any) -> str | None:
    """``None`` when the fast path applies to ``model``, else the reason it does not.

    The fast path needs a model config whose layers all map to plain (full attention)
    ``DynamicLayer`` cache layers (the cache's keyword: :func:`entropace.models.compat.cache_kwarg`).
    """
    try:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer
    except ImportError as exc:  # pragma: no cover - transformers is a dependency
        return f"transformers has no DynamicCache ({exc})"
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "get_text_config"):
        return "the model has no transformers config"
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder models are not supported"
    try:
        probe = DynamicCache(config=config.get_text_config(decoder=True))
    except Exception as exc:  # a config transformers cannot map to cache layers
        return f"no DynamicCache for this config ({exc!r})"
    if not probe.layers or any(type(layer) is not DynamicLayer for layer in probe.layers):
        kinds = sorted({type(layer).__name__ for layer in probe.layers})
        return f"cache layers {kinds} are not all full-attention DynamicLayer"
    return None


def _length_buckets(lengths: Sequence[int], max_batch: int, waste: float) -> list[list[int]]:
    """Indices grouped for padded batches: sorted by length (longest first), a bucket grows
    while its padded size stays within ``waste`` times its real tokens and ``max_batch`` rows."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    buckets: list[list[int]] = []
    for i in order:
        if buckets:
            bucket = buckets[-1]
            width = lengths[bucket[0]]
            real = sum(lengths[j] for j in bucket) + lengths[i]
            if len(bucket) < max_batch and width * (len(bucket) + 1) <= waste * real:
                bucket.append(i)
                continue
        buckets.append([i])
    return buckets


#: Distinct prompts sharing at least this many leading tokens prefill them once.
MIN_SHARED_PREFIX = 32


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def shared_roots(lists: Sequence[Sequence[int]], min_shared: int) -> list[tuple[int, list[int]]]:
    """Clusters of lists with a common prefix of at least ``min_shared`` tokens.

    Lists are sorted, and a cluster grows along the sorted order while its saving
    ``(size - 1) * common_length`` does not drop (so a list that shares little does not cut a
    long common prefix short). Returns ``(common_length, members)`` for clusters of 2 or more.
    """
    order = sorted(range(len(lists)), key=lambda i: tuple(lists[i]))
    clusters: list[tuple[int, list[int]]] = []
    for i in order:
        if clusters:
            length, members = clusters[-1]
            common = min(length, _lcp(lists[members[-1]], lists[i]))
            if common >= min_shared and len(members) * common >= (len(members) - 1) * length:
                clusters[-1] = (common, [*members, i])
                continue
        clusters.append((len(lists[i]), [i]))
    return [(length, members) for length, members in clusters if len(members) > 1]


def extend_prefixes(
    model: Any,
    lists: Sequence[Sequence[int]],
    bases: Sequence[PrefixKV | None],
    *,
    pad_id: int,
    max_batch: int = 16,
    waste: float = 1.25,
) -> tuple[list[PrefixKV], int]:
    """Keys/values of every token of each list, running only the tokens after its base.

    ``bases[i]`` (or ``None``) holds the keys/values of a prefix of ``lists[i]``. Lists with a
    similar number of uncached tokens share a left-padded forward (padded positions at most
    ``waste`` times the real ones, at most ``max_batch`` rows), laid out as a ``generate``
    call (module docstring): the ``[b, W]`` ids and mask, the first ``W - U`` columns from the
    bases, positions ``cumsum(mask) - 1``. Only the last position's logits are computed
    (``logits_to_keep=1``) where the model allows it.

    Returns:
        ``(kvs, positions)``: one :class:`PrefixKV` per list (an empty list gives an empty
        prefix) and the number of token positions run (padding included).
    """
    device = next(model.parameters()).device
    cached = [b.length if b is not None else 0 for b in bases]
    kvs: list[PrefixKV] = [PrefixKV([]) for _ in lists]
    todo = []
    for i, (ids, c) in enumerate(zip(lists, cached, strict=True)):
        if c >= len(ids) and bases[i] is not None:
            kvs[i] = bases[i]  # type: ignore[assignment]  # all cached already
        elif ids:
            todo.append(i)
    positions = 0
    keep_logits = {"logits_to_keep": 1} if takes_logits_to_keep(model) else {}
    uncached = [len(lists[i]) - cached[i] for i in todo]
    for bucket in _length_buckets(uncached, max_batch, waste):
        rows = [todo[j] for j in bucket]
        lengths = [len(lists[i]) for i in rows]
        width = max(lengths)
        new, keep = batch_layout(lengths, [cached[i] for i in rows])
        cache = batch_cache([bases[i] for i in rows], keep, width - new, new)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, (i, n) in enumerate(zip(rows, lengths, strict=True)):
            ids[r, width - n :] = torch.tensor(list(lists[i]), dtype=torch.long)
            mask[r, width - n :] = 1
        ids, mask = ids.to(device), mask.to(device)
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            model(
                input_ids=ids[:, width - new :],
                attention_mask=mask,
                position_ids=position_ids[:, width - new :],
                **{cache_kwarg(model): cache},
                use_cache=True,
                **keep_logits,
            )
        positions += len(rows) * new
        views = row_prefixes(cache, [width - n for n in lengths], lengths)
        for i, kv in zip(rows, views, strict=True):
            kvs[i] = kv
    return kvs, positions


def prefill_prefixes(
    model: Any,
    prefixes: Sequence[Sequence[int]],
    *,
    pad_id: int,
    max_batch: int = 16,
    waste: float = 1.25,
    min_shared: int | None = None,
) -> tuple[list[PrefixKV], int]:
    """Run each (distinct) token list once (no grad); keys/values of all its tokens.

    Lists with a common prefix of at least ``min_shared`` tokens (default
    :data:`MIN_SHARED_PREFIX`; e.g. the system prompt and tool descriptions of one task's
    instances) run that prefix once (:func:`shared_roots`) and then only their own tails;
    the rest as :func:`extend_prefixes`.

    Returns:
        ``(kvs, positions)``: one :class:`PrefixKV` per list and the positions run.
    """
    shared = MIN_SHARED_PREFIX if min_shared is None else min_shared
    roots = shared_roots(prefixes, shared)
    root_lists = [prefixes[members[0]][:length] for length, members in roots]
    root_kvs, positions = extend_prefixes(
        model, root_lists, [None] * len(roots), pad_id=pad_id, max_batch=max_batch, waste=waste
    )
    bases: list[PrefixKV | None] = [None] * len(prefixes)
    for kv, (_length, members) in zip(root_kvs, roots, strict=True):
        for i in members:
            bases[i] = kv
    kvs, more = extend_prefixes(
        model, prefixes, bases, pad_id=pad_id, max_batch=max_batch, waste=waste
    )
    return kvs, positions + more


def batch_cache(
    prefixes: Sequence[PrefixKV | None],
    keep: Sequence[int],
    width: int,
    reserve: int = 0,
    cursor: Tensor | None = None,
) -> Any:
    """A ``DynamicCache`` of ``width`` columns: row ``i`` holds the first ``keep[i]`` cached
    tokens of ``prefixes[i]`` right-aligned (columns ``[width - keep[i], width)``), zeros
    before them (masked by the caller's attention mask).

    Shapes: each layer's keys/values ``[b, H_kv, width, D]``, views of buffers with
    ``reserve`` more columns (:class:`GrowingLayer`); ``width == 0`` gives an empty cache that
    ``generate`` fills (its layers reserve ``reserve`` columns beyond the prefill).
    With ``cursor`` (a device long tensor ``[1]``, the next column to write): fixed-shape
    :class:`FixedLayer` s of ``width + reserve`` zeroed columns instead (``rollout.cache=static``).
    """
    from transformers import DynamicCache

    layer_class = growing_layer_class() if cursor is None else fixed_layer_class()
    cache = DynamicCache()
    if width == 0:
        args = (reserve,) if cursor is None else (reserve, cursor)
        cache.layer_class_to_replicate = functools.partial(layer_class, *args)
        return cache
    template = next((p for p, k in zip(prefixes, keep, strict=True) if k > 0 and p), None)
    if template is None:
        raise ValueError("batch_cache: width > 0 but no row has cached tokens to keep")
    layers = []
    for layer, (k0, v0) in enumerate(template.layers):
        keys = k0.new_empty((len(prefixes), k0.shape[0], width + reserve, k0.shape[-1]))
        values = v0.new_empty((len(prefixes), v0.shape[0], width + reserve, v0.shape[-1]))
        zeroed = width if cursor is None else width + reserve  # a fixed layer reads them all
        keys[:, :, :zeroed].zero_()  # masked columns must be finite (0 * -inf would be NaN)
        values[:, :, :zeroed].zero_()
        for row, (prefix, n) in enumerate(zip(prefixes, keep, strict=True)):
            if n <= 0:
                continue
            if prefix is None or prefix.length < n:
                raise ValueError(f"batch_cache: row {row} keeps {n} tokens of a shorter prefix")
            k, v = prefix.layers[layer]
            keys[row, :, width - n : width] = k[:, :n]
            values[row, :, width - n : width] = v[:, :n]
        layers.append(
            layer_class.from_buffers(keys, values, width)
            if cursor is None
            else layer_class.from_buffers(keys, values, width, cursor)
        )
    cache.layers = layers
    return cache


def row_prefixes(cache: Any, starts: Sequence[int], lengths: Sequence[int]) -> list[PrefixKV]:
    """Views of row ``i``'s columns ``[starts[i], starts[i] + lengths[i])`` of every layer."""
    out: list[PrefixKV] = []
    layers = [(layer.keys, layer.values) for layer in cache.layers]
    for row, (start, n) in enumerate(zip(starts, lengths, strict=True)):
        out.append(PrefixKV([(k[row, :, start : start + n], v[row, :, start : start + n])
                             for k, v in layers]))  # fmt: skip
    return out


def batch_layout(lengths: Sequence[int], cached: Sequence[int]) -> tuple[int, list[int]]:
    """``(U, keep)`` for rows of ``n_i = lengths[i]`` tokens with ``c_i = cached[i]`` cached:
    every row prefills the last ``U = max_i (n_i - c_i)`` columns of the left-padded batch and
    takes its first ``keep_i = max(0, n_i - U)`` tokens from its cache (module docstring)."""
    uncached = max(n - c for n, c in zip(lengths, cached, strict=True))
    return uncached, [max(0, n - uncached) for n in lengths]


def kept_prefixes(cache: Any, lengths: Sequence[int], kept: Sequence[int]) -> list[PrefixKV]:
    """Each row's cache after ``generate``, limited to the tokens its episode keeps.

    Row ``i`` of the ``[b, W]`` input holds its ``n_i = lengths[i]`` ids at columns
    ``[W - n_i, W)``, followed by its generated tokens, of which it keeps the first
    ``kept[i]`` (up to its stop token and its own budget). The cache holds every column but
    the last generated one, so row ``i`` keeps ``min(n_i + kept_i, S - (W - n_i))`` tokens.
    """
    width, columns = max(lengths), cache.get_seq_length()
    starts = [width - n for n in lengths]
    keep = [min(n + k, columns - s) for n, k, s in zip(lengths, kept, starts, strict=True)]
    return row_prefixes(cache, starts, keep)
