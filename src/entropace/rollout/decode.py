"""The rollout's decoding loop: ``generate``'s sampling, without a host synchronisation per step.

:func:`decode` computes what ``model.generate`` computes for the engine (same forwards on the
same ids, mask and positions, the same temperature / top-p warpers from transformers, the same
``torch.multinomial`` draws from the global RNG, finished rows padded), with three differences
in how the work reaches the device:

* **no host-device synchronisation per step**: the tokens go into a preallocated ``[B, N]``
  device buffer, the finished-row flags and each row's stop step stay on the device, the
  statistics recorder keeps its columns there; the host reads whether every row has stopped
  only every ``check_every`` steps (1 on the CPU, where reading costs nothing;
  :data:`STOP_CHECK_EVERY` on an accelerator, so the host queues that many steps ahead). A loop
  that ran past the step where the last row stopped (at most ``check_every - 1`` steps) is
  undone: the surplus tokens are dropped, the cache cut back to the columns ``generate`` would
  hold, and the RNG set back to its state after that step (the states of the current window
  are kept), so the results do not depend on ``check_every``. The Python work of a step does
  not depend on the batch size.
* **a fixed-shape path** (``static=True``, ``rollout.cache=static``): the cache is made of
  :class:`~entropace.rollout.kvcache.FixedLayer` s of ``W + max_new_tokens`` columns written
  at a device-side cursor, and the model gets a 4D boolean attention mask built here, so every
  decoding step has identical shapes and no host value; on CUDA (``cuda_graph=True``,
  ``rollout.cuda_graph``) one step's forward is captured once per call as a CUDA graph and
  replayed (falling back to eager steps, with a warning, if the capture fails).
* the dynamic path (the default) hands the model the 2D attention mask, exactly as
  ``generate`` does, so on the CPU its tokens are ``generate``'s bit for bit
  (``tests/test_decode.py``); the static path gives the same tokens and statistics to float
  round-off of the longer masked attention (tested equal on the CPU in float32).

Memory of one call: the cache, ``b * (W + N) * layers * 2 * H_kv * D`` elements either way
(the dynamic path reserves the same columns, :class:`~entropace.rollout.kvcache.GrowingLayer`),
plus ``[b, V]`` float32 logits of one step and ``[b, N]`` tokens: linear in the batch and in
the episode's length, nothing that grows with the number of steps but the tokens (and the
recorder's ``[b, 5]`` per step).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from entropace.models.compat import cache_kwarg, takes_logits_to_keep

#: Decoding steps between two reads of "has every row stopped?" on an accelerator ...
STOP_CHECK_EVERY = 16
#: ... and on the CPU (a read costs nothing there; steps past the end would).
CPU_CHECK_EVERY = 1

__all__ = ["CPU_CHECK_EVERY", "STOP_CHECK_EVERY", "cache_kwargs", "decode", "sampling_warpers"]


def cache_kwargs(model: Any, cache: Any) -> dict[str, Any]:
    """The keyword argument that hands ``cache`` to ``model``'s forward (the installed
    transformers' name for it: :func:`entropace.models.compat.cache_kwarg`)."""
    return {cache_kwarg(model): cache}


def sampling_warpers(
    temperature: float, top_p: float, do_sample: bool
) -> list[Callable[[Tensor, Tensor], Tensor]]:
    """The warpers ``generate`` applies for this sampling setting, in its order: transformers'
    own ``TemperatureLogitsWarper`` (when ``T != 1``) then ``TopPLogitsWarper`` (when
    ``top_p < 1``); none for greedy decoding (argmax is invariant to both)."""
    if not do_sample:
        return []
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    warpers: list[Callable[[Tensor, Tensor], Tensor]] = []
    if float(temperature) != 1.0:
        warpers.append(TemperatureLogitsWarper(float(temperature)))
    if float(top_p) < 1.0:
        warpers.append(TopPLogitsWarper(float(top_p)))
    return warpers


def _generator(device: torch.device) -> torch.Generator:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]
    return torch.default_generator


def _mask_4d(mask: Tensor, first: int, queries: int) -> Tensor:
    """``[B, 1, q, K]`` boolean: query ``i`` (column ``first + i``) sees the real columns
    ``j <= first + i`` of the 2D ``mask`` ``[B, K]``."""
    cols = torch.arange(mask.shape[1], device=mask.device)
    rows = first + torch.arange(queries, device=mask.device)
    return mask.bool()[:, None, None, :] & (cols[None, :] <= rows[:, None])[None, None]


class _Step:
    """One decoding step's forward of the fixed-shape path, optionally as a CUDA graph."""

    def __init__(
        self, model: Any, cache: Any, ids: Tensor, pos: Tensor, mask: Tensor, keep: dict[str, int]
    ) -> None:
        self.model, self.cache, self.keep = model, cache, keep
        self.cache_kw = cache_kwargs(model, cache)  # read once: not a per-step lookup
        self.ids, self.pos, self.mask = ids, pos, mask
        self.graph: Any = None
        self.logits: Tensor | None = None

    def eager(self) -> Tensor:
        return self.model(
            input_ids=self.ids, attention_mask=self.mask, position_ids=self.pos,
            use_cache=True, **self.keep, **self.cache_kw,
        ).logits[:, -1]  # fmt: skip

    def capture(self) -> None:
        """Record one step as a CUDA graph (its inputs are the buffers it was built with)."""
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.logits = self.eager()
            self.graph = graph
        except Exception as exc:  # an op the capture does not allow: stay eager
            self.graph = None
            warnings.warn(
                f"rollout.cuda_graph: capturing a decoding step failed ({exc!r}); decoding "
                "without CUDA graphs",
                RuntimeWarning,
                stacklevel=3,
            )

    def __call__(self) -> Tensor:
        if self.graph is None:
            return self.eager()
        self.graph.replay()
        assert self.logits is not None
        return self.logits


def decode(
    model: Any,
    input_ids: Tensor,
    attention_mask: Tensor,
    cache: Any,
    *,
    cached: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    do_sample: bool,
    stop_ids: Sequence[int],
    pad_id: int,
    recorder: Any = None,
    cursor: Tensor | None = None,
    cuda_graph: bool = False,
    check_every: int | None = None,
) -> Tensor:
    """Sample up to ``max_new_tokens`` tokens after each row of the left-padded batch.

    Args:
        input_ids, attention_mask: ``[B, W]`` (left padding).
        cache: a cache whose first ``cached`` columns hold the keys/values of the first
            ``cached`` columns of ``input_ids`` (:func:`entropace.rollout.kvcache.batch_cache`);
            the loop prefills the other ``W - cached`` columns and appends one per step. After
            the call it holds every column but the last generated one (as after ``generate``).
        stop_ids: a row stops after generating one of them (later tokens of the row: ``pad_id``).
        recorder: optional :class:`~entropace.rollout.gen_stats.GenerationRecorder`; gets
            every step's raw logits and sampled tokens.
        cursor: the device tensor ``[1]`` of a fixed-shape cache (``batch_cache(...,
            cursor=)``): the static path (module docstring). ``None``: the dynamic path.
        cuda_graph: replay one captured step (static path on CUDA only).
        check_every: steps between two host reads of the stop flags (default 1 on the CPU,
            :data:`STOP_CHECK_EVERY` elsewhere); the results do not depend on it.

    Returns:
        ``[B, n]`` generated ids on the CPU (``n`` = the steps ``generate`` would take: until
        every row stopped, at most ``max_new_tokens``).
    """
    device = input_ids.device
    batch, width = input_ids.shape
    total = width + max_new_tokens
    every = check_every or (CPU_CHECK_EVERY if device.type == "cpu" else STOP_CHECK_EVERY)
    static = cursor is not None
    warpers = sampling_warpers(temperature, top_p, do_sample)
    stops = torch.tensor(sorted(stop_ids), dtype=torch.long, device=device)
    pad = torch.tensor(pad_id, dtype=torch.long, device=device)
    # 2D mask of the whole call: generated columns count as real for every row (as generate)
    mask = torch.ones((batch, total), dtype=attention_mask.dtype, device=device)
    mask[:, :width] = attention_mask
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    tokens = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
    unfinished = torch.ones(batch, dtype=torch.bool, device=device)
    stopped_at = torch.full((batch,), max_new_tokens, dtype=torch.long, device=device)
    generator = _generator(device)
    states: list[Tensor] = []  # RNG state after each step of the current window

    def sample(logits: Tensor, step: int) -> Tensor:
        """Step ``step`` (0-based): the token of every row, bookkeeping on the device."""
        nonlocal unfinished
        logits = logits.to(dtype=torch.float32, copy=True)
        scores = logits
        for warp in warpers:
            scores = warp(tokens, scores)  # transformers' warpers ignore the ids
        if do_sample:
            chosen = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
        else:
            chosen = torch.argmax(scores, dim=-1)
        chosen = torch.where(unfinished, chosen, pad)
        if recorder is not None:
            recorder.record(logits, chosen)
        tokens[:, step] = chosen
        ends = unfinished & torch.isin(chosen, stops)
        stopped_at.masked_fill_(ends, step + 1)
        unfinished = unfinished & ~ends
        if every > 1:
            states.append(generator.get_state())
        return chosen

    # Prefill the uncached columns.
    if static:
        assert cursor is not None
        cursor.fill_(cached)
        prefill_mask = _mask_4d(mask, cached, width - cached)  # causal: nothing past width
    else:
        prefill_mask = _mask_4d(mask[:, :width], cached, width - cached)
    keep = {"logits_to_keep": 1} if takes_logits_to_keep(model) else {}
    cache_kw = cache_kwargs(model, cache)  # read once per call
    logits = model(
        input_ids=input_ids[:, cached:], attention_mask=prefill_mask,
        position_ids=position_ids[:, cached:], use_cache=True, **keep, **cache_kw,
    ).logits[:, -1]  # fmt: skip
    chosen = sample(logits, 0)
    steps = 1
    if max_new_tokens > 1 and (every > 1 or bool(unfinished.any())):
        ids = chosen[:, None].clone()
        pos = position_ids[:, -1:].clone()
        step_fn: Callable[[], Tensor]
        if static:
            assert cursor is not None
            # column j visible to the query at column c: real and j <= c; columns not yet
            # written are 0 here and become 1 as the loop reaches them
            live = mask.bool().clone()
            live[:, width:] = False
            mask4 = live[:, None, None, :]
            fixed = _Step(model, cache, ids, pos, mask4, keep)
            step_fn = fixed
        else:
            step_fn = None  # type: ignore[assignment]
            visible = mask.bool()[:, None, None, :]  # a 4D mask: no padding check per step
        for step in range(1, max_new_tokens):
            column = width + step - 1  # where the previous token goes
            pos.add_(1)
            if static:
                cursor.fill_(column)
                live[:, column] = True
                if step == 2 and cuda_graph and device.type == "cuda":
                    fixed.capture()
                logits = step_fn()
            else:
                logits = model(
                    input_ids=ids, attention_mask=visible[:, :, :, : column + 1], position_ids=pos,
                    use_cache=True, **keep, **cache_kw,
                ).logits[:, -1]  # fmt: skip
            chosen = sample(logits, step)
            ids.copy_(chosen[:, None])
            steps = step + 1
            if steps % every == 0 or steps == max_new_tokens:
                if not bool(unfinished.any()):
                    break
                states.clear()
    # One read: where the last row stopped; undo the steps run past it.
    done = min(max(int(stopped_at.max()), 1), steps)
    if done < steps:
        generator.set_state(states[done - 1 - (steps - len(states))])
        if recorder is not None:
            recorder.truncate(done)
    for layer in getattr(cache, "layers", []):
        if static:
            layer.settle(width + done - 1)
        elif layer.keys is not None and layer.keys.shape[-2] > width + done - 1:
            layer.keys = layer.keys[:, :, : width + done - 1]
            layer.values = layer.values[:, :, : width + done - 1]
    return tokens[:, :done].cpu()
