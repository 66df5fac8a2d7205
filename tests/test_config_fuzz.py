"""Issue 21 (config bounds): every numeric key of every shipped preset, sent the values a
careless or hostile user would write, either loads within its documented range or raises
:class:`ConfigError` naming the key; never another exception (OverflowError, a NaN reaching
the trainer). The keys are enumerated from the dataclasses (and every policy loss's options),
not from a hand list, so a new numeric field is fuzzed as soon as it exists."""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from collections.abc import Iterator
from typing import Any

import pytest

from entropace.algos import POLICY_LOSSES
from entropace.train.config import (
    ConfigError,
    TrainConfig,
    _preset_dict,
    parse_override,
    preset_names,
    resolve,
)
from entropace.train.schema import INT_RANGE, Range, _numeric_type, field_range, merge

#: The values of the issue: a 21-digit int, negative, 0, NaN, +-inf, and bools (YAML text).
VALUES = ("1000000000000000000000", "-1", "0", ".nan", ".inf", "-.inf", "true", "false")


@dataclasses.dataclass(frozen=True)
class NumericKey:
    dotted: str  # e.g. "algorithm.pacer.eps0"
    owner: type  # the dataclass holding the field
    name: str  # the field
    shape: str  # "scalar" | "list" | "dict"


def numeric_keys(cls: type = TrainConfig, prefix: str = "") -> Iterator[NumericKey]:
    """Every int / float field under ``cls`` (``X | None``, ``list[X]``, ``dict[str, X]``
    included), nested dataclasses recursively."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, dotted = hints[f.name], f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            yield from numeric_keys(tp, dotted + ".")
        elif _numeric_type(tp) is not None:
            origin = typing.get_origin(tp)
            shape = "list" if origin is list else "dict" if origin is dict else "scalar"
            yield NumericKey(dotted, cls, f.name, shape)


def loss_keys() -> Iterator[tuple[str, NumericKey]]:
    """``(loss name, key)`` for every numeric option of every registered policy loss."""
    for loss, spec in sorted(POLICY_LOSSES.items()):
        for key in numeric_keys(spec.config_cls):
            yield loss, key


@functools.cache
def _preset(name: str) -> dict[str, Any]:
    return _preset_dict(name)


def load(preset: str, overrides: list[str]) -> TrainConfig:
    """``load_config(preset, overrides, check_envs=False)`` with the preset's YAML read once."""
    cli: dict[str, Any] = {}
    for text in overrides:
        cli = merge(cli, parse_override(text))
    return resolve(_preset(preset), cli, check_envs=False)


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _overrides(preset: str, key: NumericKey, value: str) -> list[str]:
    if key.shape == "list":
        return [f"{key.dotted}=[{value}, {value}]"]
    if key.shape == "dict":  # tasks.mix: a weight of the preset's first task
        first = load(preset, []).tasks.names[0]
        return [f"{key.dotted}={{{first}: {value}}}"]
    return [f"{key.dotted}={value}"]


def _entries(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return list(value.values())
    return list(value) if isinstance(value, list) else [value]


def _assert_named(err: ConfigError, dotted: str) -> None:
    """The error names the key: its dotted path, or its section and its field (a foreign
    config's own check, reported as ``algorithm.pacer: eps_min must ...``)."""
    text = str(err)
    section, _, leaf = dotted.rpartition(".")
    assert dotted in text or (section in text and leaf in text), (dotted, text)


def _check(preset: str, overrides: list[str], dotted: str, read: Any, rng: Range) -> None:
    try:
        cfg = load(preset, overrides)
    except ConfigError as err:
        _assert_named(err, dotted)
        return
    for v in _entries(read(cfg)):
        if v is None:
            continue
        assert not isinstance(v, bool), (overrides, v)
        assert v in rng, (overrides, v, str(rng))


KEYS = list(numeric_keys())


def test_the_enumeration_finds_every_section() -> None:
    """The walk reaches the nested sections (a broken walk would fuzz nothing)."""
    found = {k.dotted for k in KEYS}
    for expected in ("seed", "tasks.group_size", "rollout.temperature", "model.lora_dropout",
                     "algorithm.overlong.max_len", "algorithm.pacer.eps0", "optim.betas",
                     "tasks.mix", "rollout.max_episode_tokens", "audit.probe_step"):  # fmt: skip
        assert expected in found
    assert len(KEYS) >= 50 and len(list(loss_keys())) >= 8


@pytest.mark.parametrize("preset", preset_names())
def test_every_numeric_key_is_bounded(preset: str) -> None:
    for key in KEYS:
        rng = field_range(key.owner, key.name)
        assert rng is not None
        for value in VALUES:
            _check(preset, _overrides(preset, key, value), key.dotted,
                   lambda cfg, d=key.dotted: _get(cfg, d), rng)  # fmt: skip


@pytest.mark.parametrize("preset", preset_names())
def test_every_policy_loss_option_is_bounded(preset: str) -> None:
    for loss, key in loss_keys():
        rng = field_range(key.owner, key.name)
        assert rng is not None
        # a loss without a trust-region width is refused with a preset's pacer (EPPO)
        rule = [] if POLICY_LOSSES[loss].width else ["algorithm.clip_rule=fixed"]
        for value in VALUES:
            overrides = [f"algorithm.policy_loss={loss}", *rule,
                         f"algorithm.loss_options={{{key.name}: {value}}}"]  # fmt: skip
            _check(preset, overrides, f"algorithm.loss_options.{key.name}",
                   lambda cfg, n=key.name: cfg.algorithm.loss_options.get(n), rng)  # fmt: skip


def test_every_int_key_has_a_finite_maximum() -> None:
    """An int key is a count, an index or a seed: none may be 10**21 (G, P and token counts
    have maxima of their own, far below the default)."""
    for key in KEYS:
        if _numeric_type(typing.get_type_hints(key.owner)[key.name]) is int:
            rng = field_range(key.owner, key.name)
            assert math.isfinite(rng.lo) and rng.hi <= max(INT_RANGE.hi, 2**32 - 1), key
    for dotted, most in (("tasks.group_size", 1024), ("tasks.prompts_per_task", 1024),
                         ("rollout.max_episode_tokens", 2**20), ("seed", 2**32 - 1)):  # fmt: skip
        key = next(k for k in KEYS if k.dotted == dotted)
        assert field_range(key.owner, key.name).hi == most
