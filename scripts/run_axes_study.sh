#!/usr/bin/env bash
# The axes study (docs/axes_study.md): every part, then docs/axes/{tables.md,axes.png}.
# ~80 min on 2 CPU cores (two runs at a time, one thread each); rerun to resume, finished runs are skipped.
#   bash scripts/run_axes_study.sh                        # everything
#   bash scripts/run_axes_study.sh -- train.max_steps=8   # a quick check of the machinery (any override)
set -euo pipefail
cd "$(dirname "$0")/.."
export WANDB_MODE="${WANDB_MODE:-disabled}"
exec "${PYTHON:-python}" scripts/study.py axes --runs-root "${RUNS_ROOT:-runs}" --docs "${DOCS:-docs}" "$@"
