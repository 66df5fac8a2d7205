"""``EntropaceGRPOTrainer``: TRL's ``GRPOTrainer`` with EPPO's pacing and PAPO's reweighting.

TRL 1.16 has no public hook for custom advantages or clip bounds (maintainers recommend
overriding ``_generate_and_score_completions``, TRL issue 4525), so the subclass hooks in at
four private methods and changes nothing else:

1. ``_generate_and_score_completions``: after TRL's own (generation, rewards, advantages),
   once per generation batch (= one of our trainer's steps):

   a. statistics of the completion tokens at the sampling temperature: collected while
      ``transformers.generate`` samples (a logits processor,
      :class:`~entropace.integrations.trl.stats.GenerationStats`: no extra forward pass), or,
      with vLLM / tools, in one chunked no-grad pass of the policy
      (:func:`~entropace.integrations.trl.stats.completion_token_stats`); entropace's
      multi-turn rollouts bring their own, computed by our rollout engine;
   b. per-task sums of entropy / tokens / episodes / success / reward / reward^2, SUM-reduced
      across processes, so every rank sees the global batch's numbers;
   c. EPPO: the ``pacer`` clip rule (``entropace.control.build_clip_rule``, around
      :class:`~entropace.control.EntropyPacer`) steps on these signals (``h_k``, or the success
      rate / reward variance for the ablations), and every completion gets its task's bounds
      as ``[B, 1]`` tensors ``entropace_eps_low`` / ``entropace_eps_high`` in the batch;
   d. RLOO: leave-one-out advantages from the global rewards replace TRL's;
   e. PAPO: :class:`~entropace.control.PolarityController` updates from the global mean token
      entropy; polarity ``P = A S`` and :func:`~entropace.algos.polarity_reweight` turn the
      ``(B,)`` advantages into ``(B, T)`` ones (with several processes the ``sum |A|``
      preserving factor is the global one, as for a one-process run on the global batch);
   f. metrics into TRL's ``self._metrics`` (``entropace/task/<k>/eps_low`` ...).
2. ``_compute_loss``: TRL's own, with ``self.epsilon_low`` / ``self.epsilon_high`` set to the
   batch's ``[B, 1]`` bound tensors for the call, so TRL's
   ``torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)`` clips each completion with its
   task's ``eps_k`` (and TRL's clip-ratio metrics use the same bounds).
3. ``_save_checkpoint`` / ``_load_optimizer_and_scheduler``: the controllers' JSON state in
   ``checkpoint-<step>/entropace_state.json``, restored by ``resume_from_checkpoint``.
4. ``_calculate_rewards``: keeps the gathered rewards for (b) and (d).

With ``algorithm="grpo"`` (and ``dr_grpo``, ``dapo``, ``gspo``) steps (a), (c)-(e) are off: the
losses, gradients and weights are TRL's exactly (tested); only per-task reward / success
metrics are added when the dataset has a task column.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOConfig, GRPOTrainer

from entropace.control import (
    ClipSettings,
    PacerConfig,
    PolarityConfig,
    PolarityController,
    build_clip_rule,
    signals_from_sums,
    task_sums,
)
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
from entropace.integrations.trl.steps import (
    batch_entropy,
    completion_bounds,
    global_polarity_reweight,
    rloo_slice,
)

__all__ = ["EntropaceGRPOTrainer", "EPS_HIGH_KEY", "EPS_LOW_KEY", "STATE_FILE", "TASK_IDS_KEY"]

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
        algorithm: a name of :data:`entropace.integrations.trl.SUPPORTED`. Its TRL fields
            (``loss_type``, ``scale_rewards``, ``epsilon``, ``epsilon_high``,
            ``importance_sampling_level``) are written into ``args``.
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
        apply_recipe(args, recipe)
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
        self._task_index = {name: k for k, name in enumerate(self.task_names)}
        self.clip_rule = (
            build_clip_rule(
                "pacer",
                ClipSettings(
                    eps_low=recipe.trl_args["epsilon"],
                    eps_high=recipe.trl_args["epsilon_high"],
                    pacer=recipe.pacer,
                ),
            )
            if recipe.pacer is not None
            else None
        )
        self.polarity_controller = (
            PolarityController(config=recipe.polarity) if recipe.polarity is not None else None
        )
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
        return self.clip_rule.pacer if self.clip_rule is not None else None

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

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Tensor:
        if EPS_LOW_KEY not in inputs:
            return super()._compute_loss(model, inputs)
        saved = self.epsilon_low, self.epsilon_high
        self.epsilon_low, self.epsilon_high = inputs[EPS_LOW_KEY], inputs[EPS_HIGH_KEY]
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self.epsilon_low, self.epsilon_high = saved

    # ----------------------------------------------------------------------- the per-step work
    def _task_ids(self, inputs: list[dict[str, Any]], device: torch.device) -> Tensor:
        if len(self.task_names) == 1 and self.task_names == ["all"]:
            if all(self.task_column not in x for x in inputs):
                return torch.zeros(len(inputs), dtype=torch.long, device=device)
        ids = []
        for x in inputs:
            name = str(x.get(self.task_column))
            if name not in self._task_index:
                raise ValueError(
                    f"prompt with {self.task_column}={name!r}, which is not among the task "
                    f"names {self.task_names}; pass task_names=[...] listing every task"
                )
            ids.append(self._task_index[name])
        return torch.tensor(ids, dtype=torch.long, device=device)

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
        """Steps (a)-(f) of the module docstring on TRL's scored batch ``output``."""
        recipe = self.entropace_recipe
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
        sums = task_sums(
            entropy if entropy is not None else torch.zeros_like(mask),
            mask if entropy is not None else torch.zeros_like(mask),
            torch.nan_to_num(rewards, nan=0.0),
            success,
            task_ids,
            len(self.task_names),
            abnormal=abnormal,
        )
        sums = self._reduce(sums)  # the global batch's sums, on every rank
        signals = signals_from_sums(sums, self.task_names)
        present = list(signals.task_success)
        metrics: dict[str, float] = {}
        for name in present:
            metrics[f"task/{name}/success"] = signals.task_success[name]
            metrics[f"task/{name}/reward"] = signals.task_reward[name]
            if name in signals.task_entropy:
                metrics[f"task/{name}/entropy"] = signals.task_entropy[name]
            if abnormal is not None:
                metrics[f"task/{name}/abnormal"] = signals.task_abnormal[name]
        output[TASK_IDS_KEY] = task_ids  # [B] index into task_names (metrics, debugging)

        # EPPO: the clip rule updates from this batch (train mode), each completion gets its
        # task's bounds in TRL's clamp
        if self.clip_rule is not None:
            cfg = self.pacer.config
            default = (cfg.eps0, cfg.eps0 if cfg.eps_high0 is None else cfg.eps_high0)
            if mode == "train":
                bounds = self.clip_rule.on_step(signals)
            else:
                bounds = {k: tuple(v) for k, v in self.pacer.bounds().items()}
            output[EPS_LOW_KEY], output[EPS_HIGH_KEY] = completion_bounds(
                bounds, self.task_names, task_ids, default
            )
            for name in present:
                lo, hi = bounds.get(name, default)
                metrics[f"task/{name}/eps_low"] = lo
                metrics[f"task/{name}/eps_high"] = hi
            metrics.update(self.clip_rule.metrics(present))
        if recipe.advantage == "rloo":
            rows = slice(rank * local, (rank + 1) * local)
            output["advantages"] = rloo_slice(rewards_all, self.num_generations, rows)
        # PAPO: the controller updates from the global mean entropy, then (B, T) advantages
        ctrl = self.polarity_controller
        if ctrl is not None and mode == "train":
            assert sensitivity is not None
            h = batch_entropy(sums)
            if h == h:  # not NaN: some token was scored
                ctrl.update(h)
            output["advantages"], masses = global_polarity_reweight(
                output["advantages"],
                sensitivity,
                mask,
                w_plus=ctrl.w_plus,
                w_minus=ctrl.w_minus,
                reduce=self._reduce,
                world_size=self.accelerator.num_processes,
            )
            metrics.update({f"polarity/{k}": v for k, v in masses.items()})
            metrics.update(ctrl.metrics())
        for key, value in metrics.items():
            self._metrics[mode][f"entropace/{key}"].append(float(value))
        return output

    # --------------------------------------------------------------------------- checkpoints
    def entropace_state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state of the controllers (what each checkpoint stores)."""
        return {
            "version": 1,
            "algorithm": self.entropace_recipe.name,
            "task_names": list(self.task_names),
            "pacer": self.clip_rule.state_dict() if self.clip_rule is not None else None,
            "polarity": (
                self.polarity_controller.state_dict()
                if self.polarity_controller is not None
                else None
            ),
        }

    def load_entropace_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`entropace_state_dict` output (the algorithm must match)."""
        if state.get("algorithm") != self.entropace_recipe.name:
            raise ValueError(
                f"checkpoint was written by algorithm={state.get('algorithm')!r}, this trainer "
                f"runs {self.entropace_recipe.name!r}"
            )
        if self.clip_rule is not None and state.get("pacer") is not None:
            self.clip_rule.load_state_dict(state["pacer"])
        if self.polarity_controller is not None and state.get("polarity") is not None:
            self.polarity_controller.load_state_dict(state["polarity"])

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            path = os.path.join(self._get_output_dir(trial=trial), folder, STATE_FILE)
            tmp = path + ".tmp"
            with open(tmp, "w") as fh:
                json.dump(self.entropace_state_dict(), fh, indent=1)
            os.replace(tmp, path)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, STATE_FILE)
        if os.path.exists(path):
            with open(path) as fh:
                self.load_entropace_state_dict(json.load(fh))
        elif self.pacer is not None or self.polarity_controller is not None:
            warnings.warn(
                f"{checkpoint} has no {STATE_FILE}: the entropace controllers start fresh",
                stacklevel=2,
            )
