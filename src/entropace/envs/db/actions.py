"""Parse ``db`` actions and score final answers against a gold result.

Actions (the model's raw text for one turn; text before the command is ignored as thoughts):

* ``SQL: <one SELECT statement>``: may span several lines, may be in a code fence.
* ``Answer: <value(s)>``: one value, several values separated by commas or newlines, or a
  JSON list (``["AC/DC", "Accept"]``) when values contain commas.

Answer matching (:func:`answer_matches`):

* numbers are compared numerically: ``1 == 1.0 == "1.00"``, relative tolerance ``1e-4``;
  when the question asks for ``d`` decimals, any value that rounds to the gold one is right
  (``|a - g| <= 0.5 * 10^-d``);
* strings are NFKC-normalised (curly quotes made straight), trimmed, surrounding quotes
  removed, whitespace collapsed, compared case-insensitively;
* the list of values is compared as a multiset, or as a sequence when the question asks for
  an ordered list.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

# A command at the start of a line, tolerating markdown around it ("**Answer:** 3", "> SQL: ...").
_COMMAND = re.compile(r"^[ \t>*#`_]*(SQL|Answer)[*_]*\s*:[*_]*", re.I | re.M)


@dataclass(frozen=True)
class Action:
    """A parsed action: ``kind`` is ``"sql"`` or ``"answer"``, ``arg`` the text after the colon."""

    kind: Literal["sql", "answer"]
    arg: str


def parse_action(text: str) -> Action | None:
    """The first ``SQL:`` / ``Answer:`` command at the start of a line of ``text``, or None.

    Everything after the colon up to the end of the text is the argument (so a multi-line SQL
    query works); trailing closing code fences are dropped.
    """
    m = _COMMAND.search(text)
    if m is None:
        return None
    kind: Literal["sql", "answer"] = "sql" if m.group(1).lower() == "sql" else "answer"
    arg = text[m.end() :].strip()
    if arg.endswith("```") and arg.count("```") % 2 == 1:
        arg = arg[:-3].rstrip()
    return Action(kind, arg)


def split_answer(text: str) -> list[list[str]]:
    """Candidate value lists of an answer: JSON list, else by newline, by comma, and whole.

    Several readings are returned (e.g. ``"Rock, Metal"`` is two values or one title); the
    answer is right when any reading matches the gold result.
    """
    text = text.strip()
    readings: list[list[str]] = []
    if text.startswith("["):
        try:
            parsed = json.loads(text)
        except (ValueError, RecursionError):
            parsed = None
        if isinstance(parsed, list):
            readings.append([_json_text(v) for v in parsed])
    lines = [ln.strip().lstrip("-*•").strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    if len(lines) > 1:
        readings.append(lines)
    one_line = " ".join(lines)
    if "," in one_line:
        readings.append([p for p in (p.strip() for p in one_line.split(",")) if p])
    readings.append([one_line])
    return readings


def _json_text(value: object) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _number(text: str) -> float | None:
    s = text.strip().strip("'\"").strip()
    s = s.removeprefix("$").removesuffix("%").strip()
    if not s or len(s) > 60:
        return None
    try:
        x = float(s)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


def _norm_text(text: str) -> str:
    s = unicodedata.normalize("NFKC", text).translate(_QUOTES).strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        s = s[1:-1]
    return " ".join(s.split()).casefold()


def value_matches(given: str, gold: object, decimals: int | None = None) -> bool:
    """Whether one answered value (text) equals one gold value (from SQLite)."""
    if isinstance(gold, int | float) and not isinstance(gold, bool):
        x = _number(given)
        if x is None:
            return False
        g = float(gold)
        if decimals is not None and abs(x - g) <= 0.5 * 10.0**-decimals * (1 + 1e-9) + 1e-12:
            return True
        return abs(x - g) <= 1e-4 * max(1.0, abs(g))
    return _norm_text(given) == _norm_text(str(gold))


def values_match(
    given: Sequence[str], gold: Sequence[object], *, ordered: bool, decimals: int | None = None
) -> bool:
    """Whether answered values equal the gold values (as a sequence or as a multiset)."""
    if len(given) != len(gold):
        return False
    if ordered:
        return all(value_matches(a, g, decimals) for a, g in zip(given, gold))
    # Multiset match = a perfect bipartite matching between answered and gold values (Kuhn's
    # augmenting paths; n <= 10 in practice). Greedy is not enough when values of different
    # types or within tolerance could pair up in more than one way.
    n = len(gold)
    ok = [[value_matches(a, g, decimals) for g in gold] for a in given]
    match_of_gold: list[int | None] = [None] * n

    def augment(i: int, seen: list[bool]) -> bool:
        for j in range(n):
            if ok[i][j] and not seen[j]:
                seen[j] = True
                if match_of_gold[j] is None or augment(match_of_gold[j], seen):
                    match_of_gold[j] = i
                    return True
        return False

    return all(augment(i, [False] * n) for i in range(len(given)))


def answer_matches(
    text: str, gold: Sequence[object], *, ordered: bool, decimals: int | None = None
) -> bool:
    """Whether the answer ``text`` (after ``Answer:``) matches the gold result values."""
    return any(
        values_match(r, gold, ordered=ordered, decimals=decimals) for r in split_answer(text)
    )


def format_answer(values: Sequence[object]) -> str:
    """The canonical answer text for ``values``: a JSON list (what the oracle sends)."""
    return json.dumps(list(values), ensure_ascii=False)
