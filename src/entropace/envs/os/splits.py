"""Content splits of ``os``: held-out task kinds and fingerprint-disjoint instances.

* ``test_unseen`` draws only the kinds of :data:`UNSEEN_KINDS` (a question and a goal per
  difficulty, :mod:`entropace.envs.os.tasks_more`); ``train`` and ``test`` never draw them
  (an explicit ``kinds`` option naming one is refused).
* ``train`` and ``test`` draw the same kinds; an instance belongs to ``test`` (or
  ``test_unseen``) only when its fingerprint (the task prompt the agent reads plus the gold
  answer or goal) hashes into the test bucket (:func:`entropace.envs.splits.draw_in_split`),
  so no test instance equals a train instance. A kind with a fixed prompt and few possible
  answers (``count_users``) keeps, in ``test``, only the answers that hash into the bucket.
"""

from __future__ import annotations

import random

from entropace.envs.os.tasks import BY_DIFFICULTY, TASKS, Task, TaskFn
from entropace.envs.os.tasks_more import MORE_TASKS
from entropace.envs.os.tasks_shell import SHELL_TASKS
from entropace.envs.os.tree import Tree, generate_tree
from entropace.envs.splits import draw_in_split, fingerprint, split_of

__all__ = [
    "ALL_TASKS",
    "TRAIN_KINDS",
    "UNSEEN_KINDS",
    "draw_task",
    "pools",
    "task_fingerprint",
]

#: Every kind by name (fresh-shell, added and persistent-shell kinds).
ALL_TASKS: dict[str, TaskFn] = {**TASKS, **MORE_TASKS, **SHELL_TASKS}

#: difficulty -> the fresh-shell kinds ``train`` and ``test`` draw by default.
TRAIN_KINDS: dict[str, tuple[str, ...]] = {
    "easy": (*BY_DIFFICULTY["easy"], "count_scripts"),
    "medium": (*BY_DIFFICULTY["medium"], "max_amount"),
    "hard": (*BY_DIFFICULTY["hard"], "top_region"),
}

#: difficulty -> the kinds only ``test_unseen`` draws (held out from train and test).
UNSEEN_KINDS: dict[str, tuple[str, ...]] = {
    "easy": ("word_count", "append_line"),
    "medium": ("user_requests", "delete_rotated"),
    "hard": ("error_components", "merge_tables"),
}

HELD_OUT: frozenset[str] = frozenset(k for kinds in UNSEEN_KINDS.values() for k in kinds)


def task_fingerprint(task: Task) -> str:
    """:func:`~entropace.envs.splits.fingerprint` of the first observation and the gold."""
    return fingerprint(f"Task: {task.prompt}", task.gold)


def draw_task(seed: int, difficulty: str, kinds: tuple[str, ...]) -> tuple[str, Tree, Task]:
    """The kind, tree and task of ``seed`` in its split (``kinds``: the train/test kinds)."""
    pool = UNSEEN_KINDS[difficulty] if split_of(seed) == "test_unseen" else kinds

    def build(attempt: int) -> tuple[str, Tree, Task]:
        stream = f"entropace.os/{difficulty}/{int(seed)}" + (f"/{attempt}" if attempt else "")
        rng = random.Random(stream)
        kind = rng.choice(pool)
        tree = generate_tree(rng, difficulty)
        task = ALL_TASKS[kind](rng, tree)  # may adjust the tree (ties, modes) before rendering
        return kind, tree, task

    (kind, tree, task), _ = draw_in_split(
        seed, build, lambda c: task_fingerprint(c[2]), salt=f"os/{difficulty}"
    )
    return kind, tree, task


def pools(difficulty: str) -> dict[str, int]:
    """Task kinds of each side at ``difficulty`` (fresh shell; the persistent shell adds its
    system-state kinds to train/test)."""
    return {
        "kinds (train, test)": len(TRAIN_KINDS[difficulty]),
        "kinds (test_unseen)": len(UNSEEN_KINDS[difficulty]),
    }
