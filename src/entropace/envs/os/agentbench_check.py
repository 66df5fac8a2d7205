"""AgentBench OS's answer checks, for ``scoring="agentbench"`` (the ``agentbench`` profile).

AgentBench OS (github:THUDM/AgentBench, commit 578c5e9) judges an answer either by ``match``
or by check scripts (``src/server/tasks/os_interaction/task.py``, ``_evaluate_answer``,
lines 671-698, ``_evaluate_by_match`` 700-712, ``_evaluate_by_check_scripts`` 714-738): the
scripts get the answer as ``argv[1]`` and the output of the task's example script (the gold)
as ``argv[2]`` and pass on exit code 0. The scripts
(``data/os_interaction/scripts/1/check/*.py``), transcribed:

* ``integer-match.py``: ``int(argv[1]) == int(argv[2])`` (Python's ``int``: surrounding
  whitespace is allowed, ``"3.0"`` or ``"3 files"`` raise, i.e. fail);
* ``string-match.py``: both with ``\\r\\n``/``\\r`` turned into ``\\n`` and stripped, equal
  (case-sensitive);
* ``size-match.py``: sizes with a unit suffix (``B``, ``K``/``KB``, ``M``/``MB``, ... powers
  of 1024) equal in bytes;
* ``containing.py``: the stripped gold is a substring of the stripped answer;
* ``in.py``: the stripped answer is a substring of the stripped gold;
* ``match`` with ``strip: true`` (a plain string in the task file): ``answer.strip() ==
  gold``.

:data:`CHECK_TYPES` names the check of every question kind of the ``os`` family (numbers:
``integer-match``, names and values: ``string-match``, as AgentBench's tasks of the same shape
use). Our default (``scoring="lenient"``, :func:`~entropace.envs.os.actions.answers_match`)
also accepts ``"42.0"`` for ``42`` or a path for a file name.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["CHECKS", "CHECK_TYPES", "agentbench_check"]


def _norm(s: str) -> str:
    return s.replace("\r\n", "\n").replace("\r", "\n").strip()


def _integer_match(answer: str, gold: str) -> bool:
    try:
        return int(answer) == int(gold)
    except ValueError:
        return False


_UNITS = {
    "B": 1, "Byte": 1, "K": 1024, "KB": 1024, "M": 1024**2, "MB": 1024**2,
    "G": 1024**3, "GB": 1024**3, "T": 1024**4, "TB": 1024**4, "P": 1024**5, "PB": 1024**5,
}  # fmt: skip


def _size(text: str) -> int:
    text = text.strip()
    for unit, factor in _UNITS.items():  # size-match.py's order: the first suffix that fits
        if text.endswith(unit):
            return int(text[: -len(unit)]) * factor
    return int(text)


def _size_match(answer: str, gold: str) -> bool:
    try:
        return _size(answer) == _size(gold)
    except ValueError:
        return False


#: check type -> ``check(answer, gold) -> bool``.
CHECKS: dict[str, Callable[[str, str], bool]] = {
    "integer-match": _integer_match,
    "string-match": lambda a, g: _norm(a) == _norm(g),
    "size-match": _size_match,
    "containing": lambda a, g: _norm(g) in _norm(a),
    "in": lambda a, g: _norm(a) in _norm(g),
    "match": lambda a, g: a.strip() == g,
}

#: question kind -> its AgentBench check type.
CHECK_TYPES: dict[str, str] = {
    "count_lines": "integer-match",
    "count_files": "integer-match",
    "sum_column": "integer-match",
    "count_users": "integer-match",
    "product_total": "integer-match",
    "count_scripts": "integer-match",
    "word_count": "integer-match",
    "max_amount": "integer-match",
    "user_requests": "integer-match",
    "error_components": "integer-match",
    "config_value": "string-match",
    "largest_file": "string-match",
    "top_component": "string-match",
    "top_region": "string-match",
}


def agentbench_check(kind: str, answer: str, gold: str) -> bool:
    """Whether ``answer`` passes AgentBench's check for a question of ``kind``
    (``string-match`` for a kind not in :data:`CHECK_TYPES`)."""
    return CHECKS[CHECK_TYPES.get(kind, "string-match")](answer, gold)
