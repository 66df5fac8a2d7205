"""The TRL plug-in's arithmetic that is TRL's alone (the per-task step is
:class:`entropace.control.TaskStep`'s, shared with our trainer and the verl plug-in).

Functions see the global batch where the result must be the global batch's, so that a run on
several processes gives what one process would give on the global batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

import entropace.algos as algos

__all__ = ["rloo_slice"]


def rloo_slice(rewards: Tensor, group_size: int, rows: slice) -> Tensor:
    """RLOO advantages ``R_i - mean_{j != i} R_j`` of the global batch's ``rewards`` ``[N]``
    (groups = consecutive runs of ``group_size``; NaN = unscorable: advantage 0), sliced to
    this process's ``rows``; float32."""
    group = torch.arange(rewards.numel(), device=rewards.device) // group_size
    adv = algos.rloo_advantages(torch.nan_to_num(rewards, nan=0.0), group)
    adv = torch.where(torch.isnan(rewards), torch.zeros_like(adv), adv)
    return adv[rows].to(torch.float32)
