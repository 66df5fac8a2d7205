"""The statistics EPPO and PAPO need from a TRL generation batch, without full logits.

TRL 1.16 computes log-probs and entropies through a fused LM head that never builds the logits,
and it never computes PAPO's ``t2 = sum_v p_v^2 (H + log p_v)``. :func:`completion_token_stats`
runs one no-grad pass of the policy over the batch (``batch_size`` rows per forward, like TRL's
own old-policy pass): the backbone gives the hidden states of the completion positions, and the
LM head is applied to at most ``chunk_size`` masked positions at a time, each chunk going
through :func:`entropace.algos.token_stats` at the sampling temperature. Peak extra memory is
one ``[chunk_size, V]`` logits chunk plus ``token_stats``' float32 work buffers; no
``[B, T, V]`` tensor (fp32 or otherwise) is ever built.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import LogitsProcessor

from entropace.algos import hidden_token_stats, token_stats
from entropace.algos.token_stats import default_chunk_size

__all__ = [
    "CompletionStats",
    "GenerationStats",
    "align_generation_stats",
    "completion_token_stats",
    "rows_to_tensor",
]


@dataclass(frozen=True)
class CompletionStats:
    """Per completion token, ``[B, C]`` float32, 0 outside the mask.

    Attributes:
        logprob: ``log p_y`` at the sampling temperature.
        entropy: ``H`` of the next-token distribution at the sampling temperature.
        sensitivity: PAPO's ``S = t2 - t1``.
    """

    logprob: Tensor
    entropy: Tensor
    sensitivity: Tensor


def _logit_transform(model: torch.nn.Module) -> tuple[float, float | None]:
    """``(logit_scale, final_logit_softcapping)`` of the model's text config, as TRL's fused
    head applies them (scale, then ``cap * tanh(x / cap)``, then the temperature)."""
    config = model.config.get_text_config()
    for attr in ("output_multiplier", "lm_head_multiplier", "logits_scaling"):
        if getattr(config, attr, None) is not None:
            raise NotImplementedError(
                f"entropace's statistics pass does not support models with {attr} "
                f"({config.model_type}); use a model without logit scaling"
            )
    scale = getattr(config, "logit_scale", None)
    return (1.0 if scale is None else float(scale)), getattr(
        config, "final_logit_softcapping", None
    )


def _backbone_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The transformer body (returns ``last_hidden_state``) and the LM head of a causal LM,
    looked up through PEFT and accelerate wrappers."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = inner.get_output_embeddings()
    backbone = inner.base_model
    if head is None or backbone is inner:
        raise TypeError(
            f"{type(inner).__name__} has no separate backbone and LM head; entropace's TRL "
            "integration needs a causal LM (a *ForCausalLM model)"
        )
    return backbone, head


@torch.no_grad()
def completion_token_stats(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    completion_mask: Tensor,
    *,
    temperature: float,
    batch_size: int | None = None,
    chunk_size: int | None = None,
    autocast: object | None = None,
) -> CompletionStats:
    """Statistics of the completion tokens of a TRL batch under ``model`` (no grad).

    Args:
        model: the policy (a causal LM, possibly PEFT-wrapped).
        input_ids: ``[B, P + C]`` left-padded prompts then right-padded completions (TRL's
            ``prompt_completion_ids``).
        attention_mask: ``[B, P + C]``.
        completion_mask: ``[B, C]`` 1 on the completion tokens to score (TRL's loss mask:
            ``completion_mask * tool_mask``).
        temperature: the sampling temperature.
        batch_size: rows per forward pass (None: all).
        chunk_size: masked positions per LM-head chunk (None: the head kernel's default).
        autocast: a context manager factory for the forward (e.g. ``accelerator.autocast``).

    Returns:
        :class:`CompletionStats` ``[B, C]``, exactly 0 where ``completion_mask`` is 0. The
        token at column ``c`` is ``input_ids[:, P + c]``, scored from position ``P + c - 1``,
        the alignment of TRL's own log-probs.
    """
    rows, completion_len = completion_mask.shape
    if input_ids.shape[0] != rows or input_ids.shape[1] <= completion_len:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} must hold the prompts and the "
            f"{completion_len} completion columns of completion_mask"
        )
    backbone, head = _backbone_and_head(model)
    scale, softcap = _logit_transform(model)
    vocab = head.weight.shape[0]
    chunk = chunk_size or default_chunk_size(vocab, head.weight.device)
    plain = type(head) is torch.nn.Linear and scale == 1.0 and softcap is None
    out = [torch.zeros(rows, completion_len, dtype=torch.float32, device=input_ids.device)]
    out += [torch.zeros_like(out[0]) for _ in range(2)]
    step = batch_size or rows
    completion_ids = input_ids[:, -completion_len:]
    for start in range(0, rows, step):
        end = min(start + step, rows)
        mask = completion_mask[start:end] > 0
        if not bool(mask.any()):
            continue
        ctx = autocast() if autocast is not None else torch.autocast("cpu", enabled=False)
        with ctx:  # type: ignore[attr-defined]
            hidden = backbone(
                input_ids=input_ids[start:end],
                attention_mask=attention_mask[start:end],
                use_cache=False,
            ).last_hidden_state
        states = hidden[:, -completion_len - 1 : -1][mask]  # [n, d], predicting each token
        tokens = completion_ids[start:end][mask]
        states = states.to(head.weight.dtype)
        if plain:  # the LM head fused with the statistics (entropace.algos.hidden_token_stats)
            stats = hidden_token_stats(
                states, head.weight, tokens, bias=head.bias, temperature=temperature,
                chunk_size=chunk_size,
            )  # fmt: skip
            parts = [[stats.logprob], [stats.entropy], [stats.sensitivity]]
        else:  # scaled / soft-capped logits or a wrapped head: one logits chunk at a time
            parts = [[], [], []]
            for first in range(0, tokens.shape[0], chunk):
                logits = head(states[first : first + chunk])
                if scale != 1.0:
                    logits = logits * scale
                if softcap is not None:
                    logits = softcap * torch.tanh(logits / softcap)
                stats = token_stats(logits, tokens[first : first + chunk], temperature=temperature)
                parts[0].append(stats.logprob)
                parts[1].append(stats.entropy)
                parts[2].append(stats.sensitivity)
        for tensor, values in zip(out, parts, strict=True):
            tensor[start:end][mask] = torch.cat(values).to(torch.float32)
    return CompletionStats(logprob=out[0], entropy=out[1], sensitivity=out[2])


# ---------------------------------------------------------------------------------------------
# The same statistics collected while sampling (no extra forward pass)
# ---------------------------------------------------------------------------------------------


class GenerationStats(LogitsProcessor):
    """A ``transformers`` logits processor that records the statistics of every sampled token.

    ``generate`` calls it once per decoding step with that step's scores ``[B, V]`` (float32,
    the model's final logits after the non-sampling processors such as a repetition penalty;
    custom processors run before the temperature / top-k / top-p warpers). The token sampled
    from them is known at the next call (the last column of ``input_ids``) or, for the last
    step, from the returned sequences (:meth:`finish`). Scores wait (copied) until their token
    is known and at most ``buffer_bytes`` of them are pending, then go through
    :func:`entropace.algos.token_stats` together at the sampling temperature: the statistics of
    the full temperature-scaled distribution that was sampled (as our rollout engine records
    them). The scores pass through unchanged.
    """

    def __init__(self, temperature: float, *, buffer_bytes: int = 16 * 2**20) -> None:
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.temperature = float(temperature)
        self.buffer_bytes = int(buffer_bytes)
        self._scores: list[Tensor] = []  # steps whose token is not known yet, or not computed
        self._tokens: list[Tensor] = []  # the sampled tokens of the first len(_tokens) steps
        self._columns: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
        self.calls = 0

    def _flush(self) -> None:
        """Statistics of every pending step whose token is known, in one ``token_stats`` call."""
        n = len(self._tokens)
        if n == 0:
            return
        scores = torch.stack(self._scores[:n], dim=1)  # [B, n, V]
        tokens = torch.stack(self._tokens, dim=1).to(torch.long)  # [B, n]
        stats = token_stats(scores, tokens, temperature=self.temperature)
        for j in range(n):
            self._columns.append(
                (tokens[:, j], stats.logprob[:, j], stats.entropy[:, j], stats.sensitivity[:, j])
            )
        del self._scores[:n]
        self._tokens = []

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        with torch.no_grad():
            if self._scores:
                self._tokens.append(input_ids[:, -1].clone())
                pending = sum(x.numel() * x.element_size() for x in self._scores)
                if pending >= self.buffer_bytes:
                    self._flush()
            self._scores.append(scores.detach().clone())
        self.calls += 1
        return scores

    def finish(self, sequences: Tensor) -> None:
        """Close the last step with the returned ``sequences`` (``[B, P + T]``) and compute
        every pending step."""
        with torch.no_grad():
            if len(self._scores) > len(self._tokens):
                self._tokens.append(sequences[:, -1].clone())
            self._flush()

    def result(self) -> tuple[Tensor, CompletionStats] | None:
        """``(tokens [B, T], stats [B, T])`` of the generated columns, or None if nothing ran."""
        if not self._columns:
            return None
        tokens, logprob, entropy, sensitivity = (torch.stack(c, dim=1) for c in zip(*self._columns))
        stats = CompletionStats(
            logprob=logprob.float(), entropy=entropy.float(), sensitivity=sensitivity.float()
        )
        return tokens, stats


def align_generation_stats(
    collected: tuple[Tensor, CompletionStats], completion_ids: Tensor, mask: Tensor
) -> CompletionStats | None:
    """Collected statistics as ``[B, C]`` columns of TRL's padded completions, 0 off ``mask``;
    None when the collected tokens are not the completions' (then use the forward pass)."""
    tokens, stats = collected
    rows, width = completion_ids.shape
    if tokens.shape[0] != rows:
        return None
    used = min(width, tokens.shape[1])
    keep = mask[:, :used] > 0
    if bool((mask[:, used:] > 0).any()) or not torch.equal(
        tokens[:, :used].to(completion_ids.device)[keep], completion_ids[:, :used][keep]
    ):
        return None
    out = []
    for values in (stats.logprob, stats.entropy, stats.sensitivity):
        full = torch.zeros(rows, width, dtype=torch.float32, device=mask.device)
        full[:, :used] = torch.where(keep, values[:, :used].to(mask.device), 0.0)
        out.append(full)
    return CompletionStats(logprob=out[0], entropy=out[1], sensitivity=out[2])


def rows_to_tensor(rows: list[list[float]], mask: Tensor) -> Tensor:
    """Per-token values of each completion (lists, e.g. from a ``rollout_func``) as a
    ``[B, C]`` float32 tensor shaped like ``mask`` (right-padded), 0 off the mask."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    for i, values in enumerate(rows):
        row = torch.tensor(values[: mask.shape[1]], dtype=torch.float32)
        out[i, : row.numel()] = row.to(mask.device)
    return torch.where(mask > 0, out, 0.0)
