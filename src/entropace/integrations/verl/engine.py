"""verl's FSDP language-model engine, also returning PAPO's sensitivity ``S = t2 - t1``.

PAPO needs, for every sampled response token, ``t1 = p_y (H + log p_y)`` and
``t2 = sum_v p_v^2 (H + log p_v)`` of the sampling policy's full next-token distribution
(``docs/ALGORITHMS.md`` section 4). The full-vocabulary logits exist only inside the engine's
``prepare_model_outputs``, so :class:`EntropaceFSDPEngineWithLMHead` (a subclass of verl
0.9.1's ``FSDPEngineWithLMHead``) computes them there, chunk by chunk with
:func:`entropace.algos.token_stats` (``chunk_rows`` rows of ``V`` logits at a time, never a
float32 copy of the whole batch), when the micro-batch asks for it (non-tensor key
``entropace_sensitivity``, set by the entropace trainer on the old-log-prob pass only), and
returns ``model_output["entropace_sensitivity"]`` laid out like ``log_probs`` (nested, one value
per position, the statistic of the distribution that predicted the next token).

Without the key, the engine is verl's, unchanged. :func:`register_engine` registers it for
``model_type="language_model"``, backends ``fsdp`` / ``fsdp2``, ``device="cuda"``,
``vendor="nvidia"`` (verl looks up ``(device, vendor)`` before ``device``), so that on NVIDIA
GPUs verl builds this class; nothing registers it on ``import verl``: the entropace trainer's
actor workers call it in their own processes, and a user composing another trainer calls it
explicitly (in the processes that build the engine). Supported layout: ``use_remove_padding=True`` without fused kernels
(verl's recommended FSDP setting), Ulysses sequence parallelism included; anything else raises
a clear error when PAPO asks for the sensitivity.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

from entropace.algos import token_stats

__all__ = [
    "FLAG",
    "EntropaceFSDPEngineWithLMHead",
    "register_engine",
    "sensitivity_from_logits",
]

#: Non-tensor micro-batch key asking the engine for the sensitivity (and output key).
FLAG = "entropace_sensitivity"
DEFAULT_CHUNK_ROWS = 1024


def sensitivity_from_logits(
    logits: Tensor, labels: Tensor, temperature: Tensor, *, chunk_rows: int = DEFAULT_CHUNK_ROWS
) -> Tensor:
    """``S = t2 - t1`` of each row of ``logits / temperature`` at token ``labels``.

    Args:
        logits: ``[N, V]`` (any float dtype; each chunk is computed in float32).
        labels: ``[N]`` the token that follows each position.
        temperature: ``[N]`` (or broadcastable) sampling temperature of each row.
        chunk_rows: rows per chunk; the result does not depend on it.

    Returns:
        ``[N]`` float32, detached.
    """
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(
            f"logits must be [N, V] and labels [N]; got {tuple(logits.shape)}, "
            f"{tuple(labels.shape)}"
        )
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    n = logits.shape[0]
    temp = torch.as_tensor(temperature, device=logits.device).to(torch.float32).expand(n)
    out = torch.empty(n, dtype=torch.float32, device=logits.device)
    with torch.no_grad():
        for start in range(0, n, chunk_rows):
            stop = min(start + chunk_rows, n)
            chunk = logits[start:stop].float() / temp[start:stop, None].clamp_min(1e-8)
            stats = token_stats(chunk, labels[start:stop].long(), chunk_size=chunk_rows)
            out[start:stop] = (stats.t2 - stats.t1).float()
    return out


class _SensitivityMixin:
    """Adds :data:`FLAG` to ``prepare_model_outputs`` (see the module docstring)."""

    entropace_chunk_rows: int = DEFAULT_CHUNK_ROWS

    def _entropace_sensitivity(
        self, output: Any, output_args: dict[str, Any], micro_batch: Any
    ) -> Tensor:
        from verl.utils import tensordict_utils as tu

        use_remove_padding = tu.get_non_tensor_data(
            data=micro_batch, key="use_remove_padding", default=True
        )
        use_fused = tu.get_non_tensor_data(data=micro_batch, key="use_fused_kernels", default=False)
        if not use_remove_padding or use_fused or getattr(output, "logits", None) is None:
            raise NotImplementedError(
                "entropace PAPO sensitivity needs actor_rollout_ref.model.use_remove_padding=True "
                "and use_fused_kernels=False (the full logits must be materialised)"
            )
        logits = output.logits.squeeze(0)
        try:
            from torch.distributed.tensor import DTensor

            if isinstance(logits, DTensor):
                logits = logits.full_tensor()
        except ImportError:  # pragma: no cover - torch without DTensor
            pass
        labels = output_args["input_ids_rmpad_rolled"]
        temperature = output_args["temperature_rmpad"]
        sens = sensitivity_from_logits(
            logits, labels, temperature, chunk_rows=int(self.entropace_chunk_rows)
        )
        sens = self._gather_and_unpad_packed(sens, output_args["pad_size"])  # type: ignore[attr-defined]
        cu_seqlens = micro_batch["input_ids"].offsets()
        return torch.nested.nested_tensor_from_jagged(sens, cu_seqlens)

    def prepare_model_outputs(
        self, output: Any, output_args: Any, micro_batch: Any, logits_processor_func: Any
    ) -> dict[str, Any]:
        from verl.utils import tensordict_utils as tu

        wanted = bool(tu.get_non_tensor_data(data=micro_batch, key=FLAG, default=False))
        # before verl's own pass: it may consume the logits (in-place backward kernels)
        sens = self._entropace_sensitivity(output, output_args, micro_batch) if wanted else None
        model_output = super().prepare_model_outputs(  # type: ignore[misc]
            output, output_args, micro_batch, logits_processor_func
        )
        if sens is not None:
            model_output[FLAG] = sens
        return model_output


class EntropaceFSDPEngineWithLMHead(_SensitivityMixin, FSDPEngineWithLMHead):
    """verl's ``FSDPEngineWithLMHead`` that also returns :data:`FLAG` when asked."""


def register_engine() -> list[str]:
    """Register the engine with verl's ``EngineRegistry`` for NVIDIA GPUs (idempotent)."""
    from verl.workers.engine import EngineRegistry

    cls = EntropaceFSDPEngineWithLMHead
    names = []
    for backend in ("fsdp", "fsdp2"):
        slot = EngineRegistry._engines.setdefault("language_model", {}).setdefault(backend, {})
        if slot.get(("cuda", "nvidia")) is not cls:
            EngineRegistry.register(
                model_type="language_model", backend=backend, device="cuda", vendor="nvidia"
            )(cls)
        names.append(f"language_model/{backend}/cuda/nvidia")
    return names
