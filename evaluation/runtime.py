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
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but CUDA is not available; use device=cpu or auto")
    return dev


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    if name not in DTYPES:
        raise ValueError(f"dtype={name!r}: valid are auto, {', '.join(DTYPES)}")
    return DTYPES[name]


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
