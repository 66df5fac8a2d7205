#!/usr/bin/env bash
# The first pace-lab results (issue 14 section 4): 11 algorithms x 5 seeds on the `lab` preset
# (tiny model, 200 steps each), two runs at a time, then the reports:
#   runs/                     the run directories (local only: checkpoints, full metrics)
#   report/                   the compare report (compare.md/.html/.json, PNGs, grid.json)
#   report/compare_vs_eppo.*  the same tables with paired differences against eppo
#   summary.md                numbers compare does not tabulate (summarize.py)
# Resumable: run it again and finished runs are skipped, interrupted ones resumed.
#   bash experiments/pace_lab/run.sh            # from the repository root; SEEDS=, JOBS= to change
# Overrides: audit.every=10 logs the polarity audit (audit/* keys) every 10 steps;
# log.report=false skips each run's own report (the grid's report is written at the end).
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=experiments/pace_lab
ALGOS=grpo,eppo,eppo-global,eppo-notrend,eppo-success,eppo-rewardvar,papo,eppo+papo,dcpo,bapo,clip_cov
entropace compare --preset lab --algos "$ALGOS" --seeds "${SEEDS:-5}" \
  --out "$HERE/runs" --jobs "${JOBS:-2}" --last-k 20 \
  audit.every=10 log.report=false "$@"
mkdir -p "$HERE/report"
cp "$HERE"/runs/compare.md "$HERE"/runs/compare.html "$HERE"/runs/compare.json \
  "$HERE"/runs/*.png "$HERE"/runs/grid.json "$HERE/report/"
TMP=$(mktemp -d)
python -c "import sys; from entropace.report.compare import write_compare; \
write_compare(sys.argv[1], sys.argv[2], baseline='eppo', last_k=20)" "$HERE/runs" "$TMP"
cp "$TMP/compare.md" "$HERE/report/compare_vs_eppo.md"
cp "$TMP/compare.json" "$HERE/report/compare_vs_eppo.json"
rm -rf "$TMP"
python "$HERE/summarize.py" "$HERE/runs" > "$HERE/summary.md"
echo "reports: $HERE/report/compare.md, $HERE/report/compare_vs_eppo.md, $HERE/summary.md"
