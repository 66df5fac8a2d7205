"""The ``agentbench`` profile: AgentBench FC's interface, observations, limits and rewards.

``make(name, profile="agentbench")`` (trainer: ``tasks.profile: agentbench``; preset
``agentbench``) builds family ``name`` the way AgentBench FC (github:THUDM/AgentBench, the
function-calling release, commit 578c5e9) runs the corresponding task:

* ``interface="tools"``: the task's tool schemas (``configs/tasks/*.yaml``; kg's
  ``src/server/tasks/knowledgegraph/const.py``), results as ``tool`` messages;
* the turn limit of the task's config: ``dbbench.yaml`` ``max_round: 15``, ``os.yaml``
  ``round_limit: 8``, ``kg.yaml`` ``max_rounds: 15``, ``alfworld.yaml`` ``max_step: 20``,
  ``webshop.yaml`` ``round: 20``;
* the family options that reproduce the task's observations, output caps and scoring
  (:data:`AGENTBENCH`), where the family has them: an option a family does not (yet) have is
  left out and listed in :attr:`ProfileSettings.missing` (``docs/envs/agentbench.md``);
* calls per reply (:attr:`ProfileSettings.calls_per_reply`, the tools interface's
  ``calls_per_reply``): db and kg run every call of a reply in order (``for tool_call in
  tool_calls:``, ``src/server/tasks/dbbench/task.py`` line 133, ``knowledgegraph/task.py``
  line 140); os, household and shop run the first and ignore the rest (``tool_call =
  tool_calls[0]``: ``os_interaction/task.py`` line 569, ``webshop/task.py`` line 99,
  ``alfworld/task.py`` line 166);
* the task mix (:attr:`ProfileSettings.difficulty_mix`): where AgentBench's test set spans
  easy and hard instances (os, household, shop), a profile env built without a
  ``difficulty`` draws each seed's difficulty from the mix (:class:`MixedDifficulty`);
  household draws ALFWorld's six task types (``task_types="all"``: AgentBench's ALFWorld
  task scores all six, ``alfworld/task.py`` lines 65-72); db draws kinds without DELETE (AgentBench's test set has none);
* rewards: 1 / 0 per episode and 0 at the turn limit or after invalid calls. AgentBench FC's
  task code injects ``RewardHistoryItem(reward=0)`` on ``TASK_LIMIT_REACHED`` and on errors
  (e.g. ``src/server/tasks/dbbench/task.py``, ``os_interaction/task.py``); an abnormal end is
  the trainer's ``rollout.abnormal_penalty``, which the ``agentbench`` and ``paper`` presets
  set to 0.0 for this reason.

Explicit arguments to :func:`~entropace.envs.make` override the profile's values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from entropace.envs.splits import hash_unit

__all__ = ["AGENTBENCH", "MixedDifficulty", "ProfileSettings", "profile_settings"]


@dataclass(frozen=True)
class ProfileSettings:
    """What the profile sets for one family.

    Attributes:
        max_turns: the task's turn limit in AgentBench FC (None: the family's own).
        options: family options (applied when the family has them).
        source: where in AgentBench FC each value comes from.
        calls_per_reply: what the tools interface does with several calls in one reply
            (``"all"``, ``"first"`` or ``"strict"``; None: the suite's own).
        difficulty_mix: difficulty -> weight, drawn per seed when no ``difficulty`` is given
            (None: the family's default difficulty).
    """

    max_turns: int | None
    options: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    calls_per_reply: str | None = None
    difficulty_mix: dict[str, float] | None = None

    def missing(self, family_options: dict[str, str]) -> list[str]:
        """The profile's options that the family does not have (left out by ``make``)."""
        return sorted(set(self.options) - set(family_options))


#: Per family: AgentBench FC's turn limit and the family options matching its task.
AGENTBENCH: dict[str, ProfileSettings] = {
    "db": ProfileSettings(
        max_turns=15,
        options={
            "kinds": "select,insert,update",
            "max_rows": 1000,
            "timeout_s": 60.0,
            "style": "agentbench",
            "scoring": "agentbench",
        },  # fmt: skip
        source="configs/tasks/dbbench.yaml (max_round 15); dbbench/task.py: every call of a "
        "reply runs (line 133); the test samples are SELECT, INSERT and UPDATE, none DELETE "
        "(kinds=select,insert,update), the raw MySQL response is shown without a row limit, a "
        "statement is stopped after 60 s (asyncio.wait_for(..., 60)); first message and results "
        "as AgentBench formats them (lines 108-113; interaction.py lines 88-105: style=agentbench) "
        "and answers compared by result_processor.py's compare_results (scoring=agentbench)",
        calls_per_reply="all",
    ),
    "os": ProfileSettings(
        max_turns=8,
        options={"shell": "persistent", "output_chars": 800, "scoring": "agentbench"},
        source="configs/tasks/os.yaml (round_limit 8); os_interaction/task.py: one container "
        "shell per sample, output over 800 characters cut to 780 plus a note, the first call "
        "of a reply runs (line 569), answers judged by the check scripts (lines 671-738)",
        calls_per_reply="first",
        difficulty_mix={"easy": 1.0, "medium": 1.0, "hard": 1.0},
    ),
    "kg": ProfileSettings(
        max_turns=15,
        options={"hide_members": True, "final_answer": True, "reward": "exact_match"},
        source="configs/tasks/kg.yaml (max_rounds 15); knowledgegraph/task.py: 'variable #N, "
        "which are instances of T' only, 'Final Answer: #N' ends the episode, reward = exact "
        "match (F1 reported as the score), every call of a reply runs (line 140)",
        calls_per_reply="all",
    ),
    "household": ProfileSettings(
        max_turns=20,
        options={
            "action_list": True,
            "nearest_action": True,
            "repeat_limit": 3,
            "task_types": "all",
        },
        source="configs/tasks/alfworld.yaml (max_step 20); alfworld/task.py: ' AVAILABLE "
        "ACTIONS: ...' after every observation, process_action maps to the nearest "
        "admissible command, three identical actions fail the episode, the first call of a "
        "reply runs (line 166); the test games cover ALFWorld's six task types",
        calls_per_reply="first",
        difficulty_mix={"easy": 1.0, "medium": 1.0, "hard": 1.0},
    ),
    "shop": ProfileSettings(
        max_turns=20,
        options={"reward": "webshop", "page_format": "webshop"},
        source="configs/tasks/webshop.yaml (round 20); WebShop's get_reward (fuzzy attribute "
        "and option matching, type factor); webshop/task.py: observation_mode='text' pages "
        "(lines 39, 50), the first call of a reply runs (line 99)",
        calls_per_reply="first",
        difficulty_mix={"easy": 1.0, "medium": 1.0, "hard": 1.0},
    ),
    "reasoning": ProfileSettings(
        max_turns=None,
        source="not an AgentBench task: only the tools interface (final_answer)",
    ),
}


def profile_settings(family: str, difficulty: str | None = None) -> ProfileSettings:
    """The ``agentbench`` settings of ``family`` (``ValueError`` for a family it does not cover).

    ``difficulty`` is accepted for symmetry with the families' options; AgentBench FC's limits
    do not depend on it.
    """
    del difficulty
    if family not in AGENTBENCH:
        raise ValueError(
            f"the agentbench profile does not cover {family!r}; it covers {sorted(AGENTBENCH)}"
        )
    return AGENTBENCH[family]


class MixedDifficulty:
    """One environment per difficulty; ``reset(seed)`` plays the seed's difficulty.

    The difficulty of a seed is a stable draw from ``weights``
    (:func:`~entropace.envs.splits.hash_unit` of the seed), so a seed always gives the same
    instance; ``info["difficulty"]`` names it. Every other attribute is the current
    environment's (oracles and tool suites reach its state through it).

    Args:
        build: ``build(difficulty) -> env``.
        weights: difficulty -> weight (> 0).
        salt: keeps the draw of one family independent of another's.
    """

    def __init__(
        self, build: Callable[[str], Any], weights: dict[str, float], salt: str = ""
    ) -> None:
        if not weights or any(not w > 0 for w in weights.values()):
            raise ValueError(f"difficulty weights must be positive, got {weights!r}")
        self.envs = {d: build(d) for d in weights}
        total = sum(weights.values())
        self._edges: list[tuple[float, str]] = []
        acc = 0.0
        for d, w in weights.items():
            acc += w / total
            self._edges.append((acc, d))
        self.salt = salt
        self.current = next(iter(self.envs.values()))
        self.name = self.current.name
        self.max_turns = max(int(e.max_turns) for e in self.envs.values())

    def difficulty_of(self, seed: int) -> str:
        u = hash_unit(str(int(seed)), f"mix/{self.salt}")
        return next((d for edge, d in self._edges if u < edge), self._edges[-1][1])

    @property
    def system_prompt(self) -> str:
        return str(self.current.system_prompt)

    def __getattr__(self, item: str) -> Any:
        if item in ("envs", "current", "_edges", "salt"):
            raise AttributeError(item)
        return getattr(self.current, item)

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        close = getattr(self.current, "close", None)
        if callable(close):  # the previous episode's resources (os persistent shell)
            close()
        self.current = self.envs[self.difficulty_of(seed)]
        return self.current.reset(seed)

    def step(self, action: str) -> Any:
        return self.current.step(action)

    def close(self) -> None:
        for env in self.envs.values():
            close = getattr(env, "close", None)
            if callable(close):
                close()
