"""Stateful per-step controllers (plain Python floats, JSON-serialisable ``state_dict``).

- :class:`EntropyPacer`: EPPO's task-wise clip ranges paced by retained entropy (section 3).
- :class:`PolarityController`: PAPO's phase signal and branch weights (section 4).
- :class:`BapoClipController`: BAPO's per-step adaptive clip bounds (BASELINES.md).
"""

from entropace.control.bapo import BapoClipController, BapoConfig, positive_share
from entropace.control.pacer import SIGNALS, EntropyPacer, PacerConfig
from entropace.control.polarity_controller import PolarityConfig, PolarityController

__all__ = [
    "SIGNALS",
    "BapoClipController",
    "BapoConfig",
    "EntropyPacer",
    "PacerConfig",
    "PolarityConfig",
    "PolarityController",
    "positive_share",
]
