"""The ``algorithm`` section of the config and the algorithms by name (recipes).

A recipe is not code: it is a named, complete *identity* of an algorithm (advantage estimator,
policy loss and its options, aggregation, clip rule and bounds, PAPO on/off, DAPO's dynamic
sampling and overlong penalty, task normalisation, plus any controller options it is about)
over :class:`AlgorithmConfig`. The update step (:mod:`entropace.train.update`) reads only the
resolved config, so every part of a recipe can still be overridden
(``algorithm.eps_high=0.3``), and a new algorithm is one :func:`register_recipe` call. The
pieces a recipe names live in their own registries: advantage estimators and policy losses in
:mod:`entropace.algos`, clip rules in :mod:`entropace.control`.

Bounds: ``eps_low`` / ``eps_high`` are the policy loss's trust-region widths in its own units
(:attr:`entropace.algos.PolicyLoss.width`: ratio half-widths for the PPO family and CISPO,
GMPO's log-ratio bounds, DPPO's divergence thresholds). They are None unless a recipe (or the
user) sets them, which means the loss's own defaults
(:attr:`entropace.algos.PolicyLoss.default_bounds`: 0.2 / 0.2 for the PPO family, GSPO's
3e-4 / 4e-4, DCPO's 0.16 / 0.2); a loss whose widths are options (SAPO's ``tau_neg`` /
``tau_pos``, DRO's ``beta``) takes them from ``loss_options`` and refuses these two keys.
:func:`effective_bounds` resolves them. Under EPPO's pacer a native (ratio-bound) width starts
at ``pacer.eps0`` / ``eps_high0``; any other starts at the loss's own widths and is scaled by
the task's pace (ALGORITHMS.md section 3, "Widths"); a loss without a width (GPG, KL-Cov) is
refused with the pacer. Defaults follow ``shared/docs/BASELINES.md`` and ``ALGORITHMS.md``.
Two deliberate choices, so that recipes differ only in the rule they are about:

* ``kl_beta`` is 0 in every recipe (GRPO's paper uses 0.04: ``algorithm.kl_beta=0.04``).
* DCPO's "smooth advantage standardisation across visits of a prompt" needs a prompt to be
  revisited across steps, which the trainer's seed stream never does; it uses GRPO
  advantages, with DCPO's probability-dependent bounds and per-response token mean.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from entropace.algos import (
    ADVANTAGE_ESTIMATORS,
    AGG_MODES,
    POLICY_LOSSES,
    get_advantage,
    get_policy_loss,
)
from entropace.algos.limits import ENTROPY_COEF_MAX, KL_BETA_MAX, RATIO_MAX
from entropace.algos.widths import RATIO_WIDTH
from entropace.control import (
    CLIP_RULES,
    BapoConfig,
    ClipSettings,
    PacerConfig,
    PolarityConfig,
)
from entropace.train.schema import (
    ConfigError,
    Range,
    build_dataclass,
    check_in,
    check_ranges,
    did_you_mean,
    merge,
    register_ranges,
)

__all__ = [
    "IDENTITY",
    "RECIPES",
    "AlgorithmConfig",
    "OverlongConfig",
    "Recipe",
    "advantage_config",
    "algorithm_config",
    "clip_settings",
    "effective_bounds",
    "get_recipe",
    "loss_config",
    "recipe_lever",
    "register_recipe",
    "validate_algorithm",
]


@dataclass
class OverlongConfig:
    """DAPO's soft overlong penalty, added to the episode reward (response tokens)."""

    enabled: bool = False
    max_len: int = 1024
    cache_len: int = 256


@dataclass
class AlgorithmConfig:
    """The policy-optimisation algorithm. ``name`` selects a recipe; every other field can
    still be overridden (the recipe only changes their defaults).

    Attributes:
        name: a recipe of :data:`RECIPES`.
        advantage: an estimator of :data:`entropace.algos.ADVANTAGE_ESTIMATORS`.
        advantage_options: that estimator's own options (e.g. ``gamma`` of
            ``reinforce_plus_plus``, ``norm_by_std`` of ``grpo_passk``), validated on load.
        task_norm: AgentRL's per-task re-standardisation of token advantages.
        policy_loss: a name of :data:`entropace.algos.POLICY_LOSSES`.
        loss_options: that loss's own options (fields of its config dataclass, e.g.
            ``dual_clip``, ``beta1``), validated when the config loads.
        agg: ``token-mean`` | ``seq-mean-token-mean`` | ``seq-mean-token-sum-norm``.
        seq_norm: the constant of ``seq-mean-token-sum-norm`` (None: the rollout's
            ``max_episode_tokens``).
        clip_rule: a name of :data:`entropace.control.CLIP_RULES`: ``fixed`` (eps_low /
            eps_high) | ``pacer`` (EPPO) | ``bapo``.
        eps_low, eps_high: the loss's fixed widths in its own units (the clip range
            ``[1 - eps_low, 1 + eps_high]`` of the PPO family); None: the policy loss's
            default bounds.
        task_bounds: ``clip_rule: fixed`` only: fixed per-task widths ``{task: [eps_low,
            eps_high]}`` (the loss's units) for the tasks named (the others keep ``eps_low`` /
            ``eps_high``).
        papo: reweight advantages by entropy polarity (PAPO).
        dynamic_sampling: DAPO's filter dropping groups whose rewards are all equal.
        kl_beta: coefficient of the k3 KL to a frozen reference (0: no reference model).
        entropy_coef: entropy bonus coefficient (loss -= coef * mean entropy).
    """

    name: str = "grpo"
    advantage: str = "grpo"
    advantage_options: dict[str, Any] = field(default_factory=dict)
    task_norm: bool = False
    policy_loss: str = "ppo"
    loss_options: dict[str, Any] = field(default_factory=dict)
    agg: str = "token-mean"
    seq_norm: float | None = None
    clip_rule: str = "fixed"
    eps_low: float | None = None
    eps_high: float | None = None
    task_bounds: dict[str, list[float]] = field(default_factory=dict)
    papo: bool = False
    dynamic_sampling: bool = False
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    kl_beta: float = 0.0
    entropy_coef: float = 0.0
    pacer: PacerConfig = field(default_factory=PacerConfig)
    polarity: PolarityConfig = field(default_factory=PolarityConfig)
    bapo: BapoConfig = field(default_factory=BapoConfig)


#: The fields every recipe sets (to its own value or the default below): choosing an algorithm
#: replaces all of them, so a preset's settings for another algorithm never leak into it.
IDENTITY: dict[str, Any] = {
    "advantage": "grpo",
    "advantage_options": {},
    "task_norm": False,
    "policy_loss": "ppo",
    "loss_options": {},
    "agg": "token-mean",
    "clip_rule": "fixed",
    "eps_low": None,
    "eps_high": None,
    "task_bounds": {},
    "papo": False,
    "dynamic_sampling": False,
    "overlong": {"enabled": False},
}


#: Most tokens of DAPO's overlong window (``rollout.max_episode_tokens``' own maximum).
MAX_OVERLONG_TOKENS = 2**20
#: Most warmup steps of a controller (the trainer's own maximum of steps).
MAX_WARMUP = 1_000_000

# The ranges of the section's numbers, checked when it loads (``build_dataclass``) and by
# :func:`validate_algorithm`; any other number is finite (floats) or in [0, 2**31 - 1] (ints).
# The controllers' and the losses' configs check their own relations on construction.
register_ranges(AlgorithmConfig, {
    "seq_norm": Range(1, note="a number of tokens, the divisor of the per-sequence sums"),
    # the loss's own range (its width's limits) and < 1 for a ratio bound: validate_algorithm
    "eps_low": Range(0, lo_open=True),
    "eps_high": Range(0, lo_open=True),
    # finite in float32 over 2**24 tokens (entropace.algos.limits)
    "kl_beta": Range(0, KL_BETA_MAX, note="the float32 loss stays finite"),
    "entropy_coef": Range(0, ENTROPY_COEF_MAX, note="the float32 loss stays finite"),
})  # fmt: skip
register_ranges(OverlongConfig, {
    "max_len": Range(1, MAX_OVERLONG_TOKENS),
    "cache_len": Range(1, MAX_OVERLONG_TOKENS),
})  # fmt: skip
register_ranges(PacerConfig, {
    "warmup_steps": Range(1, MAX_WARMUP),
    "eps_high0": Range(0, RATIO_MAX, lo_open=True, note="a ratio half-width; no ratio is above e^20"),
})  # fmt: skip
register_ranges(PolarityConfig, {"warmup_steps": Range(1, MAX_WARMUP)})


def validate_algorithm(a: AlgorithmConfig, key: str = "algorithm") -> AlgorithmConfig:
    """Range and registry checks of the algorithm section (``ConfigError`` naming the key);
    the loss options are checked against the loss's own config dataclass."""
    check_ranges(a, key)
    check_in(f"{key}.name", a.name, sorted(RECIPES))
    check_in(f"{key}.advantage", a.advantage, sorted(ADVANTAGE_ESTIMATORS))
    check_in(f"{key}.policy_loss", a.policy_loss, sorted(POLICY_LOSSES))
    check_in(f"{key}.agg", a.agg, list(AGG_MODES))
    check_in(f"{key}.clip_rule", a.clip_rule, sorted(CLIP_RULES))
    loss_config(a, key)
    advantage_config(a, key)
    width = _check_widths(a, key)
    if a.clip_rule == "pacer" and width.native:  # it starts at (pacer.eps0, pacer.eps_high0)
        for name, start in zip(("eps_low", "eps_high"), a.pacer.bounds0, strict=True):
            value = getattr(a, name)
            if value is not None and value != start:
                raise ConfigError(
                    f"{key}.{name}={value} under {key}.clip_rule=pacer: the pacer sets every "
                    f"task's bounds, starting from {key}.pacer.eps0 / eps_high0 "
                    f"{a.pacer.bounds0}; set {key}.pacer."
                    f"{'eps0' if name == 'eps_low' else 'eps_high0'}={value} instead"
                )
    if a.task_bounds and a.clip_rule != "fixed":
        raise ConfigError(
            f"{key}.task_bounds: fixed per-task bounds need {key}.clip_rule=fixed (got "
            f"{a.clip_rule!r}, which sets every task's bounds itself)"
        )
    try:
        clip_settings(a)
    except ValueError as exc:
        raise ConfigError(f"{key}.{exc}") from None
    # checked whether the penalty is on or not (a value switched on later is then valid)
    if a.overlong.cache_len > a.overlong.max_len:
        raise ConfigError(
            f"{key}.overlong.cache_len must be in [1, {key}.overlong.max_len], got "
            f"{a.overlong.cache_len} (max_len {a.overlong.max_len})"
        )
    return a


def _check_widths(a: AlgorithmConfig, key: str) -> Any:
    """The loss's width checks of the section: widths held in options refuse ``eps_*``, a
    ratio bound needs ``eps_low < 1``, the pacer needs a width and BAPO a ratio bound.
    Returns the loss's width (the PPO family's for a loss without one)."""
    width = get_policy_loss(a.policy_loss).width
    if width is not None and width.options is not None:
        for name in ("eps_low", "eps_high"):
            if getattr(a, name) is not None:
                raise ConfigError(
                    f"{key}.{name}: the widths of policy loss {a.policy_loss!r} are its "
                    f"{width.unit}s {key}.loss_options.{width.options[0]} / "
                    f"{width.options[1]}; set those instead"
                )
    if (width is None or width.low_below_one) and a.eps_low is not None and not a.eps_low < 1:
        raise ConfigError(
            f"{key}.eps_low must be < 1 for policy loss {a.policy_loss!r} (its lower ratio bound "
            f"is 1 - eps_low), got {a.eps_low}"
        )
    if a.clip_rule == "pacer" and width is None:
        paced = sorted(n for n, s in POLICY_LOSSES.items() if s.width is not None)
        raise ConfigError(
            f"{key}.clip_rule=pacer: policy loss {a.policy_loss!r} has no trust-region width "
            f"for EPPO's pacer to set; the pacer composes with {paced}"
        )
    if a.clip_rule == "bapo" and (width is None or not width.native):
        raise ConfigError(
            f"{key}.clip_rule=bapo searches PPO's ratio bounds; policy loss {a.policy_loss!r} "
            f"has {'no width' if width is None else width.unit + 's'}"
        )
    return width or RATIO_WIDTH


def loss_config(a: AlgorithmConfig, key: str = "algorithm") -> Any:
    """The validated config dataclass of ``a.policy_loss`` built from ``a.loss_options``."""
    spec = get_policy_loss(a.policy_loss)
    return build_dataclass(spec.config_cls, a.loss_options, f"{key}.loss_options")


def advantage_config(a: AlgorithmConfig, key: str = "algorithm") -> Any:
    """The validated config dataclass of ``a.advantage`` built from ``a.advantage_options``."""
    spec = get_advantage(a.advantage)
    return build_dataclass(spec.config_cls, a.advantage_options, f"{key}.advantage_options")


def effective_bounds(a: AlgorithmConfig) -> tuple[float, float]:
    """``(eps_low, eps_high)`` a task starts with, in the loss's width units: the configured
    values, else the policy loss's defaults (its width options for SAPO / DRO; 0.2 / 0.2 for a
    loss without a width, whose bounds are then unused); under the pacer with a native
    (ratio-bound) width, its ``(eps0, eps_high0)`` (:attr:`entropace.control.PacerConfig.
    bounds0`, which :func:`validate_algorithm` makes agree with any ``eps_low`` /
    ``eps_high`` given)."""
    spec = get_policy_loss(a.policy_loss)
    width = spec.width or RATIO_WIDTH
    if a.clip_rule == "pacer" and width.native:
        return a.pacer.bounds0
    if width.options is not None:
        return width.option_widths(loss_config(a))
    default = spec.default_bounds or (0.2, 0.2)
    lo = default[0] if a.eps_low is None else a.eps_low
    hi = default[1] if a.eps_high is None else a.eps_high
    return float(lo), float(hi)


def clip_settings(a: AlgorithmConfig, seed: int = 0) -> ClipSettings:
    """What :func:`entropace.control.build_clip_rule` builds ``a.clip_rule`` from (the bounds in
    the loss's width units, and that width); ``seed``: the run's seed."""
    lo, hi = effective_bounds(a)
    width = get_policy_loss(a.policy_loss).width or RATIO_WIDTH
    per_task = {k: tuple(v) for k, v in a.task_bounds.items()}
    return ClipSettings(
        eps_low=lo, eps_high=hi, task_bounds=per_task, pacer=a.pacer, bapo=a.bapo, width=width,
        seed=seed,
    )


# --------------------------------------------------------------------------------------------
# Recipes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recipe:
    """A named algorithm: its identity over :class:`AlgorithmConfig`.

    A recipe is either a baseline of its own (``base=None``: ``overrides`` on top of
    :data:`IDENTITY`) or a **variant** of another recipe (``base``: ``overrides`` is the lever,
    the one change the variant makes to its base's identity). Every EPPO and PAPO recipe and
    every control is a variant, so that comparing it with its base compares exactly that
    change (issue 35: ``eppo`` once differed from ``grpo`` in its aggregation too);
    :func:`recipe_lever` derives the difference and ``tests/test_config.py`` checks it equals
    the declared one for every registered variant.

    Attributes:
        name: registry key (``algorithm.name``).
        summary: one line for docs and ``--help``.
        reference: paper (arXiv id) or spec section.
        overrides: nested ``AlgorithmConfig`` field values; with ``base``, the lever (what
            the variant changes); without, on top of :data:`IDENTITY` (every identity field
            it does not name takes the default there).
        base: the recipe this one is a variant of (None: a baseline of its own).
    """

    name: str
    summary: str
    reference: str
    overrides: dict[str, Any] = field(default_factory=dict)
    base: str | None = None

    def identity(self) -> dict[str, Any]:
        """The recipe's identity (what choosing it sets): its base's identity, or
        :data:`IDENTITY`, with :attr:`overrides` on top."""
        below = IDENTITY if self.base is None else get_recipe(self.base).identity()
        return merge(below, self.overrides)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"pacer": {"alpha": 1}}`` -> ``{"pacer.alpha": 1}`` (an empty dict stays a leaf)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def recipe_lever(name: str, against: str | None = None) -> dict[str, tuple[Any, Any]]:
    """What recipe ``name`` changes against recipe ``against`` (default: its base), derived
    from the two resolved :class:`AlgorithmConfig` s: ``{dotted field: (against's value,
    name's value)}`` over every field but ``name``. Empty for a baseline without a base."""
    recipe = get_recipe(name)
    other = against if against is not None else recipe.base
    if other is None:
        return {}
    mine = _flatten(asdict(algorithm_config(name)))
    theirs = _flatten(asdict(algorithm_config(other)))
    keys = (set(mine) | set(theirs)) - {"name"}
    return {
        k: (theirs.get(k), mine.get(k)) for k in sorted(keys) if mine.get(k) != theirs.get(k)
    }


RECIPES: dict[str, Recipe] = {}


def register_recipe(recipe: Recipe) -> Recipe:
    """Add (or replace) a recipe; its overrides must make a valid ``AlgorithmConfig``, and a
    variant's lever must change every field it names against its base (no silent no-op)."""
    previous = RECIPES.get(recipe.name)
    RECIPES[recipe.name] = recipe
    try:
        if recipe.base == recipe.name:
            raise ConfigError("a recipe cannot be its own base")
        data = {**recipe.identity(), "name": recipe.name}
        validate_algorithm(build_dataclass(AlgorithmConfig, data, "algorithm"))
        if recipe.base is not None:
            declared = set(_flatten(recipe.overrides))
            changed = set(recipe_lever(recipe.name))
            if declared != changed:
                raise ConfigError(
                    f"its lever {sorted(declared)} against base {recipe.base!r} changes "
                    f"{sorted(changed)}: a variant must change exactly the fields it names"
                )
    except ConfigError as exc:
        if previous is None:
            del RECIPES[recipe.name]
        else:
            RECIPES[recipe.name] = previous
        raise ConfigError(f"recipe {recipe.name!r}: {exc}") from exc
    return recipe


def get_recipe(name: str) -> Recipe:
    """The recipe ``name``; an unknown name raises :class:`ConfigError` listing the known."""
    if name not in RECIPES:
        raise ConfigError(
            f"algorithm.name: unknown algorithm {name!r}{did_you_mean(name, list(RECIPES))}; "
            f"allowed values: {sorted(RECIPES)}"
        )
    return RECIPES[name]


def algorithm_config(name: str, overrides: dict[str, Any] | None = None) -> AlgorithmConfig:
    """The validated :class:`AlgorithmConfig` of recipe ``name`` plus nested ``overrides``
    (what an engine plug-in takes instead of a whole training config)."""
    data = merge({**get_recipe(name).identity(), "name": name}, overrides or {})
    return validate_algorithm(build_dataclass(AlgorithmConfig, data, "algorithm"))


_EPPO = {"clip_rule": "pacer"}

for _recipe in (
    # GRPO as verl and AgentRL run it: token-mean aggregation (ALGORITHMS.md section 1,
    # "Aggregation"); the GRPO paper's per-sequence mean is algorithm.agg=seq-mean-token-mean.
    Recipe("grpo", "GRPO: group-standardised advantages, PPO clip", "2402.03300"),
    Recipe("dr_grpo", "Dr.GRPO: unnormalised group advantages, per-sequence sum / constant",
           "2503.20783", {"advantage": "dr_grpo", "agg": "seq-mean-token-sum-norm"}),
    Recipe("dapo", "DAPO: clip-higher, token-mean, dynamic sampling, overlong penalty",
           "2503.14476", {"eps_low": 0.2, "eps_high": 0.28, "dynamic_sampling": True,
                          "overlong": {"enabled": True}}),
    Recipe("rloo", "RLOO: leave-one-out baseline", "2402.14740", {"advantage": "rloo"}),
    Recipe("gspo", "GSPO: sequence-level ratio clipped per sequence", "2507.18071",
           {"policy_loss": "gspo", "agg": "seq-mean-token-mean"}),
    Recipe("clip_cov", "Clip-Cov: drop gradients of a few high-covariance tokens", "2505.22617",
           {"policy_loss": "clip_cov"}),
    Recipe("kl_cov", "KL-Cov: KL penalty on the top-covariance tokens", "2505.22617",
           {"policy_loss": "kl_cov"}),
    Recipe("dcpo", "DCPO: probability-dependent clip bounds", "2509.02333",
           {"policy_loss": "dcpo", "agg": "seq-mean-token-mean"}),
    Recipe("bapo", "BAPO: per-step adaptive clip balancing positive/negative contributions",
           "2510.18927", {"clip_rule": "bapo"}),
    Recipe("ce_gppo", "CE-GPPO: gradient-preserving clip", "2509.20712",
           {"policy_loss": "ce_gppo"}),
    Recipe("cispo", "CISPO: clipped stop-gradient importance weight on every token",
           "2506.13585", {"policy_loss": "cispo", "eps_low": 10.0, "eps_high": 0.2}),
    Recipe("gmpo", "GMPO: geometric mean of the token ratios, log-ratio clip", "2507.20673",
           {"policy_loss": "gmpo", "agg": "seq-mean-token-mean", "eps_low": 0.4,
            "eps_high": 0.4}),
    Recipe("sapo", "SAPO: soft temperature-controlled gate instead of a clip", "2511.20347",
           {"policy_loss": "sapo", "agg": "seq-mean-token-mean"}),
    Recipe("dppo_tv", "DPPO-Binary-TV: total-variation bound instead of a ratio clip",
           "2602.04879", {"policy_loss": "dppo_tv", "advantage": "dr_grpo",
                          "agg": "seq-mean-token-sum-norm", "eps_low": 0.15, "eps_high": 0.15,
                          "loss_options": {"ratio_cap": None}}),
    Recipe("dppo_kl", "DPPO-Binary-KL: binary-KL bound instead of a ratio clip", "2602.04879",
           {"policy_loss": "dppo_kl", "advantage": "dr_grpo", "agg": "seq-mean-token-sum-norm",
            "eps_low": 0.05, "eps_high": 0.05, "loss_options": {"ratio_cap": None}}),
    Recipe("dro", "DRO: policy gradient with a quadratic log-ratio penalty", "2405.19107",
           {"policy_loss": "dro", "advantage": "dr_grpo"}),
    Recipe("gpg", "GPG: REINFORCE on GPG's rescaled group advantages, no ratio", "2504.02546",
           {"policy_loss": "gpg", "advantage": "gpg"}),
    Recipe("reinforce_plus_plus", "REINFORCE++: batch-whitened returns, PPO clip",
           "2501.03262", {"advantage": "reinforce_plus_plus"}),
    Recipe("reinforce_plus_plus_baseline",
           "REINFORCE++ with the group-mean baseline, batch-whitened", "2501.03262",
           {"advantage": "reinforce_plus_plus_baseline"}),
    Recipe("opo", "OPO: length-weighted optimal group baseline", "2505.23585",
           {"advantage": "opo"}),
    Recipe("grpo_passk", "GRPO pass@k: only each group's best response gets r_max - r_second",
           "2503.19595", {"advantage": "grpo_passk", "agg": "seq-mean-token-mean"}),
    # EPPO, PAPO and their controls: each its base plus exactly the change it names.
    Recipe("eppo", "EPPO: per-task clip range paced by retained entropy",
           "ALGORITHMS.md section 3", dict(_EPPO), base="grpo"),
    Recipe("papo", "PAPO: advantages reweighted by entropy polarity",
           "ALGORITHMS.md section 4", {"papo": True}, base="grpo"),
    Recipe("eppo+papo", "EPPO pacer and PAPO reweighting together",
           "ALGORITHMS.md sections 3-4", {"papo": True}, base="eppo"),
    Recipe("eppo-global", "EPPO ablation: one global clip range (w/o task-wise clip)",
           "ALGORITHMS.md section 3", {"pacer": {"task_wise": False}}, base="eppo"),
    Recipe("eppo-notrend", "EPPO ablation: no trend constraint",
           "ALGORITHMS.md section 3", {"pacer": {"trend": False}}, base="eppo"),
    Recipe("eppo-success", "EPPO control: pacer driven by EMA success rate, not entropy",
           "ALGORITHMS.md section 3", {"pacer": {"signal": "success"}}, base="eppo"),
    Recipe("eppo-shuffled", "EPPO control: the step's eps_k permuted across tasks",
           "ALGORITHMS.md section 3", {"pacer": {"shuffle": True}}, base="eppo"),
    Recipe("eppo-rewardvar", "EPPO control: pacer driven by reward variance, not entropy",
           "ALGORITHMS.md section 3", {"pacer": {"signal": "reward_var"}}, base="eppo"),
):  # fmt: skip
    register_recipe(_recipe)

#: The trust-region losses EPPO's pacer composes with beyond PPO's clip (``eppo+<name>``: the
#: loss's recipe with the pacer over its width; ALGORITHMS.md section 3, "Widths").
PACED_LOSS_RECIPES = ("cispo", "gmpo", "sapo", "dppo_tv", "dppo_kl", "dro")
for _name in PACED_LOSS_RECIPES:
    register_recipe(Recipe(
        f"eppo+{_name}", f"EPPO pacer over the width of {RECIPES[_name].summary.split(':')[0]}",
        "ALGORITHMS.md section 3", dict(_EPPO), base=_name))  # fmt: skip
