"""Nearest admissible command: AgentBench-ALFWorld's mapping of free text to a command.

AgentBench (github:THUDM/AgentBench, ``src/server/tasks/alfworld/utils.py``, ``process_action``)
lower-cases and strips the agent's action and, when it is not one of the admissible commands,
replaces it by the admissible command with the highest sentence BLEU (the command as the
reference, the action as the hypothesis), provided that BLEU exceeds ``limit = 0.01``; ties go
to the first command in the list (``np.argmax``). Its BLEU is NLTK's
``sentence_bleu(reference.split(), hypothesis.split(), smoothing_function=SmoothingFunction().method4)``
with the default 4-gram weights; :func:`sentence_bleu` re-implements exactly that (NLTK >= 3.6.6,
whose ``corpus_bleu`` skips zero precisions; checked against NLTK in the tests), so no NLTK is
needed at run time.

BLEU of a hypothesis ``h`` (``c`` tokens) against one reference ``r`` (``len(r)`` tokens)::

    p_n  = clipped n-gram matches / max(1, number of n-grams of h),   n = 1..4
    p_n  = (1 / (2**k_n * 5 / ln c)) / max(1, number of n-grams of h)  when p_n has no match
           and c > 1 (Chen & Cherry's method 4; k_n = 1, 2, ... counts the smoothed orders)
    BP   = 1 if c > len(r), 0 if c == 0, else exp(1 - len(r) / c)
    BLEU = 0 if no unigram matches, else BP * exp(sum over p_n > 0 of 0.25 * ln p_n)
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache

#: AgentBench's threshold: a best BLEU at or below it leaves the action unmapped.
BLEU_LIMIT = 0.01
#: NLTK's ``SmoothingFunction(k=5)`` default, used by method 4.
SMOOTHING_K = 5
#: BLEU's n-gram orders and weights (NLTK's default ``(0.25, 0.25, 0.25, 0.25)``).
WEIGHTS = (0.25, 0.25, 0.25, 0.25)


Grams = tuple[Counter[tuple[str, ...]], ...]


def _grams(tokens: Sequence[str]) -> Grams:
    """The 1- to 4-gram counts of ``tokens`` (empty for orders longer than ``tokens``)."""
    return tuple(
        Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
        for n in range(1, len(WEIGHTS) + 1)
    )


@lru_cache(maxsize=8192)
def _command_grams(command: str) -> tuple[int, Grams]:
    """Token count and n-gram counts of an admissible command (the same few recur each turn)."""
    tokens = command.split()
    return len(tokens), _grams(tokens)


def _bleu(ref_len: int, ref: Grams, hyp_len: int, hyp: Grams) -> float:
    precisions = [
        (sum(min(count, r[gram]) for gram, count in h.items()), max(1, sum(h.values())))
        for h, r in zip(hyp, ref, strict=True)
    ]
    if precisions[0][0] == 0:
        return 0.0
    c = hyp_len
    bp = 1.0 if c > ref_len else math.exp(1 - ref_len / c)  # c >= 1 here (a unigram matched)
    smoothed: list[float] = []
    increment = 1
    for matched, total in precisions:
        if matched == 0 and c > 1:
            smoothed.append(1 / (2**increment * SMOOTHING_K / math.log(c)) / total)
            increment += 1
        else:
            smoothed.append(matched / total)
    logs = (w * math.log(p) for w, p in zip(WEIGHTS, smoothed, strict=True) if p > 0)
    return bp * math.exp(math.fsum(logs))


def sentence_bleu(reference: Sequence[str], hypothesis: Sequence[str]) -> float:
    """NLTK's sentence BLEU of ``hypothesis`` against one ``reference`` with smoothing method 4.

    Args:
        reference: the reference tokens (an admissible command, split on whitespace).
        hypothesis: the hypothesis tokens (the agent's action, split on whitespace).

    Returns:
        BLEU in ``[0, 1]`` (see the module docstring for the formula).
    """
    return _bleu(len(reference), _grams(reference), len(hypothesis), _grams(hypothesis))


def nearest_admissible(action: str, admissible: Sequence[str]) -> str | None:
    """The admissible command AgentBench would run for ``action``, or None to leave it as is.

    ``action`` is lower-cased and stripped; an exact admissible command is returned unchanged;
    otherwise the first command with the highest :func:`sentence_bleu` is returned if that BLEU
    is above :data:`BLEU_LIMIT`. Never raises.
    """
    line = action.strip().lower()
    if not admissible:
        return None
    if line in admissible:
        return line
    tokens = line.split()
    hyp_len, hyp = len(tokens), _grams(tokens)
    best, best_score = None, BLEU_LIMIT
    for choice in admissible:
        score = _bleu(*_command_grams(choice), hyp_len, hyp)
        if score > best_score:  # strict: the first of equal maxima wins, as np.argmax
            best, best_score = choice, score
    return best
