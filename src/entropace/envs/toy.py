"""A toy environment for tests, smoke runs and benchmarks (never registered by default).

``LetterEnv``: instance ``seed`` asks for a word containing the letter ``"aeiost"[seed % 6]``;
a reply containing it gets reward 1 and ends the episode, anything else gets 0 and
"Try again." until ``max_turns`` (2). A random-initialised tiny model hits the letter often
enough that GRPO groups have reward variance, which makes it the cheapest real workload for the
trainer. :func:`register_letter_envs` registers copies under the given names (idempotent).
"""

from __future__ import annotations

from typing import Any

from entropace.envs.registry import EnvSpec, register, specs

__all__ = ["LetterEnv", "register_letter_envs"]


class LetterEnv:
    """Say a word containing the instance's letter (see the module docstring)."""

    name = "letter"
    system_prompt = "Reply with one word."
    max_turns = 2

    def __init__(self, difficulty: str = "easy") -> None:
        self.letter = "a"

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.letter = "aeiost"[seed % 6]
        info = {"task": self.name, "seed": seed, "difficulty": "easy", "gold": self.letter}
        return f"Say a word with the letter {self.letter}.", info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        ok = self.letter in action
        info = {"success": ok, "parse_error": False}
        return ("Correct." if ok else "Try again."), float(ok), ok, False, info


def register_letter_envs(*names: str) -> None:
    """Register a :class:`LetterEnv` family under each name not registered yet."""
    for name in names:
        if name in specs():
            continue
        register(
            EnvSpec(
                name=name,
                factory=type(name, (LetterEnv,), {"name": name}),
                oracle=lambda env: lambda obs: env.env.letter,
                description="toy env: say a word containing a letter",
                options={"difficulty": "easy|medium|hard (ignored)"},
            )
        )
