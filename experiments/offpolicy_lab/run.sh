#!/usr/bin/env bash
# Issue 23's preregistered grid (experiments/offpolicy_lab/PREREGISTRATION.md): 10 arms x 12
# seeds (7100-7111) on lab v2, resumable (run it again after an interruption), two runs at a time
# with one torch thread each. Then one report over every arm and the confirmatory tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=experiments/offpolicy_lab/runs
common=(--preset lab2 --seed-start 7100 --seeds 12 --jobs 2)

entropace compare "${common[@]}" --algos grpo,eppo,eppo-success,eppo-shuffled,papo,eppo+papo \
  --out "$out/main"
entropace compare "${common[@]}" --algos grpo --out "$out/eps0.1" \
  algorithm.eps_low=0.1 algorithm.eps_high=0.1
entropace compare "${common[@]}" --algos grpo --out "$out/eps0.3" \
  algorithm.eps_low=0.3 algorithm.eps_high=0.3
entropace compare "${common[@]}" --algos grpo,eppo --out "$out/async2" \
  rollout.mode=async rollout.max_staleness=2

python experiments/offpolicy_lab/analyse.py "$out"
