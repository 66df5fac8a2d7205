"""The text-environment protocol every entropace task family implements.

An environment is a gymnasium-style, single-episode text world:

* ``reset(seed) -> (observation, info)``: build instance ``seed`` (same seed, same instance,
  same gold answer) and return the first observation the agent reads.
* ``step(action) -> (observation, reward, terminated, truncated, info)``: apply one agent
  action (the model's raw text for that turn).

Conventions shared by every family (the trainer and the CLI rely on them):

* ``info["success"]`` (bool) is present in every ``step`` info; it is True only on the step
  that solves the instance.
* ``info["parse_error"]`` (bool) is present in every ``step`` info; True when the action could
  not be parsed as any valid action of the family. A parse error ends the episode (as an
  abnormal end) only when ``rollout.end_on_parse_error`` is set; otherwise the episode goes on
  and the error observation is the next turn's input.
* ``reset`` info carries ``task`` (family name), ``seed``, ``difficulty`` and ``gold`` (the
  gold answer or goal, as text, for ``entropace envs sample`` and debugging; never shown to
  the agent).
* An environment never raises on a bad action: malformed, empty, huge or hostile actions get
  an observation that explains what went wrong. It raises only on misuse by the caller
  (``step`` before ``reset`` or after the episode ended).
* One length rule in every family: a reply of at most :data:`MAX_ACTION_CHARS` characters is
  parsed whole (by the family's own rule: first command, last line, last call, ...); a longer
  reply is not parsed at all and is a parse error whose observation names the limit
  (:func:`action_too_long`). Every family parser is linear in the reply's length.
* Turn limits are enforced by :class:`TurnLimit`, which :func:`entropace.envs.make` wraps
  around every environment: the step that reaches ``max_turns`` without termination returns
  ``truncated=True``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

DIFFICULTIES: tuple[str, ...] = ("easy", "medium", "hard")

#: Longest reply any family parses (characters). 8k tokens of ~4 characters fit; the default
#: rollout budget (256 tokens a turn) stays far below. Longer replies are parse errors.
MAX_ACTION_CHARS = 32_000

#: Every character for which ``str.isspace()`` holds (what ``str.strip()`` removes), for
#: C-speed ``strip(WHITESPACE + extra)`` calls; a test checks it against the Unicode database.
WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
    "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)

StepResult = tuple[str, float, bool, bool, dict[str, Any]]


class EnvError(RuntimeError):
    """Raised when an environment is misused (step before reset, step after the end)."""


@runtime_checkable
class TextEnv(Protocol):
    """What every environment exposes.

    Attributes:
        name: the task family name (the key used in multi-task batches and metrics).
        system_prompt: explains the action syntax to the agent; the trainer puts it in the
            system turn of the chat.
        max_turns: the number of agent actions after which the episode is truncated.
    """

    name: str
    system_prompt: str
    max_turns: int

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]: ...

    def step(self, action: str) -> StepResult: ...


Policy = Callable[[str], str]
"""A policy maps the latest observation to the next action (used by scripted oracles)."""


def action_too_long(action: str) -> str | None:
    """The parse-error observation for a reply over :data:`MAX_ACTION_CHARS`, or None.

    Families call it first in ``step`` (before any parsing), so no parser ever sees more than
    ``MAX_ACTION_CHARS`` characters.
    """
    if len(action) <= MAX_ACTION_CHARS:
        return None
    return (
        f"Your reply is {len(action)} characters long; replies are limited to "
        f"{MAX_ACTION_CHARS} characters and this one was not read. Reply with one short action."
    )


def check_difficulty(difficulty: str) -> str:
    """Validate a difficulty option, naming the allowed values on error."""
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {list(DIFFICULTIES)}, got {difficulty!r}")
    return difficulty


class TurnLimit:
    """Wraps an environment and truncates the episode after ``max_turns`` actions.

    Also enforces the call order (``reset`` before ``step``, no ``step`` after the episode
    ended) and fills the standard info keys (``success``, ``parse_error``, ``turn``), so each
    family only has to implement its own dynamics.
    """

    def __init__(self, env: TextEnv, max_turns: int | None = None) -> None:
        self.env = env
        self.max_turns = int(max_turns if max_turns is not None else env.max_turns)
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        self.turn = 0
        self.done = True

    @property
    def name(self) -> str:
        return self.env.name

    @property
    def system_prompt(self) -> str:
        # an env whose prompt states its turn limit (the tools interface) gets this one's
        render = getattr(self.env, "system_prompt_for", None)
        return render(self.max_turns) if callable(render) else self.env.system_prompt

    def __getattr__(self, item: str) -> Any:  # delegate family-specific attributes
        if item == "env":
            raise AttributeError(item)
        return getattr(self.env, item)

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        obs, info = self.env.reset(seed)
        self.turn = 0
        self.done = False
        return obs, info

    def step(self, action: str) -> StepResult:
        if self.done:
            raise EnvError(f"{self.name}: step() called before reset() or after the episode ended")
        if not isinstance(action, str):
            raise TypeError(f"action must be str, got {type(action).__name__}")
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.turn += 1
        info.setdefault("success", False)
        info.setdefault("parse_error", False)
        info["turn"] = self.turn
        if not terminated and self.turn >= self.max_turns:
            truncated = True
        self.done = bool(terminated or truncated)
        end = getattr(self.env, "end_episode", None) if truncated else None
        if callable(end):  # a family holding per-episode resources (the os persistent shell)
            end()
        return obs, float(reward), bool(terminated), bool(truncated), info
