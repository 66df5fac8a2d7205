"""The entropace verl hook on hand-built verl batches (``DataProto``, several ``data_source``s).

- the per-token bounds equal a standalone :class:`EntropyPacer` fed the same per-task mean
  entropies (computed here by brute force), step after step;
- PAPO's advantages equal :func:`polarity_reweight` with a standalone
  :class:`PolarityController` fed the batch mean token entropy;
- the controller state survives a JSON round trip (resumed runs give the same bounds);
- the config switches resolve as documented.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("verl", reason="verl is not installed (pip install 'entropace[verl]')")

from omegaconf import OmegaConf  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from verl import DataProto  # noqa: E402

from entropace import algos  # noqa: E402
from entropace.control import EntropyPacer, PacerConfig, PolarityController  # noqa: E402
from entropace.integrations.verl.hooks import (  # noqa: E402
    EntropaceHook,
    settings_from_config,
)

SOURCES = np.array(["db", "os", "db", "kg", "os", "db"], dtype=object)


def _config(loss_mode: str = "eppo_papo", entropace: dict | None = None):
    cfg = {
        "actor_rollout_ref": {
            "actor": {
                "clip_ratio": 0.2,
                "clip_ratio_low": 0.2,
                "clip_ratio_high": 0.2,
                "policy_loss": {"loss_mode": loss_mode},
            }
        }
    }
    if entropace is not None:
        cfg["entropace"] = entropace
    return OmegaConf.create(cfg)


def _batch(step: int, b: int = 6, t: int = 9) -> DataProto:
    g = torch.Generator().manual_seed(100 + step)
    # the tasks lose entropy at different paces: db fast, os slowly, kg in between
    pace = {"db": 0.7, "os": 0.97, "kg": 0.85}
    scale = torch.tensor([pace[s] ** step for s in SOURCES], dtype=torch.float32)[:, None]
    entropy = (0.5 + torch.rand(b, t, generator=g)) * scale
    mask = (torch.rand(b, t, generator=g) > 0.3).to(torch.float32)
    mask[:, 0] = 1.0
    scores = torch.zeros(b, t)
    scores[:, -1] = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    td = TensorDict(
        {
            "entropy": entropy,
            "response_mask": mask,
            "token_level_scores": scores,
            "advantages": torch.randn(b, 1, generator=g).expand(b, t).contiguous() * mask,
            "entropace_sensitivity": torch.randn(b, t, generator=g),
        },
        batch_size=[b],
    )
    return DataProto(batch=td, non_tensor_batch={"data_source": SOURCES.copy()})


def _task_entropy(data: DataProto) -> dict[str, float]:
    ent = data.batch["entropy"].double()
    mask = data.batch["response_mask"].double()
    out: dict[str, float] = {}
    for k in dict.fromkeys(SOURCES):
        rows = [i for i, s in enumerate(SOURCES) if s == k]
        num = sum(float((ent[i] * mask[i]).sum()) for i in rows)
        den = sum(float(mask[i].sum()) for i in rows)
        out[k] = num / den
    return out


def test_bounds_equal_a_standalone_pacer_and_papo_equals_polarity_reweight() -> None:
    hook = EntropaceHook(settings_from_config(_config("eppo_papo")))
    assert hook.writes_bounds and hook.needs_sensitivity
    pacer = EntropyPacer(PacerConfig())
    polarity = PolarityController()
    for step in range(5):
        data = _batch(step)
        metrics = hook.on_old_log_prob(data)
        eps = pacer.update(_task_entropy(data))
        low, high = data.batch["entropace_eps_low"], data.batch["entropace_eps_high"]
        for i, s in enumerate(SOURCES):
            assert torch.all(low[i] == torch.tensor(eps[s], dtype=torch.float32))
            assert torch.all(high[i] == torch.tensor(eps[s], dtype=torch.float32))
            assert metrics[f"entropace/task/{s}/eps_low"] == pytest.approx(eps[s], abs=1e-12)
            assert metrics[f"entropace/task/{s}/entropy"] == pytest.approx(
                _task_entropy(data)[s], rel=1e-12
            )
        # the paces differ, so after warm-up the bounds differ across tasks
        if step >= 2:
            assert eps["db"] < eps["kg"] < eps["os"]
            assert metrics["entropace/task/db/pace_z"] < 0 < metrics["entropace/task/os/pace_z"]
        assert metrics["entropace/task/db/success"] == pytest.approx(1 / 3)
        assert metrics["entropace/task/kg/reward"] == pytest.approx(1.0)

        m = data.batch["response_mask"].double()
        h = float((data.batch["entropy"].double() * m).sum() / m.sum())
        w_plus, w_minus = polarity.update(h)
        assert metrics["entropace/polarity/w_plus"] == pytest.approx(w_plus, rel=1e-12)
        adv = data.batch["advantages"].clone()
        sens = data.batch["entropace_sensitivity"]
        more = hook.on_advantages(data)
        pol = algos.entropy_polarity(adv, sens)
        expected = algos.polarity_reweight(
            adv, pol, data.batch["response_mask"], w_plus=w_plus, w_minus=w_minus
        )
        torch.testing.assert_close(data.batch["advantages"], expected, rtol=0, atol=0)
        if step >= 1:
            assert not torch.allclose(expected, adv)
        total = float((adv.abs() * m).sum())
        assert more["entropace/polarity/pos_mass"] == pytest.approx(
            float((adv.abs() * m * (pol > 0)).sum()) / total
        )


def test_state_round_trip_resumes_exactly() -> None:
    cfg = _config("eppo_papo", {"options": {"pacer": {"alpha": 0.6, "warmup_steps": 2}}})
    a = EntropaceHook(settings_from_config(cfg))
    for step in range(3):
        a.on_old_log_prob(_batch(step))
    state = json.loads(json.dumps(a.state_dict()))
    b = EntropaceHook(settings_from_config(cfg))
    b.load_state_dict(state)
    da, db = _batch(3), _batch(3)
    ma, mb = a.on_old_log_prob(da), b.on_old_log_prob(db)
    assert ma == mb
    assert torch.equal(da.batch["entropace_eps_low"], db.batch["entropace_eps_low"])
    a.on_advantages(da)
    b.on_advantages(db)
    assert torch.equal(da.batch["advantages"], db.batch["advantages"])
    other = EntropaceHook(settings_from_config(_config("eppo")))
    with pytest.raises(ValueError, match="recipe"):
        other.load_state_dict(state)


def test_papo_alone_keeps_verl_bounds_and_eppo_alone_keeps_advantages() -> None:
    papo = EntropaceHook(settings_from_config(_config("papo")))
    data = _batch(0)
    metrics = papo.on_old_log_prob(data)
    assert "entropace_eps_low" not in data.batch.keys()
    assert metrics["entropace/task/db/eps_low"] == 0.2
    eppo = EntropaceHook(settings_from_config(_config("eppo")))
    data = _batch(0)
    adv = data.batch["advantages"].clone()
    eppo.on_old_log_prob(data)
    assert eppo.on_advantages(data) == {}
    assert torch.equal(data.batch["advantages"], adv)
    assert not eppo.needs_sensitivity


def test_settings_errors_and_overrides() -> None:
    s = settings_from_config(_config("eppo", {"algorithm": "eppo-notrend"}))
    assert s.recipe == "eppo-notrend" and s.clip.pacer.trend is False
    s = settings_from_config(_config("dcpo", {"options": {"loss_options": {"r_max": 5.0}}}))
    assert s.clip_rule == "fixed" and dict(s.loss_options) == {"r_max": 5.0}
    with pytest.raises(ValueError, match="loss_mode"):
        settings_from_config(_config("vanilla"))
    with pytest.raises(ValueError, match="matching loss_mode"):
        settings_from_config(_config("eppo", {"algorithm": "dcpo"}))
    with pytest.raises(ValueError, match="bapo"):
        settings_from_config(_config("eppo", {"algorithm": "bapo"}))
    hook = EntropaceHook(settings_from_config(_config("eppo_papo")))
    data = _batch(0)
    del data.batch["entropace_sensitivity"]
    hook.on_old_log_prob(data)
    with pytest.raises(ValueError, match="entropace_sensitivity"):
        hook.on_advantages(data)
    no_source = _batch(0)
    no_source.non_tensor_batch.pop("data_source")
    with pytest.raises(ValueError, match="data_source"):
        hook.on_old_log_prob(no_source)


def test_padding_rows_enter_no_statistic() -> None:
    cfg = _config("eppo")
    a, b = EntropaceHook(settings_from_config(cfg)), EntropaceHook(settings_from_config(cfg))
    data = _batch(0)
    ma = a.on_old_log_prob(data, valid=[True] * 6)
    # row 5 ("db", reward 0) as a synthetic padding copy of row 0 (reward 1, same task)
    padded = _batch(0)
    padded.batch["token_level_scores"][5] = padded.batch["token_level_scores"][0]
    padded.batch["response_mask"][5] = 0.0
    mb = b.on_old_log_prob(padded, valid=[True] * 5 + [False])
    assert mb["entropace/task/db/success"] == pytest.approx(0.5)  # rows 0, 2 only
    assert ma["entropace/task/db/success"] == pytest.approx(1 / 3)
    assert torch.equal(padded.batch["entropace_eps_low"][5], padded.batch["entropace_eps_low"][0])
    with pytest.raises(ValueError, match="one entry per row"):
        b.on_old_log_prob(_batch(1), valid=[True])


def test_the_shuffled_control_is_seeded_by_the_run() -> None:
    """Issue 35: the pacer's seed is ``entropace.seed``, else verl's ``data.seed``, 0 when that
    is null (verl's default); anything else is an error naming the keys."""
    from omegaconf import OmegaConf

    cfg = _config("eppo", {"algorithm": "eppo-shuffled"})
    assert settings_from_config(cfg).clip.seed == 0
    cfg = OmegaConf.merge(cfg, {"data": {"seed": 7}})
    assert settings_from_config(cfg).clip.seed == 7
    cfg = OmegaConf.merge(cfg, {"entropace": {"seed": 11}})
    assert settings_from_config(cfg).clip.seed == 11
    with pytest.raises(ValueError, match=r"entropace.seed \(or data.seed\) must be an int"):
        settings_from_config(OmegaConf.merge(cfg, {"entropace": {"seed": "x"}}))
