"""AdamW with decay on matrices only, and the LR schedules (cosine, wsd, constant).

The LR lives in a 0-dim tensor computed on the device from a device-side count of applied updates,
so a skipped (non-finite) step leaves the schedule where it was without a host sync.
"""
from __future__ import annotations

import math

import torch

from .config import OptimConfig


def fused_supported(device: torch.device) -> bool:
    # torch ships fused AdamW kernels for CUDA and CPU (>= 2.4); others fall back to the for-loop path.
    return device.type in ("cuda", "cpu") and hasattr(torch, "_fused_adamw_")


def build_optimizer(model: torch.nn.Module, ocfg: OptimConfig, device: torch.device) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    fused = fused_supported(device) if ocfg.fused == "auto" else bool(ocfg.fused)
    lr = torch.tensor(ocfg.lr, dtype=torch.float32, device=device)  # shared by both groups, filled each step
    groups = [{"params": decay, "weight_decay": ocfg.weight_decay, "lr": lr},
              {"params": no_decay, "weight_decay": 0.0, "lr": lr}]
    kw = {"fused": True} if fused else {"foreach": False}  # tensor LR needs fused or the for-loop path
    opt = torch.optim.AdamW(groups, lr=lr, betas=tuple(ocfg.betas), eps=ocfg.eps, **kw)
    opt.lr_tensor = lr
    opt.is_fused = fused
    return opt


def attach_lr(opt: torch.optim.Optimizer) -> None:
    """After load_state_dict (which copies the saved LR into each group), share lr_tensor again."""
    for g in opt.param_groups:
        g["lr"] = opt.lr_tensor


class LRSchedule:
    """lr(u) for u = number of applied updates. Same formula on tensors (hot path) and floats."""

    def __init__(self, ocfg: OptimConfig, max_steps: int):
        self.kind, self.lr, self.min_lr = ocfg.schedule, ocfg.lr, ocfg.min_lr
        self.warmup, self.max_steps = ocfg.warmup_steps, max_steps
        self.decay_start = max_steps - max(1, round(ocfg.decay_frac * max_steps))

    def __call__(self, u):
        """`u` a float or a float64 tensor; returns the same kind."""
        t = torch if isinstance(u, torch.Tensor) else None
        clamp = (lambda x, lo, hi: x.clamp(lo, hi)) if t else (lambda x, lo, hi: min(max(x, lo), hi))
        where = t.where if t else (lambda c, a, b: a if c else b)
        warm = self.lr * (u + 1) / (self.warmup + 1)  # nanoGPT: never exactly 0
        if self.kind == "constant":
            main = u * 0 + self.lr
        elif self.kind == "cosine":
            span = max(1, self.max_steps - self.warmup)
            r = clamp((u - self.warmup) / span, 0.0, 1.0)
            cos = t.cos(math.pi * r) if t else math.cos(math.pi * r)
            main = self.min_lr + 0.5 * (1.0 + cos) * (self.lr - self.min_lr)
        else:  # wsd: warmup, stable at lr, then linear decay to min_lr over the last decay_frac
            span = max(1, self.max_steps - self.decay_start)
            r = clamp((u - self.decay_start) / span, 0.0, 1.0)
            main = self.lr + r * (self.min_lr - self.lr)
        return where(u < self.warmup, warm, main)
