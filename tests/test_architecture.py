"""The layering the README's layout promises, read from the source.

Every import counts: absolute and relative (``from ..train import config`` resolved against the
module's package), inside functions too, and ``importlib.import_module("entropace....")`` /
``__import__`` with a literal name. Checked: no import cycles between modules; every package of
``src/entropace`` has a rule (:data:`LAYERS`: the packages below it that it may import); no
module imports a package outside its rule. The checker itself is tested on planted upward
imports in every package, in every import form.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = SRC / "entropace"

#: package -> the entropace packages (besides itself and the SHARED helpers) it may import.
LAYERS: dict[str, set[str]] = {
    "algos": set(),  # pure tensor functions
    "control": {"algos"},  # stateful controllers over algos
    "envs": set(),  # environments know nothing of training
    "models": set(),  # model loading
    "rollout": {"algos", "envs", "models"},
    "diagnostics": {"algos", "control", "models", "rollout"},
    "train": {"algos", "control", "diagnostics", "envs", "models", "rollout"},
    "report": {"algos", "control", "diagnostics", "train"},
    "integrations": {"algos", "control", "diagnostics", "envs", "models", "rollout", "train"},
    "cli": {
        "algos", "control", "diagnostics", "envs", "integrations", "models", "report", "rollout",
        "train",
    },
}  # fmt: skip
SHARED = {"_lazy", "_cache", "_memory", "_files", "_text"}  # top-level helpers every package may use


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()
PACKAGES = {m for m, p in MODULES.items() if p.name == "__init__.py"}


def imported_names(module: str, source: str, *, is_package: bool = False) -> set[str]:
    """Every dotted ``entropace`` name ``module``'s source imports (relative imports resolved;
    ``from X import a`` yields ``X`` and ``X.a``; literal ``importlib.import_module`` /
    ``__import__`` names included)."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level - 1 > len(base) - 1:
                    raise ValueError(f"{module}: relative import beyond the top-level package")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            found |= {target, *(f"{target}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (
                    isinstance(node.func, ast.Name)
                    and node.func.id in ("import_module", "__import__")
                )
            )
        ):
            found.add(node.args[0].value.split(":")[0])
    return {n for n in found if n == "entropace" or n.startswith("entropace.")}


def _layer(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def violations(module: str, source: str, *, is_package: bool = False) -> list[str]:
    """The imports of ``module`` that break its package's rule (an unknown package breaks)."""
    own = _layer(module)
    if own in SHARED or own == "":
        return []
    if own not in LAYERS:
        return [f"{module}: package {own!r} has no layering rule"]
    allowed = LAYERS[own] | {own} | SHARED | {""}
    return sorted(
        f"{module} imports {name}"
        for name in imported_names(module, source, is_package=is_package)
        if _layer(name) not in allowed
    )


def test_every_package_has_a_rule() -> None:
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(LAYERS)
    for below in LAYERS.values():  # rules name packages that exist, and never the CLI
        assert below <= set(LAYERS) - {"cli"}


def test_packages_import_only_the_layers_below() -> None:
    bad = []
    for module, path in MODULES.items():
        bad += violations(module, path.read_text(), is_package=path.name == "__init__.py")
    assert bad == []


def test_the_layers_are_acyclic() -> None:
    def reaches(a: str, b: str, seen: set[str]) -> bool:
        return any(x == b or (x not in seen and reaches(x, b, seen | {x})) for x in LAYERS[a])

    assert [p for p in LAYERS if reaches(p, p, set())] == []


def _graph() -> dict[str, set[str]]:
    return {
        m: imported_names(m, p.read_text(), is_package=p.name == "__init__.py") & MODULES.keys()
        for m, p in MODULES.items()
    }


def test_no_import_cycles_between_modules() -> None:
    # package __init__ files only re-export their children; cycles through them are lazy
    graph = {
        m: {t for t in v if t not in PACKAGES} for m, v in _graph().items() if m not in PACKAGES
    }
    cycles = []
    state: dict[str, int] = {}  # 1 on the stack, 2 done

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == [], [" -> ".join(c) for c in cycles]


# --------------------------------------------------------------------------------------------
# The checker has teeth: planted upward imports fail it, in every package and import form
# --------------------------------------------------------------------------------------------


def test_the_issues_planted_imports_fail() -> None:
    planted = "from entropace.train.trainer import train\n"
    assert violations("entropace.rollout.engine", planted) == [
        "entropace.rollout.engine imports entropace.train.trainer",
        "entropace.rollout.engine imports entropace.train.trainer.train",
    ]
    rel = "def f():\n    from ..train import config\n"
    assert violations("entropace.algos.policy_losses", rel) == [
        "entropace.algos.policy_losses imports entropace.train",
        "entropace.algos.policy_losses imports entropace.train.config",
    ]
    assert violations("entropace.algos", "from .. import train\n", is_package=True) == [
        "entropace.algos imports entropace.train"
    ]
    # allowed forms stay allowed
    assert violations("entropace.algos.kl", "from . import aggregation\nimport torch\n") == []
    assert violations("entropace.control.pacer", "from ..algos import surrogate\n") == []
    assert violations("entropace.newpkg.x", "import os\n") == [
        "entropace.newpkg.x: package 'newpkg' has no layering rule"
    ]


FORMS = [
    "import entropace.{up}\n",
    "import entropace.{up}.x as y\n",
    "from entropace.{up} import x\n",
    "from entropace import {up}\n",
    "from ..{up} import x\n",
    "from ..{up}.x import y\n",
    "from .. import {up}\n",
    "def f():\n    if True:\n        from ..{up} import x\n",
    "import importlib\nm = importlib.import_module('entropace.{up}.x')\n",
    "m = __import__('entropace.{up}')\n",
]


@pytest.mark.parametrize("package", sorted(p for p in LAYERS if p != "cli"))
def test_an_upward_import_planted_anywhere_fails(package: str) -> None:
    above = sorted(set(LAYERS) - LAYERS[package] - {package})
    assert above, package
    module = f"entropace.{package}.planted"
    for up in above:
        for form in FORMS:
            source = form.format(up=up)
            assert violations(module, source), (package, source)
    with pytest.raises(ValueError, match="beyond the top-level"):
        imported_names(module, "from .... import x\n")
