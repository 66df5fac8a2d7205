"""Activation memory of the update: recompute parts of each decoder layer in the backward pass.

Both are exact: ``torch.utils.checkpoint`` (non-reentrant) reruns the same kernels on the same
inputs, so values and gradients are bitwise those of the plain pass. Both leave attention and
its key/value cache alone, so the shared-prefix path (``ppo.share_prefix``) stays on (HF's
``model.gradient_checkpointing`` recomputes whole layers and turns the cache off). The module
tree and the ``state_dict`` are unchanged (each instance's ``forward`` is wrapped), and the
wrapping only acts in training mode with gradients on (generation and no-grad passes run the
plain forward).

* :func:`checkpoint_mlps` (``ppo.checkpoint_mlp``): the MLP's four ``[tokens, d_ff]`` tensors.
* :func:`checkpoint_norms` (``ppo.checkpoint_norms``): the RMSNorms' normalised
  intermediates ``x * rsqrt(mean(x^2) + eps)`` (one ``[tokens, d]`` per norm, two per layer
  plus the final norm), which the plain pass keeps besides the norm's input and the output
  that the next projection keeps anyway. Measured on SmolLM2-135M (one 1,404-token row,
  forward + backward, live tensors at the peak by the op that made them): the RMSNorms'
  products (intermediates and outputs) were 373 of 1,069 MiB; the intermediates are half.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.utils.checkpoint
from torch import Tensor


def _checkpointed(
    forward: Callable[[Tensor], Tensor], module: torch.nn.Module
) -> Callable[[Tensor], Tensor]:
    def run(x: Tensor) -> Tensor:
        if module.training and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(forward, x, use_reentrant=False)
        return forward(x)

    run.entropace_checkpointed = True  # type: ignore[attr-defined]
    return run


def _wrap(modules: list[torch.nn.Module]) -> int:
    """Checkpoint each module's ``forward`` (once: already wrapped ones are left); returns
    ``len(modules)``."""
    for module in modules:
        if not getattr(module.forward, "entropace_checkpointed", False):
            module.forward = _checkpointed(module.forward, module)
    return len(modules)


def checkpoint_mlps(model: torch.nn.Module) -> int:
    """Recompute every decoder layer's MLP in the backward pass instead of keeping its
    activations (``ppo.checkpoint_mlp``); returns the number of MLPs wrapped (idempotent).

    A Llama-style MLP ``down(act(gate(x)) * up(x))`` keeps four ``[tokens, d_ff]`` tensors for
    its backward (``d_ff = 1536`` for SmolLM2-135M: 24 KiB per token and layer in fp32, about
    half of a layer's activations); checkpointed, it keeps only ``x``. Exact: the recompute
    runs the same kernels on the same inputs (``torch.utils.checkpoint``, non-reentrant), so
    values and gradients are bitwise those of the plain pass. Unlike
    ``model.gradient_checkpointing`` (whole layers, which turns the key/value cache off), it
    leaves attention alone, so the shared-prefix path (``ppo.share_prefix``) stays on. Costs
    one more MLP forward per micro-batch (about a quarter of the update's compute). The
    module tree and the ``state_dict`` are unchanged (the instance's ``forward`` is wrapped).

    Raises:
        ValueError: the model has no decoder layer with ``self_attn`` and ``mlp`` submodules.
    """
    mlps = [
        layer.mlp
        for layer in model.modules()
        if isinstance(getattr(layer, "mlp", None), torch.nn.Module) and hasattr(layer, "self_attn")
    ]
    count = _wrap(mlps)
    if count == 0:
        raise ValueError(
            f"ppo.checkpoint_mlp: {type(model).__name__} has no decoder layer with self_attn and "
            "mlp submodules; turn ppo.checkpoint_mlp off (or use model.gradient_checkpointing)"
        )
    return count


def checkpoint_norms(model: torch.nn.Module) -> int:
    """Recompute every RMSNorm (a module whose class name ends in ``RMSNorm``: Llama, Qwen,
    Mistral, SmolLM...) in the backward pass (``ppo.checkpoint_norms``); returns the number
    wrapped (idempotent). Keeps only the norm's input instead of its input and its
    normalised intermediate; the recompute is a few elementwise ops per token.

    Raises:
        ValueError: the model has no RMSNorm module.
    """
    count = _wrap([m for m in model.modules() if type(m).__name__.endswith("RMSNorm")])
    if count == 0:
        raise ValueError(
            f"ppo.checkpoint_norms: {type(model).__name__} has no RMSNorm module; turn "
            "ppo.checkpoint_norms off"
        )
    return count
