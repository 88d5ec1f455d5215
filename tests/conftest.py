"""Test-wide settings: never talk to wandb's servers, one CPU thread.

The packages are imported as installed (`pip install -e .[dev]`, see the README).
"""
import os

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
# Tiny models gain nothing from a second thread, and subprocess tests (torchrun, CLI) run several
# processes on 2 cores: OpenMP threads spinning against each other make them ~10-50x slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402  (after OMP_NUM_THREADS is set)

torch.set_num_threads(1)
