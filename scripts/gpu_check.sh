#!/usr/bin/env bash
# Run this first on a GPU machine: it exercises what the CPU test suite cannot (bf16 + torch.compile
# for every variant, the neox block in fp16, fused AdamW's NaN skip, the training loop in bf16 and fp16,
# NCCL and DDP accumulation with 2 GPUs, throughput, MFU and memory per variant family and model preset,
# 50 steps of each paper experiment). The list is in scripts/gpu_check.py (the checks themselves:
# experiments/gpu_checks.py); --only picks checks.
# Prints a table; exits 1 if any check failed. Options go to scripts/gpu_check.py (--help).
# Runs from the repository root with `python -m`, so it checks this checkout's code.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader || true
fi
export WANDB_MODE=disabled
exec python -m scripts.gpu_check "$@"
