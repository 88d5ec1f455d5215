#!/usr/bin/env bash
# The fidelity study (docs/fidelity_study.md, configs/study/fidelity.yaml): every part, then every figure
# and table under docs/fidelity/. ~2.5 h on 2 CPU cores (two runs at a time, one thread each); rerun to
# resume, finished runs are skipped.
#   bash scripts/run_fidelity_study.sh                       # everything
#   bash scripts/run_fidelity_study.sh -- train.max_steps=8  # a quick check (any override): runs/fidelity-custom
#   RUNS_ROOT=/tmp/runs DOCS=/tmp/docs bash scripts/run_fidelity_study.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export WANDB_MODE="${WANDB_MODE:-disabled}"
roots=()  # study.py's defaults unless set: runs and docs, or with overrides a scratch dir of their own
[ -n "${RUNS_ROOT:-}" ] && roots+=(--runs-root "$RUNS_ROOT")
[ -n "${DOCS:-}" ] && roots+=(--docs "$DOCS")
exec "${PYTHON:-python}" scripts/study.py fidelity "${roots[@]}" "$@"
