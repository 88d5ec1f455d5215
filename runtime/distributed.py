"""The runtime set-up shared by train.py, eval.py and sample.py: device, precision, the torchrun
process group (NCCL on CUDA, gloo on CPU), CPU threads, and the few collectives the training loop needs."""
from __future__ import annotations

import contextlib
import datetime
import logging
import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from common import ConfigError, UserError

from .launch import TORCH_NAMES, env_rank, precision_name  # noqa: F401  (env_rank: the rank before a process group exists)

log = logging.getLogger("nanonorm.train")


@dataclass(frozen=True)
class Runtime:
    """This process's place in the job and how it computes."""
    device: torch.device
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    precision: str = "fp32"  # bf16 | fp16 | fp32 (resolved; see resolve_precision)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def ptdtype(self) -> torch.dtype:
        return PRECISIONS[self.precision]

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16/fp16 autocast of a forward pass; a no-op in fp32."""
        return autocast(self.device, self.precision)()

    @property
    def cache_dtype(self):
        """The KV cache's dtype when sampling: the autocast dtype, or None (the model's) in fp32."""
        return None if self.precision == "fp32" else self.ptdtype



# Collectives of the training loop: a rank stuck for longer is a hang, and NCCL's watchdog ends the job.
PG_TIMEOUT = datetime.timedelta(minutes=30)
# Ranks > 0 waiting for rank 0 to prepare a dataset: streaming FineWeb-Edu's sample-10BT takes hours.
# (If rank 0 fails, torchrun stops the other ranks at once; they do not wait this long.)
WAIT_TIMEOUT = datetime.timedelta(hours=48)
_wait_group = None


def init_process_group(device: torch.device) -> None:
    """The default group (NCCL on CUDA, gloo on CPU; PG_TIMEOUT) and a gloo group for long waits."""
    global _wait_group
    cuda = device.type == "cuda"
    dist.init_process_group(backend="nccl" if cuda else "gloo", timeout=PG_TIMEOUT,
                            device_id=device if cuda else None)
    # A gloo barrier is a plain TCP wait on the CPU: no NCCL watchdog, and its own timeout.
    _wait_group = dist.new_group(backend="gloo", timeout=WAIT_TIMEOUT)


def resolve_device(name: str, local_rank: int = 0, key: str = "train.device") -> torch.device:
    """`auto` (CUDA when torch sees a GPU, else CPU), `cpu`, `cuda` (this process's local rank's GPU)
    or `cuda:N`. A GPU asked for where there is none: one-line ConfigError naming `key`."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"bad config {key}={name!r}: valid: auto, cpu, cuda, cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"bad config {key}={name!r}: torch sees no CUDA device here; valid: auto, cpu")
        device = torch.device("cuda", local_rank if device.index is None else device.index)
    elif device.type != "cpu":
        raise ConfigError(f"bad config {key}={name!r}: valid: auto, cpu, cuda, cuda:N")
    return device


def init_distributed(device_pref: str = "auto", key: str = "train.device", precision: str = "fp32") -> Runtime:
    """Initialise from torchrun's env vars (RANK, LOCAL_RANK, WORLD_SIZE); single process otherwise.
    Under torchrun each rank takes its local rank's GPU. `precision`: a valid name (see precision_name)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = env_rank(), int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_pref, local_rank, key)
    if device.type == "cuda":
        if world > 1:
            device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        init_process_group(device)
    return Runtime(device, rank, local_rank, world, resolve_precision(precision, device))


# --- precision -----------------------------------------------------------------------------------

PRECISIONS = {name: getattr(torch, torch_name) for name, torch_name in TORCH_NAMES.items()}


def resolve_precision(name: str, device: torch.device) -> str:
    """bf16 | fp16 | fp32 for a valid `name` (see precision_name); `auto` is bf16 on a CUDA device
    that supports it, else fp32. Training and evaluation both resolve it here."""
    canonical = precision_name(name)
    if canonical is None:  # a bug: config parsing validates the name first
        raise ValueError(f"unvalidated precision {name!r}")
    if canonical == "auto":
        return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    return canonical


def autocast(device: torch.device, precision: str) -> Callable[[], contextlib.AbstractContextManager]:
    """A factory of the forward pass's context: autocast to bf16/fp16, nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext
    dtype = PRECISIONS[precision]
    return lambda: torch.autocast(device.type, dtype=dtype)


def wait_group():
    """The gloo group with WAIT_TIMEOUT (None, i.e. the default group, if another caller set up torch.distributed)."""
    return _wait_group


class RankZeroFailed(UserError):
    """Rank 0 failed in a step the other ranks were waiting on; its own error is printed above."""


@contextlib.contextmanager
def main_step(what: str):
    """`with main_step("preparing the data"):` around work that rank 0 alone does while the others wait (on
    the gloo group, up to WAIT_TIMEOUT). Rank 0 runs the body and tells the others whether it succeeded;
    the other ranks skip the body and, if rank 0 failed, stop with one line naming the cause (RankZeroFailed,
    exit 2) instead of a collective's traceback when rank 0's process goes. Use it as
    `with main_step(w) as run: if run: ...`: `run` is True on rank 0 (and without a process group)."""
    if not dist.is_initialized():
        yield True
        return
    rank, box = dist.get_rank(), [None]
    if rank == 0:
        try:
            yield True
        except BaseException as e:
            box[0] = type(e).__name__
            dist.broadcast_object_list(box, src=0, group=_wait_group)
            raise
        dist.broadcast_object_list(box, src=0, group=_wait_group)
        return
    yield False
    dist.broadcast_object_list(box, src=0, group=_wait_group)
    if box[0] is not None:
        raise RankZeroFailed(f"rank 0 failed while {what} ({box[0]}; its error is printed above); rank {rank} "
                             "stops with it")


def main_first(fn, what: str = "preparing the data"):
    """fn() on rank 0, then on the other ranks, which find rank 0's work done (data preparation:
    the others then only read the prepared files). They wait on the gloo group, up to WAIT_TIMEOUT:
    a barrier on the default group would end the job after PG_TIMEOUT (NCCL's watchdog). If rank 0
    fails, each other rank stops with one line (main_step)."""
    out = None
    with main_step(what) as run:
        if run:
            out = fn()
    return out if not dist.is_initialized() or dist.get_rank() == 0 else fn()


def configure_torch(device: torch.device, threads=None, deterministic: bool = False, flush_denormal=False) -> None:
    """Threads (None: torch's), deterministic kernels, subnormals flushed on CPU, and TF32 matmuls on CUDA."""
    if threads is not None:
        torch.set_num_threads(threads)
    if flush_denormal and device.type == "cpu":
        if not torch.set_flush_denormal(True):
            log.warning("train.flush_denormal: this CPU cannot flush subnormal floats; running with them")
        elif not flushing_denormals(every_thread=True):
            # the flag is per thread; threads started later inherit it, a pool started before does not
            log.warning("train.flush_denormal: torch's CPU threads started before it was set keep their "
                        "subnormals; set it in a fresh process (train.py) or with train.threads=1")
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def flushing_denormals(every_thread: bool = False) -> bool:
    """Whether CPU ops flush subnormal floats to zero now (torch has a setter only): in this thread, or in
    every thread of torch's pool (an op large enough to be split over all of them; starts the pool)."""
    # made from their bits (~1.5e-39 each): made from a float, they would already be flushed
    x = torch.full(((1 << 20) if every_thread else 1,), 1 << 20, dtype=torch.int32).view(torch.float32)
    return bool(((x * 1.0) == 0).all())


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
    """Apply cpu_threads() when running on CPU (eval.py, sample.py). Returns (threads now, threads
    before) so that an in-process caller can restore torch's setting."""
    before = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads(requested))
    return torch.get_num_threads(), before


def teardown() -> None:
    global _wait_group
    if dist.is_initialized():
        dist.destroy_process_group()
    _wait_group = None


def barrier() -> None:
    """Wait for every rank on the gloo group (WAIT_TIMEOUT): after a checkpoint save, which on a slow file
    system can outlast the NCCL watchdog that a barrier on the default group would trip."""
    if dist.is_initialized():
        dist.barrier(group=_wait_group)


def all_reduce_(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
    return t


def all_reduce_async(t: torch.Tensor, op: str, group):
    """Start an all-reduce and return its work handle (call .wait() before reading `t`)."""
    return dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op], group=group,
                           async_op=True)


def new_cpu_group():
    """A gloo group over all ranks, for small CPU-side collectives that must not wait on the GPU stream."""
    return dist.new_group(backend="gloo")


def gather_objects(obj):
    """Every rank's `obj` as a list (on every rank); [obj] without a process group."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj, src: int = 0):
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
