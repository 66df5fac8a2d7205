"""entropace's algorithms inside other RL engines (optional extras).

Subpackages (each imports its engine lazily and, when the engine is missing, raises an
``ImportError`` naming the extra to install):

    trl   ``EntropaceGRPOTrainer``: EPPO / PAPO in Hugging Face TRL's ``GRPOTrainer``
          (``pip install 'entropace[trl]'``), plus a ``rollout_func`` adapter that runs
          entropace's environments as TRL multi-turn rollouts.

Importing this package imports no engine.
"""

from __future__ import annotations

__all__: list[str] = []
