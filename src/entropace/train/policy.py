"""The policy model a training config names (``model`` section): built on its device, with
LoRA adapters when asked (the trainer, the async worker, ``entropace eval`` and the warm start
all build it here)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from entropace.train.schema import ConfigError

__all__ = ["MODEL_LOADERS", "build_model", "lora_options", "resolve_device"]


def resolve_device(name: str) -> str:
    """``auto`` -> ``cuda`` when available, else ``cpu``; a named device must exist here
    (:class:`ConfigError` naming ``model.device`` and what this machine has)."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(name.split(":")[1]) if ":" in name else 0
        if index >= count:
            raise ConfigError(
                f"model.device={name}: this machine has {count} CUDA device(s)"
                + ("" if count else "; use model.device=cpu or auto")
            )
    if name == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("model.device=mps: MPS is not available here; use cpu or auto")
    return name


def lora_options(cfg: Any) -> dict[str, Any] | None:
    """The LoRA options of the model section ``cfg`` (:func:`entropace.models.apply_lora`), or
    None without ``cfg.lora``."""
    if not cfg.lora:
        return None
    return {
        "r": cfg.lora_r,
        "alpha": cfg.lora_alpha,
        "dropout": cfg.lora_dropout,
        "target_modules": cfg.lora_target_modules,
        "layers": cfg.lora_layers,
    }


def _load_tiny(cfg: Any, device: str) -> tuple[Any, Any]:
    from entropace.models.loading import apply_lora
    from entropace.models.tiny import build_tiny_model

    model, tokenizer = build_tiny_model(seed=0)
    lora = lora_options(cfg)
    if lora is not None:
        model = apply_lora(model, lora)
    return model.to(device), tokenizer


def _load_hf(cfg: Any, device: str) -> tuple[Any, Any]:
    from entropace.models import load_model

    return load_model(cfg.name, dtype=cfg.dtype, device=device, lora=lora_options(cfg))


#: ``model.name`` values with their own loader; any other name goes to
#: :func:`entropace.models.load_model` (hub id, local path, ``smollm2-135m``). ``tiny`` is the
#: random-initialised test model (smoke runs, tests).
MODEL_LOADERS: dict[str, Callable[[Any, str], tuple[Any, Any]]] = {"tiny": _load_tiny}


def build_model(cfg: Any) -> tuple[Any, Any, str]:
    """``(model, tokenizer, device)`` for the model section of the config."""
    from entropace.models.loading import LoraTargetError
    from entropace.train.warm_store import is_adapter_entry, load_adapter_entry

    if is_adapter_entry(cfg.name):  # a LoRA warm start: its base with the adapter merged
        return load_adapter_entry(cfg, build_model, lora_options(cfg))
    device = resolve_device(cfg.device)
    try:
        model, tokenizer = MODEL_LOADERS.get(cfg.name, _load_hf)(cfg, device)
    except LoraTargetError as exc:
        raise ConfigError(
            f"model.lora_target_modules / model.lora_layers of {cfg.name}: {exc}; set "
            "model.lora_target_modules to module names of this model (e.g. [q_proj, k_proj, "
            "v_proj, o_proj]) with model.lora_layers the top fraction of its layers to adapt "
            "(e.g. 0.333), or model.lora_target_modules=all-linear"
        ) from None
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model, tokenizer, device
