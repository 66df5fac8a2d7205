"""Pure tensor functions: token statistics, entropy polarity, advantages, policy losses.

No config objects, no I/O, no host syncs in hot paths. The trainer, and any engine
plug-in, calls these; their names are the public API.
"""

from entropace.algos.advantage_baselines import (  # registers reinforce_plus_plus ... gpg
    gpg_advantages,
    grpo_passk_advantages,
    opo_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    remax_advantages,
)
from entropace.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageEstimator,
    dr_grpo_advantages,
    get_advantage,
    grpo_advantages,
    register_advantage,
    rloo_advantages,
    task_normalize_advantages,
)
from entropace.algos.aggregation import (
    AGG_MODES,
    aggregate_loss,
    check_mask,
    loss_counts,
)
from entropace.algos.dapo import (
    dynamic_sampling_mask,
    overlong_penalty,
)
from entropace.algos.decoupled import (
    behaviour_importance_weights,
    behaviour_kl_k3,
)
from entropace.algos.fused_head import (
    hidden_token_stats,
)
from entropace.algos.kl import (
    kl_k3,
)
from entropace.algos.pg_losses import (  # registers dro, gpg
    DROLossConfig,
    GPGLossConfig,
)
from entropace.algos.polarity import (
    entropy_polarity,
    polarity_reweight,
)
from entropace.algos.policy_losses import (
    POLICY_LOSSES,
    LossInputs,
    PolicyLoss,
    dcpo_bounds,
    get_policy_loss,
    register_policy_loss,
)
from entropace.algos.surrogate import (
    LossOutput,
    clipped_surrogate_loss,
)
from entropace.algos.token_stats import (
    TokenStats,
    token_stats,
)
from entropace.algos.trust_region_losses import (  # registers cispo, gmpo, sapo, dppo_*
    CISPOLossConfig,
    DPPOLossConfig,
    GMPOLossConfig,
    SAPOLossConfig,
)
from entropace.algos.widths import (
    TrustWidth,
    paced_widths,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGG_MODES",
    "AdvantageEstimator",
    "CISPOLossConfig",
    "DPPOLossConfig",
    "DROLossConfig",
    "GMPOLossConfig",
    "GPGLossConfig",
    "SAPOLossConfig",
    "TrustWidth",
    "LossInputs",
    "LossOutput",
    "POLICY_LOSSES",
    "PolicyLoss",
    "TokenStats",
    "aggregate_loss",
    "behaviour_importance_weights",
    "behaviour_kl_k3",
    "check_mask",
    "clipped_surrogate_loss",
    "dcpo_bounds",
    "dr_grpo_advantages",
    "dynamic_sampling_mask",
    "entropy_polarity",
    "get_advantage",
    "get_policy_loss",
    "gpg_advantages",
    "grpo_passk_advantages",
    "grpo_advantages",
    "hidden_token_stats",
    "kl_k3",
    "loss_counts",
    "opo_advantages",
    "overlong_penalty",
    "paced_widths",
    "polarity_reweight",
    "register_advantage",
    "register_policy_loss",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "remax_advantages",
    "rloo_advantages",
    "task_normalize_advantages",
    "token_stats",
]
