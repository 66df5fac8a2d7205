"""The quick preset's warm start: building it vs loading the shipped adapter, in one process.

Prints (JSON) the seconds of: building the warm start anew into the cache (``--rebuild``; the
recipe of ``configs/quick.yaml``), finding and checking the shipped entry (its sha256 against
the record and the pin), after a warm-up load (imports, page cache), building the run's
policy on it (SmolLM2 loaded and checked, the adapter
merged, the run's LoRA adapter on top) and, for comparison, the policy without the warm start;
the torch threads used; and whether the rebuilt adapter has the shipped one's sha256
(determinism: the same bytes for the same torch build and thread count).

    OMP_NUM_THREADS=2 python benchmarks/bench_warm_start_load.py --rebuild
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rebuild", action="store_true", help="also build it anew (minutes)")
    args = p.parse_args()
    from entropace.train.config import load_config
    from entropace.train.policy import build_model
    from entropace.train.warm_start import ensure_warm_start

    cfg = load_config("quick")
    out: dict[str, object] = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    if args.rebuild:
        t = time.perf_counter()
        unpinned = dataclasses.replace(  # the pin is checked below, not by the build
            cfg, warm_start=dataclasses.replace(cfg.warm_start, sha256=None)
        )
        rebuilt = ensure_warm_start(unpinned, rebuild=True)
        out["build_s"] = time.perf_counter() - t
        out["rebuilt_sha256"] = rebuilt.sha256
    t = time.perf_counter()
    warm = ensure_warm_start(cfg)
    out["find_and_check_s"] = time.perf_counter() - t
    out["shipped_sha256"] = warm.sha256
    out["shipped"] = str(warm.path)
    if args.rebuild:
        out["same_bytes"] = out["rebuilt_sha256"] == warm.sha256
    build_model(cfg.model)  # warm-up: imports and the page cache, counted in neither below
    t = time.perf_counter()
    build_model(dataclasses.replace(cfg.model, name=str(warm.path)))
    out["policy_on_warm_start_s"] = time.perf_counter() - t
    t = time.perf_counter()
    build_model(cfg.model)
    out["policy_without_warm_start_s"] = time.perf_counter() - t
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
