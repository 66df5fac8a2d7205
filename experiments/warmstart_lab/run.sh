#!/usr/bin/env bash
# Issue 28's preregistered grid (experiments/warmstart_lab/PREREGISTRATION.md): 14 arms x 12
# seeds (7300-7311) on lab v3 (`--preset lab3`, the shipped warm start pinned by sha256),
# resumable (run it again after an interruption: finished runs are skipped, a stopped run resumes
# from its checkpoint), two runs at a time with one torch thread each. Seeds go in blocks of 4
# (every arm of a block before the next block; the exploratory PAPO arms last in a block), so an
# interrupted grid holds complete paired blocks. Then every grid once more over all 12 seeds
# (nothing left to train: it writes each grid's manifest and report) and the analysis.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${WARMSTART_LAB_RUNS:-experiments/warmstart_lab/runs}
grids() {  # $1 = first seed, $2 = number of seeds
  local common=(--preset lab3 --seed-start "$1" --seeds "$2" --jobs 2)
  entropace compare "${common[@]}" --algos grpo,eppo,eppo-success,eppo-shuffled --out "$out/main"
  entropace compare "${common[@]}" --algos grpo --out "$out/eps0.1" \
    algorithm.eps_low=0.1 algorithm.eps_high=0.1
  entropace compare "${common[@]}" --algos grpo --out "$out/eps0.4" \
    algorithm.eps_low=0.4 algorithm.eps_high=0.4
  entropace compare "${common[@]}" --algos grpo --out "$out/eh0.1" algorithm.eps_high=0.1
  entropace compare "${common[@]}" --algos grpo --out "$out/eh0.4" algorithm.eps_high=0.4
  entropace compare "${common[@]}" --algos grpo --out "$out/fast-tight" \
    "algorithm.task_bounds={lab2-easy: [0.1, 0.1], lab2-hard: [0.4, 0.4]}"
  entropace compare "${common[@]}" --algos grpo --out "$out/fast-wide" \
    "algorithm.task_bounds={lab2-easy: [0.4, 0.4], lab2-hard: [0.1, 0.1]}"
  entropace compare "${common[@]}" --algos grpo,eppo --out "$out/async2" \
    rollout.mode=async rollout.max_staleness=2
  entropace compare "${common[@]}" --algos papo,eppo+papo --out "$out/papo"
}
for start in 7300 7304 7308; do
  grids "$start" 4
done
grids 7300 12
python experiments/warmstart_lab/analyse.py "$out"
