#!/usr/bin/env bash
# The axes study (docs/axes_study.md): every part, then docs/axes/{tables.md,axes.png}.
# ~80 min on 2 CPU cores (two runs at a time, one thread each); rerun to resume, finished runs are skipped.
#   bash scripts/run_axes_study.sh                        # everything
#   bash scripts/run_axes_study.sh -- train.max_steps=8   # a quick check (any override): runs/axes-custom
set -euo pipefail
cd "$(dirname "$0")/.."
export WANDB_MODE="${WANDB_MODE:-disabled}"
roots=()  # study.py's defaults unless set: runs and docs, or with overrides a scratch dir of their own
[ -n "${RUNS_ROOT:-}" ] && roots+=(--runs-root "$RUNS_ROOT")
[ -n "${DOCS:-}" ] && roots+=(--docs "$DOCS")
exec "${PYTHON:-python}" scripts/study.py axes "${roots[@]}" "$@"
