#!/usr/bin/env bash
# Issue 23's preregistered grid (experiments/offpolicy_lab/PREREGISTRATION.md): 10 arms x 12
# seeds (7100-7111) on lab v2, resumable (run it again after an interruption: finished runs are
# skipped, a stopped run resumes from its checkpoint), two runs at a time with one torch thread
# each. Seeds go in blocks of 4 (every arm of a block before the next block), the PAPO arms
# (exploratory) last in each block, so that an interrupted grid holds complete paired blocks of
# the confirmatory arms. Then every grid once more over all 12 seeds (nothing left to train:
# it writes the grid's manifest and report) and one report over every arm with the tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=experiments/offpolicy_lab/runs
grids() {  # $1 = first seed, $2 = number of seeds
  local common=(--preset lab2 --seed-start "$1" --seeds "$2" --jobs 2)
  entropace compare "${common[@]}" --algos grpo,eppo,eppo-success,eppo-shuffled --out "$out/main"
  entropace compare "${common[@]}" --algos grpo --out "$out/eps0.1" \
    algorithm.eps_low=0.1 algorithm.eps_high=0.1
  entropace compare "${common[@]}" --algos grpo --out "$out/eps0.3" \
    algorithm.eps_low=0.3 algorithm.eps_high=0.3
  entropace compare "${common[@]}" --algos grpo,eppo --out "$out/async2" \
    rollout.mode=async rollout.max_staleness=2
  entropace compare "${common[@]}" --algos papo,eppo+papo --out "$out/papo"
}
for start in 7100 7104 7108; do
  grids "$start" 4
done
grids 7100 12
python experiments/offpolicy_lab/analyse.py "$out"
