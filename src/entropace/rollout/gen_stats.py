"""The sampling statistics taken from generation's own logits (``rollout.stats_from_generation``).

``generate`` computes, at every decoding step, the next-token logits of every live row: the
distribution the token was sampled from. :class:`GenerationRecorder` (a ``transformers`` logits
processor; with the neutral processors of :func:`entropace.rollout.generate.generation_config`
it sees the model's raw logits, before the temperature / top-p warpers) turns them into the
statistics the update needs once the sampled token is known (the next call, or the returned
sequences for the last step; :func:`entropace.rollout.decode.decode` calls :meth:`record` with
both at once): ``logprob``, ``entropy``, ``t1``, ``t2`` of
``softmax(logits / T)`` (ALGORITHMS.md §4, :func:`entropace.algos.token_stats`), so the
rollout needs no second forward pass over the trajectories. One ``[B, V]`` copy is pending at
a time; the ``[B, 5]`` columns stay on the device until :meth:`GenerationRecorder.rows`.

The numbers are the generation forward's: a KV-cached, left-padded, batched computation. In
fp32 they equal the statistics pass's to float round-off (``tests/test_gen_stats.py``: 1e-5);
a bf16 GPU engine drifts further, which is why recomputation
(``rollout.stats_from_generation=false``, the default) stays the reference.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import LogitsProcessor

from entropace.algos.token_stats import TokenStats, token_stats

__all__ = ["GenerationRecorder", "assemble_generation_stats"]


class GenerationRecorder(LogitsProcessor):
    """Statistics of every sampled token of one ``generate`` call, per row.

    Args:
        temperature: the sampling temperature ``T`` (the statistics are those of
            ``softmax(logits / T)``, as the statistics pass computes them).
    """

    def __init__(self, temperature: float) -> None:
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.temperature = float(temperature)
        self._pending: Tensor | None = None  # [B, V] scores whose token is not known yet
        self._columns: list[Tensor] = []  # per step: [B, 5] token, logprob, entropy, t1, t2

    def _close(self, tokens: Tensor) -> None:
        assert self._pending is not None
        self.record(self._pending, tokens)
        self._pending = None

    def record(self, scores: Tensor, tokens: Tensor) -> None:
        """Statistics of one decoding step: ``scores`` ``[B, V]`` (the raw logits) and the
        sampled ``tokens`` ``[B]``. Kept on the scores' device (no host synchronisation per
        step); :meth:`rows` copies them to the CPU once."""
        with torch.no_grad():
            st = token_stats(scores.float()[:, None, :], tokens[:, None].long(),
                             temperature=self.temperature)  # fmt: skip
            fields = (tokens.to(st.logprob.dtype), st.logprob, st.entropy, st.t1, st.t2)
            self._columns.append(torch.stack([f.reshape(-1) for f in fields], dim=1))

    def truncate(self, steps: int) -> None:
        """Forget the steps after the first ``steps`` (a decoding loop that ran past its end)."""
        del self._columns[steps:]

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        with torch.no_grad():
            if self._pending is not None:  # the previous step's token is the last column
                self._close(input_ids[:, -1])
            self._pending = scores.detach().float().clone()
        return scores

    def finish(self, sequences: Tensor) -> None:
        """Close the last step with the returned ``sequences`` (its last column)."""
        with torch.no_grad():
            if self._pending is not None:
                self._close(sequences[:, -1])

    def rows(self, generated: list[list[int]]) -> list[Tensor]:
        """``[n_i, 4]`` (logprob, entropy, t1, t2) of the ``n_i`` tokens of each row of
        ``generated`` (the continuations ``generate_turn`` returned, cut after the stop).

        Raises:
            RuntimeError: the recorded tokens are not the returned ones (a processor order
                or a ``generate`` behaviour this recorder does not understand).
        """
        table = torch.stack(self._columns, dim=1).cpu() if self._columns else torch.zeros(0, 0, 5)
        out = []
        for i, row in enumerate(generated):
            n = len(row)
            if n > table.shape[1] or table[i, :n, 0].long().tolist() != list(row):
                raise RuntimeError(
                    "rollout.stats_from_generation: the recorded tokens of a generate call differ "
                    "from the returned ones; set rollout.stats_from_generation=false"
                )
            out.append(table[i, :n, 1:])
        return out


def assemble_generation_stats(
    per_episode: list[list[Tensor]], loss_mask: Tensor, dtype: torch.dtype = torch.float32
) -> TokenStats:
    """``[B, L]`` statistics from each episode's recorded turns (``[n, 4]`` tensors in order):
    the loss-mask positions of an episode are exactly its generated tokens, in order.

    Raises:
        RuntimeError: an episode's recorded tokens do not match its loss mask's count.
    """
    fields = [torch.zeros(loss_mask.shape, dtype=dtype) for _ in range(4)]
    for b, turns in enumerate(per_episode):
        values = torch.cat(turns).to(dtype) if turns else torch.zeros(0, 4, dtype=dtype)
        where = (loss_mask[b] > 0).nonzero().flatten()
        if where.numel() != values.shape[0]:
            raise RuntimeError(
                f"rollout.stats_from_generation: episode {b} has {where.numel()} loss tokens but "
                f"{values.shape[0]} recorded"
            )
        for k in range(4):
            fields[k][b, where] = values[:, k]
    return TokenStats(logprob=fields[0], entropy=fields[1], t1=fields[2], t2=fields[3])
