"""eval.py's and sample.py's view of the runtime (device, rank, precision; set up by
trainer.distributed, as training's) and their CPU thread count."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from trainer import distributed


@dataclass
class Runtime:
    device: torch.device
    rank: int = 0
    world_size: int = 1
    precision: str = "fp32"  # bf16 | fp16 | fp32, as train.precision

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def ptdtype(self) -> torch.dtype:
        return distributed.PRECISIONS[self.precision]

    def autocast(self):
        """bf16/fp16 autocast (as in training); a no-op in fp32."""
        return distributed.autocast(self.device, self.precision)()

    @property
    def cache_dtype(self):
        return None if self.precision == "fp32" else self.ptdtype


def cpu_threads(requested=None) -> int:
    """Threads for torch on CPU: `requested`, else OMP_NUM_THREADS when set, else the cores not busy with
    other work (usable cores minus the 1-minute load average, at least 1). torch's default, every core,
    oversubscribes a loaded machine: token-by-token decoding then runs 100x slower than on one thread."""
    if requested is not None:
        return int(requested)
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores - round(os.getloadavg()[0]))


def set_cpu_threads(requested, device: torch.device) -> tuple[int, int]:
    """Apply cpu_threads() when running on CPU. Returns (threads now, threads before) so that an
    in-process caller can restore torch's setting."""
    before = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads(requested))
    return torch.get_num_threads(), before


def setup(device: str = "auto", precision: str = "auto") -> Runtime:
    """Single process, or one rank of torchrun (its local rank's GPU; NCCL on CUDA, gloo on CPU):
    trainer.distributed's set-up, as train.py's. `precision`: a valid name (see precision_name)."""
    d = distributed.init_distributed(device, key="device")
    return Runtime(d.device, d.rank, d.world_size, distributed.resolve_precision(precision, d.device))


def teardown() -> None:
    distributed.teardown()
