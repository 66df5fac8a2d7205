"""The ``verl.plugins`` entry point: ``import verl`` imports this module in every process.

verl 0.9.1's ``verl/__init__.py`` loads each entry point of the ``verl.plugins`` group (unless
``VERL_USE_EXTERNAL_PLUGINS=none``) and logs, at debug level only, any exception. So this
module never raises: what it registered and what it could not (with the reason) are in
:data:`REGISTERED` and :data:`FAILED`.

- The policy losses are registered always (light: ``verl.trainer.ppo.core_algos``).
- The trainer, the engine and the agent loop need verl's heavier stack (TransferQueue, the
  FSDP engine, the agent-loop server stack); each registers if its imports succeed.
"""

from __future__ import annotations

import importlib
import logging

logger = logging.getLogger(__name__)

#: what was registered: {"losses": [...], "trainer": ["entropace"], ...}
REGISTERED: dict[str, list[str]] = {}
#: part -> why it could not be registered (an ImportError message, typically)
FAILED: dict[str, str] = {}

_PARTS: dict[str, str] = {
    "losses": "entropace.integrations.verl.losses:register_losses",
    "engine": "entropace.integrations.verl.engine:register_engine",
    "trainer": "entropace.integrations.verl.trainer:register_trainer_cls",
    "agent_loop": "entropace.integrations.verl.agent_loop:register_agent_loop",
}


def register_all() -> dict[str, list[str]]:
    """Register every part that can be registered; idempotent. Returns :data:`REGISTERED`."""
    for part, target in _PARTS.items():
        if part in REGISTERED:
            continue
        module, func = target.split(":")
        try:
            names = getattr(importlib.import_module(module), func)()
        except Exception as exc:  # a missing optional stack must not break `import verl`
            FAILED[part] = f"{type(exc).__name__}: {exc}"
            logger.debug("entropace verl plug-in: %s not registered: %s", part, exc)
            continue
        FAILED.pop(part, None)
        REGISTERED[part] = list(names)
    return REGISTERED


register_all()
