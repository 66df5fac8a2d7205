"""PAPO's polarity audit: does the predicted polarity ``P = A S`` match the realised ``dH``?

ALGORITHMS.md section 4 (the check the PAPO review asks for). Given, per token, the predicted
first-order entropy change direction ``P_t`` and the realised change ``dH_t`` of its state's
entropy after the update (recomputed on a sample of states), report

- overall and per branch (``P > 0``: expanding, ``P < 0``: contracting):
  ``sign_agreement`` = fraction of tokens with ``sign(P_t) == sign(dH_t)`` among those where both
  are nonzero (exact zeros have no sign and are left out; ``sign_tokens`` counts the rest),
  ``spearman`` = Spearman rank correlation of ``P`` and ``dH`` (Pearson correlation of their
  average ranks, ties get the mean of the ranks they span),
  ``mean_dh`` = mean realised ``dH``, ``tokens`` = number of masked tokens.
- A statistic with nothing to average over (no tokens, a constant input for Spearman, fewer than
  two tokens) is NaN; the token counts tell why.

Keys of the returned flat dict: ``{overall,pos,neg}/{sign_agreement,spearman,mean_dh,tokens,
sign_tokens}``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["average_ranks", "polarity_audit", "spearman"]


def _to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # torch.Tensor, without importing torch here
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of ``x`` (1-D), ties sharing the mean of the ranks they span."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    # Boundaries of runs of equal values in sorted order.
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], x.size]  # exclusive
    mean_rank = (starts + ends + 1) / 2.0  # mean of (start+1 .. end), 1-based
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation with average ranks; NaN if n < 2 or either input is constant."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.size < 2:
        return float("nan")
    rx = average_ranks(x) - (x.size + 1) / 2.0
    ry = average_ranks(y) - (y.size + 1) / 2.0
    denom = np.sqrt(np.sum(rx * rx) * np.sum(ry * ry))
    if denom == 0.0:
        return float("nan")
    return float(np.sum(rx * ry) / denom)


def _stats(p: np.ndarray, dh: np.ndarray) -> dict[str, float]:
    signed = (p != 0) & (dh != 0)
    n_signed = int(signed.sum())
    agree = float(np.mean(np.sign(p[signed]) == np.sign(dh[signed]))) if n_signed else np.nan
    return {
        "sign_agreement": float(agree),
        "spearman": spearman(p, dh),
        "mean_dh": float(dh.mean()) if dh.size else float("nan"),
        "tokens": float(p.size),
        "sign_tokens": float(n_signed),
    }


def polarity_audit(predicted: Any, realised: Any, mask: Any | None = None) -> dict[str, float]:
    """Token- and branch-level agreement of predicted polarity and realised entropy change.

    Args:
        predicted: ``[...]`` polarity ``P_t = A_t S_t`` (tensor or array).
        realised: ``[...]`` same shape, realised ``dH_t`` of each token's state.
        mask: ``[...]`` same shape (nonzero = audited token), or None for all tokens.

    Returns:
        Flat dict, keys described in the module docstring.

    Raises:
        ValueError: shape mismatch, or NaN/inf in a masked entry (unmasked entries are ignored).
    """
    p = _to_numpy(predicted)
    dh = _to_numpy(realised)
    if p.shape != dh.shape:
        raise ValueError(f"predicted has shape {p.shape}, realised {dh.shape}")
    if mask is None:
        sel = np.ones(p.shape, dtype=bool)
    else:
        m = _to_numpy(mask)
        if m.shape != p.shape:
            raise ValueError(f"mask has shape {m.shape}, predicted {p.shape}")
        sel = m != 0
    p, dh = p[sel], dh[sel]
    for name, arr in (("predicted", p), ("realised", dh)):
        bad = ~np.isfinite(arr)
        if bad.any():
            raise ValueError(f"polarity_audit: {int(bad.sum())} non-finite value(s) in {name}")
    out: dict[str, float] = {}
    branches = {"overall": np.ones(p.shape, dtype=bool), "pos": p > 0, "neg": p < 0}
    for branch, b in branches.items():
        for key, value in _stats(p[b], dh[b]).items():
            out[f"{branch}/{key}"] = value
    return out
