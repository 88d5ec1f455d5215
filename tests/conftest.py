"""Test-wide settings: never talk to wandb's servers, one CPU thread, the repo importable from any cwd."""
import os
import sys
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
# Tiny models gain nothing from a second thread, and subprocess tests (torchrun, CLI) run several
# processes on 2 cores: OpenMP threads spinning against each other make them ~10-50x slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

torch.set_num_threads(1)
