"""Content splits of ``household``: held-out floor plans and fingerprint-disjoint instances.

* ``test_unseen`` draws only from ALFRED's ``valid_unseen`` floor plans (:data:`UNSEEN_SCENES`:
  FloorPlan 10, 219, 308, 424, one kitchen, living room, bedroom and bathroom; ALFWorld's
  ``valid_unseen`` / ``eval_out_of_distribution`` games, which AgentBench's ALFWorld test uses,
  are played in them). ``train`` and ``test`` never see these plans.
* ``train`` and ``test`` share the other 116 plans; an instance belongs to ``test`` (or
  ``test_unseen``) only when its fingerprint (the first observation: the room and the task,
  plus the gold: the goal and where its objects start) hashes into the test bucket
  (:func:`entropace.envs.splits.draw_in_split`), so no test instance equals a train
  instance, not even one of a held-out plan whose furniture matches a training plan's.

The four held-out plans cover every (difficulty, task type) pair (a test checks it).
"""

from __future__ import annotations

from entropace.envs.household.generate import LEVELS, Instance, candidates, generate
from entropace.envs.splits import draw_in_split, fingerprint, split_of

__all__ = [
    "UNSEEN_SCENES",
    "first_observation",
    "instance_fingerprint",
    "pools",
    "split_instance",
]

#: ALFRED's valid_unseen floor plans (kitchen, living room, bedroom, bathroom).
UNSEEN_SCENES: frozenset[int] = frozenset({10, 219, 308, 424})

WELCOME = "-= Welcome to TextWorld, ALFRED! =-"


def first_observation(instance: Instance) -> str:
    """What the agent reads at reset (without AgentBench's optional action list)."""
    return f"{WELCOME}\n\n{instance.world.look()}\n\nYour task is to: {instance.goal.text}"


def instance_fingerprint(instance: Instance) -> str:
    """:func:`~entropace.envs.splits.fingerprint` of the first observation and the gold."""
    return fingerprint(first_observation(instance), instance.gold)


def split_instance(
    seed: int, difficulty: str, task_types: tuple[str, ...] | None = None
) -> Instance:
    """The instance of ``seed`` in its split (:func:`~entropace.envs.splits.split_of`)."""
    unseen = split_of(seed) == "test_unseen"

    def allowed(sid: int) -> bool:
        return (sid in UNSEEN_SCENES) == unseen

    def build(attempt: int) -> Instance:
        if not unseen:  # the historical draw, kept when its plan is not held out
            instance = generate(seed, difficulty, attempt=attempt, task_types=task_types)
            if allowed(instance.scene):
                return instance
        return generate(seed, difficulty, attempt=attempt, scenes=allowed, task_types=task_types)

    instance, _ = draw_in_split(seed, build, instance_fingerprint, salt=f"household/{difficulty}")
    return instance


def pools(difficulty: str) -> dict[str, int]:
    """Floor plans drawable at ``difficulty`` (train/test and held out) and its task types."""
    plans = {sid for tt in LEVELS[difficulty].task_types for sid in candidates(difficulty, tt)}
    return {
        "task types": len(LEVELS[difficulty].task_types),
        "floor plans (train, test)": len(plans - UNSEEN_SCENES),
        "floor plans (test_unseen)": len(plans & UNSEEN_SCENES),
    }
