"""``reasoning``: single-turn verifiable tasks from reasoning-gym (one family, several datasets).

See ``docs/envs/reasoning.md``. ``make("reasoning", difficulty="medium", datasets="countdown")``.
"""

from entropace.envs.reasoning.datasets import DATASETS, build_dataset, parse_datasets
from entropace.envs.reasoning.env import ReasoningEnv, extract_answer, oracle
from entropace.envs.registry import EnvSpec, register

SPEC = register(
    EnvSpec(
        name="reasoning",
        factory=ReasoningEnv,
        oracle=oracle,
        description="single-turn verifiable reasoning (reasoning-gym: " + ", ".join(DATASETS) + ")",
        options={
            "difficulty": "easy | medium | hard (default easy): each dataset's size knobs",
            "datasets": "comma-separated subset of " + ",".join(DATASETS) + " (default: all)",
        },
        data_source="reasoning-gym (procedurally generated; https://github.com/open-thought/reasoning-gym)",
        license="Apache-2.0 (reasoning-gym)",
        requires=("reasoning-gym",),
    )
)

__all__ = [
    "DATASETS",
    "SPEC",
    "ReasoningEnv",
    "build_dataset",
    "extract_answer",
    "oracle",
    "parse_datasets",
]
