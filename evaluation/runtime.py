"""Device, precision and torch.distributed plumbing shared by eval.py and sample.py."""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Runtime:
    device: torch.device
    rank: int = 0
    world_size: int = 1
    ptdtype: torch.dtype = torch.float32

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def autocast(self):
        """bf16/fp16 autocast on CUDA (as in training); a no-op in float32."""
        if self.ptdtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.ptdtype)

    @property
    def cache_dtype(self):
        return None if self.ptdtype == torch.float32 else self.ptdtype


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    from .config import EvalConfigError  # a ValueError: sample.py and eval.py both report it in one line

    try:
        dev = torch.device(name)
    except RuntimeError:
        raise EvalConfigError(f"bad device {name!r}: valid: auto, cpu, cuda, cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EvalConfigError(f"bad device {name!r}: CUDA is not available here; use --device cpu or auto")
    return dev


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    if name not in DTYPES:
        raise ValueError(f"dtype={name!r}: valid are auto, {', '.join(DTYPES)}")
    return DTYPES[name]


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


def setup(device: str = "auto", dtype: str = "auto") -> Runtime:
    """Single process, or one rank of torchrun (RANK/WORLD_SIZE/LOCAL_RANK set): NCCL on CUDA, gloo on CPU."""
    if "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", "0"))
        dev = resolve_device(device)
        if dev.type == "cuda":
            dev = torch.device("cuda", local)
            torch.cuda.set_device(dev)
        if not dist.is_initialized():
            from trainer.distributed import init_process_group

            init_process_group(dev)
        return Runtime(dev, rank, world, resolve_dtype(dtype, dev))
    dev = resolve_device(device)
    return Runtime(dev, 0, 1, resolve_dtype(dtype, dev))


def teardown() -> None:
    from trainer.distributed import teardown

    teardown()
