"""entropace as a verl plug-in (verl 0.9.1): EPPO, PAPO and baselines inside verl's trainer.

Install ``pip install -c constraints.txt "entropace[verl]"``; ``import verl`` then loads
:mod:`entropace.integrations.verl.plugin` through the ``verl.plugins`` entry point (in every
process, Ray workers included; ``VERL_USE_EXTERNAL_PLUGINS=none`` turns it off), which registers:

- policy losses ``eppo``, ``papo``, ``eppo_papo``, ``dcpo``, ``ce_gppo``
  (:mod:`~entropace.integrations.verl.losses`; ``actor_rollout_ref.actor.policy_loss.loss_mode``);
- the trainers ``entropace`` and ``entropace_colocate_async``
  (:mod:`~entropace.integrations.verl.trainer`; ``trainer.v1.trainer_mode=entropace``): per-task
  clip bounds from EntropyPacer after the old-log-prob pass, PAPO reweighting after the
  advantages, controller state in verl's checkpoints, ``entropace/...`` metrics in verl's
  tracking (the step logic is :class:`entropace.control.TaskStep`);
- the agent loop ``entropace`` running entropace's environment families
  (:mod:`~entropace.integrations.verl.agent_loop`).

Not registered on ``import verl``: the FSDP engine that also returns PAPO's sensitivity
``S = t2 - t1`` (:mod:`~entropace.integrations.verl.engine`), which only the entropace trainers'
actor workers register (in their processes), or a caller of ``register_engine()``, so that a
plain verl run keeps verl's engine.

The hook logic is plain tensor code in :mod:`~entropace.integrations.verl.hooks` (tested on a
hand-built ``DataProto``). Nothing here is imported by ``import entropace``; verl is optional.
See ``docs/integrations/verl.md`` for what is tested on CPU and what needs a GPU cluster.
"""

VERL_VERSION = "0.9.1"
