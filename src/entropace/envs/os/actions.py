"""Action syntax of the ``os`` family, answer normalisation and observation formatting.

An action is the agent's whole reply and must start (after optional whitespace) with one of::

    bash: <command>     run <command> (everything after "bash:", may span lines)
    answer: <text>      final answer to a question (first non-empty line is used)
    done                a goal task is finished (``finish`` is the same action)

Keywords are case-insensitive. After ``bash:`` the command may be wrapped in a Markdown fence
(```` ```bash ... ``` ````), which is removed. Anything else is a parse error.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from entropace.envs.base import WHITESPACE

__all__ = [
    "Answer",
    "Bash",
    "Done",
    "answers_match",
    "format_observation",
    "normalize_answer",
    "observation_output",
    "parse_action",
]


@dataclass(frozen=True)
class Bash:
    """Run ``command`` in the sandbox."""

    command: str


@dataclass(frozen=True)
class Answer:
    """Final answer ``text`` to a question task."""

    text: str


@dataclass(frozen=True)
class Done:
    """A goal task is finished."""


Action = Bash | Answer | Done

_LEFT = WHITESPACE + "`'\""
_RIGHT = _LEFT + "."
_ACTION = re.compile(r"\A\s*(bash|answer)[ \t]*:(.*)\Z", re.IGNORECASE | re.DOTALL)
_DONE = re.compile(r"\A\s*(?:done|finish)[ \t]*\.?\s*\Z", re.IGNORECASE)
_FENCE = re.compile(r"\A```[A-Za-z]*[ \t]*\n(.*?)\n?```\Z", re.DOTALL)


def parse_action(text: str) -> Action | None:
    """Parse one reply; None when it is not a valid action (never raises on a ``str``).

    ``bash:`` with an empty command and ``answer:`` with empty text are invalid.
    """
    if _DONE.match(text):
        return Done()
    m = _ACTION.match(text)
    if m is None:
        return None
    keyword, rest = m.group(1).lower(), m.group(2).strip()
    if keyword == "bash":
        fenced = _FENCE.match(rest)
        command = (fenced.group(1) if fenced else rest).strip()
        return Bash(command) if command else None
    lines = [line.strip() for line in rest.splitlines() if line.strip()]
    return Answer(lines[0]) if lines else None


def normalize_answer(text: str) -> str:
    """Lower-case, trim quotes/backticks and final periods, collapse whitespace.

    Removes the longest prefix of whitespace and quotes (`` ` ' " ``) and the longest suffix
    of whitespace, quotes and periods, one ``strip`` call each (linear; repeating
    ``strip().strip(quotes).rstrip(".")`` until nothing changes, which gives the same result,
    was quadratic on ``"'."`` repeated).
    """
    text = text.lstrip(_LEFT).rstrip(_RIGHT)
    return " ".join(text.split()).lower()


def answers_match(answer: str, gold: str) -> bool:
    """Whether ``answer`` equals ``gold`` after :func:`normalize_answer`.

    Numbers compare by value (``"42.0"`` matches ``"42"``); a path answer matches a bare
    file-name gold when its last component does (``"data/x.csv"`` matches ``"x.csv"``).
    """
    a, g = normalize_answer(answer), normalize_answer(gold)
    if a == g:
        return True
    try:
        fa, fg = float(a), float(g)
    except ValueError:
        pass
    else:
        return math.isfinite(fa) and math.isclose(fa, fg, rel_tol=0.0, abs_tol=1e-9)
    if "/" in a and "/" not in g:
        return a.rstrip("/").rsplit("/", 1)[-1] == g
    return False


_EXIT_MARK = "\n[exit code: "
_NO_OUTPUT = "(no output)"


def format_observation(output: bytes, exit_code: int, *, max_chars: int, note: str = "") -> str:
    """The agent's view of a finished command: its output (capped) and ``[exit code: N]``.

    Output is decoded as UTF-8 (invalid bytes and NULs become U+FFFD) and cut to
    ``max_chars`` characters, saying how much was cut.
    """
    text = output.decode("utf-8", "replace").replace("\x00", "\ufffd")
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n[output truncated: showing {max_chars} of {len(text)} chars]"
    if note:
        text = f"{text.rstrip()}\n[{note}]" if text.strip() else f"[{note}]"
    return f"{text.rstrip(chr(10)) or _NO_OUTPUT}{_EXIT_MARK}{exit_code}]"


def observation_output(observation: str) -> str:
    """The command output part of an observation made by :func:`format_observation`."""
    head, sep, _ = observation.rpartition(_EXIT_MARK)
    if not sep:
        return observation
    return "" if head == _NO_OUTPUT else head
