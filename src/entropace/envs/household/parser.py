"""ALFWorld's command grammar: text -> :class:`Command`, and back.

Accepted commands (case-insensitive; the last non-empty line of the model's output counts, and
a leading ``Action:`` or ``>`` is ignored; the environment refuses replies over
:data:`entropace.envs.base.MAX_ACTION_CHARS` before parsing, so the whole reply is read)::

    look | inventory | help | think: <anything>
    go to <recep>            open <recep>            close <recep>
    take <obj> from <recep>
    move <obj> to <recep>    (ALFWorld >= 0.4)       put <obj> in/on <recep>   (ALFWorld <= 0.3;
                                                     also "put <obj> in <recep>" or "on")
    clean <obj> with <recep> heat <obj> with <recep> cool <obj> with <recep>
    use <obj>                examine <obj or recep>

Names are ALFWorld's instance names, a type and a number: ``cabinet 3`` (``cabinet3`` is read as
``cabinet 3``).
"""

from __future__ import annotations

import re
from typing import NamedTuple

#: Longest line the parser looks at (a longer action is not a command).
MAX_COMMAND_CHARS = 300


class Command(NamedTuple):
    """A parsed command: ``verb`` is a key of :data:`entropace.envs.household.world.ACTIONS`
    (or ``help`` / ``think``), ``args`` the instance names in the order of the template."""

    verb: str
    args: tuple[str, ...] = ()


_PREFIX = re.compile(r"^(?:action\s*:|act\s*:|>)\s*", re.IGNORECASE)
_GLUED = re.compile(r"([a-z])(\d+)\b")
_NAME = r"([a-z]+ \d+|[a-z][a-z ]*?)"
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(rf"^{pattern}$"), verb)
    for pattern, verb in (
        (r"look(?: around)?", "look"),
        (r"(?:inventory|inv|i)", "inventory"),
        (r"help", "help"),
        (rf"go ?to {_NAME}", "go to"),
        (rf"open {_NAME}", "open"),
        (rf"close {_NAME}", "close"),
        (rf"take {_NAME} from {_NAME}", "take"),
        (rf"move {_NAME} to {_NAME}", "move"),
        (rf"put {_NAME} (?:in/on|in|on|into|onto|to) {_NAME}", "put"),
        (rf"clean {_NAME} with {_NAME}", "clean"),
        (rf"heat {_NAME} with {_NAME}", "heat"),
        (rf"cool {_NAME} with {_NAME}", "cool"),
        (rf"use {_NAME}", "use"),
        (rf"examine {_NAME}", "examine"),
    )
)

#: How each verb is written back (ALFWorld's templates).
_TEMPLATES: dict[str, str] = {
    "look": "look",
    "inventory": "inventory",
    "help": "help",
    "think": "think: {0}",
    "go to": "go to {0}",
    "open": "open {0}",
    "close": "close {0}",
    "take": "take {0} from {1}",
    "move": "move {0} to {1}",
    "put": "put {0} in/on {1}",
    "clean": "clean {0} with {1}",
    "heat": "heat {0} with {1}",
    "cool": "cool {0} with {1}",
    "use": "use {0}",
    "examine": "examine {0}",
}


def _last_line(text: str) -> str:
    """The last non-empty line of ``text``, stripped (linear: one split, one backward scan)."""
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()
    return ""


def command_line(text: str) -> str:
    """The line :func:`parse_command` reads: the last non-empty line, a leading ``Action:`` /
    ``>`` and surrounding quotes or backticks removed (case kept)."""
    return _PREFIX.sub("", _last_line(text)).strip().strip("`'\"").strip()


def parse_command(text: str) -> Command | None:
    """Parse the command on the last non-empty line of ``text``; None when it is not one.

    Never raises (any ``str``). ``think: ...`` gives ``Command("think", (thought,))``.
    """
    if not isinstance(text, str):
        return None
    line = command_line(text)
    if len(line) > MAX_COMMAND_CHARS:
        return None
    if line.lower().startswith("think:"):
        return Command("think", (line[6:].strip(),))
    line = " ".join(line.lower().rstrip(".!").split())
    line = _GLUED.sub(r"\1 \2", line)
    for pattern, verb in _PATTERNS:
        match = pattern.match(line)
        if match:
            return Command(verb, tuple(g.strip() for g in match.groups()))
    return None


def format_command(command: Command) -> str:
    """The canonical text of ``command`` (``parse_command(format_command(c)) == c``)."""
    return _TEMPLATES[command.verb].format(*command.args)
