"""Lazy package exports: a package lists ``name -> submodule`` and imports on first use.

Used by packages whose submodules pull in heavy libraries (transformers), so that
``import entropace.train`` or the CLI's ``--help`` stays fast.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_getattr(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``package`` that imports ``exports[name]`` on demand.

    The value is bound on the package once loaded, so a later import of a submodule with the
    same name cannot shadow it.
    """

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        setattr(importlib.import_module(package), name, value)
        return value

    return __getattr__
