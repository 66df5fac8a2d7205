"""``entropace warmstart``: fine-tune a model on demonstrations before RL (the warm start of a
preset's ``warm_start`` section), or find it in the cache, and say what it measured."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from entropace._text import printable
from entropace.cli import shipped_presets

EPILOG = """\
examples:
  entropace warmstart --preset lab3                    # the lab's warm start (shipped: loads at once)
  entropace warmstart --preset lab3 --rebuild          # build it anew here; checks the pinned sha256
  entropace warmstart --preset quick                   # quick's adapter (shipped: loads at once)
  entropace warmstart --preset quick --out models/quick-warm   # a copy that model.name loads
  entropace warmstart --preset lab2 warm_start.source=prior warm_start.steps=100
  entropace warmstart --preset quick warm_start.source=jsonl warm_start.path=demos.jsonl

`entropace train` builds (or loads) the same warm start itself when the config has one; this
command builds it ahead, measures it, and copies it out. A LoRA warm start (warm_start.lora)
is stored as its adapter alone (adapter.safetensors, a few MB), merged into the base model
named in its warm_start.json when it loads. Every load checks the weights against the sha256
in warm_start.json (and warm_start.sha256 when set). Overrides are key.sub=value.
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "warmstart",
        help="fine-tune the policy on demonstrations before RL (a preset's warm_start)",
        description=(
            "Fine-tune model.name on demonstrations (the tasks' oracles, their demonstration "
            "priors, or a JSONL file of chat exchanges), with the library's chat layout and the "
            "loss on the replies only; the result is cached by its recipe and loaded by "
            "`entropace train` with the same config."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--preset", default="quick",
        help=f"a shipped preset ({shipped_presets()}) or a YAML file (default: quick)",
    )  # fmt: skip
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    p.add_argument(
        "--rebuild", action="store_true",
        help="build anew into the cache even when a cached or shipped copy exists",
    )  # fmt: skip
    p.add_argument(
        "--out", type=Path, default=None,
        help="copy the result (model, tokenizer, warm_start.json) to this new directory",
    )  # fmt: skip
    p.set_defaults(func=run)


def _table(measured: dict[str, dict[str, float]]) -> str:
    lines = ["| task | entropy (nats/token) | sampled reward | sampled success | greedy success |",
             "|---|---|---|---|---|"]  # fmt: skip
    for task, m in measured.items():
        lines.append(
            f"| {task} | {m['entropy']:.3f} | {m['reward']:.3f} | {m['success']:.3f} | "
            f"{m['greedy_success']:.3f} |"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from entropace.train.config import ConfigError, load_config
    from entropace.train.demos import DemoError
    from entropace.train.sft import SFTError
    from entropace.train.warm_start import WarmStartError, ensure_warm_start

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    try:
        cfg = load_config(args.preset, args.overrides)
        if not cfg.warm_start.enabled:
            raise ConfigError(
                "the config has no warm start (warm_start.source=none); set "
                "warm_start.source to one of oracle, prior, jsonl"
            )
        if args.out is not None and args.out.exists():
            raise FileExistsError(f"--out {args.out}: exists; give a new directory")
        warm = ensure_warm_start(cfg, log=say, rebuild=args.rebuild)
        if args.out is not None:
            shutil.copytree(warm.path, args.out)
    except (ConfigError, DemoError, WarmStartError, SFTError, OSError, ImportError) as err:
        print(f"entropace warmstart: error: {printable(err)}", file=sys.stderr)
        return 2
    record = warm.record
    print(f"warm start {warm.key}: {warm.path}")
    print(f"sha256 ({warm.weights_file}): {warm.sha256}")
    if cfg.warm_start.sha256 is not None:
        print("matches the config's pin (warm_start.sha256)")
    print(
        f"{record.get('base_model')} fine-tuned on {cfg.warm_start.source} demonstrations, "
        f"{len(record.get('losses', []))} steps, final loss "
        f"{record['losses'][-1]:.4f}, built in {record.get('seconds', 0):.0f} s with torch "
        f"{record.get('torch')} on {record.get('threads')} thread(s)"
    )
    if record.get("measured"):
        print(_table(record["measured"]))
    if args.out is not None:
        print(f"copied to {args.out} (model.name={args.out} loads it)")
    return 0
