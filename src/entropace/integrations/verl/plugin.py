"""The ``verl.plugins`` entry point: ``import verl`` imports this module in every process.

verl 0.9.1's ``verl/__init__.py`` loads each entry point of the ``verl.plugins`` group (unless
``VERL_USE_EXTERNAL_PLUGINS=none``) and logs, at debug level only, any exception. So this
module never raises: what it registered and what it could not (with the reason) are in
:data:`REGISTERED` and :data:`FAILED`.

- The policy losses are registered always (light: ``verl.trainer.ppo.core_algos``), under names
  of their own (``eppo``, ``papo`` ...): a plain verl run never selects them.
- The trainer (``trainer.v1.trainer_mode=entropace``) and the agent loop (``entropace``) need
  verl's heavier stack (TransferQueue, the agent-loop server stack); each registers if its
  imports succeed, again under names a plain run never selects.
- NOT the FSDP engine: replacing verl's engine class would change every plain verl run in the
  environment. It is registered only where asked: by the entropace trainer's own actor workers
  (in their processes, before they build their engine), or explicitly with
  :func:`entropace.integrations.verl.engine.register_engine`.
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
