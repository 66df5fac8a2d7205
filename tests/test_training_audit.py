"""PAPO's polarity audit inside training (``entropace.diagnostics.training_audit``): realised
entropy changes and the probe against brute-force float64 recomputations on a tabular softmax
policy, the forward convention against the statistics pass, and the trainer wiring (keys on
audited steps, an audited run trains exactly as an unaudited one, config errors)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from entropace.algos import token_stats
from entropace.diagnostics import (
    TrainingAudit,
    probe_audit,
    realised_audit,
    realised_changes,
    sample_states,
    state_logits,
)
from entropace.envs.toy import register_letter_envs
from entropace.models.compat import keeps_logits_by_mask
from entropace.train import trainer as trainer_module
from entropace.train.checkpoint import load_checkpoint
from entropace.train.config import ConfigError, load_config
from entropace.train.metrics_log import read_metrics

register_letter_envs("letter", "letter2")


class Bigram(torch.nn.Module):
    """Tabular softmax policy: the state is the previous token, its logits are ``table[prev]``."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(table.clone())

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        return SimpleNamespace(logits=self.table[input_ids])


def entropy_np(z: np.ndarray, temperature: float) -> float:
    x = z / temperature
    x = x - x.max()
    p = np.exp(x) / np.exp(x).sum()
    return float(-(p * np.log(p)).sum())


def softmax_np(z: np.ndarray, temperature: float) -> np.ndarray:
    x = z / temperature
    e = np.exp(x - x.max())
    return e / e.sum()


def sensitivity_np(z: np.ndarray, y: int, temperature: float) -> float:
    p = softmax_np(z, temperature)
    h = -(p * np.log(p)).sum()
    return float((p**2 * (h + np.log(p))).sum() - p[y] * (h + np.log(p[y])))


T = 0.8


def one_token_batch(seed: int = 0, vocab: int = 7):
    """Rows ``[prev, y]`` with distinct ``prev``: every audited state is visited once."""
    gen = torch.Generator().manual_seed(seed)
    table = torch.randn(vocab, vocab, generator=gen, dtype=torch.float64)
    prev = torch.arange(6)
    y = torch.randint(0, vocab, (6,), generator=gen)
    ids = torch.stack([prev, y], dim=1)
    mask = torch.zeros(6, 2)
    mask[:, 1] = 1
    adv_seq = torch.tensor([1.0, -0.5, 2.0, -1.5, 0.7, -0.3], dtype=torch.float64)
    adv = adv_seq[:, None] * mask
    sens = torch.zeros(6, 2, dtype=torch.float64)
    sens[:, 1] = token_stats(table[prev], y, temperature=T).sensitivity
    return table, ids, mask, adv, sens


def pg_step(model: Bigram, ids, adv, eta: float) -> None:
    """One SGD step on ``-sum_t A_t log p(y_t)`` in logit space (PAPO's first-order setting)."""
    lp = token_stats(model.table[ids[:, 0]], ids[:, 1], temperature=T).logprob
    (-(adv[:, 1] * lp).sum()).backward()
    with torch.no_grad():
        model.table -= eta * model.table.grad
    model.table.grad = None


def test_realised_dh_equals_a_direct_recomputation_and_agrees_in_sign() -> None:
    table, ids, mask, adv, sens = one_token_batch()
    model = Bigram(table)
    audit = TrainingAudit.start(
        model, ids, torch.ones_like(ids), mask, adv, sens, temperature=T, max_states=100,
        generator=torch.Generator().manual_seed(1),
    )  # fmt: skip
    eta = 1e-3
    pg_step(model, ids, adv, eta)
    out = audit.finish(model)

    w0, w1 = table.numpy(), model.table.detach().numpy()
    dh = np.array([entropy_np(w1[s], T) - entropy_np(w0[s], T) for s in ids[:, 0].tolist()])
    pol = (adv[:, 1] * sens[:, 1]).numpy()
    assert out["audit/states"] == 6
    assert out["audit/dH_mean"] == pytest.approx(dh.mean(), rel=1e-9)
    assert out["audit/dH_pos"] == pytest.approx(dh[pol > 0].mean(), rel=1e-9)
    assert out["audit/dH_neg"] == pytest.approx(dh[pol < 0].mean(), rel=1e-9)
    assert out["audit/tokens_pos"] + out["audit/tokens_neg"] == 6
    assert out["audit/sign_agreement"] == 1.0
    assert out["audit/spearman"] == pytest.approx(1.0)
    assert out["audit/step_norm"] == pytest.approx(np.linalg.norm(w1 - w0), rel=1e-12)

    # per state: the first-order term of this step IS the polarity's prediction eta P / T^2
    ch = realised_changes(table[ids[:, 0]], model.table.detach()[ids[:, 0]], ids[:, 1], T)
    np.testing.assert_allclose(ch["dh"].numpy(), dh, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(ch["dh_lin"].numpy(), eta * pol / T**2, rtol=1e-9)
    assert out["audit/first_order_error"] == pytest.approx(
        np.abs(dh - eta * pol / T**2).mean(), rel=1e-6
    )


def test_first_order_error_shrinks_quadratically_with_the_step() -> None:
    table, ids, mask, adv, sens = one_token_batch(seed=3)
    errors, steps = [], []
    for eta in (0.04, 0.02, 0.01):
        model = Bigram(table)
        pg_step(model, ids, adv, eta)
        out = realised_audit(
            table[ids[:, 0]], model.table.detach()[ids[:, 0]], ids[:, 1],
            adv[:, 1] * sens[:, 1], temperature=T,
        )  # fmt: skip
        errors.append(out["audit/first_order_error"])
        steps.append(out["audit/logit_step_norm"])
    assert steps[0] / steps[1] == pytest.approx(2.0, rel=1e-9)
    assert steps[1] / steps[2] == pytest.approx(2.0, rel=1e-9)
    for big, small in zip(errors, errors[1:]):
        assert 3.6 < big / small < 4.4, errors


def test_probe_matches_a_brute_force_recomputation() -> None:
    vocab = 5
    gen = torch.Generator().manual_seed(7)
    table = torch.randn(vocab, vocab, generator=gen, dtype=torch.float64)
    # three masked columns per row: states are shared between rows and positions
    ids = torch.tensor([[0, 1, 2, 3], [0, 2, 2, 4], [1, 3, 0, 1], [4, 4, 1, 0]])
    mask = torch.tensor([[0, 1, 1, 1]] * 4, dtype=torch.float32)
    adv_seq = torch.tensor([1.0, -1.0, 0.5, -2.0], dtype=torch.float64)
    adv = adv_seq[:, None] * mask
    sens = torch.zeros(4, 4, dtype=torch.float64)
    sens[:, 1:] = token_stats(table[ids[:, :-1]], ids[:, 1:], temperature=T).sensitivity
    model = Bigram(table)
    delta = 0.05
    audit = TrainingAudit.start(
        model, ids, torch.ones_like(ids), mask, adv, sens, temperature=T, max_states=100,
        generator=torch.Generator().manual_seed(0), realised=False, probe_step=delta,
    )  # fmt: skip
    out = audit.finish(model)
    assert torch.equal(model.table.detach(), table)  # the policy itself is never stepped
    assert "audit/step_norm" not in out and "audit/sign_agreement" not in out

    w = table.numpy()
    states = [(r, c) for r in range(4) for c in range(1, 4)]
    s_of = [int(ids[r, c - 1]) for r, c in states]
    y_of = [int(ids[r, c]) for r, c in states]
    a_of = [float(adv_seq[r]) for r, _ in states]
    pol = np.array([a * sensitivity_np(w[s], y, T) for s, y, a in zip(s_of, y_of, a_of)])
    h0 = np.array([entropy_np(w[s], T) for s in s_of])
    for branch, sel in (("pos", pol > 0), ("neg", pol < 0)):
        idx = np.flatnonzero(sel)
        g = np.zeros_like(w)
        for i in idx:  # d/dW of -(1/n_b) A log p(y | s) = -(1/n_b) A (e_y - p) / T
            e_y = np.eye(vocab)[y_of[i]]
            g[s_of[i]] -= a_of[i] * (e_y - softmax_np(w[s_of[i]], T)) / T / len(idx)
        w_b = w - delta * g / np.linalg.norm(g)
        h1 = np.array([entropy_np(w_b[s], T) for s in s_of])
        assert out[f"audit/probe_dH_{branch}"] == pytest.approx((h1 - h0).mean(), rel=1e-9)
        assert out[f"audit/probe_grad_norm_{branch}"] == pytest.approx(np.linalg.norm(g), rel=1e-9)
    # first order, the positive branch expands and the negative one contracts (here)
    assert out["audit/probe_dH_pos"] > 0 > out["audit/probe_dH_neg"]
    with pytest.raises(ValueError, match="probe_step"):
        probe_audit(model, ids, torch.ones_like(ids), torch.zeros(1, dtype=torch.long),
                    torch.ones(1, dtype=torch.long), adv[:1, 1], adv[:1, 1], table[:1],
                    probe_step=0.0)  # fmt: skip


def test_a_batch_without_response_tokens_gives_nan_not_an_error() -> None:
    table, ids, mask, adv, sens = one_token_batch()
    model = Bigram(table)
    audit = TrainingAudit.start(
        model, ids, torch.ones_like(ids), torch.zeros_like(mask), adv, sens, temperature=T,
        max_states=8, generator=torch.Generator(), probe_step=0.1,
    )  # fmt: skip
    out = audit.finish(model)
    assert out["audit/states"] == 0 and out["audit/tokens_pos"] == 0
    for key in ("audit/sign_agreement", "audit/dH_mean", "audit/first_order_error",
                "audit/probe_dH_pos", "audit/probe_dH_neg"):  # fmt: skip
        assert math.isnan(out[key]), key


def test_sample_states_is_a_seeded_subset_of_the_mask() -> None:
    mask = torch.zeros(5, 9)
    mask[:, 3:] = 1
    mask[4, 7:] = 0
    state = torch.get_rng_state()
    rows, cols = sample_states(mask, 10, torch.Generator().manual_seed(4))
    again = sample_states(mask, 10, torch.Generator().manual_seed(4))
    assert torch.equal(torch.get_rng_state(), state)  # no global randomness consumed
    assert torch.equal(rows, again[0]) and torch.equal(cols, again[1])
    assert rows.numel() == 10 and bool(mask[rows, cols].all())
    keys = (rows * 9 + cols).tolist()
    assert keys == sorted(set(keys))  # distinct, row-major
    taken = torch.bincount(rows, minlength=5)
    drawn = taken > 0
    partial = drawn & (taken < mask.sum(dim=1).long())
    assert int(partial.sum()) <= 1  # whole trajectories, but for the one that crosses the size
    assert int(drawn.sum()) == 2
    all_rows, _ = sample_states(mask, 1000)
    assert all_rows.numel() == int(mask.sum())
    with pytest.raises(ValueError, match="max_states"):
        sample_states(mask, 0)


def test_state_logits_follow_the_statistics_pass() -> None:
    from entropace.models import build_tiny_model
    from entropace.rollout import sequence_token_stats

    model, _ = build_tiny_model(seed=0)
    model.eval()
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(4, 200, (3, 12), generator=gen)
    attn = torch.ones_like(ids)
    attn[1, 8:] = 0  # right padding
    attn[2, 6:] = 0
    ids = ids * attn
    mask = torch.zeros(3, 12)
    mask[0, 5:] = 1
    mask[1, 4:8] = 1
    mask[2, 3:6] = 1
    ref = sequence_token_stats(model, ids, attn, temperature=0.9).entropy
    rows, cols = sample_states(mask, 100)
    head_rows = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: head_rows.append(i[0].shape[0]))
    for mb in (None, 1, 2):
        head_rows.clear()
        logits = state_logits(model, ids, attn, rows, cols, micro_batch_size=mb)
        if keeps_logits_by_mask(model):  # the LM head ran on the states' positions only
            assert sum(head_rows) == rows.numel()
        else:  # an older transformers: the LM head on whole rows ([rows, L, d] inputs)
            assert sum(head_rows) == rows.unique().numel()
        h = token_stats(logits, ids[rows, cols], temperature=0.9).entropy
        torch.testing.assert_close(h, ref[rows, cols], rtol=1e-5, atol=1e-6)
    hook.remove()

    class Plain(torch.nn.Module):  # no logits_to_keep: the full-logits path
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, position_ids, use_cache):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              position_ids=position_ids, use_cache=use_cache)  # fmt: skip

    shuffled = torch.randperm(rows.numel(), generator=gen)  # any order of the states
    full = state_logits(Plain(model), ids, attn, rows[shuffled], cols[shuffled], micro_batch_size=2)
    torch.testing.assert_close(full, logits[shuffled], rtol=1e-5, atol=1e-5)


def test_first_order_error_is_quadratic_on_a_network_too() -> None:
    # the tiny LM (float64), moved along one fixed parameter direction by eps, 2 eps, 4 eps
    from entropace.models import build_tiny_model

    model, _ = build_tiny_model(seed=0)
    model = model.double().eval()
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(4, 200, (2, 10), generator=gen)
    attn = torch.ones_like(ids)
    mask = torch.zeros(2, 10)
    mask[:, 4:] = 1
    rows, cols = sample_states(mask, 100)
    base = [p.detach().clone() for p in model.parameters()]
    direction = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in base]
    scale = 1.0 / math.sqrt(sum(float((d**2).sum()) for d in direction))
    before = state_logits(model, ids, attn, rows, cols)
    errors, steps = [], []
    for eps in (4e-2, 2e-2, 1e-2):
        with torch.no_grad():
            for p, p0, d in zip(model.parameters(), base, direction):
                p.copy_(p0 + eps * scale * d)
        after = state_logits(model, ids, attn, rows, cols)
        out = realised_audit(before, after, ids[rows, cols], torch.ones(rows.numel()))
        errors.append(out["audit/first_order_error"])
        steps.append(out["audit/logit_step_norm"])
    assert steps[0] / steps[1] == pytest.approx(2.0, rel=0.05)
    for big, small in zip(errors, errors[1:]):
        assert 3.5 < big / small < 4.5, errors


# ---------------------------------------------------------------------------------------------
# the trainer
# ---------------------------------------------------------------------------------------------

OVERRIDES = [
    "model=tiny", "tasks=letter,letter2", "steps=3", "algo=eppo+papo", "P=1", "G=3",
    "rollout.max_new_tokens_per_turn=6", "rollout.max_episode_tokens=96", "optim.lr=3e-3",
    "ppo.epochs=1", "ppo.num_minibatches=2", "ppo.micro_batch_size=2",
    "log.checkpoint_every=0", "log.progress=false", "log.tensorboard=false",
]  # fmt: skip
AUDIT_KEYS = [
    "audit/states", "audit/sign_agreement", "audit/spearman", "audit/dH_pos", "audit/dH_neg",
    "audit/dH_mean", "audit/first_order_error", "audit/first_order_rel_error",
    "audit/logit_step_norm", "audit/step_norm", "audit/probe_dH_pos", "audit/probe_dH_neg",
]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("audit")
    off = trainer_module.train(load_config(None, OVERRIDES), root / "off")
    on = trainer_module.train(
        load_config(None, [*OVERRIDES, "audit.every=1", "audit.mode=both", "audit.max_states=40"]),
        root / "on",
    )
    return off.run_dir, on.run_dir


def test_audited_steps_log_finite_audit_keys(runs) -> None:
    rows = read_metrics(runs[1])
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        for key in [*AUDIT_KEYS, "time/audit"]:
            assert key in row, key
        assert 0 < row["audit/states"] <= 40
        assert row["audit/step_norm"] > 0
    first = rows[0]  # step 1 has advantages on both branches (seed 0)
    assert first["audit/tokens_pos"] > 0 and first["audit/tokens_neg"] > 0
    for key in AUDIT_KEYS:
        assert math.isfinite(first[key]), key
    assert 0 <= first["audit/sign_agreement"] <= 1 and -1 <= first["audit/spearman"] <= 1
    assert not any(k.startswith("audit/") for r in read_metrics(runs[0]) for k in r)


def test_an_audited_run_trains_exactly_as_an_unaudited_one(runs) -> None:
    def training(rows):
        return [{k: v for k, v in r.items() if not k.startswith(("audit/", "time/", "tokens_per_s", "memory/"))}
                for r in rows]  # fmt: skip

    assert training(read_metrics(runs[0])) == training(read_metrics(runs[1]))
    cfg = load_config(None, OVERRIDES)
    a, _, _ = trainer_module.build_model(cfg.model)
    b, _, _ = trainer_module.build_model(cfg.model)
    load_checkpoint(runs[0] / "checkpoints" / "step_00000003", model=a, restore_rng=False)
    load_checkpoint(runs[1] / "checkpoints" / "step_00000003", model=b, restore_rng=False)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


def test_audit_leaves_bapo_with_a_kl_reference_unchanged(tmp_path) -> None:
    # BAPO searches its bounds from the current policy each optimiser step; the KL reference
    # is a frozen copy: neither may see the audit
    extra = ["algo=bapo", "algorithm.kl_beta=0.05", "steps=2", "ppo.num_minibatches=2"]
    a = trainer_module.train(load_config(None, [*OVERRIDES, *extra]), tmp_path / "a")
    b = trainer_module.train(
        load_config(None, [*OVERRIDES, *extra, "audit.every=1", "audit.mode=both"]), tmp_path / "b"
    )

    def training(run_dir):
        rows = read_metrics(run_dir)
        return [{k: v for k, v in r.items() if not k.startswith(("audit/", "time/", "tokens_", "memory/"))}
                for r in rows]  # fmt: skip

    assert training(a.run_dir) == training(b.run_dir)
    assert "bapo/c_high" in read_metrics(b.run_dir)[0] and "kl" in read_metrics(b.run_dir)[0]


def test_start_audit_runs_on_every_nth_step_only() -> None:
    cfg = load_config(None, [*OVERRIDES, "audit.every=3"])
    assert trainer_module.start_audit(cfg, None, None, 1) is None
    assert trainer_module.start_audit(cfg, None, None, 2) is None
    off = load_config(None, OVERRIDES)
    assert trainer_module.start_audit(off, None, None, 3) is None


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("audit.every=-1", "audit.every must be an integer in \\[0, 1000000\\], got -1"),
        ("audit.every=1.5", "audit.every: expected an integer"),
        ("audit.max_states=0", "audit.max_states must be an integer in \\[1, 16777216\\]"),
        ("audit.mode=realized", "allowed values: \\['realised', 'probe', 'both'\\]"),
        ("audit.probe_step=0", "audit.probe_step must be a finite number > 0"),
        ("audit.evry=2", "did you mean 'every'"),
    ],
)
def test_config_errors_name_the_audit_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, [*OVERRIDES, override])


def test_report_draws_the_audit_figure_and_summary(runs, tmp_path) -> None:
    import json

    from entropace.report import load_run, write_report
    from entropace.report.plots import audit_figure
    from entropace.report.summary import audit_summary

    off, on = runs
    assert not audit_figure().needs(load_run(off))  # no audit keys: no figure
    summary = write_report([on, off], tmp_path / "report")
    machine = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert "audit.png" in machine["figures"] and (tmp_path / "report" / "audit.png").exists()
    assert "## Polarity audit" in summary.read_text()
    assert machine["runs"]["off"]["audit"] is None
    got = machine["runs"]["on"]["audit"]
    rows = read_metrics(on)
    assert got["audited"] == 3
    finite = [r["audit/sign_agreement"] for r in rows if math.isfinite(r["audit/sign_agreement"])]
    assert got["audit/sign_agreement"] == pytest.approx(np.mean(finite))
    assert got["audit/probe_dH_neg"] == pytest.approx(
        np.mean([r["audit/probe_dH_neg"] for r in rows if math.isfinite(r["audit/probe_dH_neg"])])
    )

    # the error exponent is the log-log slope of first_order_error against the logit step
    fake = tmp_path / "fake"
    fake.mkdir()
    lines = [
        {"step": s, "audit/states": 8, "audit/logit_step_norm": x,
         "audit/first_order_error": 3 * x**2, "audit/first_order_rel_error": 0.1 * s}
        for s, x in ((10, 0.1), (20, 0.4), (30, 0.2), (40, 1.5))
    ]  # fmt: skip
    lines.insert(1, {"step": 11, "loss": 1.0})  # a step without an audit
    (fake / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    fa = audit_summary(load_run(fake))
    assert fa["audited"] == 4 and fa["error_exponent"] == pytest.approx(2.0)
    assert fa["first_order_rel_error"] == pytest.approx(2.5)  # median of 1, 2, 3, 4
    assert fa["audit/sign_agreement"] is None
