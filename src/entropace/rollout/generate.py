"""One batched generation step: every live episode's next assistant turn in one ``generate``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from entropace.models.compat import cache_kwarg

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
) -> list[list[int]]:
    """Sample one continuation per prompt, in one batched ``model.generate`` call.

    Args:
        prompts: token ids of every live episode (lengths differ; left-padded here).
        max_new_tokens: budget of this call (the largest budget among the episodes; callers
            cut each continuation to its own budget).
        stop_ids: end-of-turn token ids; a row stops after generating one of them.
        cache: optional ``DynamicCache`` whose ``C`` columns hold the keys/values of the first
            ``C`` columns of the left-padded prompts (:func:`entropace.rollout.kvcache.batch_cache`);
            ``generate`` then prefills only the remaining columns and grows the cache in place
            (afterwards it holds every column but the last generated one).
        recorder: optional :class:`entropace.rollout.gen_stats.GenerationRecorder`, run as
            ``generate``'s logits processor (and closed with the returned sequences).

    Returns:
        The generated ids of each prompt, cut after the first stop token (inclusive) and
        without padding.
    """
    if not prompts:
        return []
    device = next(model.parameters()).device
    input_ids, attention_mask = left_pad(prompts, pad_id, device)
    config = generation_config(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        do_sample=do_sample,
        stop_ids=stop_ids,
        pad_id=pad_id,
        user_cache=cache is not None,
    )
    extra: dict[str, Any] = {cache_kwarg(model): cache} if cache is not None else {}
    if recorder is not None:
        from transformers import LogitsProcessorList

        extra["logits_processor"] = LogitsProcessorList([recorder])
    try:
        with torch.no_grad():
            output = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=config,
                **extra,
            )
    except Exception as exc:
        if is_oom(exc):
            raise RuntimeError(
                OOM_HINT.format(what=f"generating a turn for {len(prompts)} episodes")
            ) from exc
        raise
    if not isinstance(output, Tensor):
        output = output.sequences
    if recorder is not None:
        recorder.finish(output)
    new = output[:, input_ids.shape[1] :].tolist()
    stops = set(stop_ids)
    result: list[list[int]] = []
    for row in new:
        cut = next((i + 1 for i, tok in enumerate(row) if tok in stops), len(row))
        result.append(row[:cut])
    return result
