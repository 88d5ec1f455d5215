"""AdamW over the model's parameter groups (the LR schedules are in schedules.py).

The model says which group each parameter is in (`GPT.parameter_groups`: matrices, embeddings,
vectors, scalars); `optim.groups.<group>` gives each group an lr multiplier and a weight decay.
The LR lives in 0-dim tensors computed on the device from a device-side count of applied updates,
so a skipped (non-finite) step leaves the schedule where it was without a host sync.
"""
from __future__ import annotations

import torch

from .config import OptimConfig
from .schedules import LRSchedule  # noqa: F401  (re-exported: the loop builds its schedule here)


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
