"""verl's trust regions (CISPO, GMPO, SAPO, DPPO-TV/KL) and plain policy gradients (DRO, GPG):
value and gradient against float64 loops written from the papers' formulas, at several widths
and in every aggregation; their widths, defaults and flags. (Equality with verl's own functions
is ``tests/integrations/test_verl_trust_regions.py``, in the verl venv.)"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from entropace.algos import POLICY_LOSSES, LossInputs, get_policy_loss
from entropace.algos.aggregation import AGG_MODES
from entropace.algos.trust_region_losses import SAPO_HALF_WEIGHT

NEW = ["cispo", "gmpo", "sapo", "dppo_tv", "dppo_kl", "dro", "gpg"]
SEQ_NORM = 11.0


def _inputs(seed: int, B: int = 6, T: int = 8, spread: float = 0.6):
    """float64 inputs: per-token advantages of both signs and a zero, a fully masked row,
    log-ratios wide enough to cross every width tested."""
    g = torch.Generator().manual_seed(seed)
    old = (-3.0 * torch.rand(B, T, generator=g, dtype=torch.float64)).clamp(max=-0.02)
    lp = (old + spread * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64) + 0.3 * torch.randn(
        B, T, generator=g, dtype=torch.float64
    )
    adv[0, 3] = 0.0
    mask = (torch.rand(B, T, generator=g) > 0.25).to(torch.float64)
    mask[:, 0] = 1.0
    mask[-1] = 0.0
    return lp, old, adv, mask


# ------------------------------------------------------------------------ per-token references


def _cispo(lr, lp, a, lo, hi, opts):
    w = min(max(math.exp(lr), 1 - lo), 1 + hi)
    return -w * a * lp, -w * a


def _sapo(lr, lp, a, lo, hi, opts):
    tau = hi if a > 0 else lo
    r = math.exp(lr)
    s = 1.0 / (1.0 + math.exp(-tau * (r - 1.0)))
    return -(4.0 / tau) * s * a, -4.0 * s * (1.0 - s) * r * a


def _dppo(kind: str):
    def ref(lr, lp, a, lo, hi, opts):
        old = lp - lr
        p, q = math.exp(lp), math.exp(old)
        if kind == "tv":
            valid = (p - q <= hi) if a > 0 else (p - q >= -lo)
        else:
            kl = q * (old - lp) + (1 - q) * math.log((1 - q + 1e-8) / (1 - p + 1e-8))
            valid = (kl <= hi or p <= q) if a > 0 else (kl <= lo or p >= q)
        cap = opts.get("ratio_cap", 3.0)
        w = math.exp(lr) if cap is None else min(math.exp(lr), cap)
        return (-a * w * lp if valid else 0.0), (-a * w if valid else 0.0)

    return ref


def _dro(lr, lp, a, lo, hi, opts):
    beta = hi if a > 0 else lo
    return -(a * lp - 0.5 * beta * lr * lr), -(a - beta * lr)


def _gpg(lr, lp, a, lo, hi, opts):
    return -a * lp, -a


TOKEN_REFS: dict[str, Callable] = {
    "cispo": _cispo, "sapo": _sapo, "dppo_tv": _dppo("tv"), "dppo_kl": _dppo("kl"),
    "dro": _dro, "gpg": _gpg,
}  # fmt: skip


def _coefficients(mask: torch.Tensor, agg: str) -> list[list[float]]:
    """``c_it``: the aggregated loss is ``sum_it c_it L_it`` (ALGORITHMS.md section 1)."""
    B, T = mask.shape
    n_tok = float(mask.sum())
    rows = [float(mask[i].sum()) for i in range(B)]
    n_seq = sum(1 for n in rows if n > 0)
    c = [[0.0] * T for _ in range(B)]
    for i in range(B):
        for t in range(T):
            if mask[i, t]:
                c[i][t] = {
                    "token-mean": 1.0 / n_tok,
                    "seq-mean-token-mean": 1.0 / (rows[i] * n_seq),
                    "seq-mean-token-sum-norm": 1.0 / (SEQ_NORM * n_seq),
                }[agg]
    return c


def _width(value, i: int) -> float:
    return float(value[i, 0]) if isinstance(value, torch.Tensor) else float(value)


def reference(name, lp, old, adv, mask, lo, hi, agg, opts):
    """(loss, d loss / d logprobs) of registered loss ``name``, by loops in Python floats."""
    B, T = mask.shape
    c = _coefficients(mask, agg)
    grad = [[0.0] * T for _ in range(B)]
    total = 0.0
    for i in range(B):
        cells = [t for t in range(T) if mask[i, t]]
        lo_i, hi_i = _width(lo, i), _width(hi, i)
        if name == "gmpo":  # L_i on each of the row's tokens
            if not cells:
                continue
            kept, live = 0.0, []
            for t in cells:
                lr, a = float(lp[i, t] - old[i, t]), float(adv[i, t])
                if a > 0:  # the clip binds above
                    kept += min(lr, hi_i)
                    if lr <= hi_i:
                        live.append(t)
                elif a < 0:  # ... below; A = 0 contributes 0
                    kept += max(lr, -lo_i)
                    if lr >= -lo_i:
                        live.append(t)
            n = len(cells)
            ratio = math.exp(kept / n)
            abar = sum(float(adv[i, t]) for t in cells) / n
            weight = sum(c[i][t] for t in cells)
            total += weight * (-abar * ratio)
            for t in live:
                grad[i][t] = weight * (-abar * ratio / n)
            continue
        for t in cells:
            lr, a = float(lp[i, t] - old[i, t]), float(adv[i, t])
            value, d = TOKEN_REFS[name](lr, float(lp[i, t]), a, lo_i, hi_i, opts)
            total += c[i][t] * value
            grad[i][t] = c[i][t] * d
    return total, torch.tensor(grad, dtype=torch.float64)


WIDTHS = {  # (eps_low, eps_high) pairs per loss: scalars in its units, and per-row tensors
    "cispo": [(0.2, 0.2), (0.1, 0.35), (10.0, 0.25)],
    "gmpo": [(0.2, 0.2), (0.4, 0.1), (0.05, 0.5)],
    "sapo": [(1.05, 1.0), (3.0, 0.5), (0.3, 6.0)],
    "dppo_tv": [(0.2, 0.2), (0.02, 0.05), (0.1, 0.01)],
    "dppo_kl": [(0.2, 0.2), (0.005, 0.02), (0.05, 0.001)],
    "dro": [(1.0, 1.0), (0.2, 3.0), (5.0, 0.5)],
    "gpg": [(None, None)],
}
OPTIONS = {
    "dppo_tv": [{}, {"ratio_cap": 1.2}, {"ratio_cap": None}],
    "dppo_kl": [{"ratio_cap": 2.0}],
}
BINDING = {"cispo": (0.1, 0.35), "gmpo": (0.4, 0.1), "sapo": (4.0, 4.0), "dppo_tv": (0.02, 0.05),
           "dppo_kl": (0.005, 0.02)}  # fmt: skip


def _per_row(lo: float, hi: float, B: int) -> tuple[torch.Tensor, torch.Tensor]:
    scale = torch.linspace(0.5, 1.5, B, dtype=torch.float64)[:, None]
    return lo * scale, hi * scale


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("name", NEW)
def test_value_and_gradient_equal_a_float64_loop(name: str, agg: str) -> None:
    spec = get_policy_loss(name)
    lp, old, adv, mask = _inputs(NEW.index(name))
    cases = [(lo, hi) for lo, hi in WIDTHS[name]]
    if name != "gpg":
        cases.append(_per_row(*WIDTHS[name][1], lp.shape[0]))
    for lo, hi in cases:
        for opts in OPTIONS.get(name, [{}]):
            x = lp.clone().requires_grad_(True)
            inputs = LossInputs(x, old, adv, mask, eps_low=lo, eps_high=hi, agg=agg,
                                seq_norm=SEQ_NORM)  # fmt: skip
            out = spec(inputs, spec.make_config(opts))
            out.loss.backward()
            ref_lo = lo if lo is not None else 0.0
            ref_hi = hi if hi is not None else 0.0
            value, grad = reference(name, lp, old, adv, mask, ref_lo, ref_hi, agg, opts)
            assert float(out.loss.detach()) == pytest.approx(value, rel=1e-12, abs=1e-14), (
                lo,
                hi,
                opts,
            )
            torch.testing.assert_close(x.grad, grad, rtol=1e-10, atol=1e-14)
            assert float(x.grad.abs().sum()) > 0


@pytest.mark.parametrize("name", sorted(BINDING))
def test_the_widths_bind_in_the_tests(name: str) -> None:
    """The inputs above exercise each hard width on both sides: some tokens bound, some not
    (DRO's penalty acts on every token; GPG has no width)."""
    spec = get_policy_loss(name)
    lp, old, adv, mask = _inputs(NEW.index(name))
    lo, hi = BINDING[name]
    out = spec(LossInputs(lp, old, adv, mask, eps_low=lo, eps_high=hi))
    m = mask.bool()
    bound = (out.flags["clip_frac_low"] | out.flags["clip_frac_high"])[m]
    assert 0 < int(bound.sum()) < int(m.sum()), name
    assert out.flags["clip_frac_low"].any() and out.flags["clip_frac_high"].any(), name


def test_defaults_are_verl_091s() -> None:
    """verl 0.9.1's ActorConfig: clip_ratio 0.2 (CISPO / GMPO bounds, DPPO thresholds),
    tau_pos 1.0 / tau_neg 1.05, clip_ratio_c 3.0 (DPPO's cap, read as config.get); DRO: verl
    has none, ours is Tinker's 1.0."""
    for name in ("cispo", "gmpo", "dppo_tv", "dppo_kl"):
        assert POLICY_LOSSES[name].default_bounds == (0.2, 0.2), name
    assert get_policy_loss("sapo").make_config() == get_policy_loss("sapo").config_cls(1.0, 1.05)
    assert get_policy_loss("dppo_tv").make_config().ratio_cap == 3.0
    assert get_policy_loss("dro").make_config().beta == 1.0
    # None widths: the defaults (bounds, or options)
    lp, old, adv, mask = _inputs(0)
    for name, (lo, hi) in {"cispo": (0.2, 0.2), "sapo": (1.05, 1.0), "dro": (1.0, 1.0)}.items():
        spec = get_policy_loss(name)
        a = spec(LossInputs(lp, old, adv, mask))
        b = spec(LossInputs(lp, old, adv, mask, eps_low=lo, eps_high=hi))
        assert torch.equal(a.loss, b.loss), name
    sapo = get_policy_loss("sapo")
    a = sapo(LossInputs(lp, old, adv, mask), sapo.make_config({"tau_pos": 2.0, "tau_neg": 3.0}))
    b = sapo(LossInputs(lp, old, adv, mask, eps_low=3.0, eps_high=2.0))
    assert torch.equal(a.loss, b.loss)


def test_declared_widths() -> None:
    w = {n: POLICY_LOSSES[n].width for n in NEW}
    assert w["gpg"] is None and POLICY_LOSSES["kl_cov"].width is None
    assert (w["sapo"].options, w["sapo"].power) == (("tau_neg", "tau_pos"), -1.0)
    assert (w["dro"].options, w["dro"].power) == (("beta", "beta"), -1.0)
    assert w["dppo_kl"].power == 2.0 and w["dppo_tv"].power == 1.0
    assert w["gmpo"].unit == "log-ratio bound" and not any(x.native for x in w.values() if x)
    assert POLICY_LOSSES["ppo"].width.native and POLICY_LOSSES["ppo"].width.low_below_one
    assert not POLICY_LOSSES["gspo"].width.native  # GSPO: the pacer scales its own bounds


def test_hand_values() -> None:
    """One token each, by hand."""
    one = torch.ones(1, 1, dtype=torch.float64)

    def run(name, lp, old, a, **kw):
        x = torch.tensor([[lp]], dtype=torch.float64, requires_grad=True)
        spec = get_policy_loss(name)
        opts = {k: kw.pop(k) for k in list(kw) if k in ("ratio_cap", "tau_pos", "tau_neg")}
        out = spec(LossInputs(x, torch.tensor([[old]], dtype=torch.float64),
                              torch.tensor([a], dtype=torch.float64), one, **kw),
                   spec.make_config(opts))  # fmt: skip
        out.loss.backward()
        return float(out.loss.detach()), float(x.grad)

    # CISPO, r = e^0.5 = 1.65 > 1.2: weight 1.2, L = -1.2 * 2 * log pi, gradient -2.4
    assert run("cispo", -1.0, -1.5, 2.0) == pytest.approx((2.4, -2.4))
    # SAPO at r = 1: value -(4 / tau) / 2 A, gradient -A (the policy gradient)
    assert run("sapo", -0.7, -0.7, 3.0) == pytest.approx((-6.0, -3.0))
    # GMPO, one token, A = -1, log r = -0.5 < -0.2: clipped at e^-0.2, no gradient
    assert run("gmpo", -1.5, -1.0, -1.0) == pytest.approx((math.exp(-0.2), 0.0))
    # DPPO-TV, A > 0: p 0.5 -> 0.8 moved 0.3 > 0.2: invalid, zero loss and gradient
    assert run("dppo_tv", math.log(0.8), math.log(0.5), 1.0) == (0.0, 0.0)
    # ... 0.5 -> 0.6: valid, weight min(1.2, 3) = 1.2
    v, g = run("dppo_tv", math.log(0.6), math.log(0.5), 1.0)
    assert (v, g) == pytest.approx((-1.2 * math.log(0.6), -1.2))
    # DRO: -(A lp - beta/2 lr^2) with lr = 0.5, beta 1: gradient -(A - lr)
    assert run("dro", -1.0, -1.5, 2.0) == pytest.approx((-(2 * -1.0 - 0.125), -1.5))
    assert run("gpg", -1.0, -3.0, 2.0) == pytest.approx((2.0, -2.0))


def test_sapo_half_weight_flags() -> None:
    """SAPO's flags mark the tokens past the gate's half-weight point."""
    tau = 4.0
    edge = SAPO_HALF_WEIGHT / tau  # |r - 1| where the gradient weight is 1/2 (0.44)
    r = torch.tensor([[1 + 1.01 * edge, 1 + 0.99 * edge, 1 - 0.99 * edge, 1 - 1.01 * edge]],
                     dtype=torch.float64)  # fmt: skip
    lp = torch.log(r) - 1.0
    x = lp.clone().requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    out = get_policy_loss("sapo")(LossInputs(x, lp - torch.log(r), adv, torch.ones(1, 4),
                                             eps_low=tau, eps_high=tau, agg="token-mean"))  # fmt: skip
    out.loss.backward()
    assert out.flags["clip_frac_high"].tolist() == [[True, False, False, False]]
    assert out.flags["clip_frac_low"].tolist() == [[False, False, False, True]]
    assert out.flags["gate_damped_frac"].tolist() == [[True, False, False, True]]
    weight = -x.grad * 4 / (adv * r)  # the gradient weight sech^2(tau (r - 1) / 2)
    assert float(weight[0, 0]) < 0.5 < float(weight[0, 1])
    assert float(weight[0, 3]) < 0.5 < float(weight[0, 2])


def test_dro_is_not_advantage_weighted_and_gpg_has_no_width() -> None:
    lp, old, adv, mask = _inputs(1)
    x = lp.clone().requires_grad_(True)
    out = get_policy_loss("dro")(LossInputs(x, old, torch.zeros_like(adv), mask))
    out.loss.backward()
    assert float(x.grad.abs().sum()) > 0  # the penalty pulls towards pi_old with A = 0
    assert not POLICY_LOSSES["dro"].advantage_weighted
    # GPG ignores widths
    gpg = get_policy_loss("gpg")
    a = gpg(LossInputs(lp, old, adv, mask, eps_low=0.1, eps_high=0.9))
    b = gpg(LossInputs(lp, old, adv, mask))
    assert torch.equal(a.loss, b.loss)


def test_option_errors_name_the_option() -> None:
    with pytest.raises(ValueError, match="'sapo'.*tau_pos"):
        get_policy_loss("sapo").make_config({"tau_pos": 0.0})
    with pytest.raises(ValueError, match="'dro'.*beta"):
        get_policy_loss("dro").make_config({"beta": -1.0})
    with pytest.raises(ValueError, match="'dppo_kl'.*ratio_cap"):
        get_policy_loss("dppo_kl").make_config({"ratio_cap": 0})
    with pytest.raises(ValueError, match=r"'cispo': unknown option\(s\) \['dual_clip'\]"):
        get_policy_loss("cispo").make_config({"dual_clip": 3.0})
