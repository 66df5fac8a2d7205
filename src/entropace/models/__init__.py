"""Model loading: Hugging Face causal LMs, the embedded SmolLM2-135M default, a tiny test model.

* :func:`load_model` - any causal LM by hub id, local path or alias (``"smollm2-135m"``),
  optionally with LoRA adapters.
* :func:`entropace.models.tiny.build_tiny_model` - a tiny random Llama with an offline ChatML
  tokenizer, for tests and smoke runs.
* :mod:`entropace.models.compat` - what differs between transformers versions (the cache
  keyword, ``logits_to_keep``, checkpoints saved by a newer transformers), read from the
  installed one's code.
"""

from __future__ import annotations

from entropace._lazy import lazy_getattr

_EXPORTS: dict[str, str] = {
    "load_model": "loading",
    "apply_lora": "loading",
    "prepare_tokenizer": "loading",
    "resolve_dtype": "loading",
    "ALIASES": "loading",
    "DEFAULT_MODEL": "loading",
    "build_tiny_model": "tiny",
    "build_tiny_tokenizer": "tiny",
    "ensure_smollm2": "smollm2",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_getattr(__name__, _EXPORTS)
