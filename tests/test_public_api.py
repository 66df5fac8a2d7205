"""Every public name of every package resolves to the object, never to a same-named submodule
(importing a submodule binds its name on the package; a collision would shadow the export)."""

from __future__ import annotations

import importlib
import pkgutil
import types

import pytest

PACKAGES = [
    "entropace.algos",
    "entropace.control",
    "entropace.diagnostics",
    "entropace.envs",
    "entropace.models",
    "entropace.report",
    "entropace.rollout",
    "entropace.train",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_exports_survive_importing_every_submodule(name: str) -> None:
    package = importlib.import_module(name)
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{name}.{info.name}")
    assert package.__all__, name
    for export in package.__all__:
        value = getattr(package, export)
        assert not isinstance(value, types.ModuleType), f"{name}.{export} is a module"
