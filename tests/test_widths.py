"""EPPO's pacer over any trust-region width (ALGORITHMS.md section 3, "Widths"): the mapping
from a task's pace to each loss's width, the clip rules in the loss's units, TaskStep's row
widths and state, and the recipes ``eppo+<loss>`` end to end on the rule."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from entropace.algos import POLICY_LOSSES, TrustWidth, paced_widths
from entropace.control import ClipSettings, EntropyPacer, PacerConfig, TaskStep
from entropace.train.algorithms import PACED_LOSS_RECIPES, algorithm_config, clip_settings

TASKS = ["db", "os", "kg"]


def _step_sums(step: TaskStep, s: int) -> torch.Tensor:
    """Three tasks whose entropies fall at different paces (db fastest)."""
    g = torch.Generator().manual_seed(s)
    ids = torch.tensor([0, 0, 1, 1, 2, 2])
    pace = torch.tensor([0.6, 0.6, 0.95, 0.95, 0.8, 0.8]) ** s
    mask = torch.ones(6, 4)
    entropy = (0.5 + torch.rand(6, 4, generator=g)) * pace[:, None]
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 0.0])
    return step.sums(entropy, mask, rewards, rewards >= 1, ids)


def test_paced_widths_by_hand() -> None:
    ratio = POLICY_LOSSES["ppo"].width
    assert paced_widths(ratio, (0.17, 0.3), (0.2, 0.28), (9.0, 9.0)) == (0.17, 0.3)  # native
    kl = TrustWidth("binary-KL threshold", power=2.0)
    lo, hi = paced_widths(kl, (0.3, 0.42), (0.2, 0.28), (0.05, 0.04))
    assert (lo, hi) == pytest.approx((0.05 * 1.5**2, 0.04 * 1.5**2))
    temp = TrustWidth("gate temperature", power=-1.0, options=("tau_neg", "tau_pos"))
    assert paced_widths(temp, (0.15, 0.15), (0.2, 0.2), (1.05, 1.0)) == pytest.approx(
        (1.05 / 0.75, 1.0 / 0.75)
    )
    # at the pacer's start the loss's own widths, exactly
    assert paced_widths(temp, (0.2, 0.28), (0.2, 0.28), (1.05, 1.0)) == (1.05, 1.0)
    with pytest.raises(ValueError, match="cannot live in options"):
        TrustWidth("x", native=True, options=("a", "b"))


@pytest.mark.parametrize("loss", sorted(PACED_LOSS_RECIPES))
def test_pacer_rule_hands_each_task_its_width(loss: str) -> None:
    """The pacer clip rule of ``eppo+<loss>``: every task's width is the loss's own width at
    pace 1 scaled by ``(eps_k / eps0) ** power``; the pacer's eps_k are those of a plain
    EntropyPacer fed the same statistics; a collapsing task gets the tighter region."""
    a = algorithm_config(f"eppo+{loss}")
    settings = clip_settings(a)
    width = POLICY_LOSSES[loss].width
    assert settings.width is width and not width.native
    start = (settings.eps_low, settings.eps_high)
    step = TaskStep(TASKS, clip_rule="pacer", clip=settings, recipe=f"eppo+{loss}")
    assert step.default_bounds == start
    reference = EntropyPacer(config=a.pacer)
    for s in range(8):
        out = step.step(_step_sums(step, s))
        reference.update(out.signals.task_entropy)
    eps0 = a.pacer.bounds0
    for task in TASKS:
        e_lo, e_hi = reference.bounds()[task]
        lo = start[0] * (e_lo / eps0[0]) ** width.power
        hi = start[1] * (e_hi / eps0[1]) ** width.power
        assert out.bounds[task] == pytest.approx((lo, hi), rel=1e-12), task
        assert out.metrics[f"task/{task}/eps_low"] == pytest.approx(lo, rel=1e-12)
    # db collapses fastest: the tightest region (a smaller bound, a larger temperature / beta)
    tight = {t: out.bounds[t][0] ** (1 / width.power) for t in TASKS}
    assert tight["db"] < tight["kg"] < tight["os"], (loss, out.bounds)
    # per-row widths for the loss
    low, high = step.row_bounds(torch.tensor([0, 2, 1]))
    assert low.flatten().tolist() == pytest.approx([out.bounds[t][0] for t in ("db", "kg", "os")])
    assert high.shape == (3, 1)
    # the state holds the pacer's eps (its own units): a resumed rule hands the same widths
    resumed = TaskStep(TASKS, clip_rule="pacer", clip=settings, recipe=f"eppo+{loss}")
    resumed.load_state_dict(copy.deepcopy(step.state_dict()))
    assert resumed.bounds() == step.bounds()


def test_native_widths_are_the_pacers_eps_as_before() -> None:
    a = algorithm_config("eppo")
    step = TaskStep(TASKS, clip_rule="pacer", clip=clip_settings(a), recipe="eppo")
    plain = TaskStep(TASKS, clip_rule="pacer", clip=ClipSettings(pacer=a.pacer), recipe="eppo")
    for s in range(6):
        assert step.step(_step_sums(step, s)).bounds == plain.step(_step_sums(plain, s)).bounds


def test_gspo_is_paced_from_its_own_sequence_bounds() -> None:
    a = algorithm_config("eppo", {"policy_loss": "gspo"})
    settings = clip_settings(a)
    assert (settings.eps_low, settings.eps_high) == (3e-4, 4e-4)
    step = TaskStep(TASKS, clip_rule="pacer", clip=settings, recipe="eppo")
    for s in range(4):
        out = step.step(_step_sums(step, s))
    assert all(1e-4 < lo < 1e-3 for lo, _ in out.bounds.values())


def test_fixed_rule_in_the_losss_units() -> None:
    """SAPO's fixed widths are its temperatures (> 1 allowed); a ratio bound keeps eps_low < 1;
    CISPO's weight bound may exceed 1 (no lower bound)."""
    sapo = clip_settings(algorithm_config("sapo", {"loss_options": {"tau_neg": 2.5}}))
    step = TaskStep(TASKS, clip_rule="fixed", clip=sapo, recipe="sapo")
    out = step.step(_step_sums(step, 0))
    assert set(out.bounds.values()) == {(2.5, 1.0)}
    cispo = clip_settings(algorithm_config("cispo"))
    assert (cispo.eps_low, cispo.eps_high) == (10.0, 0.2)
    with pytest.raises(ValueError, match="eps_low must be < 1"):
        ClipSettings(eps_low=1.5, eps_high=0.2)
    says = r"eps_high \(gate temperature\) must be a number in \[2e-31, 7e\+29\]"
    with pytest.raises(ValueError, match=says):
        ClipSettings(eps_low=0.2, eps_high=-1.0, width=POLICY_LOSSES["sapo"].width)


def test_pacer_bounds_stay_within_the_mapped_range() -> None:
    """The pacer's eps_k in [eps_min, eps_max] map to widths in [start f_min^p, start f_max^p]."""
    a = algorithm_config("eppo+dppo_kl")
    cfg = a.pacer
    settings = clip_settings(a)
    step = TaskStep(TASKS, clip_rule="pacer", clip=settings, recipe="eppo+dppo_kl")
    for s in range(12):
        out = step.step(_step_sums(step, s))
    f_min, f_max = cfg.eps_min / cfg.eps0, cfg.eps_max / cfg.eps0
    for lo, _ in out.bounds.values():
        assert settings.eps_low * f_min**2 - 1e-15 <= lo <= settings.eps_low * f_max**2 + 1e-15
    assert math.isclose(f_max, 1.5) and math.isclose(f_min, 0.75)


def test_pacer_config_with_other_eps0_scales_by_the_relative_pace() -> None:
    a = algorithm_config("eppo+gmpo", {"pacer": {"eps0": 0.1, "eps_min": 0.05, "eps_max": 0.2}})
    step = TaskStep(TASKS, clip_rule="pacer", clip=clip_settings(a), recipe="eppo+gmpo")
    assert step.default_bounds == (0.4, 0.4)  # GMPO's own log-ratio bounds at pace 1
    ref = EntropyPacer(config=PacerConfig(eps0=0.1, eps_min=0.05, eps_max=0.2))
    for s in range(5):
        out = step.step(_step_sums(step, s))
        ref.update(out.signals.task_entropy)
    for task, (e_lo, _) in ref.bounds().items():
        assert out.bounds[task][0] == pytest.approx(0.4 * e_lo / 0.1)
