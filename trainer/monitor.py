"""Monitoring: loss/grad-norm spike detector, MFU, and the stats-step measurements."""
from __future__ import annotations

import contextlib
import logging
import math
import time
import types
from collections import deque
from typing import NamedTuple, Optional

import torch


log = logging.getLogger("nanonorm.train")


class StatsInputs(NamedTuple):
    """What a stats step hands to the stats record: its last micro-batch, its per-block grad norms
    (pre-clip) and each optimizer group's relative step ||dW||/||W|| (update_ratio/*, filled after the step)."""
    x: torch.Tensor
    y: torch.Tensor
    block_grad_norms: dict
    update_ratios: dict


def _fmean(xs):
    f = [x for x in xs if math.isfinite(x)]
    return sum(f) / len(f) if f else float("nan")


def train_record(s: int, batch_tokens: int, h: dict, elapsed: float, timed: int, world: int,
                 flops_per_token, peak: Optional[float], spike_counts: dict) -> dict:
    """The `train` record of a logging step from the host values `h` (read_host) of its interval:
    `elapsed` seconds over `timed` steps (throughput and MFU null when none was timed). `flops_per_token`:
    (nanoGPT's 6N + 12LdT, llm.c's causal 6N + 6LdT): `mfu` in the first convention, `mfu_causal` in the
    second (a plain number: both)."""
    fpt, fpt_causal = flops_per_token if isinstance(flops_per_token, tuple) else (flops_per_token,) * 2
    tps = timed * batch_tokens / max(elapsed, 1e-9) if timed else None
    return {"kind": "train", "step": s, "tokens": s * batch_tokens, "loss": _fmean(h["loss"]),
            "loss_max": _fmean(h["loss_max"]), "lr": h["lr"][0], "grad_norm": _fmean(h["grad_norm"]),
            "tokens_per_s": tps, "step_time": elapsed / timed if timed else None,
            "mfu": mfu(fpt, tps / world, peak) if timed else None,
            "mfu_causal": mfu(fpt_causal, tps / world, peak) if timed else None,
            "skipped_steps": int(h["skipped"][0]), **spike_counts}


class SpikeDetector:
    """A spike = a value more than k standard deviations above the mean of the previous `window` values.

    Non-finite values (skipped steps) are ignored. Every finite value, spike or not, enters the window:
    a lasting jump therefore stops counting as spikes once the window has absorbed it.
    """

    def __init__(self, window: int = 50, k: float = 6.0, min_history: int = 20):
        self.k, self.min_history = k, min_history
        self.values: deque = deque(maxlen=window)
        self.count = 0

    def update(self, value: float) -> Optional[float]:
        """Feed one value; returns its z-score if it is a spike, else None."""
        if not math.isfinite(value):
            return None
        z = None
        n = len(self.values)
        if n >= self.min_history:
            mean = sum(self.values) / n
            std = math.sqrt(sum((v - mean) ** 2 for v in self.values) / (n - 1))
            std = max(std, 1e-8 * max(1.0, abs(mean)))  # a flat window: any clear jump is a spike
            zz = (value - mean) / std
            if zz > self.k:
                z = zz
                self.count += 1
        self.values.append(value)
        return z

    def state_dict(self) -> dict:
        return {"values": list(self.values), "count": self.count}

    def load_state_dict(self, d: dict) -> None:
        self.values.clear()
        self.values.extend(d["values"])
        self.count = d["count"]


class Spikes:
    """The run's two spike detectors (loss and grad norm, `logging.spike_*`) and their records."""

    METRICS = ("loss", "grad_norm")

    def __init__(self, log_cfg):
        self.detectors = {m: SpikeDetector(log_cfg.spike_window, log_cfg.spike_k, log_cfg.spike_min_history)
                          for m in self.METRICS}

    def update(self, first_step: int, batch_tokens: int, **values: list) -> list[dict]:
        """Feed the per-step values of steps first_step, first_step+1, ...; the spike records they make."""
        out = []
        for i in range(len(values["loss"])):
            for m in self.METRICS:
                z = self.detectors[m].update(values[m][i])
                if z is not None:
                    s = first_step + i
                    out.append({"kind": "spike", "step": s, "tokens": s * batch_tokens, "metric": m,
                                "value": values[m][i], "z": z})
                    log.warning(f"spike in {m} at step {s}: {values[m][i]:.4g} (z={z:.1f})")
        return out

    def counts(self) -> dict:
        return {f"spikes_{m}": d.count for m, d in self.detectors.items()}

    def state_dict(self) -> dict:
        return {f"spike_{m}": d.state_dict() for m, d in self.detectors.items()}

    def load_state_dict(self, state: dict) -> None:
        for m, d in self.detectors.items():
            d.load_state_dict(state[f"spike_{m}"])


def read_host(**tensors: torch.Tensor) -> dict:
    """Named device tensors on the host as lists, through one device-to-host copy (one sync)."""
    flat = [t.detach().float().reshape(-1) for t in tensors.values()]
    values = torch.cat(flat).tolist() if flat else []
    out, i = {}, 0
    for name, t in zip(tensors, flat):
        out[name], i = values[i:i + t.numel()], i + t.numel()
    return out


# Dense (no sparsity) peak FLOP/s by the exact name torch reports, from the vendor datasheets, per
# autocast precision; fp32 means TF32 matmuls. Exact names: the PCIe and NVL parts of a generation
# are slower than its SXM part, and a substring match would give them the SXM peak.
_A100 = {"bf16": 312e12, "fp16": 312e12, "fp32": 156e12}
_H_SXM = {"bf16": 989e12, "fp16": 989e12, "fp32": 494e12}
_H_NVL = {"bf16": 835e12, "fp16": 835e12, "fp32": 418e12}
PEAK_FLOPS = {
    "NVIDIA A100-SXM4-40GB": _A100, "NVIDIA A100-SXM4-80GB": _A100, "NVIDIA A100-SXM-80GB": _A100,
    "NVIDIA A100-PCIE-40GB": _A100, "NVIDIA A100 80GB PCIe": _A100,
    "NVIDIA H100 80GB HBM3": _H_SXM, "NVIDIA H100 PCIe": {"bf16": 756e12, "fp16": 756e12, "fp32": 378e12},
    "NVIDIA H100 NVL": _H_NVL, "NVIDIA H200": _H_SXM, "NVIDIA H200 NVL": _H_NVL, "NVIDIA GH200 480GB": _H_SXM,
}
_warned: set = set()


def peak_flops(device: torch.device, precision: str) -> Optional[float]:
    """Peak FLOP/s of one device, or None where unknown (CPU, GPUs not in PEAK_FLOPS): MFU is then null."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    if name not in PEAK_FLOPS:
        if name not in _warned:
            _warned.add(name)
            log.warning(f"MFU not reported: GPU {name!r} is not in trainer/monitor.py PEAK_FLOPS "
                        f"(add its dense peak FLOP/s under that exact name)")
        return None
    return PEAK_FLOPS[name][precision]


class IntervalTimer:
    """Wall time of the training steps in a logging interval, less the work excluded from it
    (evaluation, stats, checkpoints, the compiling first step).

    The host runs ahead of the GPU, so a region's first host sync waits for the training steps
    still queued before it: `sync` (torch.cuda.synchronize on CUDA) at both ends of every excluded
    region and of the interval puts that wait in the interval, where it belongs, instead of in the
    excluded time (which would overstate tokens/s and MFU). At most a few syncs per interval, at
    steps that sync anyway.
    """

    def __init__(self, sync=None, clock=time.perf_counter):
        self.sync, self.clock = sync or (lambda: None), clock
        self.start()

    def start(self) -> None:
        self.sync()
        self.t0, self.excluded, self.steps = self.clock(), 0.0, 0

    @contextlib.contextmanager
    def exclude(self):
        """`with timer.exclude() as region:` ...; region.seconds is the region's own time."""
        self.sync()
        region = types.SimpleNamespace(seconds=0.0)
        e0 = self.clock()
        try:
            yield region
        finally:
            self.sync()
            region.seconds = self.clock() - e0
            self.excluded += region.seconds

    def step(self, fn, apart: bool = False):
        """(fn(), None) counted as one timed step; `apart` (a compiling first step): (fn(), its seconds),
        timed on its own and excluded from the interval."""
        if not apart:
            self.steps += 1
            return fn(), None
        with self.exclude() as region:
            out = fn()
        return out, region.seconds

    def read(self) -> tuple:
        """(seconds of the timed steps, number of timed steps) since start()."""
        self.sync()
        return self.clock() - self.t0 - self.excluded, self.steps


def mfu(flops_per_token: float, tokens_per_s_per_device: float, peak: Optional[float]) -> Optional[float]:
    if peak is None or tokens_per_s_per_device <= 0:
        return None
    return flops_per_token * tokens_per_s_per_device / peak


@torch.no_grad()
def block_grad_norms(blocks: list) -> dict:
    """'grad_norm/block{i}': L2 norm of block i's gradients (before clipping)."""
    out = {}
    for i, b in enumerate(blocks):
        grads = [p.grad for p in b.parameters() if p.grad is not None]
        if grads:
            out[f"grad_norm/block{i}"] = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    return out


@torch.no_grad()
def stats_values(model, x: torch.Tensor, y: torch.Tensor, autocast, extra: dict) -> dict:
    """A stats record's values: the stream's geometry (model/geometry.py: residual RMS, effective angle,
    relative update, ||F||/||h|| and ||dL/dh|| per sublayer, from an extra eval-mode forward and
    backward of (x, y)), the sphere family's norm_stats(), and `extra` (per-block grad norms, per-group
    ||dW||/||W||), read to the host in one go."""
    from model.geometry import stream_geometry

    model.eval()
    model.set_stats_tracking(True)
    with autocast():
        geometry = stream_geometry(model, x, y)
    stats = {**geometry, **extra, **model.norm_stats()}
    model.set_stats_tracking(False)
    model.train()
    keys = list(stats)
    return dict(zip(keys, torch.stack([stats[k].detach().float().reshape(()) for k in keys]).tolist()))
