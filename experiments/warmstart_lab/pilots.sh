#!/usr/bin/env bash
# Calibration pilots of lab v3 (issue 28), on pilot seeds 9101-9104 (never experiment seeds),
# recorded in CALIBRATION.md. Not the preregistered experiment. Usage:
#   bash experiments/warmstart_lab/pilots.sh ROUND [OUT]     (OUT default /work/pilots)
set -euo pipefail
round=$1
out=${2:-/work/pilots}
common=(--preset lab3 --jobs 2)
case "$round" in
  2)  # the lab3 preset (tasks.seed_offset 100000): GRPO at 0.2, the global and per-task contrasts
    s=(--seeds 2 --seed-start 9101)
    entropace compare "${common[@]}" "${s[@]}" --algos grpo --out "$out/r2/eps0.2"
    entropace compare "${common[@]}" "${s[@]}" --algos grpo --out "$out/r2/eps0.1" \
      algorithm.eps_low=0.1 algorithm.eps_high=0.1
    entropace compare "${common[@]}" "${s[@]}" --algos grpo --out "$out/r2/eps0.4" \
      algorithm.eps_low=0.4 algorithm.eps_high=0.4
    entropace compare "${common[@]}" "${s[@]}" --algos grpo --out "$out/r2/fast-tight" \
      "algorithm.task_bounds={lab2-easy: [0.1, 0.1], lab2-hard: [0.4, 0.4]}"
    entropace compare "${common[@]}" "${s[@]}" --algos grpo --out "$out/r2/fast-wide" \
      "algorithm.task_bounds={lab2-easy: [0.4, 0.4], lab2-hard: [0.1, 0.1]}"
    ;;
  *) echo "unknown round $round" >&2; exit 2 ;;
esac
