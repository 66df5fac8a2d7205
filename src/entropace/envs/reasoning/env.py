"""Single-turn verifiable reasoning tasks from reasoning-gym.

One episode = one question. The observation is the reasoning-gym question followed by the
answer-format instruction; the action is the model's whole reply, from which the final answer is
extracted (:func:`extract_answer`) and scored with the dataset's own ``score_answer``. The reward
is that score (in [0, 1]; some scorers give partial credit), success is ``score >= 1``, and the
episode always terminates after the one action.
"""

from __future__ import annotations

import math
import random
from typing import Any

from entropace.envs.base import Policy, StepResult, action_too_long, check_difficulty
from entropace.envs.reasoning.datasets import (
    DATASETS,
    MAX_ANSWER_CHARS,
    VIRTUAL_SIZE,
    build_dataset,
    parse_datasets,
)
from entropace.envs.splits import SplitUnavailable, draw_in_split, fingerprint, split_of

NAME = "reasoning"

ANSWER_INSTRUCTION = "Put your final answer inside <answer></answer> tags."

SYSTEM_PROMPT = """You solve one reasoning problem per episode (arithmetic, number puzzles, \
word sorting, logic puzzles).
You may think step by step first. Then give your final answer, and nothing else, inside \
<answer></answer> tags, in the format the question asks for. Only the last \
<answer>...</answer> block is graded. If there is no such block, the text after the last \
"Answer:" (up to the end of that line) is graded instead.
You have one reply: it is graded at once and the episode ends.

Example:
Question: Calculate 12 + 30.
Your reply: 12 + 30 = 42.
<answer>42</answer>"""

_OPEN, _CLOSE, _PREFIX = "<answer>", "</answer>", "answer:"


def extract_answer(text: str) -> str | None:
    """The final answer in ``text``, or ``None`` when there is none.

    Rules (linear time, case-insensitive tags): the content of the last ``<answer>...</answer>``
    block; otherwise the rest of the line after the last ``Answer:``. Surrounding whitespace is
    stripped; an empty answer counts as none.
    """
    low = text.lower()
    end = low.rfind(_CLOSE)
    if end >= 0:
        start = low.rfind(_OPEN, 0, end)
        if start >= 0:
            answer = text[start + len(_OPEN) : end].strip()
            return answer or None
    pos = low.rfind(_PREFIX)
    if pos >= 0:
        rest = text[pos + len(_PREFIX) :]
        answer = rest.split("\n", 1)[0].strip()
        return answer or None
    return None


def _clip(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[:n] + f"... [{len(text) - n} more characters]"


class ReasoningEnv:
    """The ``reasoning`` family: one reasoning-gym question per episode.

    Args:
        difficulty: ``easy`` / ``medium`` / ``hard``, mapped to each dataset's config knobs
            (see :data:`entropace.envs.reasoning.datasets.DATASETS`).
        datasets: comma-separated reasoning-gym dataset names (default: all of them). Seed
            ``s`` picks the dataset with ``random.Random(s)`` and then instance ``s`` of it.
    """

    name = NAME
    system_prompt = SYSTEM_PROMPT
    max_turns = 1

    def __init__(self, difficulty: str = "easy", datasets: str | None = None) -> None:
        self.difficulty = check_difficulty(difficulty)
        self.datasets = parse_datasets(datasets)
        self.dataset_name: str | None = None
        self.entry: dict[str, Any] | None = None
        self.seed: int | None = None

    def _candidate(self, seed: int, attempt: int) -> tuple[str, dict[str, Any], str]:
        """Attempt ``attempt`` of seed ``seed``: (dataset, entry, observation). Attempt 0 is
        the historical draw (dataset by ``Random(seed)``, entry ``seed``); later attempts draw
        both again from the seed's own stream."""
        if attempt == 0:
            name, index = random.Random(seed).choice(self.datasets), seed
        else:
            rng = random.Random(f"reasoning/{seed}/{attempt}")
            name, index = rng.choice(self.datasets), rng.randrange(VIRTUAL_SIZE)
        entry = build_dataset(name, self.difficulty)[index]
        return name, entry, f"{entry['question'].rstrip()}\n\n{ANSWER_INSTRUCTION}"

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        """Instance ``seed`` of its split: ``train`` and ``test`` are disjoint by content (a
        test instance's question and answer never occur in train,
        :func:`~entropace.envs.splits.draw_in_split`); there is no ``test_unseen``
        (:class:`~entropace.envs.splits.SplitUnavailable`)."""
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        split = split_of(seed)
        if split == "test_unseen":
            raise SplitUnavailable(
                "reasoning has no held-out units (test_unseen); use the test split"
            )
        (name, entry, obs), attempt = draw_in_split(
            seed,
            lambda attempt: self._candidate(seed, attempt),
            lambda c: fingerprint(c[2], str(c[1]["answer"])),
            salt=f"reasoning/{self.difficulty}",
        )
        self.seed, self.dataset_name, self.entry = seed, name, entry
        info = {
            "task": NAME,
            "seed": seed,
            "difficulty": self.difficulty,
            "gold": str(entry["answer"]),
            "dataset": name,
            "split": split,
            "attempt": attempt,
            "fingerprint": fingerprint(obs, str(entry["answer"])),
        }
        return obs, info

    @property
    def gold(self) -> str:
        """The gold answer of the current instance."""
        if self.entry is None:
            raise RuntimeError("reasoning: reset() has not been called")
        return str(self.entry["answer"])

    def score(self, answer: str) -> tuple[float, str | None]:
        """``(score, error)`` of an extracted answer: the dataset scorer's value, clipped to
        [0, 1]; ``error`` names why the scorer was not run or failed (then the score is 0)."""
        assert self.entry is not None and self.dataset_name is not None
        if len(answer) > MAX_ANSWER_CHARS:
            return 0.0, f"answer longer than {MAX_ANSWER_CHARS} characters"
        guard = DATASETS[self.dataset_name].guard
        reason = guard(answer) if guard is not None else None
        if reason is not None:
            return 0.0, reason
        try:
            value = float(
                build_dataset(self.dataset_name, self.difficulty).score_answer(answer, self.entry)
            )
        except Exception as exc:  # noqa: BLE001 - a scorer bug must never crash the rollout
            return 0.0, f"scorer raised {type(exc).__name__}"
        if not math.isfinite(value):
            return 0.0, "scorer returned a non-finite score"
        return min(1.0, max(0.0, value)), None

    def step(self, action: str) -> StepResult:
        if self.entry is None:
            raise RuntimeError("reasoning: step() called before reset()")
        too_long = action_too_long(action)
        if too_long is not None:
            obs = f"{too_long} Score: 0. The episode is over."
            return obs, 0.0, True, False, {"success": False, "parse_error": True, "score": 0.0}
        answer = extract_answer(action)
        if answer is None:
            obs = (
                "No final answer found: put it inside <answer></answer> tags. Score: 0. "
                "The episode is over."
            )
            return obs, 0.0, True, False, {"success": False, "parse_error": True, "score": 0.0}
        score, error = self.score(answer)
        success = score >= 1.0
        verdict = "correct" if success else ("partially correct" if score > 0 else "incorrect")
        obs = f"Your answer: {_clip(answer)}\nScore: {score:.3g} ({verdict}). The episode is over."
        info: dict[str, Any] = {
            "success": success,
            "parse_error": error is not None,
            "score": score,
        }
        if error is not None:
            obs += f"\nNot scored: {error}."
            info["error"] = error
        return obs, score, True, False, info


def oracle(env: Any) -> Policy:
    """Answers the gold answer in the expected format (``<answer>gold</answer>``)."""
    gold = env.gold

    def policy(observation: str) -> str:
        return f"The solution follows.\n<answer>{gold}</answer>"

    return policy
