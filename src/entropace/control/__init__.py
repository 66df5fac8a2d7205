"""Stateful per-step controllers (plain Python floats, JSON-serialisable ``state_dict``).

- :class:`EntropyPacer`: EPPO's task-wise clip ranges paced by retained entropy (section 3).
- :class:`PolarityController`: PAPO's phase signal and branch weights (section 4).
- :class:`BapoClipController`: BAPO's per-step adaptive clip bounds (BASELINES.md).
- Clip rules (:func:`build_clip_rule`, :data:`CLIP_RULES`): the one interface through which a
  trainer or an engine plug-in gets per-task clip bounds (``fixed``, ``pacer``, ``bapo``).
- :class:`TaskStep`: the per-task step every engine adapter runs (our update, the TRL and verl
  plug-ins): the clip rule, PAPO's controller and the task index, one metric naming and one
  validated controller-state format (:class:`StateError` names the file).
- Step signals (:func:`task_sums`, :func:`signals_from_sums`, :class:`StepSignals`): the
  per-task rollout statistics the controllers read, as reducible sums.
"""

from entropace.control._state import StateError
from entropace.control.bapo import BapoClipController, BapoConfig, positive_share
from entropace.control.clip_rules import (
    CLIP_RULES,
    ClipRule,
    ClipSettings,
    build_clip_rule,
    register_clip_rule,
)
from entropace.control.pacer import SIGNALS, EntropyPacer, PacerConfig
from entropace.control.polarity_controller import PolarityConfig, PolarityController
from entropace.control.signals import SUM_ROWS, StepSignals, signals_from_sums, task_sums
from entropace.control.task_step import STATE_FORMAT, StepOutput, TaskStep

__all__ = [
    "CLIP_RULES",
    "SIGNALS",
    "STATE_FORMAT",
    "SUM_ROWS",
    "BapoClipController",
    "BapoConfig",
    "ClipRule",
    "ClipSettings",
    "EntropyPacer",
    "PacerConfig",
    "PolarityConfig",
    "PolarityController",
    "StateError",
    "StepOutput",
    "StepSignals",
    "TaskStep",
    "build_clip_rule",
    "positive_share",
    "register_clip_rule",
    "signals_from_sums",
    "task_sums",
]
