"""AgentBench DBBench's observations and answer check, for ``style="agentbench"`` and
``scoring="agentbench"`` of the ``db`` family.

Everything here is a port of AgentBench FC (github:THUDM/AgentBench, commit 578c5e9):

* :func:`first_message`: ``dbbench/task.py`` lines 108-113: ``"Additional table information
  about the question: " + add_description + "\\n" + "Question: " + description + "\\n"``, where
  ``add_description`` is ``"The name of this table is T, and the headers of this table are
  A,B,C."`` (``data/dbbench/standard.jsonl``), one sentence per table here;
* :func:`raw_result`: ``dbbench/interaction.py`` lines 88-105: the rows as ``str(list of
  tuples)`` (MySQL's raw response), cut at 800 characters plus ``[TRUNCATED]``;
* :func:`answers_match`: ``dbbench/result_processor.py`` ``compare_results`` (lines 10-78)
  with ``_clean_answer`` / ``_normalize_special_values`` (lines 115-263) and ``_float_equal``
  (``abs(a - b) <= 1e-2``, line 275): values compared exactly and case-sensitively after
  trimming quotes and thousands separators, numbers within 0.01, a single ``0`` / ``NULL`` /
  empty value equal to ``0``, several values as a set (or, when all are numbers, matched one
  to one within 0.01).
"""

from __future__ import annotations

from collections.abc import Sequence

#: AgentBench's cut of a database response (characters) and its marker.
RESPONSE_CHARS = 800
TRUNCATED = "[TRUNCATED]"
#: ``_float_equal``'s tolerance.
FLOAT_TOLERANCE = 1e-2

_SPECIAL = {
    "none": "0",
    "null": "0",
    "undefined": "0",
    "nan": "0",
    "inf": "0",
    "infinity": "0",
    "-inf": "0",
    "-infinity": "0",
    "": "0",
}


def first_message(tables: Sequence[tuple[str, Sequence[str]]], question: str) -> str:
    """The first user message for ``tables`` (name, headers) and ``question``."""
    info = " ".join(
        f"The name of this table is {name}, and the headers of this table are {','.join(cols)}."
        for name, cols in tables
    )
    return f"Additional table information about the question: {info}\nQuestion: {question}\n"


def raw_result(rows: Sequence[tuple], more: bool = False) -> str:
    """``str(rows)`` cut at :data:`RESPONSE_CHARS` plus ``[TRUNCATED]`` (also when ``more``:
    the rows shown are not all the query's)."""
    text = str(list(rows))
    if len(text) > RESPONSE_CHARS:
        return text[:RESPONSE_CHARS] + TRUNCATED
    return text + TRUNCATED if more else text


def normalize(value: object) -> str:
    """``_normalize_special_values``: trimmed text, ``%`` and thousands separators dropped,
    NULL-like values as ``"0"``."""
    if value is None:
        return "0"
    text = str(value).strip()
    if text.endswith("%"):
        return text[:-1].strip()
    if "," in text and not text.startswith("[") and not text.endswith("]"):
        text = text.replace(",", "")
    return _SPECIAL.get(text.lower(), text)


def clean(values: Sequence[object]) -> list[str]:
    """``_clean_answer`` of a list: each item stripped of spaces and quotes, then normalised."""
    return [normalize(str(v).strip().strip("'\"")) for v in values]


def _is_float(text: str) -> bool:
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


def _float_equal(a: str, b: str) -> bool:
    return abs(float(a) - float(b)) <= FLOAT_TOLERANCE


def answers_match(answers: Sequence[object], gold: Sequence[object]) -> bool:
    """AgentBench's ``compare_results(answers, ground_truth, "SELECT")``."""
    got, want = clean(answers), clean(gold)
    if len(got) == 1 and len(want) == 1:
        a, g = got[0], want[0]
        if a == "0" and g == "0":
            return True
        if _is_float(a) and _is_float(g):
            return _float_equal(a, g)
        return a == g
    if all(map(_is_float, got)) and all(map(_is_float, want)):
        if len(got) != len(want):
            return False
        matched = [False] * len(want)
        for a in got:
            for i, g in enumerate(want):
                if not matched[i] and _float_equal(a, g):
                    matched[i] = True
                    break
            else:
                return False
        return all(matched)
    return set(got) == set(want)
