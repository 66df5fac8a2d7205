#!/usr/bin/env bash
# The first pace-lab results (issue 14 section 4): 11 algorithms x 5 seeds on the `lab` preset
# (tiny model, 200 steps each), two runs at a time, then the compare report in runs/.
# Resumable: run it again and finished runs are skipped, interrupted ones resumed.
#   bash experiments/pace_lab/run.sh            # from the repository root
# Overrides: audit.every=10 logs the polarity audit (audit/* keys) every 10 steps;
# log.report=false skips each run's own report (the grid's report is written at the end).
set -euo pipefail
cd "$(dirname "$0")/../.."
ALGOS=grpo,eppo,eppo-global,eppo-notrend,eppo-success,eppo-rewardvar,papo,eppo+papo,dcpo,bapo,clip_cov
exec entropace compare --preset lab --algos "$ALGOS" --seeds "${SEEDS:-5}" \
  --out experiments/pace_lab/runs --jobs "${JOBS:-2}" --last-k 20 \
  audit.every=10 log.report=false "$@"
