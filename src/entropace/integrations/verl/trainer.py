"""The ``entropace`` trainers for verl 0.9.1's V1 trainer (``trainer.v1.trainer_mode=entropace``,
or ``entropace_colocate_async``).

Subclasses of verl's synchronous ``PPOTrainerSync`` and of its colocated asynchronous
``PPOTrainerColocateAsync``, registered with verl's ``register_trainer``. Both change the same
four steps of verl's pipeline (the step hooks all V1 trainers share) and nothing else:

1. workers: the actor worker is :class:`EntropaceActorRolloutRefWorker`, whose loss function
   reads the per-token bounds from the batch (:class:`~entropace.integrations.verl.losses.
   EntropaceLossFn` around verl's ``ppo_loss``);
2. after the old-log-prob pass (which verl runs with ``calculate_entropy=True``): per-task
   entropy from ``entropy``, ``response_mask`` and ``data_source`` drives EPPO's pacer on the
   driver, and ``entropace_eps_low`` / ``entropace_eps_high`` are written to the batch
   (TransferQueue), response-aligned like ``advantages``. With PAPO the pass also returns
   ``entropace_sensitivity`` (:mod:`~entropace.integrations.verl.engine`) and the polarity
   controller advances;
3. after verl's advantage estimator: PAPO reweights ``advantages``;
4. checkpoints: the controllers' JSON state is written to ``global_step_<n>/entropace.json``
   (``_save_checkpoint``, before verl's own files and tracker, so a checkpoint verl can resume
   always has it) and read back, validated, on resume (verl's public ``on_init_end`` hook, after
   verl loaded its checkpoint).

Metrics (``entropace/task/<k>/eps_low``, ``.../entropy``, ``.../pace_z``,
``entropace/polarity/...``) go into the step's metrics, hence verl's tracking. The driver logic
itself is :class:`~entropace.integrations.verl.hooks.EntropaceHook`.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import ray
import torch
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.single_controller.base.decorator import Dispatch, register
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1 import trainer_base
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.utils.padding import response_from_nested, response_to_nested

from entropace.control import StateError
from entropace.integrations.verl.engine import FLAG, register_engine
from entropace.integrations.verl.hooks import (
    SENSITIVITY_FIELD,
    SUCCESS_FIELD,
    EntropaceHook,
    settings_from_config,
)
from entropace.integrations.verl.losses import BOUND_FIELDS, EntropaceLossFn

__all__ = [
    "STATE_FILE",
    "TRAINERS",
    "TRAINER_NAME",
    "EntropaceActorRolloutRefWorker",
    "EntropaceColocateAsyncTrainer",
    "EntropacePPOTrainer",
    "register_trainer_cls",
]

logger = logging.getLogger(__name__)

TRAINER_NAME = "entropace"
STATE_FILE = "entropace.json"
_ACTOR_ROLES = (Role.Actor, Role.ActorRollout, Role.ActorRolloutRef)


class EntropaceActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's actor/rollout/ref worker whose actor loss reads entropace's per-token bounds, and
    whose engine is entropace's FSDP engine (verl's, plus PAPO's sensitivity when asked):
    registered here, in this worker's process, before verl builds the engine, so that only
    the entropace trainer's workers use it."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        register_engine()
        super().init_model()
        if getattr(self, "actor", None) is not None and self.loss_fn is not None:
            self.loss_fn = EntropaceLossFn(self.loss_fn)
            self.actor.set_loss_fn(self.loss_fn)


def _tq() -> Any:
    """verl's TransferQueue client module, as the base trainer uses it (patchable in tests)."""
    return trainer_base.tq


def _padded(data: TensorDict, names: list[str]) -> TensorDict:
    present = [n for n in names if n in data.keys()]
    return data.select(*present).to_padded_tensor()


def _non_tensor_list(data: TensorDict, name: str) -> list[Any] | None:
    if name not in data.keys():
        return None
    value = data[name]
    if hasattr(value, "tolist"):
        value = value.tolist()
    return list(value)


class _EntropaceSteps:
    """EPPO / PAPO in the step hooks every verl V1 trainer shares (``PPOTrainer``'s
    ``_compute_old_log_prob``, ``_compute_advantage``, ``_update_actor``, checkpoints); the
    lifecycle (``on_step_end``, weight sync, warm-up batches ...) stays the base trainer's.
    ``base_mode`` is the verl trainer mode whose replay buffer and options it runs with."""

    base_mode: str = "sync"

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.entropace = EntropaceHook(settings_from_config(config))
        corr = config.algorithm.get("rollout_correction", None)
        if corr is not None and corr.get("bypass_mode", False):
            raise ValueError(
                "the entropace trainer needs verl's old-log-prob pass (entropy per token); "
                "algorithm.rollout_correction.bypass_mode=True skips it"
            )

    def _build_replay_buffer(self) -> Any:
        # verl's base branches on `trainer_mode == "sync"` (replay buffer, TransferQueue
        # checkpoints, refills); this trainer IS the base-mode trainer registered under its own
        # name, so it runs with that mode and the `trainer.v1.<base_mode>` options.
        self.trainer_mode = self.base_mode
        options = self.config.trainer.v1.get(self.base_mode, None) or {}
        self.parameter_sync_step = options.get("parameter_sync_step", 1)
        return super()._build_replay_buffer()

    # ------------------------------------------------------------------------------ workers
    def _init_resource_pool_mgr(self) -> None:
        super()._init_resource_pool_mgr()
        for role in list(self.role_worker_mapping):
            if role in _ACTOR_ROLES:
                self.role_worker_mapping[role] = ray.remote(EntropaceActorRolloutRefWorker)

    # ------------------------------------------------------------------------- step hooks
    def _compute_old_log_prob(self, batch: Any, metrics: dict) -> Any:
        if self.entropace.needs_sensitivity:
            batch.extra_info[FLAG] = True
        meta = batch
        try:
            batch = super()._compute_old_log_prob(batch, metrics)
        finally:  # the later passes (ref, update) must not compute it
            meta.extra_info.pop(FLAG, None)
            batch.extra_info.pop(FLAG, None)
        tq = _tq()
        fields = ["entropy", "response_mask", "rm_scores", "data_source", "extra_fields"]
        if self.entropace.needs_sensitivity:
            fields.append(SENSITIVITY_FIELD)
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=fields
        )
        response_mask = data["response_mask"]
        write: dict[str, torch.Tensor] = {}
        if self.entropace.needs_sensitivity:
            if SENSITIVITY_FIELD not in data.keys():
                raise ValueError(
                    "PAPO: the old-log-prob pass returned no 'entropace_sensitivity'; the actor "
                    "engine must be entropace's FSDP engine (NVIDIA GPUs, use_remove_padding=True)"
                )
            sens = response_from_nested(data[SENSITIVITY_FIELD], response_mask)
            write[SENSITIVITY_FIELD] = sens
        padded = _padded(data, ["entropy", "response_mask", "rm_scores"])
        non_tensor: dict[str, np.ndarray] = {}
        sources = _non_tensor_list(data, "data_source")
        if sources is not None:
            non_tensor["data_source"] = np.array([str(s) for s in sources], dtype=object)
        extra = _non_tensor_list(data, "extra_fields")
        if extra and all(isinstance(e, dict) and SUCCESS_FIELD in e for e in extra):
            non_tensor[SUCCESS_FIELD] = np.array([float(e[SUCCESS_FIELD]) for e in extra])
        proto = DataProto(batch=padded, non_tensor_batch=non_tensor)
        valid = [not tag.get("is_padding", False) for tag in batch.tags]
        metrics.update(self.entropace.on_old_log_prob(proto, valid=valid))
        if self.entropace.writes_bounds:
            for name in BOUND_FIELDS:
                write[name] = response_to_nested(proto.batch[name], response_mask)
        if write:
            batch = tq.kv_batch_put(
                keys=batch.keys,
                partition_id=batch.partition_id,
                fields=TensorDict(write, batch_size=len(batch)),
            )
        return batch

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        batch = super()._compute_advantage(batch, metrics)
        if not self.entropace.needs_sensitivity:
            return batch
        tq = _tq()
        data = tq.kv_batch_get(
            keys=batch.keys,
            partition_id=batch.partition_id,
            select_fields=["advantages", "response_mask", SENSITIVITY_FIELD],
        )
        response_mask = data["response_mask"]
        proto = DataProto(batch=data.to_padded_tensor())
        metrics.update(self.entropace.on_advantages(proto))
        adv = response_to_nested(proto.batch["advantages"], response_mask)
        return tq.kv_batch_put(
            keys=batch.keys,
            partition_id=batch.partition_id,
            fields=TensorDict({"advantages": adv}, batch_size=len(batch)),
        )

    def _update_actor(self, batch: Any, metrics: dict) -> Any:
        batch.extra_info.update(self.entropace.loss_options)
        return super()._update_actor(batch, metrics)

    # ------------------------------------------------------------------------- checkpoints
    def _step_folder(self, step: int) -> str:
        root = self.config.trainer.default_local_dir
        if not os.path.isabs(root):
            root = os.path.join(os.getcwd(), root)
        return os.path.join(root, f"global_step_{step}")

    def save_entropace_state(self, folder: str) -> str:
        """Write the controllers' state to ``folder/entropace.json`` (atomic rename)."""
        path = os.path.join(folder, STATE_FILE)
        self.entropace.step.save_state_file(path)
        return path

    def load_entropace_state(self, folder: str) -> None:
        """Restore the controllers from ``folder/entropace.json``, validated; a missing or bad
        file is a :class:`~entropace.control.StateError` naming it (a resumed run never
        restarts its controllers silently)."""
        path = os.path.join(folder, STATE_FILE)
        if not os.path.exists(path):
            raise StateError(
                f"{path}: missing; this checkpoint was not written by the entropace trainer, so "
                "its controllers cannot resume exactly"
            )
        self.entropace.load_state_file(path)

    def _save_checkpoint(self) -> None:
        self.save_entropace_state(self._step_folder(self.global_steps))
        super()._save_checkpoint()

    def on_init_end(self) -> None:
        """verl's public hook after set-up, which has loaded verl's checkpoint (``global_steps``
        > 0 on a resume): the controllers' state of that checkpoint is loaded here, validated,
        before the base trainer's own ``on_init_end`` (weight sync)."""
        if getattr(self, "global_steps", 0) > 0:
            self.load_entropace_state(self._resume_folder())
        super().on_init_end()

    def _resume_folder(self) -> str:
        if self.config.trainer.resume_mode == "resume_path":
            folder = self.config.trainer.resume_from_path
            if not os.path.isabs(folder):
                folder = os.path.join(os.getcwd(), folder)
        else:
            root = self.config.trainer.default_local_dir
            if not os.path.isabs(root):
                root = os.path.join(os.getcwd(), root)
            folder = find_latest_ckpt_path(root) or self._step_folder(self.global_steps)
        return folder


class EntropacePPOTrainer(_EntropaceSteps, PPOTrainerSync):
    """verl's synchronous PPO trainer with EPPO / PAPO (``trainer.v1.trainer_mode=entropace``)."""

    base_mode = "sync"


class EntropaceColocateAsyncTrainer(_EntropaceSteps, PPOTrainerColocateAsync):
    """verl's colocated asynchronous trainer (partial rollouts, ``trainer.v1.colocate_async.
    num_warmup_batches`` batches generated ahead: off-policy by that many versions) with EPPO /
    PAPO (``trainer.v1.trainer_mode=entropace_colocate_async``). The statistics come from the
    old-log-prob pass, i.e. under the policy the update starts from (verl's proximal policy),
    not the stale one that sampled."""

    base_mode = "colocate_async"


#: verl trainer mode -> the entropace trainer registered under it.
TRAINERS: dict[str, type] = {
    TRAINER_NAME: EntropacePPOTrainer,
    f"{TRAINER_NAME}_colocate_async": EntropaceColocateAsyncTrainer,
}


def register_trainer_cls() -> list[str]:
    """Register the entropace trainers with verl's ``register_trainer`` (idempotent):
    ``entropace`` (sync) and ``entropace_colocate_async``."""
    for name, cls in TRAINERS.items():
        if trainer_base.TRAINER_REGISTRY.get(name) is not cls:
            register_trainer(name)(cls)
    return list(TRAINERS)
