"""``EntropaceGRPOTrainer``: TRL's ``GRPOTrainer`` with EPPO's pacing and PAPO's reweighting.

The per-task arithmetic is :class:`entropace.control.TaskStep`'s (the same object our own
trainer's update and the verl plug-in drive); this class is its adapter to TRL 1.16. TRL has no
public hook for custom advantages or clip bounds (maintainers recommend overriding
``_generate_and_score_completions``, TRL issue 4525), so it hooks in where it must:

1. ``_generate_and_score_completions`` (private, the recommended one): after TRL's own
   (generation, rewards, advantages), once per generation batch (= one of our trainer's steps):

   a. statistics of the completion tokens at the sampling temperature: collected while
      ``transformers.generate`` samples (a logits processor,
      :class:`~entropace.integrations.trl.stats.GenerationStats`: no extra forward pass), or,
      with vLLM / tools, in one chunked no-grad pass of the policy
      (:func:`~entropace.integrations.trl.stats.completion_token_stats`); entropace's
      multi-turn rollouts bring their own, computed by our rollout engine;
   b. the TaskStep's per-task sums, SUM-reduced across processes, then ``TaskStep.step``: EPPO's
      pacer and PAPO's controller advance (train batches only), and every completion gets its
      task's bounds as ``[B, 1]`` tensors ``entropace_eps_low`` / ``entropace_eps_high``;
   c. RLOO: leave-one-out advantages from the global rewards replace TRL's;
   d. PAPO: ``TaskStep.reweight`` turns the ``(B,)`` advantages into ``(B, T)`` ones (with
      several processes the ``sum |A|`` preserving factor is the global one);
   e. the TaskStep's metrics into TRL's ``self._metrics`` as ``entropace/<name>`` (W&B, MLflow,
      TensorBoard ... through TRL's ``report_to``).
2. ``compute_loss`` (the public ``Trainer`` override point): TRL's own, with
   ``self.epsilon_low`` / ``self.epsilon_high`` set to the batch's ``[B, 1]`` bound tensors for
   the call, so TRL's ``torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)`` clips each
   completion with its task's ``eps_k`` (and TRL's clip-ratio metrics use the same bounds).
3. Checkpoints: :class:`EntropaceStateCallback`, a ``TrainerCallback`` whose ``on_save`` writes
   the TaskStep's state to ``checkpoint-<step>/entropace_state.json`` with each of TRL's
   checkpoints and whose ``on_train_begin`` loads it back, validated, when ``train`` resumes
   (``resume_from_checkpoint``); a checkpoint without the file, or with a bad one, is an error
   naming it.
4. ``_calculate_rewards``: keeps the gathered rewards for (b) and (c).

``GRPOConfig``: a recipe sets only the fields it needs (:data:`~entropace.integrations.trl.
recipes.REQUIRES`), where the user left TRL's default, and refuses a conflicting user value; with
``algorithm="grpo"`` the losses, gradients and weights are TRL's exactly for the same
``GRPOConfig`` (tested), with per-task reward / success metrics added when the dataset has a task
column.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
from trl import GRPOConfig, GRPOTrainer

from entropace.control import ClipSettings, PacerConfig, PolarityConfig, StateError, TaskStep
from entropace.integrations.trl.recipes import (
    TRLRecipe,
    apply_recipe,
    overlong_reward,
    resolve_recipe,
)
from entropace.integrations.trl.stats import (
    GenerationStats,
    align_generation_stats,
    completion_token_stats,
    rows_to_tensor,
)
from entropace.integrations.trl.steps import rloo_slice

__all__ = [
    "EPS_HIGH_KEY",
    "EPS_LOW_KEY",
    "STATE_FILE",
    "TASK_IDS_KEY",
    "EntropaceGRPOTrainer",
    "EntropaceStateCallback",
]

#: Batch keys of the per-completion clip bounds (``[B, 1]`` float32).
EPS_LOW_KEY = "entropace_eps_low"
EPS_HIGH_KEY = "entropace_eps_high"
#: Batch key of each completion's task index into ``trainer.task_names`` (``[B]`` long).
TASK_IDS_KEY = "entropace_task_ids"
#: The controllers' state inside each TRL checkpoint folder.
STATE_FILE = "entropace_state.json"
#: Per-token statistics that entropace's multi-turn rollouts hand over as extra fields.
ROLLOUT_ENTROPY_KEY = "entropace_entropy"
ROLLOUT_SENSITIVITY_KEY = "entropace_sensitivity"
#: Per-episode success / abnormal-end flags that entropace's rollouts hand over.
ROLLOUT_SUCCESS_KEY = "entropace_success"
ROLLOUT_ABNORMAL_KEY = "entropace_abnormal"


class EntropaceGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` running an entropace algorithm recipe (see the module docstring).

    Args:
        model, reward_funcs, args, train_dataset, eval_dataset, processing_class, **kwargs:
            as for ``trl.GRPOTrainer`` (``rollout_func``, ``peft_config``, ``callbacks`` ...).
        algorithm: a name of :data:`entropace.integrations.trl.SUPPORTED`. The ``GRPOConfig``
            fields it needs (:data:`~entropace.integrations.trl.recipes.REQUIRES`) are set in
            ``args`` where the user left TRL's default (listed in :attr:`entropace_changes`),
            a conflicting user value is refused; every other field is the user's.
        pacer: EPPO's :class:`~entropace.control.PacerConfig` (or a mapping of its fields).
        polarity: PAPO's :class:`~entropace.control.PolarityConfig` (or a mapping).
        algorithm_overrides: further ``AlgorithmConfig`` fields of the recipe.
        task_column: the dataset column naming each prompt's task (needed by EPPO; optional
            otherwise, then every prompt is task ``"all"``).
        task_names: the tasks in a fixed order (default: the sorted distinct values of
            ``train_dataset[task_column]``; required for iterable datasets).
        success_threshold: a completion whose total weighted reward is ``>=`` this counts as a
            success (unless the batch carries a success flag: ``entropace_success`` from our
            environment rollouts or a boolean ``success_column``).
        success_column: dataset / rollout field holding a per-completion success flag.
        stats_chunk_size: masked positions per LM-head chunk in the statistics pass.
        stats_from_generation: collect the statistics while ``transformers.generate`` samples
            (:class:`~entropace.integrations.trl.stats.GenerationStats`) instead of a separate
            no-grad pass (used anyway with vLLM, tools or a ``rollout_func``).
    """

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: GRPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        *,
        algorithm: str = "grpo",
        pacer: PacerConfig | Mapping[str, Any] | None = None,
        polarity: PolarityConfig | Mapping[str, Any] | None = None,
        algorithm_overrides: Mapping[str, Any] | None = None,
        task_column: str = "task",
        task_names: Sequence[str] | None = None,
        success_threshold: float = 1.0,
        success_column: str = "success",
        stats_chunk_size: int | None = None,
        stats_from_generation: bool = True,
        **kwargs: Any,
    ) -> None:
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = GRPOConfig(f"{str(name).split('/')[-1]}-GRPO")
        recipe = resolve_recipe(
            algorithm,
            pacer=pacer,
            polarity=polarity,
            overrides=algorithm_overrides,
            max_completion_length=args.max_completion_length,
        )
        self.entropace_changes = apply_recipe(args, recipe)
        if recipe.overlong is not None:
            funcs = list(reward_funcs) if isinstance(reward_funcs, list | tuple) else [reward_funcs]
            reward_funcs = [f for f in funcs if f is not None] + [overlong_reward(*recipe.overlong)]
            if args.reward_weights is not None:
                args.reward_weights = [*args.reward_weights, 1.0]
            rpc = kwargs.get("reward_processing_classes")
            if isinstance(rpc, list):
                kwargs["reward_processing_classes"] = [*rpc, None]
        self.entropace_recipe = recipe
        self.task_column = task_column
        self.success_column = success_column
        self.success_threshold = float(success_threshold)
        self.stats_chunk_size = stats_chunk_size
        self.stats_from_generation = bool(stats_from_generation)
        self._generation_stats: Any = None
        self.task_names = self._find_task_names(train_dataset, task_column, task_names, recipe)
        eps = args.epsilon, args.epsilon if args.epsilon_high is None else args.epsilon_high
        self.entropace_step = TaskStep(
            self.task_names,
            clip_rule="pacer" if recipe.pacer is not None else "fixed",
            clip=ClipSettings(
                eps_low=eps[0],
                eps_high=eps[1],
                pacer=recipe.pacer or PacerConfig(),
                width=recipe.width,
                seed=int(args.seed),
            ),
            polarity=recipe.polarity,
            recipe=recipe.name,
        )
        self._resume_checkpoint: str | None = None
        callbacks = [*(kwargs.pop("callbacks", None) or []), EntropaceStateCallback(self)]
        kwargs["callbacks"] = callbacks
        self._entropace_inputs: list[dict[str, Any]] | None = None
        self._rewards_per_func: Tensor | None = None
        super().__init__(
            model,
            reward_funcs,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            **kwargs,
        )

    @property
    def pacer(self) -> Any:
        """EPPO's :class:`~entropace.control.EntropyPacer` (None when the recipe has none)."""
        return getattr(self.entropace_step.rule, "pacer", None)

    @property
    def polarity_controller(self) -> Any:
        """PAPO's :class:`~entropace.control.PolarityController` (None without PAPO)."""
        return self.entropace_step.polarity

    # ------------------------------------------------------------------------------ set-up
    @staticmethod
    def _find_task_names(
        dataset: Any, column: str, names: Sequence[str] | None, recipe: TRLRecipe
    ) -> list[str]:
        if names is not None:
            out = [str(n) for n in names]
            if len(set(out)) != len(out) or not out:
                raise ValueError(f"task_names must be distinct and non-empty, got {out}")
            return out
        columns = getattr(dataset, "column_names", None)
        if columns is not None and column in columns:
            return sorted({str(t) for t in dataset[column]})
        if recipe.pacer is not None:
            raise ValueError(
                f"algorithm={recipe.name!r} paces each task: the train dataset needs a "
                f"{column!r} column naming each prompt's task (task_column=...), or pass "
                "task_names=[...] for an iterable dataset"
            )
        return ["all"]

    def _set_signature_columns_if_needed(self) -> None:
        super()._set_signature_columns_if_needed()
        for col in (self.task_column, self.success_column):
            if self._signature_columns is not None and col not in self._signature_columns:
                self._signature_columns.append(col)

    # ------------------------------------------------------------------------------ hooks
    def _calculate_rewards(self, inputs: Any, *rest: Any, **kwargs: Any) -> Tensor:
        rewards = super()._calculate_rewards(inputs, *rest, **kwargs)
        self._rewards_per_func = rewards
        return rewards

    def _collect_during_generation(self) -> bool:
        return (
            self.entropace_recipe.needs_stats
            and self.stats_from_generation
            and not self.use_vllm
            and not getattr(self, "use_transformers_continuous_batching", False)
            and not self.tools
            and self.rollout_func is None
            and not self._is_vlm
        )

    def _generate_single_turn(self, *args: Any, **kwargs: Any) -> Any:
        """TRL's, with :class:`GenerationStats` added to ``generate``'s logits processors."""
        if not self._collect_during_generation():
            return super()._generate_single_turn(*args, **kwargs)
        collector = GenerationStats(self.temperature)
        model = self.model
        original = model.generate

        def generate(*a: Any, logits_processor: Any = None, **kw: Any) -> Any:
            from transformers import LogitsProcessorList

            processors = LogitsProcessorList([*(logits_processor or []), collector])
            out = original(*a, logits_processor=processors, **kw)
            collector.finish(out if isinstance(out, Tensor) else out.sequences)
            return out

        model.generate = generate
        try:
            result = super()._generate_single_turn(*args, **kwargs)
        finally:
            del model.generate  # the instance attribute; the class method shows again
        self._generation_stats = collector.result()
        return result

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self._entropace_inputs = inputs  # read by entropace's rollout_func adapter
        self._rewards_per_func = None
        self._generation_stats = None
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._entropace_inputs = None
        mode = "train" if self.model.training else "eval"
        return self._entropace_process(output, inputs, mode)

    def compute_loss(
        self,
        model: Any,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Tensor:
        """TRL's loss with each completion's ``[B, 1]`` clip bounds in TRL's clamp."""
        if EPS_LOW_KEY not in inputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        saved = self.epsilon_low, self.epsilon_high
        self.epsilon_low, self.epsilon_high = inputs[EPS_LOW_KEY], inputs[EPS_HIGH_KEY]
        try:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        finally:
            self.epsilon_low, self.epsilon_high = saved

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any) -> Any:
        """``Trainer.train``; remembers the checkpoint a resume starts from, whose
        ``entropace_state.json`` :class:`EntropaceStateCallback` loads."""
        path = resume_from_checkpoint
        if path is True:
            path = get_last_checkpoint(self.args.output_dir)
        self._resume_checkpoint = str(path) if isinstance(path, str | os.PathLike) else None
        try:
            return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
        finally:
            self._resume_checkpoint = None

    # ----------------------------------------------------------------------- the per-step work
    def _task_ids(self, inputs: list[dict[str, Any]], device: torch.device) -> Tensor:
        if self.task_names == ["all"] and all(self.task_column not in x for x in inputs):
            return torch.zeros(len(inputs), dtype=torch.long, device=device)
        try:
            return self.entropace_step.task_ids([x.get(self.task_column) for x in inputs], device)
        except ValueError as exc:
            raise ValueError(
                f"a prompt's {self.task_column}: {exc}; pass task_names=[...] listing every task"
            ) from None

    def _global_rewards(self, device: torch.device) -> Tensor:
        """Total weighted reward of every completion of the global batch (NaN: unscorable)."""
        rpf = self._rewards_per_func
        if rpf is None:
            raise RuntimeError("TRL did not compute rewards through _calculate_rewards")
        weights = self.reward_weights.to(rpf.device).unsqueeze(0)
        total = (rpf * weights).nansum(dim=1)
        total[torch.isnan(rpf).all(dim=1)] = torch.nan
        return total.to(device)

    def _local_success(self, inputs: list[dict[str, Any]], rewards: Tensor) -> Tensor:
        for key in (ROLLOUT_SUCCESS_KEY, self.success_column):
            if inputs and all(key in x and x[key] is not None for x in inputs):
                return torch.tensor([bool(x[key]) for x in inputs], device=rewards.device)
        return torch.nan_to_num(rewards, nan=-torch.inf) >= self.success_threshold

    def _reduce(self, tensor: Tensor) -> Tensor:
        if self.accelerator.num_processes == 1:
            return tensor
        return self.accelerator.reduce(tensor, reduction="sum")

    def _token_stats(
        self, output: dict[str, Any], inputs: list[dict[str, Any]], mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """``(entropy, sensitivity)`` ``[B, C]`` of the completion tokens at the sampling
        temperature: from our rollout engine when it supplied them, else from the scores seen
        during ``generate``, else one no-grad pass."""
        if inputs and all(ROLLOUT_ENTROPY_KEY in x for x in inputs):
            entropy = rows_to_tensor([x[ROLLOUT_ENTROPY_KEY] for x in inputs], mask)
            return entropy, rows_to_tensor([x[ROLLOUT_SENSITIVITY_KEY] for x in inputs], mask)
        if self._generation_stats is not None:
            collected, self._generation_stats = self._generation_stats, None
            aligned = align_generation_stats(collected, output["completion_ids"], mask)
            if aligned is not None:
                return aligned.entropy, aligned.sensitivity
            warnings.warn(
                "the statistics collected during generation do not match the completions; "
                "falling back to a no-grad statistics pass",
                stacklevel=2,
            )
        input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        batch_size = (
            self.args.per_device_train_batch_size
            if self.model.training
            else self.args.per_device_eval_batch_size
        )
        with torch.no_grad():
            stats = completion_token_stats(
                self.model,
                input_ids,
                attention,
                mask,
                temperature=self.temperature,
                batch_size=batch_size,
                chunk_size=self.stats_chunk_size,
                autocast=self.accelerator.autocast,
            )
        return stats.entropy, stats.sensitivity

    def _entropace_process(
        self, output: dict[str, Any], inputs: list[dict[str, Any]], mode: str
    ) -> dict[str, Any]:
        """Steps (b)-(e) of the module docstring on TRL's scored batch ``output``."""
        recipe, step = self.entropace_recipe, self.entropace_step
        track = self.task_names != ["all"] or recipe.needs_stats
        if not track and recipe.advantage is None:
            return output
        device = output["completion_ids"].device
        mask = output["completion_mask"].to(torch.float32)
        if "tool_mask" in output:
            mask = mask * output["tool_mask"].to(torch.float32)
        local = len(inputs)
        rank = self.accelerator.process_index
        rewards_all = self._global_rewards(device)
        rewards = rewards_all[rank * local : (rank + 1) * local]
        task_ids = self._task_ids(inputs, device)
        success = self._local_success(inputs, rewards)
        entropy = sensitivity = None
        if recipe.needs_stats:
            entropy, sensitivity = self._token_stats(output, inputs, mask)
        abnormal = None
        if inputs and all(ROLLOUT_ABNORMAL_KEY in x for x in inputs):
            abnormal = torch.tensor([bool(x[ROLLOUT_ABNORMAL_KEY]) for x in inputs], device=device)
        sums = step.sums(
            entropy if entropy is not None else torch.zeros_like(mask),
            mask,
            torch.nan_to_num(rewards, nan=0.0),
            success,
            task_ids,
            abnormal=abnormal,
        )
        sums = self._reduce(sums)  # the global batch's sums, on every rank
        # EPPO / PAPO controllers move on train batches only; bounds for every completion
        step.step(sums, train=mode == "train", abnormal=abnormal is not None)
        output[TASK_IDS_KEY] = task_ids  # [B] index into task_names (metrics, debugging)
        if recipe.pacer is not None:
            output[EPS_LOW_KEY], output[EPS_HIGH_KEY] = step.row_bounds(task_ids)
        if recipe.advantage == "rloo":
            rows = slice(rank * local, (rank + 1) * local)
            output["advantages"] = rloo_slice(rewards_all, self.num_generations, rows)
        if step.polarity is not None and mode == "train":
            assert sensitivity is not None
            output["advantages"], _ = step.reweight(
                output["advantages"],
                sensitivity,
                mask,
                reduce=self._reduce,
                world_size=self.accelerator.num_processes,
            )
        for key, value in step.metrics.items():
            if not recipe.needs_stats and key.endswith("entropy"):
                continue  # no statistics pass: the entropy was not measured
            if value == value:  # NaN (a task without scored tokens) is not logged
                self._metrics[mode][f"entropace/{key}"].append(float(value))
        return output

    # --------------------------------------------------------------------------- checkpoints
    def entropace_state_dict(self) -> dict[str, Any]:
        """The controllers' state (:meth:`entropace.control.TaskStep.state_dict`)."""
        return self.entropace_step.state_dict()

    def load_entropace_state_dict(self, state: Any, source: str = "entropace state") -> None:
        """Restore :meth:`entropace_state_dict` output, validated (a :class:`StateError` naming
        ``source`` otherwise)."""
        self.entropace_step.load_state_dict(state, source=source)


class EntropaceStateCallback(TrainerCallback):
    """Saves the trainer's :class:`~entropace.control.TaskStep` state with every TRL checkpoint
    (``checkpoint-<step>/entropace_state.json``, written on ``on_save``) and loads it, validated,
    when ``train(resume_from_checkpoint=...)`` resumes (``on_train_begin``, after TRL restored
    its own state). Added by :class:`EntropaceGRPOTrainer` itself."""

    def __init__(self, trainer: EntropaceGRPOTrainer) -> None:
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        checkpoint = self.trainer._resume_checkpoint
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, STATE_FILE)
        if not os.path.exists(path):
            raise StateError(
                f"{path}: missing; the checkpoint was not written by EntropaceGRPOTrainer and the "
                "entropace controllers cannot resume exactly (start a fresh run instead)"
            )
        self.trainer.entropace_step.load_state_file(path)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not args.should_save:
            return
        folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if os.path.isdir(folder):
            self.trainer.entropace_step.save_state_file(os.path.join(folder, STATE_FILE))
