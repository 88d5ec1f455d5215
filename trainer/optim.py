"""The optimizers (`optim.name`, picked from OPTIMIZERS) over the model's parameter groups, behind one
small container the loop talks to, `Optimizer` (the LR schedules are in schedules.py).

The model says which group each parameter is in (`GPT.parameter_groups`: matrices, embeddings,
vectors, scalars); `optim.groups.<group>` gives each group an lr multiplier and a weight decay.
The LR lives in 0-dim tensors computed on the device from a device-side count of applied updates,
so a skipped (non-finite) step leaves the schedule where it was without a host sync. A new optimizer
is a class with a `build(model, optim_cfg, device)` returning an `Optimizer`, named with its keys (an
`Options` dataclass extending OptimConfig, the keys every optimizer reads) in optim_options.py (torch-free);
one defined in a user's module is a class under `@OPTIMIZERS.register("name")` carrying its Options.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from common import ConfigError

from .optim_options import (OPTIMIZERS, GroupConfig, GroupsConfig, MuonSettings, OptimConfig,  # noqa: F401
                            flat_schedule, optim_config)  # (re-exported: the config is read from here too)
from .schedules import SCHEDULES, Schedule



class Optimizer:
    """One torch optimizer (or Muon + AdamW) as the loop uses it: `set_lr` writes the schedule's LR
    into every group's LR tensor on the device; `step(bad)` applies the update unless `bad` (a 0-d
    bool tensor: the step was non-finite), without a host sync where the optimizer allows it;
    `state_dict`/`load_state_dict` as torch's (the checkpoint format is the inner optimizer's)."""

    def __init__(self, inner, lr: torch.Tensor, group_lrs: list, settings: dict, fused: bool):
        self.inner, self.lr, self.group_lrs, self.settings, self.fused = inner, lr, group_lrs, settings, fused

    @property
    def param_groups(self) -> list:
        return self.inner.param_groups

    @property
    def state(self):
        return self.inner.state

    def set_lr(self, lr: torch.Tensor) -> None:
        """Every group's LR = the schedule's LR x its lr_mult, written in place on the device (no sync)."""
        self.lr.copy_(lr)
        for g, t in zip(self.param_groups, self.group_lrs):
            t.copy_(lr * g["lr_mult"] if g["lr_mult"] != 1.0 else lr)

    def step(self, bad: Optional[torch.Tensor] = None, scaler=None) -> None:
        """The update, skipped where `bad` is true. fp16 (`scaler`): the scaler skips on inf/NaN itself;
        fused AdamW: `found_inf` skips the whole update on the device; otherwise (for-loop AdamW, Muon)
        one host read per step of the skip flag and the LR, which torch's for-loop code takes as a float
        (a tensor LR there would be read back once per parameter)."""
        if scaler is not None:
            scaler.step(self.inner)
            scaler.update()
        elif bad is None:
            self.inner.step()
        elif self.fused:
            self.inner.found_inf = bad.float()
            self.inner.step()
        else:
            skip, lr = torch.stack([bad.float(), self.lr.float()]).tolist()
            for g in self.param_groups:
                g["lr"] = lr * g["lr_mult"]
            if not skip:
                self.inner.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """torch's load copies the saved hyper-parameters into each group: the groups then use this
        optimizer's LR tensors again, and the configured lr_mult and weight decay."""
        self.inner.load_state_dict(state)
        saved = [g.get("group") for g in self.param_groups]
        for g, t in zip(self.param_groups, self.group_lrs):
            g["lr"] = t
        for g, name in zip(self.param_groups, saved):
            g["lr_mult"], g["weight_decay"] = self.settings[name]


def fused_supported(device: torch.device) -> bool:
    # torch ships fused AdamW kernels for CUDA and CPU (>= 2.4); others fall back to the for-loop path.
    return device.type in ("cuda", "cpu") and hasattr(torch, "_fused_adamw_")


def group_settings(optim_cfg: OptimConfig) -> dict[str, tuple[float, float]]:
    """group -> (lr_mult, weight_decay); a weight decay left null means `optim.weight_decay`."""
    out = {}
    for name in optim_cfg.groups.names():
        g = getattr(optim_cfg.groups, name)
        out[name] = (g.lr_mult, optim_cfg.weight_decay if g.weight_decay is None else g.weight_decay)
    return out


def for_variant(optim_cfg: OptimConfig, variant) -> OptimConfig:
    """The optimizer config with the variant's `optim_overrides` applied (nGPT: no weight decay in any
    group, no warmup). A `weight_decay` override sets every group's decay too."""
    over = dict(getattr(variant, "optim_overrides", {}))
    if not over:
        return optim_cfg
    if "weight_decay" in over:
        wd = over["weight_decay"]
        groups = {
            n: dataclasses.replace(getattr(optim_cfg.groups, n), weight_decay=wd) for n in optim_cfg.groups.names()
        }
        over["groups"] = dataclasses.replace(optim_cfg.groups, **groups)
    return dataclasses.replace(optim_cfg, **over)


def build_optimizer(model: torch.nn.Module, optim_cfg: OptimConfig, device: torch.device) -> Optimizer:
    """The `optim.name` optimizer over the model's parameter groups (an unknown name: one line)."""
    return OPTIMIZERS[optim_cfg.name].build(model, optim_cfg, device)


class AdamW:
    """AdamW over every group (fused where torch has the kernel)."""

    @staticmethod
    def build(model: torch.nn.Module, optim_cfg: OptimConfig, device: torch.device) -> Optimizer:
        opt, lr, fused = build_adamw(model, model.parameter_groups(), optim_cfg, device)
        return Optimizer(opt, lr, [g["lr"] for g in opt.param_groups], group_settings(optim_cfg), fused)


class Muon:
    """Muon for the matrices group, AdamW (its keys: AdamW's) for the rest: MuonAdamW."""

    @staticmethod
    def build(model: torch.nn.Module, optim_cfg: OptimConfig, device: torch.device) -> Optimizer:
        m = MuonAdamW(model, optim_cfg, device)
        return Optimizer(m, m.lr_tensor, m.group_lrs, m.group_settings, fused=False)


def build_adamw(model: torch.nn.Module, named_groups: dict, optim_cfg: OptimConfig,
                device: torch.device) -> tuple[torch.optim.AdamW, torch.Tensor, bool]:
    """(AdamW over `named_groups` with a tensor LR per group, the schedule's LR tensor, fused)."""
    settings = group_settings(optim_cfg)
    fused = fused_supported(device) if optim_cfg.fused == "auto" else bool(optim_cfg.fused)
    lr = torch.tensor(optim_cfg.lr, dtype=torch.float32, device=device)  # the schedule's LR (logged), filled each step
    groups = []
    for name, named in named_groups.items():
        if named:  # a variant without scalars has no scalar group
            mult, wd = settings[name]
            groups.append({"params": [p for _, p in named], "weight_decay": wd, "group": name, "lr_mult": mult,
                           "lr": torch.tensor(optim_cfg.lr * mult, dtype=torch.float32, device=device)})
    kw = {"fused": True} if fused else {"foreach": False}  # tensor LR needs fused or the for-loop path
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(optim_cfg.betas), eps=optim_cfg.eps, **kw), lr, fused


class MuonAdamW:
    """torch.optim.Muon for the `matrices` group and AdamW for every other group, as one optimizer
    (modded-nanogpt's recipe). The loop uses it like AdamW: `param_groups` (with their LR tensors),
    `step`, `zero_grad`, `state_dict`, `load_state_dict`.

    Muon orthogonalizes each weight's update as one matrix, so a weight that stacks several matrices
    (attention's q, k, v rows: `GPT.fused_matrices()`) is handed to Muon as views of its row blocks,
    each with the matching rows of the gradient: Q, K and V are orthogonalized separately, as in the
    speedrun. Muon reads its LR on the host, so a step costs one host sync, and the non-finite guard
    takes the loop's host-checked path (a bad step skips both optimizers). Under DDP the gradients
    are all-reduced first, so every rank computes the same update.
    """

    def __init__(self, model: torch.nn.Module, optim_cfg: OptimConfig, device: torch.device):
        if not hasattr(torch.optim, "Muon"):
            raise ConfigError(f"optim=muon needs torch >= 2.9 (torch.optim.Muon); this is torch {torch.__version__}")
        groups = model.parameter_groups()
        matrices = groups.pop("matrices")
        self.adamw, self.lr_tensor, _ = build_adamw(model, groups, optim_cfg, device)
        self.group_settings = group_settings(optim_cfg)
        mult, wd = self.group_settings["matrices"]
        # Muon's lr follows the schedule's shape: schedule(u) x muon.lr / lr, times the group's lr_mult.
        self.group_settings["matrices"] = (mult * optim_cfg.muon.lr / optim_cfg.lr, wd)
        fused = model.fused_matrices()
        self.splits = []   # (stacked weight, its row-block views)
        params = []
        for _, p in matrices:
            n = fused.get(id(p), 1)
            if n == 1:
                params.append(p)
                continue
            rows = p.shape[0] // n
            views = [p.detach()[i * rows:(i + 1) * rows] for i in range(n)]  # share p's storage
            self.splits.append((p, views))
            params.extend(views)
        mult = self.group_settings["matrices"][0]
        lr = torch.tensor(optim_cfg.lr * mult, dtype=torch.float32, device=device)
        self.muon = torch.optim.Muon([{"params": params, "group": "matrices", "lr_mult": mult, "lr": lr}],
                                     lr=lr, weight_decay=wd, momentum=optim_cfg.muon.momentum,
                                     nesterov=optim_cfg.muon.nesterov, ns_steps=optim_cfg.muon.ns_steps)
        self.group_lrs = [g["lr"] for g in self.adamw.param_groups] + [lr]

    @property
    def param_groups(self) -> list:
        return self.adamw.param_groups + self.muon.param_groups

    def step(self) -> None:
        for p, views in self.splits:
            if p.grad is not None:
                rows = views[0].shape[0]
                for i, v in enumerate(views):
                    v.grad = p.grad[i * rows:(i + 1) * rows]
        self.adamw.step()
        self.muon.step()
        for _, views in self.splits:
            for v in views:
                v.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.adamw.zero_grad(set_to_none=set_to_none)
        self.muon.zero_grad(set_to_none=set_to_none)
        for p, _ in self.splits:  # the stacked weights themselves are in neither optimizer
            p.grad = None

    def state_dict(self) -> dict:
        return {"adamw": self.adamw.state_dict(), "muon": self.muon.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"adamw", "muon"}:
            raise ValueError("optimizer state is not Muon + AdamW's (was the run trained with another optim.name?)")
        self.adamw.load_state_dict(state["adamw"])
        self.muon.load_state_dict(state["muon"])


def LRSchedule(optim_cfg: OptimConfig, max_steps: int) -> Schedule:
    """The schedule `optim_cfg.schedule` names, over `max_steps` (an unknown name: ConfigError listing the
    valid ones). Built here, beside OptimConfig, so that schedules.py needs nothing of the config."""
    return SCHEDULES[optim_cfg.schedule.name](optim_cfg.lr, optim_cfg.min_lr, optim_cfg.warmup_steps, max_steps,
                                              optim_cfg.schedule)
