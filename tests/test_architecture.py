"""The layering the README's layout promises, read from the source (every import, also those
inside functions): no import cycles between modules, ``algos`` imports nothing but itself,
``control`` only ``algos`` and itself, no core package imports ``train`` or an engine plug-in."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = SRC / "entropace"


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()
PACKAGES = {m for m, p in MODULES.items() if p.name == "__init__.py"}


def _imports(path: Path) -> set[str]:
    """Every ``entropace`` module a file imports (a name imported from a package counts as
    its submodule when one has that name)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if not node.module.startswith("entropace"):
                continue
            subs = {f"{node.module}.{a.name}" for a in node.names} & MODULES.keys()
            found |= subs or {node.module}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("entropace")}
    return found & MODULES.keys()


GRAPH = {m: _imports(p) for m, p in MODULES.items()}


def test_no_import_cycles_between_modules() -> None:
    # package __init__ files only re-export their children; cycles through them are lazy
    graph = {m: {t for t in v if t not in PACKAGES} for m, v in GRAPH.items() if m not in PACKAGES}
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


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


SHARED = {"_lazy", "_cache"}  # top-level helpers (lazy exports, the cache directory)
ALLOWED = {  # package -> the entropace packages its modules may import
    "algos": {"algos", *SHARED},
    "control": {"algos", "control", *SHARED},
    "diagnostics": {"algos", "control", "diagnostics", *SHARED},
    "envs": {"envs", *SHARED},
}


def test_core_packages_import_only_the_layers_below() -> None:
    bad = []
    for module, targets in GRAPH.items():
        allowed = ALLOWED.get(_layer(module))
        if allowed is None:
            continue
        for target in targets:
            if _layer(target) not in allowed and target != "entropace":
                bad.append(f"{module} imports {target}")
    assert bad == []


def test_nothing_outside_integrations_imports_an_engine_plug_in() -> None:
    bad = [
        f"{m} imports {t}"
        for m, targets in GRAPH.items()
        if _layer(m) != "integrations"
        for t in targets
        if _layer(t) == "integrations"
    ]
    assert bad == []
