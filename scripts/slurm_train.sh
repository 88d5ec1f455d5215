#!/usr/bin/env bash
# SLURM launcher: one torchrun per node, c10d rendezvous on the first node; extra args are Hydra overrides.
#
#   sbatch --nodes=4 --gpus-per-node=8 scripts/slurm_train.sh norm=geonorm model=gpt_125m data=fineweb_edu
#
# Pre-emption: SLURM sends SIGUSR1 120 s before the time limit (--signal below) to every process of the
# step; train.py checkpoints within two steps (docs/training.md: "Pre-emption grace period") and exits 0; the job
# then requeues itself and train.resume=auto continues from the newest checkpoint (also after a crash
# or a manual requeue).
# torchrun itself would die on SIGUSR1, so it is started with SIGUSR1 ignored (the Python workers
# install their own handler, which replaces the inherited "ignore").
#SBATCH --job-name=nanonorm
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --time=24:00:00
#SBATCH --signal=USR1@120
#SBATCH --requeue
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail

cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
GPUS_PER_NODE=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-8}}
NNODES=${SLURM_JOB_NUM_NODES:-1}
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=${MASTER_PORT:-29500}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
export WANDB_MODE=${WANDB_MODE:-offline}

echo "nanonorm: $NNODES node(s) x $GPUS_PER_NODE GPU(s), rendezvous $MASTER_ADDR:$MASTER_PORT, args: $*"
set +e
srun --kill-on-bad-exit=1 bash -c "trap '' USR1; exec torchrun \
    --nnodes=$NNODES --nproc_per_node=$GPUS_PER_NODE \
    --rdzv_id=${SLURM_JOB_ID} --rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT \
    train.py train.resume=auto $(printf '%q ' "$@")"
rc=$?
set -e

# Finished runs end with a summary line in metrics.jsonl; anything else (pre-empted) is requeued.
RUN_DIR=$(python train.py "$@" --cfg job --resolve 2>/dev/null | sed -n 's/^out_dir: //p' | head -n 1)
if [ $rc -eq 0 ] && [ -n "$RUN_DIR" ] && ! tail -n 1 "$RUN_DIR/metrics.jsonl" 2>/dev/null | grep -q '"kind": "summary"'; then
    echo "nanonorm: run not finished (pre-empted); requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
fi
exit $rc
