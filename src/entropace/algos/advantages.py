"""Per-trajectory advantages from group rewards, and AgentRL's per-task token re-standardisation.

All functions are vectorised over groups (``torch.unique`` + ``index_add``), accept arbitrary,
non-contiguous integer group ids, compute their statistics in float64 and return the rewards'
floating dtype (float32 for integer rewards).

Formulas (ALGORITHMS.md section 1; ``g`` the group of trajectory ``i``, ``n_g`` its size):

- GRPO (arXiv 2402.03300): ``A_i = (R_i - mean_g) / (std_g + eps)`` with the UNBIASED (Bessel,
  ``n_g - 1``) standard deviation, as ``torch.std`` in verl and TRL.
- Dr.GRPO (arXiv 2503.20783): ``A_i = R_i - mean_g``.
- RLOO (arXiv 2402.14740): ``A_i = R_i - mean_{j in g, j != i} R_j = n_g / (n_g - 1) (R_i - mean_g)``.

In all three a singleton group and a group whose rewards are all equal give exactly 0.

Rewards are checked for NaN/inf (one cheap host sync per call; these run once per step).

Every estimator is registered by name (:data:`ADVANTAGE_ESTIMATORS`, :func:`get_advantage`) as
an :class:`AdvantageEstimator`: ``spec(rewards [B], group_ids [B], mask=..., baselines=...,
config=...)`` returns ``[B]`` (one advantage per trajectory) or, for ``per_token`` estimators,
``[B, T]``. The entry declares the inputs the estimator needs beyond rewards and groups
(``mask``: the ``[B, T]`` loss mask; ``baselines``: ReMax's greedy rewards) and its options
(a validated config dataclass, whose fields are the function's keyword arguments). Add one with
``@register_advantage("name", config=..., needs=(...), per_token=...)``. Besides the three
above, :mod:`entropace.algos.advantage_baselines` registers verl's REINFORCE++ (with and without
baseline), ReMax, OPO, GRPO pass@k and GPG.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from entropace.algos.options import build_options

AdvantageFn = Callable[..., Tensor]

#: The extra inputs an estimator may need (keyword arguments of its function).
INPUTS = ("mask", "baselines")


@dataclass(frozen=True)
class NoOptions:
    """The config of an estimator without options."""


#: The largest ``eps`` added to a group's reward standard deviation. ``eps`` is a floor for
#: groups whose rewards barely differ: rewards in ``[0, 1]`` have a standard deviation of at
#: most ``sqrt(G / (4 (G - 1))) <= 0.71``, so an ``eps`` above 1 outweighs every group's own
#: spread and only shrinks the advantages ``z std / (std + eps)`` towards 0 (at ``eps =
#: 1e300`` they round to exactly 0 in float32: nothing is trained).
STD_EPS_MAX = 1.0


def check_std_eps(eps: object) -> None:
    """``ValueError`` unless ``eps`` is a number in ``(0, STD_EPS_MAX]``."""
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 < eps <= STD_EPS_MAX:
        raise ValueError(
            f"eps must be a number in (0, {STD_EPS_MAX:g}]; got {eps!r} (a floor on the "
            "group's reward standard deviation: a larger one only shrinks every advantage)"
        )


@dataclass(frozen=True)
class GRPOAdvantageConfig:
    """``grpo``: ``eps`` added to the group's standard deviation, in ``(0, 1]``
    (:data:`STD_EPS_MAX`)."""

    eps: float = 1e-6

    def __post_init__(self) -> None:
        check_std_eps(self.eps)


@dataclass(frozen=True)
class AdvantageEstimator:
    """One registered advantage estimator.

    Attributes:
        name: registry key.
        fn: ``fn(rewards, group_ids, *, <needs>, <options>) -> [B]`` (or ``[B, T]``).
        config_cls: its options' frozen dataclass (fields = ``fn``'s keyword options).
        needs: the extra inputs of :data:`INPUTS` it reads.
        per_token: it returns ``[B, T]`` advantages (0 off the mask), not one per trajectory.
    """

    name: str
    fn: AdvantageFn
    config_cls: type = NoOptions
    needs: tuple[str, ...] = ()
    per_token: bool = False

    def make_config(self, options: Mapping[str, Any] | None = None) -> Any:
        """The validated config from plain options; ``ValueError`` naming the bad option."""
        return build_options(f"advantage estimator {self.name!r}", self.config_cls, options)

    def __call__(
        self,
        rewards: Tensor,
        group_ids: Tensor,
        *,
        mask: Tensor | None = None,
        baselines: Tensor | None = None,
        config: Any | None = None,
    ) -> Tensor:
        """The advantages; inputs the estimator does not need are ignored, a needed one
        missing is a ``ValueError``."""
        cfg = self.config_cls() if config is None else config
        if not isinstance(cfg, self.config_cls):
            raise TypeError(
                f"advantage estimator {self.name!r} takes a {self.config_cls.__name__}; got "
                f"{type(cfg).__name__}"
            )
        given = {"mask": mask, "baselines": baselines}
        extra = {}
        for need in self.needs:
            if given[need] is None:
                raise ValueError(f"advantage estimator {self.name!r} needs {need}=")
            extra[need] = given[need]
        options = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
        return self.fn(rewards, group_ids, **extra, **options)


#: ``name -> AdvantageEstimator``.
ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}


def register_advantage(
    name: str,
    *,
    config: type = NoOptions,
    needs: tuple[str, ...] = (),
    per_token: bool = False,
) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator adding an estimator ``fn(rewards, group_ids, ...)`` under ``name`` (the keyword
    arguments are the :class:`AdvantageEstimator` attributes)."""
    unknown = sorted(set(needs) - set(INPUTS))
    if unknown:
        raise ValueError(f"advantage estimator {name!r}: unknown needs {unknown}; known {INPUTS}")
    if not dataclasses.is_dataclass(config):
        raise TypeError(f"advantage estimator {name!r}: config must be a dataclass")

    def decorator(fn: AdvantageFn) -> AdvantageFn:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADVANTAGE_ESTIMATORS[name] = AdvantageEstimator(name, fn, config, tuple(needs), per_token)
        return fn

    return decorator


def get_advantage(name: str) -> AdvantageEstimator:
    """The estimator ``name``; ``KeyError`` listing the known names otherwise."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        raise KeyError(
            f"unknown advantage estimator {name!r}; known: {sorted(ADVANTAGE_ESTIMATORS)}"
        ) from None


__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "INPUTS",
    "AdvantageEstimator",
    "AdvantageFn",
    "GRPOAdvantageConfig",
    "NoOptions",
    "STD_EPS_MAX",
    "check_rewards",
    "check_std_eps",
    "get_advantage",
    "register_advantage",
    "group_stats",
    "dr_grpo_advantages",
    "grpo_advantages",
    "out_dtype",
    "rloo_advantages",
    "task_normalize_advantages",
]


def check_rewards(rewards: Tensor, group_ids: Tensor, name: str = "rewards") -> None:
    """Raise a clear error unless ``rewards`` is a finite ``[B]`` tensor and ``group_ids`` an
    integer ``[B]`` tensor (one host sync for the finiteness check)."""
    if rewards.dim() != 1:
        raise ValueError(f"{name} must be 1-D [B]; got shape {tuple(rewards.shape)}")
    if group_ids.shape != rewards.shape:
        raise ValueError(
            f"group ids must have the shape of {name} [B] = {tuple(rewards.shape)}; got "
            f"{tuple(group_ids.shape)}"
        )
    if torch.is_floating_point(group_ids) or torch.is_complex(group_ids):
        raise TypeError(f"group ids must be an integer tensor; got {group_ids.dtype}")
    if torch.is_floating_point(rewards) and not bool(torch.isfinite(rewards).all()):
        bad = (~torch.isfinite(rewards)).nonzero().flatten()[:5].tolist()
        raise ValueError(f"{name} contain NaN or inf (first bad indices: {bad})")


def out_dtype(x: Tensor) -> torch.dtype:
    """The advantages' dtype: the rewards' floating dtype, float32 for integer rewards."""
    return x.dtype if torch.is_floating_point(x) else torch.float32


def group_stats(values: Tensor, ids: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-element group statistics, gathered back to ``[N]`` (float64).

    Returns ``(count, mean, unbiased_var, all_equal)`` for each element's group; ``unbiased_var``
    is 0 for singletons, ``all_equal`` is True where the group's min equals its max.
    """
    _, inv = torch.unique(ids, return_inverse=True)
    num_groups = int(inv.max()) + 1 if inv.numel() else 0
    v = values.to(torch.float64)
    count = torch.zeros(num_groups, dtype=torch.float64, device=v.device).index_add_(
        0, inv, torch.ones_like(v)
    )
    total = torch.zeros_like(count).index_add_(0, inv, v)
    mean = total / count
    sq_dev = torch.zeros_like(count).index_add_(0, inv, (v - mean[inv]) ** 2)
    var = sq_dev / (count - 1.0).clamp_min(1.0)
    gmax = torch.full_like(count, -torch.inf).scatter_reduce_(0, inv, v, "amax")
    gmin = torch.full_like(count, torch.inf).scatter_reduce_(0, inv, v, "amin")
    return count[inv], mean[inv], var[inv], (gmax == gmin)[inv]


@register_advantage("grpo", config=GRPOAdvantageConfig)
def grpo_advantages(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """GRPO group-normalised advantages ``(R_i - mean_g) / (std_g + eps)`` (arXiv 2402.03300).

    ``std_g`` is the unbiased sample standard deviation (divides by ``n_g - 1``).

    Args:
        rewards: ``[B]`` episode rewards (finite).
        group_ids: ``[B]`` integer ids, equal for trajectories of the same prompt; any values,
            any order.
        eps: added to the standard deviation.

    Returns:
        ``[B]`` advantages; exactly 0 for singleton groups and groups with all-equal rewards.
    """
    check_rewards(rewards, group_ids)
    _, mean, var, equal = group_stats(rewards, group_ids)
    adv = (rewards.to(torch.float64) - mean) / (var.sqrt() + eps)
    return torch.where(equal, torch.zeros_like(adv), adv).to(out_dtype(rewards))


@register_advantage("dr_grpo")
def dr_grpo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Dr.GRPO advantages ``R_i - mean_g`` (no std division; arXiv 2503.20783).

    Args and returns as :func:`grpo_advantages`; 0 for singleton and all-equal groups.
    """
    check_rewards(rewards, group_ids)
    _, mean, _, equal = group_stats(rewards, group_ids)
    adv = rewards.to(torch.float64) - mean
    return torch.where(equal, torch.zeros_like(adv), adv).to(out_dtype(rewards))


@register_advantage("rloo")
def rloo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """RLOO leave-one-out advantages ``R_i - mean_{j != i} R_j`` (arXiv 2402.14740).

    Computed as ``R_i - (S_g - R_i) / (n_g - 1)`` with ``S_g`` the group sum.
    Args and returns as :func:`grpo_advantages`; 0 for singleton and all-equal groups.
    """
    check_rewards(rewards, group_ids)
    count, mean, _, equal = group_stats(rewards, group_ids)
    r = rewards.to(torch.float64)
    loo_mean = (mean * count - r) / (count - 1.0).clamp_min(1.0)
    adv = torch.where(equal | (count < 2), torch.zeros_like(r), r - loo_mean)
    return adv.to(out_dtype(rewards))


def task_normalize_advantages(
    advantages: Tensor, mask: Tensor, task_ids: Tensor, *, eps: float = 1e-6
) -> Tensor:
    """AgentRL task advantage normalisation (arXiv 2510.04206).

    After the group step, the advantages of all masked tokens of task ``k`` (pooled over its
    trajectories, so long trajectories weigh more) are re-standardised:
    ``A'_t = (A_t - mu_k) / (sigma_k + eps)`` with ``mu_k``, ``sigma_k`` the mean and unbiased
    standard deviation over task ``k``'s masked tokens. This balances the gradient scale across
    tasks of different reward ranges.

    Args:
        advantages: ``[B, T]`` per-token advantages, or ``[B]`` (broadcast over tokens).
        mask: ``[B, T]`` 0/1 loss mask.
        task_ids: ``[B]`` integer task of each trajectory.
        eps: added to the standard deviation.

    Returns:
        ``[B, T]``; 0 on unmasked tokens. A task whose masked tokens all carry the same advantage
        (including a task with a single token, or none) gets 0 on all its tokens: it holds no
        within-task signal.
    """
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T]; got shape {tuple(mask.shape)}")
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(mask)
    if advantages.shape != mask.shape:
        raise ValueError(
            f"advantages must be [B] or [B, T] = {tuple(mask.shape)}; got {tuple(advantages.shape)}"
        )
    if task_ids.dim() != 1 or task_ids.shape[0] != mask.shape[0]:
        raise ValueError(
            f"task_ids must be [B] with B = {mask.shape[0]}; got {tuple(task_ids.shape)}"
        )
    if torch.is_floating_point(task_ids) or torch.is_complex(task_ids):
        raise TypeError(f"task_ids must be an integer tensor; got {task_ids.dtype}")
    m = mask.bool()
    if not bool(torch.isfinite(advantages[m]).all()):
        raise ValueError("advantages contain NaN or inf on masked tokens")
    flat_ids = task_ids[:, None].expand_as(mask)[m]  # [N] task of each masked token
    values = advantages[m]
    out = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device)
    if values.numel() == 0:
        return out.to(out_dtype(advantages))
    _, mean, var, equal = group_stats(values, flat_ids)
    normed = (values.to(torch.float64) - mean) / (var.sqrt() + eps)
    out[m] = torch.where(equal, torch.zeros_like(normed), normed)
    return out.to(out_dtype(advantages))
