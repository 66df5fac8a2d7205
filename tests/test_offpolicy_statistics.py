"""Which policy each statistic is under (ALGORITHMS.md section 9), where the choice matters.

On an off-policy batch (recorded statistics of another policy than the learner at update
start): EPPO's per-task entropy ``h_k``, PAPO's sensitivities (and so its polarity masses and
reweighting) and the polarity audit's ``P`` are the proximal policy's (the learner at update
start), not the recorded behaviour ones; on an on-policy batch the recorded ones are used.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from tests.test_training_audit import Bigram, T, entropy_np, one_token_batch, pg_step
from tests.test_update import as_minibatch, make_batch, make_cfg

from entropace.algos.token_stats import token_stats
from entropace.diagnostics.training_audit import TrainingAudit
from entropace.train.learner import proximal_statistics
from entropace.train.trainer import build_learner
from entropace.train.update import token_advantages, update_step


def polarity_masses(polarity, adv, mask) -> tuple[float, float]:
    """Shares of ``sum |A|`` over masked tokens on ``P > 0`` / ``P < 0`` (a loop-free
    restatement of TaskStep.reweight's masses, ALGORITHMS.md section 4)."""
    w = adv.abs() * mask
    total = float(w.sum())
    if total == 0:
        return 0.0, 0.0
    return float((w * (polarity > 0)).sum()) / total, float((w * (polarity < 0)).sum()) / total


@pytest.fixture(scope="module")
def tiny():
    from entropace.models.tiny import build_tiny_model

    model, _ = build_tiny_model(seed=0)
    return model


def test_audit_polarity_is_under_the_policy_the_update_starts_from() -> None:
    table, ids, mask, adv, _sens = one_token_batch(seed=2)
    gen = torch.Generator().manual_seed(9)
    behaviour = table + 1.5 * torch.randn(table.shape, generator=gen, dtype=torch.float64)
    stale = torch.zeros_like(_sens)
    stale[:, 1] = token_stats(behaviour[ids[:, 0]], ids[:, 1], temperature=T).sensitivity
    prox = token_stats(table[ids[:, 0]], ids[:, 1], temperature=T).sensitivity
    model = Bigram(table)
    audit = TrainingAudit.start(
        model, ids, torch.ones_like(ids), mask, adv, None, temperature=T, max_states=100,
        generator=torch.Generator().manual_seed(1),
    )  # fmt: skip
    order = audit.rows  # states in the audit's sample order (one per row here)
    torch.testing.assert_close(audit.polarity, (adv[:, 1] * prox)[order], rtol=1e-12, atol=0)
    # the behaviour sensitivities would predict other signs: the choice is visible
    assert ((adv[:, 1] * stale[:, 1]).sign() != (adv[:, 1] * prox).sign()).any()
    pg_step(model, ids, adv, 1e-3)
    out = audit.finish(model)
    assert out["audit/sign_agreement"] == 1.0  # the proximal P predicts the realised dH
    w0, w1 = table.numpy(), model.table.detach().numpy()
    dh = np.array([entropy_np(w1[s], T) - entropy_np(w0[s], T) for s in ids[:, 0].tolist()])
    pol = (adv[:, 1] * prox).numpy()
    assert out["audit/dH_pos"] == pytest.approx(dh[pol > 0].mean(), rel=1e-9)


@pytest.mark.parametrize("off_policy", [False, True])
def test_eppo_and_papo_read_the_proximal_statistics_of_an_off_policy_batch(
    tiny, off_policy
) -> None:
    """Recorded entropy and sensitivities overwritten with garbage: an on-policy batch's
    controllers read them as recorded; an off-policy batch's read the learner's own."""
    batch = make_batch(tiny)
    batch.entropy = 5.0 * batch.loss_mask  # not what the model computes
    batch.sensitivity = -batch.loss_mask  # every token "contracting"
    batch.off_policy = off_policy
    cfg = make_cfg("algo=eppo+papo")
    learner = build_learner(cfg, copy.deepcopy(tiny))
    mb = as_minibatch(batch, torch.zeros_like(batch.old_logprobs))
    mb.group_ids = batch.group_ids
    prox = proximal_statistics(learner, mb)
    m = update_step(learner, batch, generator=torch.Generator().manual_seed(0))
    mask = batch.loss_mask
    entropy = prox.entropy if off_policy else batch.entropy
    sens = prox.sensitivity if off_policy else batch.sensitivity
    for k, name in enumerate(batch.task_names):
        rows = batch.task_ids == k
        expect = float((entropy[rows] * mask[rows]).sum() / mask[rows].sum())
        assert m[f"task/{name}/entropy"] == pytest.approx(expect, rel=1e-5)
    adv, _ = token_advantages(batch, cfg)
    pos, neg = polarity_masses(adv * sens, adv, mask)
    assert m["polarity/pos_mass"] == pytest.approx(pos, rel=1e-5)
    assert m["polarity/neg_mass"] == pytest.approx(neg, abs=1e-6)
    garbage = polarity_masses(adv * batch.sensitivity, adv, mask)
    assert abs(polarity_masses(adv * prox.sensitivity, adv, mask)[0] - garbage[0]) > 0.01
    assert ("rollout/behaviour_kl" in m) == off_policy
