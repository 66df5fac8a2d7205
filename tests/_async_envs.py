"""Environments for the async-rollout tests, registered on import so that a rollout worker
process can import them (``rollout.worker_imports: [_async_envs]``).

* ``letter``: the toy :class:`~entropace.envs.toy.LetterEnv`;
* ``boom``: a LetterEnv whose ``reset`` raises from the third train seed on (step 3 of a run
  with one prompt per step), in any process;
* ``crash``: a LetterEnv that SIGKILLs its own process from the third train seed on, but
  only inside a worker process (a process with a multiprocessing parent), never the test's.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from typing import Any

from entropace.envs.registry import EnvSpec, register
from entropace.envs.splits import SPLITS
from entropace.envs.toy import LetterEnv, register_letter_envs

register_letter_envs("letter")
FIRST = SPLITS["train"].start


class BoomEnv(LetterEnv):
    name = "boom"

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        if seed > FIRST + 1:
            raise ValueError(f"boom at seed {seed}")
        return super().reset(seed)


class CrashEnv(LetterEnv):
    name = "crash"

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        if seed > FIRST + 1 and multiprocessing.parent_process() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().reset(seed)


for cls in (BoomEnv, CrashEnv):
    register(
        EnvSpec(
            name=cls.name,
            factory=cls,
            oracle=lambda env: lambda obs: env.env.letter,
            description="test env",
            options={"difficulty": "ignored"},
        )  # fmt: skip
    )
