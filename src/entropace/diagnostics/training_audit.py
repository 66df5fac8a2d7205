"""PAPO's polarity audit inside training: predicted polarity against the realised entropy change.

ALGORITHMS.md section 4 ("Polarity audit"), the check the PAPO review asks for. On an audited
training step, a sample of the step's states (masked response positions of its rollout batch,
drawn by whole trajectories: :func:`sample_states`) is taken before the update and looked at
again after it.

Notation, per sampled state ``s`` (batch row ``b``, token column ``t``: the prefix
``input_ids[b, :t]``, the sampled token ``y = input_ids[b, t]``), at the sampling temperature
``T``, tempered logits ``x = z / T``, ``p = softmax(x)``:

- ``P_s = A_s S_s``: the predicted polarity, ``A`` the token's advantage (before PAPO's
  reweighting, which keeps every sign) and ``S = t2 - t1`` the sensitivity under the policy
  the update starts from (the proximal policy, ALGORITHMS.md section 9): the one recorded by
  the step's statistics pass for an on-policy batch (the same weights), else recomputed here
  from the audit's own "before" logits (:func:`entropace.algos.entropy_polarity`).
- ``dH_s = H(x_after) - H(x_before)``: the realised entropy change of the state, both entropies
  recomputed here (float64, :func:`entropace.algos.token_stats`) from the logits of the policy
  before and after the step's whole update (every optimiser step of it).
- ``dH_lin_s = sum_v dH/dx_v (x_before) Dx_v = -sum_v p_v (log p_v + H) Dx_v`` with
  ``Dx = x_after - x_before``: the first-order (Taylor) prediction of ``dH_s`` from the realised
  logit step. For PAPO's setting, one gradient step of size ``eta`` on ``A log p_y`` in raw logit
  space at one state, ``Dx = eta A (e_y - p) / T^2`` and ``dH_lin = eta A S / T^2 = eta P / T^2``:
  the polarity's own prediction (``algos/token_stats.py``). In a network the step at one state
  also carries every other token's gradient (shared parameters), which ``dH_lin`` includes and
  ``P`` does not: ``first_order_error`` measures the Taylor remainder, the sign agreement and the
  rank correlation measure how much of the step ``P`` explains.

Realised metrics (:func:`realised_audit`; keys under ``audit/``):

- ``sign_agreement`` / ``spearman``: :func:`entropace.diagnostics.polarity_audit` of ``P`` against
  ``dH`` over the sampled states with ``P != 0`` (a zero-advantage token predicts nothing);
  ``sign_agreement_pos`` / ``_neg`` the same within each branch (the share of ``P > 0`` tokens
  whose entropy rose, of ``P < 0`` tokens whose entropy fell).
- ``dH_pos`` / ``dH_neg``: mean ``dH`` over the ``P > 0`` / ``P < 0`` states (``tokens_pos`` /
  ``tokens_neg`` of them); ``dH_mean``: mean ``dH`` over every sampled state; ``states``: count.
- ``first_order_error = mean_s |dH_s - dH_lin_s|`` and ``first_order_rel_error =
  sum_s |dH_s - dH_lin_s| / sum_s |dH_s|``: the remainder is ``O(|Dx|^2)``, so against
- ``logit_step_norm = sqrt(mean_s |Dx_s|_2^2)`` (RMS over the sampled states of the tempered-logit
  step) it shrinks quadratically; ``step_norm = |theta_after - theta_before|_2`` is the update's
  parameter step (trainable parameters, float64 sum of squares).

Probe metrics (:func:`probe_audit`, optional, for small models): from a copy of the policy before
the update, for each branch ``b`` in ``{pos: P > 0, neg: P < 0}`` separately, one plain gradient
step on the branch's policy-gradient loss over the sampled states,
``L_b = -(1 / n_b) sum_{s in b} A_s log p_theta(y_s | s)``,
``theta_b = theta - delta g_b / |g_b|_2`` with ``g_b = grad L_b`` (a step of parameter norm
``delta = probe_step``, so that probes are comparable across steps), then
``probe_dH_<b> = mean over ALL sampled states of H_theta_b(s) - H_theta(s)``. At the sampling
policy the ratio is 1, so ``grad L_b`` is also the gradient of the clipped surrogate restricted to
the branch (token-mean). ALGORITHMS.md's pilot: the positive branch raises entropy, the negative
branch lowers it, linearly in the step size. ``probe_grad_norm_<b>`` is ``|g_b|_2``.

A statistic with nothing to average over is NaN (written as ``null`` in ``metrics.jsonl``).

Nothing here consumes global random state: the states are drawn with the caller's generator, the
forward passes run in eval mode without dropout, and the probe works on a copy of the model, so an
audited run trains exactly as an unaudited one (``tests/test_training_audit.py``).
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from entropace.algos.token_stats import token_stats
from entropace.diagnostics.polarity_audit import polarity_audit
from entropace.models.compat import keeps_logits_by_mask

__all__ = [
    "TrainingAudit",
    "first_order_entropy_change",
    "parameter_step_norm",
    "probe_audit",
    "realised_audit",
    "realised_changes",
    "sample_states",
    "state_logits",
]


# ---------------------------------------------------------------------------------------------
# the sample and its logits
# ---------------------------------------------------------------------------------------------


def sample_states(
    loss_mask: Tensor, max_states: int, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Up to ``max_states`` masked positions, sampled by whole trajectories.

    Rows are visited in a random order (``generator``) and each contributes all its masked
    positions until ``max_states`` is reached; the positions of the row that crosses it are
    subsampled uniformly without replacement. A cluster sample of trajectories (each state is in
    it with the same probability when the rows are equally long): the audit's forward passes
    run only on the rows drawn, so its cost grows with the rows, not with the batch.

    Args:
        loss_mask: ``[B, L]``, nonzero on the response tokens (the candidate states).
        max_states: sample size (all positions when there are fewer).
        generator: a CPU generator (the global one is never used; None: seed 0).

    Returns:
        ``(rows, cols)``, each ``[n]`` long on CPU, in row-major order.
    """
    if isinstance(max_states, bool) or not isinstance(max_states, int) or max_states < 1:
        raise ValueError(f"sample_states: max_states must be an int >= 1, got {max_states!r}")
    mask = (loss_mask != 0).cpu()
    positions = mask.nonzero()  # [N, 2], row-major
    if positions.shape[0] > max_states:
        if generator is None:
            generator = torch.Generator().manual_seed(0)
        order = torch.randperm(mask.shape[0], generator=generator)
        cumulative = mask.sum(dim=1)[order].cumsum(0)
        full = int((cumulative <= max_states).sum())  # rows taken whole
        picked = positions[torch.isin(positions[:, 0], order[:full])]
        rest = max_states - picked.shape[0]
        if rest > 0:
            partial = positions[positions[:, 0] == order[full]]
            pick = torch.randperm(partial.shape[0], generator=generator)[:rest]
            picked = torch.cat([picked, partial[pick]])
        positions = picked[torch.argsort(picked[:, 0] * mask.shape[1] + picked[:, 1])]
    return positions[:, 0].contiguous(), positions[:, 1].contiguous()


def _forward(model: Any, ids: Tensor, mask: Tensor, **extra: Any) -> Tensor:
    """The model's logits, positions ``cumsum(mask) - 1`` as in the statistics pass, no cache."""
    return model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=(mask.cumsum(dim=-1) - 1).clamp(min=0),
        use_cache=False,
        **extra,
    ).logits


def state_logits(
    model: Any,
    input_ids: Tensor,
    attention_mask: Tensor,
    rows: Tensor,
    cols: Tensor,
    *,
    micro_batch_size: int | None = None,
    grad: bool = False,
) -> Tensor:
    """Raw next-token logits ``[n, V]`` of ``model`` at the states ``(rows[i], cols[i])``.

    State ``i`` is the prefix ``input_ids[rows[i], :cols[i]]`` (``cols >= 1``): its logits are the
    model's output at position ``cols[i] - 1``, computed as the statistics pass computes them
    (positions ``cumsum(attention_mask) - 1``, no cache). Only the rows holding a state are run,
    ``micro_batch_size`` of them per forward pass (None: all at once), and for models whose
    ``forward`` takes a boolean ``[rows, L]`` ``logits_to_keep`` mask (transformers' causal
    LMs after 5.10: :func:`entropace.models.compat.keeps_logits_by_mask`) the LM head runs on
    the states' positions only, never on the ``[rows, L, V]`` logits. Runs under ``torch.no_grad`` unless ``grad``.
    """
    if rows.shape != cols.shape or rows.dim() != 1:
        raise ValueError("state_logits: rows and cols must be 1-D and of the same length")
    if rows.numel() and int(cols.min()) < 1:
        raise ValueError("state_logits: a state needs a prefix (cols >= 1)")
    device = input_ids.device
    unique = torch.unique(rows, sorted=True)
    step = micro_batch_size or max(int(unique.numel()), 1)
    pieces: list[Tensor] = []
    order: list[Tensor] = []
    selective = keeps_logits_by_mask(model)
    with torch.set_grad_enabled(grad):
        for start in range(0, unique.numel(), step):
            chunk = unique[start : start + step]
            ids = input_ids[chunk.to(device)]
            mask = attention_mask[chunk.to(device)].long()
            used = int(mask.any(dim=0).nonzero().max()) + 1  # drop all-padding columns
            ids, mask = ids[:, :used], mask[:, :used]
            which = torch.isin(rows, chunk).nonzero().flatten()  # states in this chunk
            local, pos = torch.searchsorted(chunk, rows[which]), cols[which] - 1
            logits = None
            if selective:  # the LM head on the states' positions only
                keep = torch.zeros(len(chunk), used, dtype=torch.bool)
                keep[local, pos] = True
                out = _forward(model, ids, mask, logits_to_keep=keep.to(device))
                if out.dim() == 2 and out.shape[0] == int(keep.sum()):  # [kept, V], row-major
                    kept = keep.flatten().nonzero().flatten()
                    logits = out[torch.searchsorted(kept, local * used + pos).to(device)]
                else:  # a forward that did not slice by the mask: all positions
                    selective = False
            if logits is None:
                logits = _forward(model, ids, mask)[local.to(device), pos.to(device)]
            pieces.append(logits)
            order.append(which)
    if not pieces:
        vocab = int(model.config.vocab_size) if hasattr(model, "config") else 0
        return torch.zeros((0, vocab), device=device)
    out = torch.cat(pieces)
    inverse = torch.empty_like(torch.cat(order))
    inverse[torch.cat(order)] = torch.arange(inverse.numel())
    return out[inverse.to(device)]


# ---------------------------------------------------------------------------------------------
# realised change
# ---------------------------------------------------------------------------------------------


def first_order_entropy_change(before: Tensor, after: Tensor, temperature: float = 1.0) -> Tensor:
    """``dH_lin = -sum_v p_v (log p_v + H) Dx_v`` per row (module docstring), float64.

    Args:
        before, after: ``[n, V]`` raw logits of the same states before / after a step. Entries
            that are ``-inf`` in both (masked vocabulary) have ``p = 0`` and no step.
        temperature: ``T``; ``x = z / T``.

    Returns:
        ``[n]`` float64, the directional derivative of the entropy along the realised logit step.
    """
    x0 = before.double() / temperature
    both = torch.isfinite(x0) & torch.isfinite(after)
    dx = torch.where(both, after.double() / temperature - x0, 0.0)
    logp = torch.log_softmax(x0, dim=-1)
    p = logp.exp()
    h = -torch.where(p > 0, p * logp, 0.0).sum(dim=-1, keepdim=True)
    return -torch.where(p > 0, p * (logp + h) * dx, 0.0).sum(dim=-1)


def realised_changes(
    before: Tensor, after: Tensor, tokens: Tensor, temperature: float = 1.0
) -> dict[str, Tensor]:
    """Per-state realised quantities of a step, all ``[n]`` float64.

    Returns:
        ``entropy_before``, ``entropy_after`` (``H``, :func:`entropace.algos.token_stats`), ``dh``
        (their difference), ``dh_lin`` (:func:`first_order_entropy_change`) and ``logit_step``
        (``|Dx|_2``, the tempered-logit step), on the CPU.
    """
    names = ("entropy_before", "entropy_after", "dh", "dh_lin", "logit_step")
    if before.shape[0] == 0:
        return {name: torch.zeros(0, dtype=torch.float64) for name in names}
    # float64 on the CPU: small ([n, V]), exact enough for tiny steps, and any device works
    before, after = before.detach().cpu().double(), after.detach().cpu().double()
    tokens = tokens.cpu()
    h0 = token_stats(before, tokens, temperature=temperature).entropy
    h1 = token_stats(after, tokens, temperature=temperature).entropy
    finite = torch.isfinite(before) & torch.isfinite(after)
    dx = torch.where(finite, (after - before) / temperature, 0.0)
    return {
        "entropy_before": h0,
        "entropy_after": h1,
        "dh": h1 - h0,
        "dh_lin": first_order_entropy_change(before, after, temperature),
        "logit_step": dx.norm(dim=-1),
    }


def _mean(x: Tensor) -> float:
    return float(x.mean()) if x.numel() else math.nan


def realised_audit(
    before: Tensor,
    after: Tensor,
    tokens: Tensor,
    polarity: Tensor,
    *,
    temperature: float = 1.0,
) -> dict[str, float]:
    """The realised metrics of one step (module docstring), keyed ``audit/<name>``.

    Args:
        before, after: ``[n, V]`` logits of the sampled states before / after the update.
        tokens: ``[n]`` sampled token of each state.
        polarity: ``[n]`` predicted ``P = A S`` of each state's token.
        temperature: the sampling temperature.
    """
    ch = realised_changes(before, after, tokens, temperature)
    dh, p = ch["dh"], polarity.detach().double().cpu()
    dh_cpu = dh.cpu()
    stats = polarity_audit(p, dh_cpu, mask=p != 0)
    err = (dh - ch["dh_lin"]).abs()
    total = float(dh.abs().sum())
    return {
        "audit/states": float(dh.numel()),
        "audit/sign_agreement": stats["overall/sign_agreement"],
        "audit/sign_agreement_pos": stats["pos/sign_agreement"],
        "audit/sign_agreement_neg": stats["neg/sign_agreement"],
        "audit/spearman": stats["overall/spearman"],
        "audit/dH_pos": stats["pos/mean_dh"],
        "audit/dH_neg": stats["neg/mean_dh"],
        "audit/tokens_pos": stats["pos/tokens"],
        "audit/tokens_neg": stats["neg/tokens"],
        "audit/dH_mean": _mean(dh),
        "audit/first_order_error": _mean(err),
        "audit/first_order_rel_error": float(err.sum()) / total if total > 0 else math.nan,
        "audit/logit_step_norm": math.sqrt(_mean(ch["logit_step"] ** 2)),
    }


def parameter_step_norm(before: list[Tensor], after: list[Tensor]) -> float:
    """``|theta_after - theta_before|_2`` over matching parameter lists (float64 sum of squares)."""
    total = sum(
        float((a.detach().double() - b.double()).pow(2).sum()) for a, b in zip(after, before)
    )
    return math.sqrt(total)


# ---------------------------------------------------------------------------------------------
# probe
# ---------------------------------------------------------------------------------------------


def _wide(x: Tensor) -> Tensor:
    """float64 (float32 on MPS, which has no float64)."""
    return x.float() if x.device.type == "mps" else x.double()


def probe_audit(
    model: Any,
    input_ids: Tensor,
    attention_mask: Tensor,
    rows: Tensor,
    cols: Tensor,
    advantages: Tensor,
    polarity: Tensor,
    before: Tensor,
    *,
    probe_step: float,
    temperature: float = 1.0,
    micro_batch_size: int | None = None,
) -> dict[str, float]:
    """Branch-restricted probe steps on a copy of ``model`` (module docstring).

    Args:
        model: the policy before the update (left untouched: the probe steps a deep copy).
        input_ids, attention_mask: ``[B, L]`` of the step's batch.
        rows, cols: ``[n]`` the sampled states (:func:`sample_states`).
        advantages, polarity: ``[n]`` ``A`` and ``P`` of their tokens.
        before: ``[n, V]`` the model's logits at the states (:func:`state_logits`).
        probe_step: ``delta > 0``, the parameter norm of each probe step.

    Returns:
        ``audit/probe_dH_pos``, ``audit/probe_dH_neg``, ``audit/probe_grad_norm_pos``,
        ``audit/probe_grad_norm_neg`` (NaN for a branch without tokens or with a zero gradient).
    """
    if not (probe_step > 0 and math.isfinite(probe_step)):
        raise ValueError(f"probe_audit: probe_step must be finite and > 0, got {probe_step}")
    keys = [f"audit/probe_{k}_{b}" for k in ("dH", "grad_norm") for b in ("pos", "neg")]
    out: dict[str, float] = dict.fromkeys(keys, math.nan)
    if rows.numel() == 0:
        return out
    tokens = input_ids[rows.to(input_ids.device), cols.to(input_ids.device)]
    h0 = token_stats(_wide(before.detach()), tokens, temperature=temperature).entropy
    probe = copy.deepcopy(model)
    probe.eval()
    live = [p for p in model.parameters() if p.requires_grad]
    params = [p for p in probe.parameters() if p.requires_grad]
    adv = _wide(advantages.detach().to(input_ids.device))
    pol = polarity.detach().cpu()
    for branch, sel in (("pos", pol > 0), ("neg", pol < 0)):
        index = sel.nonzero().flatten()
        if not index.numel():
            continue
        logits = state_logits(
            probe, input_ids, attention_mask, rows[index], cols[index],
            micro_batch_size=micro_batch_size, grad=True,
        )  # fmt: skip
        logp = token_stats(_wide(logits), tokens[index.to(tokens.device)],
                           temperature=temperature).logprob  # fmt: skip
        loss = -(adv[index.to(adv.device)] * logp).mean()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads if g is not None))
        out[f"audit/probe_grad_norm_{branch}"] = norm
        if not (norm > 0 and math.isfinite(norm)):
            continue
        with torch.no_grad():
            for p, g in zip(params, grads):
                if g is not None:
                    p.sub_(g, alpha=probe_step / norm)
        after = state_logits(
            probe, input_ids, attention_mask, rows, cols, micro_batch_size=micro_batch_size
        )
        h1 = token_stats(_wide(after), tokens, temperature=temperature).entropy
        out[f"audit/probe_dH_{branch}"] = float((h1 - h0).mean())
        with torch.no_grad():  # back to the policy before the update for the other branch
            for p, q in zip(params, live):
                p.copy_(q)
    del probe
    return out


# ---------------------------------------------------------------------------------------------
# one audited step
# ---------------------------------------------------------------------------------------------


@dataclass
class TrainingAudit:
    """One audited training step: :meth:`start` before the update, :meth:`finish` after it.

    Attributes:
        rows, cols: ``[n]`` the sampled states; tokens, advantages, polarity: ``[n]`` at them.
        before: ``[n, V]`` logits (the model's dtype) of the policy before the update (the probe's and the
            realised audit's reference).
        params_before: copies of the trainable parameters before the update (realised mode
            only: the parameter step norm; the memory of one copy of the trainable weights).
        metrics: the probe's metrics (from :meth:`start`), then the realised ones.
        seconds: time spent in the audit (both halves).
    """

    input_ids: Tensor
    attention_mask: Tensor
    rows: Tensor
    cols: Tensor
    tokens: Tensor
    polarity: Tensor
    before: Tensor
    temperature: float
    micro_batch_size: int | None
    realised: bool
    params_before: list[Tensor] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    @classmethod
    def start(
        cls,
        model: Any,
        input_ids: Tensor,
        attention_mask: Tensor,
        loss_mask: Tensor,
        advantages: Tensor,
        sensitivity: Tensor | None,
        *,
        temperature: float,
        max_states: int,
        generator: torch.Generator,
        realised: bool = True,
        probe_step: float | None = None,
        micro_batch_size: int | None = None,
    ) -> TrainingAudit:
        """Sample the states and record the policy at them, before the update.

        Args:
            model: the policy, as it sampled the batch (run in eval mode here).
            input_ids, attention_mask, loss_mask: ``[B, L]`` of the step's rollout batch.
            advantages: ``[B, L]`` per-token advantages the update uses (before PAPO's
                reweighting; 0 on dropped groups).
            sensitivity: ``[B, L]`` ``S`` from the statistics pass (an on-policy batch: the
                policy at update start sampled it), or None: ``S`` of the policy at update start,
                from the audited states' logits (an off-policy batch, whose recorded ``S`` is the
                behaviour policy's).
            temperature: the sampling temperature.
            max_states: sample size (:func:`sample_states`).
            generator: CPU generator of the sample (derive it from the step's seed).
            realised: record what :meth:`finish` needs (the realised audit).
            probe_step: run :func:`probe_audit` with this step norm now (None: no probe).
            micro_batch_size: rows per forward pass.
        """
        t0 = time.perf_counter()
        rows, cols = sample_states(loss_mask, max_states, generator)
        dev = input_ids.device
        r, c = rows.to(dev), cols.to(dev)
        was_training = model.training
        model.eval()
        before = state_logits(
            model, input_ids, attention_mask, rows, cols, micro_batch_size=micro_batch_size
        )
        if sensitivity is None:  # the policy at update start, not the batch's sampler
            wide = before.detach().cpu().double()
            sens = token_stats(wide, input_ids[r, c].cpu(), temperature=temperature).sensitivity
        else:
            sens = sensitivity[r, c].cpu().double()
        polarity = advantages[r, c].cpu().double() * sens
        audit = cls(
            input_ids=input_ids, attention_mask=attention_mask, rows=rows, cols=cols,
            tokens=input_ids[r, c], polarity=polarity, before=before, temperature=temperature,
            micro_batch_size=micro_batch_size, realised=realised,
        )  # fmt: skip
        if realised:
            audit.params_before = [
                p.detach().clone() for p in model.parameters() if p.requires_grad
            ]
        if probe_step is not None:
            probe = probe_audit(
                model, input_ids, attention_mask, rows, cols, advantages[r, c], polarity,
                before, probe_step=probe_step, temperature=temperature,
                micro_batch_size=micro_batch_size,
            )  # fmt: skip
            audit.metrics.update(probe)
        model.train(was_training)
        audit.seconds = time.perf_counter() - t0
        return audit

    def finish(self, model: Any) -> dict[str, float]:
        """The step's audit metrics, after the update (realised ones computed now)."""
        t0 = time.perf_counter()
        if self.realised:
            was_training = model.training
            model.eval()
            after = state_logits(
                model, self.input_ids, self.attention_mask, self.rows, self.cols,
                micro_batch_size=self.micro_batch_size,
            )  # fmt: skip
            model.train(was_training)
            self.metrics.update(
                realised_audit(
                    self.before, after, self.tokens, self.polarity, temperature=self.temperature
                )
            )
            live = [p for p in model.parameters() if p.requires_grad]
            self.metrics["audit/step_norm"] = parameter_step_norm(self.params_before, live)
            self.params_before = []
        self.seconds += time.perf_counter() - t0
        return dict(self.metrics)
