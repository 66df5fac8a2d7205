"""EPPO and PAPO inside Hugging Face TRL (``pip install 'entropace[trl]'``, TRL 1.16).

    from entropace.integrations.trl import EntropaceGRPOTrainer
    trainer = EntropaceGRPOTrainer(model, reward_funcs, args=GRPOConfig(...),
                                   train_dataset=ds, algorithm="eppo+papo", task_column="task")

Modules:
    trainer  ``EntropaceGRPOTrainer`` (a ``trl.GRPOTrainer`` subclass)
    recipes  which algorithm recipes TRL can run (``SUPPORTED``, ``UNSUPPORTED`` with reasons)
    stats    the statistics at the sampling temperature: collected during ``generate``, or a
             chunked no-grad pass
    steps    the per-batch arithmetic (per-completion bounds, global PAPO rescaling, RLOO)
    envs     entropace's environments as TRL multi-turn rollouts (``env_rollout_func``)
    tools    the families' tools through TRL's ``environment_factory`` (``tool_environment``)

See ``docs/integrations/trl.md``.
"""

from __future__ import annotations

try:
    import trl as _trl
except ImportError as _exc:  # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        "entropace.integrations.trl needs TRL: pip install 'entropace[trl]' "
        f"(TRL 1.16.0; the import failed with: {_exc})"
    ) from _exc

from entropace.integrations.trl.envs import (
    EnvRolloutConfig,
    env_dataset,
    env_reward,
    env_rollout_func,
)
from entropace.integrations.trl.recipes import SUPPORTED, UNSUPPORTED, TRLRecipe, resolve_recipe
from entropace.integrations.trl.stats import (
    CompletionStats,
    GenerationStats,
    completion_token_stats,
)
from entropace.integrations.trl.tools import (
    EntropaceToolEnvironment,
    env_tool_reward,
    tool_env_dataset,
    tool_environment,
    tool_environments,
)
from entropace.integrations.trl.trainer import (
    EPS_HIGH_KEY,
    EPS_LOW_KEY,
    STATE_FILE,
    TASK_IDS_KEY,
    EntropaceGRPOTrainer,
)

TRL_VERSION = "1.16.0"
if _trl.__version__ != TRL_VERSION:
    import warnings as _warnings

    _warnings.warn(
        f"entropace.integrations.trl is tested with trl=={TRL_VERSION}; found "
        f"{_trl.__version__}. It overrides private GRPOTrainer methods, which can change "
        "between TRL releases: pip install 'entropace[trl]'",
        stacklevel=2,
    )

__all__ = [
    "EPS_HIGH_KEY",
    "EPS_LOW_KEY",
    "STATE_FILE",
    "SUPPORTED",
    "TASK_IDS_KEY",
    "TRL_VERSION",
    "UNSUPPORTED",
    "CompletionStats",
    "EntropaceGRPOTrainer",
    "EntropaceToolEnvironment",
    "GenerationStats",
    "EnvRolloutConfig",
    "TRLRecipe",
    "completion_token_stats",
    "env_dataset",
    "env_reward",
    "env_rollout_func",
    "env_tool_reward",
    "resolve_recipe",
    "tool_env_dataset",
    "tool_environment",
    "tool_environments",
]
