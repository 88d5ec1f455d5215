"""What the entry points need before torch is imported: this process's rank as the launcher set it, the
Hydra arguments of that rank, and the precision names. (Kept free of torch, so `--help` and config
errors answer quickly.)"""
from __future__ import annotations

import os


def env_rank() -> int:
    """This process's global rank as torchrun/SLURM set it, before any process group exists."""
    return int(os.environ.get("RANK", "0"))


def hydra_argv_for_rank(argv: list[str], rank: int) -> list[str]:
    """Hydra writes nothing into the run dir: no .hydra/ and no train.log file handler at start-up, on any
    rank. A refused command (a bad value, a run dir another process holds) must leave a run's records as they
    were; rank 0 writes both itself once the config is accepted and the run dir's lock is held
    (trainer/sinks.py: open_run_sinks). `rank` is kept for callers; every rank gets the same arguments.

    The run dir itself comes from `out_dir` (no timestamps), so every rank resolves the same path.
    """
    extra = ["hydra.output_subdir=null", "hydra/job_logging=stdout"]
    given = {x.split("=")[0] for x in argv}
    # first, before the user's arguments: Hydra's flags (--cfg job) take no overrides after them
    return argv[:1] + [a for a in extra if a.split("=")[0] not in given] + argv[1:]


# train.precision and eval's/sample's --dtype: one set of names (their torch dtypes: runtime.distributed).
TORCH_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # torch's names, accepted by eval/sample
PRECISION_CHOICES = ("auto", *TORCH_NAMES)
_ALIASES = {torch_name: name for name, torch_name in TORCH_NAMES.items()}


def precision_name(name) -> str | None:
    """The canonical name (auto, bf16, fp16, fp32) of `name` or of its torch alias; None if neither."""
    name = _ALIASES.get(name, name) if isinstance(name, str) else name
    return name if name in PRECISION_CHOICES else None
