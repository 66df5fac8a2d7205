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
* rewards: 1 / 0 per episode and 0 at the turn limit or after invalid calls. AgentBench FC's
  task code injects ``RewardHistoryItem(reward=0)`` on ``TASK_LIMIT_REACHED`` and on errors
  (e.g. ``src/server/tasks/dbbench/task.py``, ``os_interaction/task.py``); an abnormal end is
  the trainer's ``rollout.abnormal_penalty``, which the ``agentbench`` and ``paper`` presets
  set to 0.0 for this reason.

Explicit arguments to :func:`~entropace.envs.make` override the profile's values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["AGENTBENCH", "ProfileSettings", "profile_settings"]


@dataclass(frozen=True)
class ProfileSettings:
    """What the profile sets for one family.

    Attributes:
        max_turns: the task's turn limit in AgentBench FC (None: the family's own).
        options: family options (applied when the family has them).
        source: where in AgentBench FC each value comes from.
    """

    max_turns: int | None
    options: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    def missing(self, family_options: dict[str, str]) -> list[str]:
        """The profile's options that the family does not have (left out by ``make``)."""
        return sorted(set(self.options) - set(family_options))


#: Per family: AgentBench FC's turn limit and the family options matching its task.
AGENTBENCH: dict[str, ProfileSettings] = {
    "db": ProfileSettings(
        max_turns=15,
        options={"kinds": "all", "max_rows": 1000, "timeout_s": 60.0},
        source="configs/tasks/dbbench.yaml (max_round 15); dbbench/task.py: 200 of the 300 "
        "test samples are INSERT/UPDATE/DELETE (kinds=all), the raw MySQL response is shown "
        "without a row limit, a statement is stopped after 60 s (asyncio.wait_for(..., 60))",
    ),
    "os": ProfileSettings(
        max_turns=8,
        options={"shell": "persistent", "output_chars": 800},
        source="configs/tasks/os.yaml (round_limit 8); os_interaction/task.py: one container "
        "shell per sample, output over 800 characters cut to 780 plus a note",
    ),
    "kg": ProfileSettings(
        max_turns=15,
        options={"hide_members": True, "final_answer": True, "reward": "exact_match"},
        source="configs/tasks/kg.yaml (max_rounds 15); knowledgegraph/task.py: 'variable #N, "
        "which are instances of T' only, 'Final Answer: #N' ends the episode, reward = exact "
        "match (F1 reported as the score)",
    ),
    "household": ProfileSettings(
        max_turns=20,
        options={"action_list": True, "nearest_action": True, "repeat_limit": 3},
        source="configs/tasks/alfworld.yaml (max_step 20); alfworld/task.py: ' AVAILABLE "
        "ACTIONS: ...' after every observation, process_action maps to the nearest "
        "admissible command, three identical actions fail the episode",
    ),
    "shop": ProfileSettings(
        max_turns=20,
        options={"reward": "webshop"},
        source="configs/tasks/webshop.yaml (round 20); WebShop's get_reward (fuzzy attribute "
        "and option matching, type factor)",
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
