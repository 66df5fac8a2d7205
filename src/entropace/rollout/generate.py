"""One batched generation step: every live episode's next assistant turn in one ``generate``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

OOM_HINT = (
    "out of memory while {what}. Lower rollout.max_new_tokens_per_turn or "
    "rollout.max_episode_tokens, the prompts per task or the group size (fewer episodes per "
    "step), rollout.generation_batch_size (episodes per generate call) or "
    "rollout.micro_batch_size (trajectories per statistics forward pass)."
)


def is_oom(exc: BaseException) -> bool:
    """True for CUDA/MPS/CPU out-of-memory errors."""
    oom_type = getattr(torch, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int, device: Any) -> tuple[Tensor, Tensor]:
    """``[b, L]`` ids and attention mask, each sequence right-aligned (left padding)."""
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, length - len(seq) :] = torch.tensor(list(seq), dtype=torch.long)
            mask[row, length - len(seq) :] = 1
    return ids.to(device), mask.to(device)


def generation_config(
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    do_sample: bool,
    stop_ids: Sequence[int],
    pad_id: int,
    user_cache: bool = False,
) -> Any:
    """A fresh ``GenerationConfig`` sampling from temperature + top-p only.

    Every processor that transformers would otherwise take from the checkpoint's
    ``generation_config.json`` or its global defaults (top-k 50, repetition penalty, ...) is set
    to its neutral value, so the sampling distribution is exactly the one the statistics pass
    describes (up to top-p). A new object per call: nothing about the batch is cached.
    ``user_cache``: the caller passes its own cache (then no ``cache_implementation``).
    """
    from transformers import GenerationConfig

    sampling: dict[str, Any] = (
        {"do_sample": True, "temperature": float(temperature), "top_p": float(top_p)}
        if do_sample
        else {"do_sample": False, "temperature": None, "top_p": None}
    )
    return GenerationConfig(
        max_new_tokens=int(max_new_tokens),
        min_new_tokens=0,
        top_k=0 if do_sample else None,
        min_p=None,
        typical_p=1.0,
        epsilon_cutoff=0.0,
        eta_cutoff=0.0,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        num_beams=1,
        num_return_sequences=1,
        eos_token_id=sorted(stop_ids),
        pad_token_id=int(pad_id),
        use_cache=True,
        cache_implementation=None if user_cache else "dynamic",
        **sampling,
    )


def generate_turn(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    do_sample: bool,
    stop_ids: Sequence[int],
    pad_id: int,
    cache: Any = None,
    recorder: Any = None,
    cursor: Tensor | None = None,
    static: bool = False,
    cuda_graph: bool = False,
) -> list[list[int]]:
    """Sample one continuation per prompt, in one batched decoding loop
    (:func:`entropace.rollout.decode.decode`: ``model.generate``'s sampling without a host
    synchronisation per step).

    Args:
        prompts: token ids of every live episode (lengths differ; left-padded here).
        max_new_tokens: budget of this call (the largest budget among the episodes; callers
            cut each continuation to its own budget).
        stop_ids: end-of-turn token ids; a row stops after generating one of them.
        cache: optional cache whose ``C`` columns hold the keys/values of the first ``C``
            columns of the left-padded prompts (:func:`entropace.rollout.kvcache.batch_cache`,
            built with ``cursor`` for the static path); only the remaining columns are
            prefilled and the cache grows in place (afterwards it holds every column but the
            last generated one). ``None``: an empty one is made here.
        recorder: optional :class:`entropace.rollout.gen_stats.GenerationRecorder` (every
            step's logits and tokens).
        cursor: the device cursor ``cache`` was built with (the static path).
        static: without ``cache``: decode on a fixed-shape cache (``rollout.cache=static``).
        cuda_graph: replay each decoding step as a CUDA graph (static path, CUDA only).

    Returns:
        The generated ids of each prompt, cut after the first stop token (inclusive) and
        without padding.
    """
    from entropace.rollout.decode import decode
    from entropace.rollout.kvcache import batch_cache

    if not prompts:
        return []
    device = next(model.parameters()).device
    input_ids, attention_mask = left_pad(prompts, pad_id, device)
    if cache is None:
        if static:
            cursor = torch.zeros(1, dtype=torch.long, device=device)
        width = input_ids.shape[1] + max_new_tokens
        cache = batch_cache([None] * len(prompts), [0] * len(prompts), 0, width, cursor)
    try:
        with torch.no_grad():
            new_ids = decode(
                model, input_ids, attention_mask, cache,
                cached=int(cache.get_seq_length()), max_new_tokens=max_new_tokens,
                temperature=temperature, top_p=top_p, do_sample=do_sample,
                stop_ids=stop_ids, pad_id=pad_id, recorder=recorder, cursor=cursor,
                cuda_graph=cuda_graph,
            )  # fmt: skip
    except Exception as exc:
        if is_oom(exc):
            raise RuntimeError(
                OOM_HINT.format(what=f"generating a turn for {len(prompts)} episodes")
            ) from exc
        raise
    stops = set(stop_ids)
    result: list[list[int]] = []
    for row in new_ids.tolist():
        cut = next((i + 1 for i, tok in enumerate(row) if tok in stops), len(row))
        result.append(row[:cut])
    return result
