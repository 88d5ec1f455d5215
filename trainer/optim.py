"""AdamW over the model's parameter groups, and the LR schedules (cosine, wsd, constant).

The model says which group each parameter is in (`GPT.parameter_groups`: matrices, embeddings,
vectors, scalars); `optim.groups.<group>` gives each group an lr multiplier and a weight decay.
The LR lives in 0-dim tensors computed on the device from a device-side count of applied updates,
so a skipped (non-finite) step leaves the schedule where it was without a host sync.
"""
from __future__ import annotations

import math

import torch

from .config import OptimConfig


def fused_supported(device: torch.device) -> bool:
    # torch ships fused AdamW kernels for CUDA and CPU (>= 2.4); others fall back to the for-loop path.
    return device.type in ("cuda", "cpu") and hasattr(torch, "_fused_adamw_")


def group_settings(ocfg: OptimConfig) -> dict[str, tuple[float, float]]:
    """group -> (lr_mult, weight_decay); a weight decay left null means `optim.weight_decay`."""
    out = {}
    for name in ocfg.groups.names():
        g = getattr(ocfg.groups, name)
        out[name] = (g.lr_mult, ocfg.weight_decay if g.weight_decay is None else g.weight_decay)
    return out


def build_optimizer(model: torch.nn.Module, ocfg: OptimConfig, device: torch.device) -> torch.optim.AdamW:
    settings = group_settings(ocfg)
    fused = fused_supported(device) if ocfg.fused == "auto" else bool(ocfg.fused)
    lr = torch.tensor(ocfg.lr, dtype=torch.float32, device=device)  # the schedule's LR (logged), filled each step
    groups = []
    for name, named in model.parameter_groups().items():
        if named:  # a variant without scalars has no scalar group
            mult, wd = settings[name]
            groups.append({"params": [p for _, p in named], "weight_decay": wd, "group": name, "lr_mult": mult,
                           "lr": torch.tensor(ocfg.lr * mult, dtype=torch.float32, device=device)})
    kw = {"fused": True} if fused else {"foreach": False}  # tensor LR needs fused or the for-loop path
    opt = torch.optim.AdamW(groups, lr=lr, betas=tuple(ocfg.betas), eps=ocfg.eps, **kw)
    opt.lr_tensor = lr
    opt.group_lrs = [g["lr"] for g in opt.param_groups]
    opt.group_settings = settings
    opt.is_fused = fused
    return opt


def set_lr(opt: torch.optim.Optimizer, lr: torch.Tensor) -> None:
    """Every group's LR = the schedule's LR x its lr_mult, written in place on the device (no sync)."""
    opt.lr_tensor.copy_(lr)
    for g, t in zip(opt.param_groups, opt.group_lrs):
        t.copy_(lr * g["lr_mult"] if g["lr_mult"] != 1.0 else lr)


def attach_lr(opt: torch.optim.Optimizer) -> None:
    """After load_state_dict (which copies the saved hyper-parameters into each group): the groups
    use the optimizer's own LR tensors again, and the configured lr_mult / weight decay."""
    saved = [g.get("group") for g in opt.param_groups]
    for g, t in zip(opt.param_groups, opt.group_lrs):
        g["lr"] = t
    for g, name in zip(opt.param_groups, saved):
        g["lr_mult"], g["weight_decay"] = opt.group_settings[name]


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
