"""Monitoring: loss/grad-norm spike detector, MFU, and the stats-step measurements."""
from __future__ import annotations

import math
from collections import deque
from typing import Optional

import torch


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


# Dense peak FLOP/s per GPU (vendor datasheets, SXM parts) by autocast precision; fp32 means TF32 matmuls.
PEAK_FLOPS = {
    "A100": {"bf16": 312e12, "fp16": 312e12, "fp32": 156e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "fp32": 494e12},
    "H200": {"bf16": 989e12, "fp16": 989e12, "fp32": 494e12},
}


def peak_flops(device: torch.device, precision: str) -> Optional[float]:
    """Peak FLOP/s of one device, or None where unknown (CPU, other GPUs): MFU is then null."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).upper()
    for key in ("H200", "H100", "A100"):  # H200 first: its name may not contain "H100"
        if key in name:
            return PEAK_FLOPS[key][precision]
    return None


def mfu(flops_per_token: float, tokens_per_s_per_device: float, peak: Optional[float]) -> Optional[float]:
    if peak is None or tokens_per_s_per_device <= 0:
        return None
    return flops_per_token * tokens_per_s_per_device / peak


@torch.no_grad()
def residual_rms(hidden: list) -> dict:
    """'rms/{j}': RMS of the residual stream after the input step (j=0) and after every sublayer."""
    return {f"rms/{j}": h.float().pow(2).mean().sqrt() for j, h in enumerate(hidden)}


@torch.no_grad()
def block_grad_norms(blocks: list) -> dict:
    """'grad_norm/block{i}': L2 norm of block i's gradients (before clipping)."""
    out = {}
    for i, b in enumerate(blocks):
        grads = [p.grad for p in b.parameters() if p.grad is not None]
        if grads:
            out[f"grad_norm/block{i}"] = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    return out
