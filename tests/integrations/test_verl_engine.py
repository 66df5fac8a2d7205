"""PAPO's sensitivity inside verl's FSDP engine output path (CPU, no FSDP, no process group).

``prepare_model_outputs`` of the entropace engine is run on logits laid out as verl's
remove-padding path lays them out (packed ``[1, total_nnz (+ pad), V]``, rolled labels,
per-token temperature): the returned ``entropace_sensitivity`` is nested like ``log_probs`` and
equals a brute-force float64 ``t2 - t1``; verl's own outputs are unchanged; the engine is
registered for NVIDIA and chosen there.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("verl", reason="verl is not installed (pip install 'entropace[verl]')")

from tensordict import TensorDict  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils import torch_functional as verl_F  # noqa: E402
from verl.workers.engine import EngineRegistry  # noqa: E402

from entropace.integrations.verl import engine as ve  # noqa: E402

LENS = [5, 3, 6]
V = 37


def _brute_sensitivity(logits: torch.Tensor, labels: torch.Tensor, temp: torch.Tensor):
    x = logits.double() / temp.double()[:, None]
    logp = torch.log_softmax(x, -1)
    p = logp.exp()
    h = -(p * logp).sum(-1)
    lp_y = logp.gather(-1, labels[:, None]).squeeze(-1)
    t1 = lp_y.exp() * (h + lp_y)
    t2 = (p * p * (h[:, None] + logp)).sum(-1)
    return t2 - t1


def _engine():
    eng = object.__new__(ve.EntropaceFSDPEngineWithLMHead)
    eng.engine_config = SimpleNamespace(
        entropy_checkpointing=False, entropy_from_logits_with_chunking=False
    )
    eng.compute_entropy_from_logits = verl_F.entropy_from_logits
    eng.use_ulysses_sp = False
    eng.entropace_chunk_rows = 4  # several chunks, a partial last one
    return eng


def _inputs(pad: int, flag: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(0, V, (n,), generator=g) for n in LENS]
    input_ids = torch.nested.as_nested_tensor(ids, layout=torch.jagged)
    total = sum(LENS)
    logits = torch.randn(1, total + pad, V, generator=g) * 3
    flat = torch.cat(ids)
    rolled = torch.roll(flat, shifts=-1)
    temp = torch.cat([torch.full((n,), t) for n, t in zip(LENS, [0.7, 1.0, 1.3], strict=True)])
    rolled = torch.cat([rolled, torch.zeros(pad, dtype=rolled.dtype)])
    temp = torch.cat([temp, torch.ones(pad)])
    micro = TensorDict({"input_ids": input_ids}, batch_size=[len(LENS)])
    tu.assign_non_tensor(micro, use_remove_padding=True, calculate_entropy=True)
    if flag:
        tu.assign_non_tensor(micro, **{ve.FLAG: True})
    args = {
        "input_ids_rmpad_rolled": rolled,
        "temperature_rmpad": temp,
        "pad_size": pad,
        "temperature_is_one": False,
    }
    return SimpleNamespace(logits=logits), args, micro, (logits[0], rolled, temp, total)


@pytest.mark.parametrize("pad", [0, 3])
def test_sensitivity_is_nested_like_log_probs_and_exact(pad: int) -> None:
    output, args, micro, (logits, labels, temp, total) = _inputs(pad, flag=True)
    out = _engine().prepare_model_outputs(output, args, micro, None)
    sens = out[ve.FLAG]
    assert sens.is_nested
    assert sens.offsets().tolist() == out["log_probs"].offsets().tolist()
    expected = _brute_sensitivity(logits[:total], labels[:total], temp[:total])
    torch.testing.assert_close(sens.values().double(), expected, rtol=1e-5, atol=1e-6)
    # verl's own outputs are those of the unmodified engine
    output2, args2, micro2, _ = _inputs(pad, flag=False)
    ref = _engine().prepare_model_outputs(output2, args2, micro2, None)
    assert ve.FLAG not in ref
    torch.testing.assert_close(out["log_probs"].values(), ref["log_probs"].values())
    torch.testing.assert_close(out["entropy"].values(), ref["entropy"].values())


def test_sensitivity_from_logits_does_not_depend_on_chunking() -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(11, V, generator=g, dtype=torch.float64)
    labels = torch.randint(0, V, (11,), generator=g)
    temp = torch.full((11,), 0.9)
    a = ve.sensitivity_from_logits(logits, labels, temp, chunk_rows=1)
    b = ve.sensitivity_from_logits(logits, labels, temp, chunk_rows=100)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a.double(), _brute_sensitivity(logits, labels, temp), rtol=1e-5,
                               atol=1e-6)  # fmt: skip
    with pytest.raises(ValueError, match="chunk_rows"):
        ve.sensitivity_from_logits(logits, labels, temp, chunk_rows=0)


def test_unsupported_layout_is_refused_clearly() -> None:
    output, args, micro, _ = _inputs(0, flag=True)
    tu.assign_non_tensor(micro, use_fused_kernels=True)
    with pytest.raises(NotImplementedError, match="use_remove_padding"):
        _engine().prepare_model_outputs(output, args, micro, None)


def test_registered_for_nvidia_gpus(monkeypatch) -> None:
    assert ve.register_engine() == [
        "language_model/fsdp/cuda/nvidia",
        "language_model/fsdp2/cuda/nvidia",
    ]
    monkeypatch.setenv("VERL_ENGINE_DEVICE", "cuda")
    monkeypatch.setenv("VERL_ENGINE_VENDOR", "nvidia")
    for backend in ("fsdp", "fsdp2"):
        cls = EngineRegistry.get_engine_cls("language_model", backend)
        assert cls is ve.EntropaceFSDPEngineWithLMHead
    monkeypatch.setenv("VERL_ENGINE_DEVICE", "npu")
    monkeypatch.delenv("VERL_ENGINE_VENDOR")
    assert EngineRegistry.get_engine_cls("language_model", "fsdp") is not (
        ve.EntropaceFSDPEngineWithLMHead
    )
