"""``lab-*``: the pace-mismatch lab, synthetic code-answer tasks of graded difficulty.

A controlled toy for studying entropy pacing on the tiny model in minutes (``docs/lab.md``),
not an agent benchmark. Each task of :data:`LAB_TASKS` is registered as its own family
(``lab-easy``, ``lab-mid``, ``lab-hard``) because batches and metrics are keyed by family.
"""

from entropace.envs.lab.env import (
    CREDITS,
    LAB_TASKS,
    LabEnv,
    LabTask,
    check_credit,
    favourite_letter,
    lab_oracle,
    lab_prior,
    matched_positions,
    matched_prefix,
    score_reply,
)
from entropace.envs.registry import EnvSpec, register

__all__ = [
    "CREDITS",
    "LAB_TASKS",
    "SPECS",
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


def _spec(task: LabTask) -> EnvSpec:
    factory = type(f"LabEnv_{task.name.replace('-', '_')}", (LabEnv,), {"task": task})
    hints = []
    if task.partial:
        hints.append(f"{task.credit} credit {task.partial:g}")
    if task.decoy:
        hints.append(f"decoy {task.decoy!r} worth {task.decoy_reward:g}")
    extra = f" ({', '.join(hints)})" if hints else ""
    unit = "digit" if task.alphabet.isdigit() else "letter"
    return EnvSpec(
        name=task.name,
        factory=factory,
        oracle=lab_oracle,
        prior=lab_prior,
        description=(
            f"pace-mismatch lab, {task.level}: reply with a {len(task.code)}-{unit} code{extra}"
        ),
        options={
            "difficulty": "easy | medium | hard (default easy): code length +0 / +1 / +2",
            "credit": f"prefix | position (default {task.credit}): how partial credit counts",
        },
    )


SPECS: dict[str, EnvSpec] = {name: register(_spec(task)) for name, task in LAB_TASKS.items()}
