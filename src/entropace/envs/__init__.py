"""Text environments for multi-turn agent RL (see :mod:`entropace.envs.base`)."""

from entropace.envs.base import DIFFICULTIES, EnvError, Policy, TextEnv, TurnLimit, check_difficulty
from entropace.envs.registry import SPLITS, EnvSpec, make, register, seeds, spec, specs

__all__ = [
    "DIFFICULTIES",
    "EnvError",
    "EnvSpec",
    "Policy",
    "SPLITS",
    "TextEnv",
    "TurnLimit",
    "check_difficulty",
    "make",
    "register",
    "seeds",
    "spec",
    "specs",
]
