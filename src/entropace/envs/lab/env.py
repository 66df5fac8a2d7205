"""The pace-mismatch lab: synthetic code-answer tasks of graded difficulty (``docs/lab.md``).

Every lab task asks for a short digit *code*. Instance ``seed`` of a task shows the code, a
seeded list of distractor codes and, for tasks with a decoy, the decoy rule; the agent's reply
is scored by its beginning (leading whitespace skipped):

* it starts with the code: reward 1, ``success`` (the episode ends);
* it starts with the task's decoy prefix (a dead end): reward ``decoy_reward``, no success;
* otherwise: partial credit ``partial * m / n``, ``m`` the number of leading characters it
  shares with the code (``n`` characters); the episode ends (one attempt per instance);
* an empty reply is a parse error (the episode goes on: the next turn may answer).

Difficulty comes from the code length (each extra digit is one more token the policy has to
find), the first digit's base rate under the tiny model, the prefix credit and the decoy (a
cheap reward that pulls the policy the wrong way: lab-hard's decoy is lab-easy's answer, which
the shared model already favours once lab-easy is learnt). GRPO normalises rewards within a
group, so any reward variance drives the group to its best reply: a partial credit makes the
policy commit to the digits it has found, a task whose groups all score 0 gets no gradient
and keeps exploring until its first hit. Under GRPO on the ``lab`` preset lab-easy is solved
within about 30 steps, lab-mid in some seeds and later, lab-hard rarely (``docs/lab.md``).

The code of a task is the same in every instance (the seed changes the prompt's distractors
and their order, not the gold answer): the lab measures how fast a policy commits to a rewarded
string under each algorithm, not reading. The ``difficulty`` option lengthens every code by 0
(``easy``), 1 (``medium``) or 2 (``hard``) characters.

**Lab v2** (``lab2-easy``, ``lab2-mid``, ``lab2-hard``; issue 23, ``docs/lab.md``): the v1 tasks
couple through a shared answer (lab-hard's decoy is lab-easy's code) and stop giving reward
variance as soon as a task is solved or never found. The v2 tasks share no answer: each writes
its codes (and distractors) in an alphabet of its own, single-token letters no other task uses,
so no reply can score on two tasks. Their credit is graded over the whole code and counted by
position (``partial = 0.8``, ``credit = "position"``: every position ``i`` with ``reply[i] ==
code[i]`` is worth ``0.8 / n``, whatever precedes it), with codes of 2, 3 and 4 characters, so
each task keeps reward variance while it finds its code one character at a time, at its own
pace. (With credit on the leading characters only, the letters after a found prefix were
reinforced with it whatever they were and committed to wrong letters: the reward variance ended
within ~20 steps; experiments/offpolicy_lab/RESULTS.md.)
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from entropace.envs.base import DIFFICULTIES, WHITESPACE, action_too_long, check_difficulty
from entropace.envs.splits import in_test_bucket, split_of

#: How partial credit counts matched characters (:attr:`LabTask.credit`).
CREDITS: tuple[str, ...] = ("prefix", "position")


def check_credit(name: str, credit: str) -> str:
    """``credit`` if it is one of :data:`CREDITS`, else a ``ValueError`` naming task ``name``."""
    if credit not in CREDITS:
        raise ValueError(f"{name}: credit must be one of {CREDITS}, got {credit!r}")
    return credit


__all__ = [
    "CREDITS",
    "LAB_TASKS",
    "LabEnv",
    "LabTask",
    "check_credit",
    "favourite_letter",
    "lab_oracle",
    "lab_prior",
    "matched_positions",
    "matched_prefix",
    "score_reply",
]


@dataclass(frozen=True)
class LabTask:
    """One lab task (registered as its own family so metrics are keyed by ``name``).

    Attributes:
        name: family name (``lab-easy`` ...).
        level: the task's own difficulty label, ``reset`` info ``level`` (``difficulty`` there
            is the option, which sets the code length).
        code: the gold code at ``difficulty="easy"`` (characters of ``alphabet``).
        extension: characters appended to ``code`` at ``medium`` (1) and ``hard`` (2).
        partial: weight of the partial credit, ``reward = partial * m / n`` (in [0, 1)), ``m``
            the matched characters counted by ``credit``, ``n`` the code's length.
        decoy: a prefix (not a prefix of the code) that earns ``decoy_reward``; "" for none.
        decoy_reward: reward of a decoy reply (in [0, 1)).
        distractors: distractor codes listed in the prompt (seeded).
        alphabet: the characters the task's codes and distractors are written in (default the
            ten digits; the v2 tasks use letters of their own).
        credit: how a wrong reply's partial credit counts matches: ``"prefix"`` (``m`` = the
            leading characters it shares with the code) or ``"position"`` (``m`` = the positions
            ``i < n`` where ``reply[i] == code[i]``, each judged whatever precedes it).
    """

    name: str
    level: str
    code: str
    extension: str
    partial: float = 0.0
    decoy: str = ""
    decoy_reward: float = 0.0
    distractors: int = 0
    alphabet: str = "0123456789"
    credit: str = "prefix"

    def __post_init__(self) -> None:
        check_credit(self.name, self.credit)
        if len(set(self.alphabet)) != len(self.alphabet) or not self.alphabet.isascii():
            raise ValueError(f"{self.name}: the alphabet must be distinct ASCII characters")
        chars = set(self.code + self.extension)
        if not (self.code and chars <= set(self.alphabet) and len(self.extension) >= 2):
            what = "digits" if self.alphabet.isdigit() else f"characters of {self.alphabet!r}"
            raise ValueError(f"{self.name}: code and extension must be {what} (extension >= 2)")
        if not 0.0 <= self.partial < 1.0 or not 0.0 <= self.decoy_reward < 1.0:
            raise ValueError(f"{self.name}: partial and decoy_reward must be in [0, 1)")
        if self.decoy and (self.code + self.extension).startswith(self.decoy):
            raise ValueError(f"{self.name}: the decoy {self.decoy!r} must not prefix the code")
        if self.distractors > len(self.alphabet) ** len(self.code) // 2:
            raise ValueError(f"{self.name}: too many distractors for a {len(self.code)}-digit code")

    def gold(self, difficulty: str) -> str:
        """The code at ``difficulty`` (``code`` plus 0 / 1 / 2 extension digits)."""
        return self.code + self.extension[: DIFFICULTIES.index(check_difficulty(difficulty))]


#: The shipped lab tasks, easiest first. Tuned on the ``lab`` preset (docs/lab.md).
LAB_TASKS: dict[str, LabTask] = {
    t.name: t
    for t in (
        LabTask("lab-easy", "easy", "4", "58", distractors=2),
        LabTask("lab-mid", "medium", "70", "36", partial=0.5, distractors=4),
        LabTask(
            "lab-hard",
            "hard",
            "03",
            "81",
            partial=0.5,
            decoy="4",
            decoy_reward=0.15,
            distractors=6,
        ),
        # v2: no shared answers (disjoint alphabets), graded credit, codes of 2 / 3 / 4 letters
        # chosen from the tiny model's likeliest next letters, each task's letters its own
        # (experiments/offpolicy_lab/choose_codes.py; base rates in docs/lab.md).
        # Credit by position (each matching position, whatever precedes it): with prefix credit
        # the letters after a found prefix committed to wrong letters and the reward variance
        # ended within ~20 steps (calibration, experiments/offpolicy_lab/RESULTS.md).
        *(
            LabTask(
                name, level, code, ext, partial=0.8, distractors=d, alphabet=a, credit="position"
            )
            for name, level, code, ext, d, a in (
                ("lab2-easy", "easy", "SF", "wk", 2, "SFwk"),
                ("lab2-mid", "medium", "JHj", "qY", 4, "JHjqY"),
                ("lab2-hard", "hard", "lRfD", "zQ", 6, "lRfDzQ"),
            )
        ),
    )
}


def matched_prefix(reply: str, gold: str) -> int:
    """Length of the longest common prefix of ``reply`` and ``gold``."""
    n = 0
    for r, g in zip(reply, gold):
        if r != g:
            break
        n += 1
    return n


def matched_positions(reply: str, gold: str) -> int:
    """Number of positions ``i < len(gold)`` with ``reply[i] == gold[i]`` (any order of hits)."""
    return sum(r == g for r, g in zip(reply, gold))


def score_reply(
    task: LabTask, gold: str, reply: str, credit: str | None = None
) -> tuple[float, bool]:
    """``(reward, success)`` of a (non-empty, left-stripped) reply: see the module docstring.

    ``reward = 1`` if ``reply.startswith(gold)``; else ``decoy_reward`` if the task has a decoy
    and the reply starts with it; else ``partial * m / len(gold)`` with ``m`` from ``credit``
    (default ``task.credit``): ``matched_prefix(reply, gold)`` for ``"prefix"``,
    ``matched_positions(reply, gold)`` for ``"position"``.
    """
    if reply.startswith(gold):
        return 1.0, True
    if task.decoy and reply.startswith(task.decoy):
        return task.decoy_reward, False
    count = matched_positions if (credit or task.credit) == "position" else matched_prefix
    return task.partial * count(reply, gold) / len(gold), False


class LabEnv:
    """One lab task as a :class:`~entropace.envs.base.TextEnv` (see the module docstring).

    Subclassed per task by :func:`entropace.envs.lab.register_lab_envs` (class attribute
    ``task``); ``max_turns`` is 2 so that an empty reply (a parse error) gets a second try.
    """

    task: LabTask = LAB_TASKS["lab-easy"]
    max_turns = 2
    system_prompt = "Reply with the code only: its digits, nothing before them."

    def __init__(self, difficulty: str = "easy", credit: str | None = None) -> None:
        self.credit = self.task.credit if credit is None else check_credit(self.task.name, credit)
        if not self.task.alphabet.isdigit():  # v2: letters (v1's prompt text stays as it was)
            self.system_prompt = "Reply with the code only: its characters, nothing before them."
        self.difficulty = check_difficulty(difficulty)
        self.name = self.task.name
        self.gold = self.task.gold(self.difficulty)
        self.seed: int | None = None

    def _distractors(self, seed: int) -> list[str]:
        """Seeded distractor codes of the gold's length, none equal to the gold or decoy.

        v2 tasks split by content (:mod:`entropace.envs.splits`): a distractor list belongs to
        the held-out side when its hash falls in the held-out quarter, and a seed of the
        ``train`` split only draws lists of the training side (a ``test`` or ``test_unseen``
        seed only held-out ones), so no held-out prompt's content occurs in training. The v1
        tasks keep their original draw (their results stay reproducible).
        """
        rng = random.Random(f"{self.name}:{seed}")
        held_out = None if self.task.alphabet.isdigit() else split_of(seed) != "train"
        while True:
            out: list[str] = []
            while len(out) < self.task.distractors:
                code = "".join(rng.choice(self.task.alphabet) for _ in self.gold)
                bad = code == self.gold or (self.task.decoy and code.startswith(self.task.decoy))
                if not bad and code not in out:
                    out.append(code)
            if held_out is None or in_test_bucket(" ".join(out), 0.25, self.name) == held_out:
                return out

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.seed = int(seed)
        lines = [f"{self.name} #{self.seed}. The code is {self.gold}."]
        if self.task.partial:
            lines.append("A reply that starts like the code earns part of the reward.")
        if self.task.decoy:
            lines.append(f"A reply starting with {self.task.decoy} earns a little, never all.")
        if self.task.distractors:
            lines.append("Not these: " + " ".join(self._distractors(self.seed)) + ".")
        info = {
            "task": self.name,
            "seed": self.seed,
            "difficulty": self.difficulty,
            "level": self.task.level,
            "gold": self.gold,
        }
        return "\n".join(lines), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        too_long = action_too_long(action)
        if too_long is not None:
            return too_long, 0.0, False, False, {"success": False, "parse_error": True}
        reply = action.lstrip(WHITESPACE)
        if not reply:
            obs = "Empty reply. Reply with the code's " + (
                "digits." if self.task.alphabet.isdigit() else "characters."
            )
            return obs, 0.0, False, False, {"success": False, "parse_error": True}
        reward, success = score_reply(self.task, self.gold, reply, self.credit)
        obs = "Correct." if success else f"Wrong code (reward {reward:.2f})."
        return obs, reward, True, False, {"success": success, "parse_error": False}


def lab_oracle(env: Any) -> Any:
    """The scripted policy: read the code from the first observation and reply with it."""

    def policy(obs: str) -> str:
        marker = "The code is "
        start = obs.find(marker)
        if start < 0:  # a later observation (after a parse error): the code is known
            return str(env.gold)
        return obs[start + len(marker) :].split(".", 1)[0]

    return policy


def _per_position(name: str, value: float | list[float], n: int) -> list[float]:
    """``value`` for each of ``n`` positions (a number for all, or a list of ``n``)."""
    values = [value] * n if isinstance(value, int | float) else list(value)
    if len(values) != n or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and 0.0 <= v <= 1.0 for v in values
    ):
        raise ValueError(f"{name} must be a probability or a list of {n} probabilities in [0, 1]")
    return [float(v) for v in values]


def favourite_letter(alphabet: str, letter: str) -> str:
    """The favourite wrong letter of a position whose code letter is ``letter``: the next
    letter of the task's alphabet, cyclically (``SFwk``: S -> F, k -> S)."""
    return alphabet[(alphabet.index(letter) + 1) % len(alphabet)]


def lab_prior(
    env: Any,
    rng: random.Random,
    correct: float | list[float] = 0.5,
    favourite: float | list[float] = 0.0,
) -> Any:
    """The lab's demonstration prior (:attr:`entropace.envs.EnvSpec.prior`): a demonstrator
    that writes each position ``i`` of the code independently as

    * the code's letter with probability ``correct[i]``;
    * the position's *favourite wrong letter* (:func:`favourite_letter`) with probability
      ``favourite[i]``;
    * otherwise one of the alphabet's other letters, uniformly.

    ``correct`` and ``favourite`` are one probability for every position or a list with one
    per position of the code (its length at the env's difficulty), with ``correct[i] +
    favourite[i] <= 1`` (and ``= 1`` on a two-letter alphabet). A position whose favourite is
    likelier than its code letter makes the prior's mode wrong there: a model fine-tuned on the
    prior then fails greedily and samples the rewarded letter at a low probability (lab v3,
    docs/lab.md). Called after ``env.reset(seed)``; replies ignore the observation.
    """
    gold, alphabet = str(env.gold), env.task.alphabet
    p_correct = _per_position("correct", correct, len(gold))
    p_favourite = _per_position("favourite", favourite, len(gold))
    for i, (c, f) in enumerate(zip(p_correct, p_favourite)):
        if c + f > 1.0 + 1e-12 or (len(alphabet) == 2 and abs(c + f - 1.0) > 1e-12):
            raise ValueError(
                f"position {i}: correct + favourite = {c + f:g} must be <= 1 (and = 1 on a "
                "two-letter alphabet, which has no other letters)"
            )

    def letter(i: int) -> str:
        code = gold[i]
        fav = favourite_letter(alphabet, code)
        u = rng.random()
        if u < p_correct[i]:
            return code
        if u < p_correct[i] + p_favourite[i]:
            return fav
        return rng.choice([a for a in alphabet if a not in (code, fav)])

    def policy(obs: str) -> str:
        return "".join(letter(i) for i in range(len(gold)))

    return policy
