"""``entropace demo``: check the PAPO entropy-polarity theorem on tabular softmaxes.

For a distribution ``p = softmax(z)`` whose logits ``z`` are the parameters, one gradient step of
size ``eta`` on ``A log p_y`` moves the logits by ``dz = eta A (e_y - p)`` and changes the entropy by
``dH = eta A S + O(eta^2)``, with ``S = t2 - t1`` from :func:`entropace.algos.token_stats.token_stats`
(``shared/docs/ALGORITHMS.md`` section 4). The demo takes a few distributions (near-flat, random,
peaked), a frequent (most likely) and a rare (least likely) sampled token, ``A = +1`` and ``-1``,
and prints the predicted ``dH = eta P`` (``P = A S``) next to the realised one, in float64.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from entropace._text import printable

if TYPE_CHECKING:  # torch is imported when the demo runs, not when the CLI builds its parser
    import torch
    from torch import Tensor

__all__ = ["PolarityRow", "DISTRIBUTIONS", "polarity_check", "format_table", "add_parser"]


def _near_flat(vocab: int, gen: torch.Generator) -> Tensor:
    import torch

    return 0.05 * torch.randn(vocab, generator=gen, dtype=torch.float64)


def _random(vocab: int, gen: torch.Generator) -> Tensor:
    import torch

    return torch.randn(vocab, generator=gen, dtype=torch.float64)


def _peaked(vocab: int, gen: torch.Generator) -> Tensor:
    """One dominant token on top of a random background."""
    import torch

    background = torch.randn(vocab, generator=gen, dtype=torch.float64)
    top = torch.randint(vocab, (1,), generator=gen)
    return background + 10.0 * (torch.arange(vocab) == top).to(torch.float64)


# name -> logits generator (vocab, generator) -> [V] float64
DISTRIBUTIONS: dict[str, Callable[[int, torch.Generator], Tensor]] = {
    "near-flat": _near_flat,
    "random": _random,
    "peaked": _peaked,
}

# sampled-token choice -> index into the distribution
TOKENS: dict[str, Callable[[Tensor], int]] = {
    "frequent": lambda p: int(p.argmax()),
    "rare": lambda p: int(p.argmin()),
}


@dataclass(frozen=True)
class PolarityRow:
    """One line of the demo table (all float64 values)."""

    distribution: str
    token: str
    advantage: float
    entropy: float
    logprob: float
    sensitivity: float
    polarity: float
    predicted_dh: float
    realised_dh: float

    @property
    def signs_agree(self) -> bool:
        """Whether the predicted and realised entropy changes have the same sign (0 counts as a sign)."""
        return _sign(self.predicted_dh) == _sign(self.realised_dh)


def _sign(value: float) -> int:
    return (value > 0) - (value < 0)


def _entropy(z: Tensor) -> Tensor:
    import torch

    logp = torch.log_softmax(z, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def polarity_check(vocab: int = 1024, eta: float = 0.01, seed: int = 0) -> list[PolarityRow]:
    """Rows of the demo: every distribution x token choice x ``A in (+1, -1)``."""
    if vocab < 2:
        raise ValueError(f"vocab must be >= 2, got {vocab}")
    if not eta > 0:
        raise ValueError(f"eta must be > 0, got {eta}")
    import torch

    from entropace.algos.token_stats import token_stats

    gen = torch.Generator().manual_seed(seed)
    rows: list[PolarityRow] = []
    for dist_name, make_logits in DISTRIBUTIONS.items():
        z = make_logits(vocab, gen)
        p = torch.softmax(z, dim=-1)
        for token_name, pick in TOKENS.items():
            y = pick(p)
            stats = token_stats(z[None], torch.tensor([y]))
            for advantage in (1.0, -1.0):
                # one SGD step on A log p_y in logit space: z <- z + eta A (e_y - p)
                step = -p.clone()
                step[y] += 1.0
                realised = float(_entropy(z + eta * advantage * step) - _entropy(z))
                s = float(stats.sensitivity[0])
                rows.append(
                    PolarityRow(
                        distribution=dist_name,
                        token=token_name,
                        advantage=advantage,
                        entropy=float(stats.entropy[0]),
                        logprob=float(stats.logprob[0]),
                        sensitivity=s,
                        polarity=advantage * s,
                        predicted_dh=eta * advantage * s,
                        realised_dh=realised,
                    )
                )
    return rows


def format_table(rows: list[PolarityRow]) -> str:
    """Fixed-width text table of the rows, with a sign-agreement summary line."""
    header = (
        f"{'distribution':<12} {'token':<9} {'A':>4} {'H':>9} {'log p_y':>10} {'S':>11} "
        f"{'P':>11} {'pred dH':>11} {'real dH':>11} {'agree':>5}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.distribution:<12} {r.token:<9} {r.advantage:>+4.0f} {r.entropy:>9.4f} "
            f"{r.logprob:>10.4f} {r.sensitivity:>+11.3e} {r.polarity:>+11.3e} "
            f"{r.predicted_dh:>+11.3e} {r.realised_dh:>+11.3e} {'yes' if r.signs_agree else 'NO':>5}"
        )
    agree = sum(r.signs_agree for r in rows)
    lines.append(f"sign agreement: {agree}/{len(rows)}")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    try:
        rows = polarity_check(vocab=args.vocab, eta=args.eta, seed=args.seed)
    except ValueError as err:
        print(f"entropace demo: error: {printable(err)}", file=sys.stderr)
        return 2
    print(
        f"PAPO entropy polarity on tabular softmaxes (V={args.vocab}, eta={args.eta}, "
        f"seed={args.seed}): one logit-space step on A log p_y, dH = eta*P + O(eta^2), P = A*S"
    )
    print(format_table(rows))
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``entropace demo``."""
    parser = subparsers.add_parser(
        "demo",
        help="check the entropy-polarity theorem on tabular softmaxes (a few seconds, most of "
        "it importing torch)",
        description=(
            "Check the PAPO entropy-polarity theorem on tabular softmaxes: for a few "
            "distributions and sampled tokens, one logit-space step on A log p_y changes the "
            "entropy by eta*A*S + O(eta^2); print the predicted and realised changes."
        ),
    )
    parser.add_argument("--vocab", type=int, default=1024, help="vocabulary size (default 1024)")
    parser.add_argument("--eta", type=float, default=0.01, help="step size (default 0.01)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.set_defaults(func=_run)
