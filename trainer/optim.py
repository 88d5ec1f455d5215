"""The optimizers (`optim.name`, picked from OPTIMIZERS) over the model's parameter groups, behind one
small container the loop talks to, `Optimizer` (the LR schedules are in schedules.py).

The model says which group each parameter is in (`GPT.parameter_groups`: matrices, embeddings,
vectors, scalars); `optim.groups.<group>` gives each group an lr multiplier and a weight decay.
The LR lives in 0-dim tensors computed on the device from a device-side count of applied updates,
so a skipped (non-finite) step leaves the schedule where it was without a host sync. A new optimizer
is a class under `@OPTIMIZERS.register("name")` with its keys as an `Options` dataclass (extending
OptimConfig, the keys every optimizer reads) and a `build(model, optim_cfg, device)` returning an `Optimizer`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Optional

import torch

from common import ConfigError, Registry
from common.config import (NonNeg, NonNegInt, PosInt, Positive, Range, bad, check, defaults, own_options, set_values,
                           to_plain, union_keys)

from .schedules import SCHEDULES, Schedule, ScheduleOptions

OPTIMIZERS = Registry("optim.name")


@dataclass(frozen=True)
class GroupConfig:
    """One optimizer parameter group: lr = the schedule's lr x lr_mult; weight_decay null = optim.weight_decay."""
    lr_mult: Positive = 1.0               # lr = the schedule's lr x lr_mult
    #: null = optim.weight_decay
    weight_decay: Optional[Annotated[float, Range(0, note="(null: optim.weight_decay)")]] = None


@dataclass(frozen=True)
class GroupsConfig:
    """The model's parameter groups (GPT.parameter_groups). Defaults = plain AdamW with decay on
    matrices and embeddings only (nanoGPT's p.dim() >= 2 rule)."""
    #: attention/MLP weights (Muon's group under optim=muon)
    matrices: GroupConfig = field(default_factory=GroupConfig)
    embeddings: GroupConfig = field(default_factory=GroupConfig)  # token/position embeddings, untied head
    vectors: GroupConfig = field(default_factory=lambda: GroupConfig(weight_decay=0.0))  # norm gains/biases, biases
    #: learned step sizes (a, b, rho, g)
    scalars: GroupConfig = field(default_factory=lambda: GroupConfig(weight_decay=0.0))

    @staticmethod
    def names() -> tuple:
        return tuple(f.name for f in dataclasses.fields(GroupsConfig))

    def __post_init__(self) -> None:  # each group's errors name its full key (optim.groups.vectors.lr_mult)
        for name in self.names():
            check(getattr(self, name), f"optim.groups.{name}")


@dataclass(frozen=True)
class OptimConfig:
    """The `optim.*` keys every optimizer reads. Each optimizer's Options (below) extends it with
    its own keys; `schedule` is the LR schedule's Options (its name on the command line, `optim.schedule`,
    its keys beside the others: `optim.decay_frac`; a file may nest them, `schedule: {name: wsd,
    decay_frac: 0.4}`, so that naming another schedule drops them). `optim_config` builds the pair."""
    #: the optimizer: adamw | muon (Muon for the matrices group, AdamW for the rest)
    name: str = "adamw"
    lr: Positive = 1e-3                   # peak learning rate of the schedule (finite: inf trains to NaN weights)
    min_lr: NonNeg = 1e-4                 # floor: cosine decays to it, wsd's final decay ends at it
    weight_decay: NonNeg = 0.1            # decoupled weight decay (groups with weight_decay null)
    #: max global grad norm; 0 = no clipping (the norm is still logged)
    grad_clip: Annotated[float, Range(0, note="(0 = no clipping)")] = 1.0
    #: the LR schedule (trainer/schedules.py): cosine | wsd | constant
    schedule: Any = field(default_factory=lambda: SCHEDULES[ScheduleOptions.name].Options())
    warmup_steps: NonNegInt = 50          # linear warmup (all schedules)
    groups: GroupsConfig = field(default_factory=GroupsConfig)  # per parameter group: lr = schedule x lr_mult

    def __post_init__(self) -> None:
        check(self, "optim")
        if self.min_lr > self.lr:
            bad("optim.min_lr", self.min_lr, f"must be in [0, optim.lr={self.lr}]")


def flat_schedule(node: Mapping) -> dict:
    """The `optim` group as the command line spells it: a file's nested `schedule: {name: wsd, decay_frac:
    0.4}` (or asdict's) as `schedule: wsd` with its keys beside the others, where `optim.<key>` set wins."""
    sched = node.get("schedule")
    if not isinstance(sched, Mapping):
        return dict(node)
    nested = {k: v for k, v in sched.items() if k != "name" and node.get(k) is None}
    return {**node, **nested, "schedule": sched.get("name", ScheduleOptions.name)}


def optim_config(node: Any = None) -> OptimConfig:
    """The `optim` group as the chosen optimizer's Options, holding the chosen schedule's. A null value is
    the component's default; a key that only another optimizer or schedule reads is one line naming the
    chosen one and its keys (`optim.decay_frac=null` drops a file's top-level value)."""
    plain, shared = flat_schedule(to_plain(node or {})), {f.name for f in dataclasses.fields(OptimConfig)}
    given = {**set_values({k: v for k, v in plain.items() if k not in shared}),
             **{k: v for k, v in plain.items() if k in shared and v is not None}}
    name, sched = given.pop("name", OptimConfig.name), given.pop("schedule", ScheduleOptions.name)
    schedules = union_keys(s.Options for s in SCHEDULES.values())
    mine = {k: given.pop(k) for k in list(given) if k in schedules}
    hint = "; if a config file set it, {key}=null drops it"
    schedule = own_options(SCHEDULES[sched].Options, {"name": sched, **mine}, "optim", f"optim.schedule={sched}",
                           schedules, hide=("name",), hint=hint)
    return own_options(OPTIMIZERS[name].Options, {"name": name, **given, "schedule": schedule}, "optim",
                       f"optim.name={name}", optim_group_keys(), hint=hint)


def optim_group_keys() -> dict:
    """{key: the class declaring it first} over every optimizer and schedule: the `optim` schema."""
    out = union_keys(o.Options for o in OPTIMIZERS.values())
    for k, cls in union_keys(s.Options for s in SCHEDULES.values()).items():
        out.setdefault(k, cls)  # `name` is the optimizer's; the schedule's is `schedule`
    return out


def optim_group_defaults() -> dict:
    """The `optim` group's Hydra schema: the shared keys at their defaults, the schedule by name, every
    optimizer's and schedule's own key null (each component fills in its defaults: `optim_config`; a
    nested group's keys are each null, so `optim.muon.lr=0.1` needs no `+`)."""
    def null(v):
        return {k: null(x) for k, x in v.items()} if isinstance(v, Mapping) else None
    shared = defaults(OptimConfig)
    return {k: ScheduleOptions.name if k == "schedule" else shared[k] if k in shared else null(defaults(cls).get(k))
            for k, cls in optim_group_keys().items()}




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


@OPTIMIZERS.register("adamw")
class AdamW:
    """AdamW over every group (fused where torch has the kernel)."""

    @dataclass(frozen=True)
    class Options(OptimConfig):
        betas: tuple = (0.9, 0.95)            # AdamW betas
        eps: Positive = 1e-8                  # AdamW epsilon
        fused: Literal["auto", True, False] = "auto"  # auto: fused where supported; false: for-loop AdamW (slower)

        def __post_init__(self) -> None:
            super().__post_init__()
            if len(self.betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in self.betas):
                bad("optim.betas", list(self.betas), "must be two numbers in [0, 1)")

    @staticmethod
    def build(model: torch.nn.Module, optim_cfg: Options, device: torch.device) -> Optimizer:
        opt, lr, fused = build_adamw(model, model.parameter_groups(), optim_cfg, device)
        return Optimizer(opt, lr, [g["lr"] for g in opt.param_groups], group_settings(optim_cfg), fused)


@dataclass(frozen=True)
class MuonSettings:
    """optim=muon: torch.optim.Muon's settings for the matrices group (lr x the schedule's shape)."""
    lr: Positive = 0.05                   # Muon lr; optim.groups.matrices.lr_mult multiplies it
    momentum: Annotated[float, Range(0, 1, "[)")] = 0.95  # Muon momentum
    nesterov: bool = True                 # Nesterov momentum
    ns_steps: PosInt = 5                  # Newton-Schulz iterations

    def __post_init__(self) -> None:
        check(self, "optim.muon")


@OPTIMIZERS.register("muon")
class Muon:
    """Muon for the matrices group, AdamW (its keys: AdamW's) for the rest: MuonAdamW."""

    @dataclass(frozen=True)
    class Options(AdamW.Options):
        muon: MuonSettings = field(default_factory=MuonSettings)  # the matrices group's optimizer

    @staticmethod
    def build(model: torch.nn.Module, optim_cfg: Options, device: torch.device) -> Optimizer:
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
