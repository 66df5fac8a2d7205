"""The ``entropace`` command line: one entry point, one module per subcommand.

Each module in :data:`SUBCOMMANDS` defines ``add_parser(subparsers) -> None``, which adds its
parser and sets ``func`` (called with the parsed namespace, returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

SUBCOMMANDS: tuple[str, ...] = (
    "entropace.cli.demo",
    "entropace.cli.envs",
    "entropace.cli.train",
    "entropace.cli.warmstart",
    "entropace.cli.eval",
    "entropace.cli.report",
    "entropace.cli.compare",
)


def shipped_presets() -> str:
    """The shipped preset names, comma-separated, for ``--preset`` help texts (no heavy import:
    the same files :func:`entropace.train.config.preset_names` lists)."""
    from importlib.resources import files

    names = sorted(f.name[:-5] for f in files("entropace").joinpath("configs").iterdir()
                   if f.name.endswith(".yaml"))  # fmt: skip
    return ", ".join(names)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="entropace",
        description="Entropy-aware RL for multi-task LLM agents (EPPO, PAPO and baselines).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in SUBCOMMANDS:
        if importlib.util.find_spec(name) is None:
            continue
        importlib.import_module(name).add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from entropace.train.threads import default_wait_policy

    default_wait_policy()  # OMP_WAIT_POLICY=PASSIVE before torch loads, unless the user chose
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
