"""What train.py needs before torch is imported: this process's rank as the launcher set it, and the
Hydra arguments of that rank. (Kept free of torch, so `--help` and config errors answer quickly.)"""
from __future__ import annotations

import os


def env_rank() -> int:
    """This process's global rank as torchrun/SLURM set it, before any process group exists."""
    return int(os.environ.get("RANK", "0"))


def hydra_argv_for_rank(argv: list[str], rank: int) -> list[str]:
    """Only rank 0 writes Hydra's files (.hydra/, train.log) in the shared run dir.

    The run dir itself comes from `out_dir` (no timestamps), so every rank resolves the same path.
    """
    if rank == 0:
        return argv
    extra = ["hydra.output_subdir=null", "hydra/job_logging=stdout"]
    return argv + [a for a in extra if a.split("=")[0] not in {x.split("=")[0] for x in argv}]
