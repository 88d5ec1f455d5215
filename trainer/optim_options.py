"""The `optim.*` keys, without torch: the keys every optimizer reads (`OptimConfig`), each optimizer's and
each LR schedule by name with its own `Options` (`OPTIMIZERS`, `SCHEDULES`: the class in optim.py or
schedules.py, imported when first read), and `optim_config`, which builds the pair from the composed group.
The config, `--help` and composition read them before torch is imported. An optimizer or schedule defined in
a user's own module is one class under `@OPTIMIZERS.register("name")`, carrying its Options.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Optional

from common import Registry
from common.config import (NonNeg, NonNegInt, PosInt, Positive, Range, bad, check, defaults, own_options, set_values,
                           to_plain, union_keys)

OPTIMIZERS = Registry("optim.name")         # optimizer name -> its class (optim.py), with its Options
SCHEDULES = Registry("optim.schedule")      # LR schedule name -> its class (schedules.py), with its Options


@dataclass(frozen=True)
class ScheduleOptions:
    """A schedule's own `optim.*` keys (`optim.schedule` is its name); subclasses add fields."""
    name: str = "cosine"                  # the schedule (`optim.schedule` on the command line)

    def __post_init__(self) -> None:
        check(self, "optim")


@dataclass(frozen=True)
class WSDOptions(ScheduleOptions):
    #: the last fraction of train.max_steps decays linearly to min_lr
    decay_frac: Annotated[float, Range(0, 1, "(]")] = 0.2


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
    schedule: Any = field(default_factory=lambda: SCHEDULES.options(ScheduleOptions.name)())
    warmup_steps: NonNegInt = 50          # linear warmup (all schedules)
    groups: GroupsConfig = field(default_factory=GroupsConfig)  # per parameter group: lr = schedule x lr_mult

    def __post_init__(self) -> None:
        check(self, "optim")
        if self.min_lr > self.lr:
            bad("optim.min_lr", self.min_lr, f"must be in [0, optim.lr={self.lr}]")


@dataclass(frozen=True)
class AdamWOptions(OptimConfig):
    betas: tuple = (0.9, 0.95)            # AdamW betas
    eps: Positive = 1e-8                  # AdamW epsilon
    fused: Literal["auto", True, False] = "auto"  # auto: fused where supported; false: for-loop AdamW (slower)

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in self.betas):
            bad("optim.betas", list(self.betas), "must be two numbers in [0, 1)")


@dataclass(frozen=True)
class MuonSettings:
    """optim=muon: torch.optim.Muon's settings for the matrices group (lr x the schedule's shape)."""
    lr: Positive = 0.05                   # Muon lr; optim.groups.matrices.lr_mult multiplies it
    momentum: Annotated[float, Range(0, 1, "[)")] = 0.95  # Muon momentum
    nesterov: bool = True                 # Nesterov momentum
    ns_steps: PosInt = 5                  # Newton-Schulz iterations

    def __post_init__(self) -> None:
        check(self, "optim.muon")


@dataclass(frozen=True)
class MuonOptions(AdamWOptions):
    """optim=muon: Muon (torch.optim.Muon, torch >= 2.9) for the matrices group, AdamW for embeddings, head,
    vectors and scalars, at modded-nanogpt's recipe (docs/variants.md, "Optimizers"): these defaults.
    Q, K and V are orthogonalized as separate matrices."""
    lr: Positive = 0.008                  # AdamW groups (modded-nanogpt's head lr); the schedule's peak
    min_lr: NonNeg = 0.0                  # wsd decays to 0, as the speedrun's cooldown does
    weight_decay: NonNeg = 0.0            # modded-nanogpt: none
    #: 0 = no clipping (modded-nanogpt: none; the norm is still logged and checked for NaN)
    grad_clip: Annotated[float, Range(0, note="(0 = no clipping)")] = 0.0
    #: constant, then a linear cooldown over the last 40% of the steps; naming another schedule drops it
    schedule: Any = field(default_factory=lambda: SCHEDULES.options("wsd")(name="wsd", decay_frac=0.4))
    warmup_steps: NonNegInt = 0
    #: AdamW groups: lr = optim.lr x lr_mult; vectors and scalars at 0.04, modded-nanogpt's scalar lr
    groups: GroupsConfig = field(default_factory=lambda: GroupsConfig(
        vectors=GroupConfig(lr_mult=5.0, weight_decay=0.0), scalars=GroupConfig(lr_mult=5.0, weight_decay=0.0)))
    betas: tuple = (0.8, 0.95)            # modded-nanogpt's Adam betas
    eps: Positive = 1e-10                 # AdamW epsilon
    muon: MuonSettings = field(default_factory=MuonSettings)  # the matrices group's optimizer


# The order here is the order of every listing of valid names.
SCHEDULES.add("cosine", f"{__package__}.schedules:Cosine", options=ScheduleOptions)
SCHEDULES.add("wsd", f"{__package__}.schedules:WarmupStableDecay", options=WSDOptions)
SCHEDULES.add("constant", f"{__package__}.schedules:Constant", options=ScheduleOptions)
OPTIMIZERS.add("adamw", f"{__package__}.optim:AdamW", options=AdamWOptions)
OPTIMIZERS.add("muon", f"{__package__}.optim:Muon", options=MuonOptions)


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
    plain, shared = to_plain(node or {}), {f.name for f in dataclasses.fields(OptimConfig)}
    if plain.get("schedule") is None:  # the optimizer's own schedule (muon's: wsd), its keys where not set
        plain = {**plain, "schedule": defaults(OPTIMIZERS.options(plain.get("name") or OptimConfig.name))["schedule"]}
    plain = flat_schedule(plain)
    given = {**set_values({k: v for k, v in plain.items() if k not in shared}),
             **{k: v for k, v in plain.items() if k in shared and v is not None}}
    name, sched = given.pop("name", OptimConfig.name), given.pop("schedule", ScheduleOptions.name)
    schedules = union_keys(SCHEDULES.all_options().values())
    mine = {k: given.pop(k) for k in list(given) if k in schedules}
    hint = "; if a config file set it, {key}=null drops it"
    schedule = own_options(SCHEDULES.options(sched), {"name": sched, **mine}, "optim", f"optim.schedule={sched}",
                           schedules, hide=("name",), hint=hint)
    return own_options(OPTIMIZERS.options(name), {"name": name, **given, "schedule": schedule}, "optim",
                       f"optim.name={name}", optim_group_keys(), hint=hint)


def optim_group_keys() -> dict:
    """{key: the class declaring it first} over every optimizer and schedule: the `optim` schema."""
    out = union_keys(OPTIMIZERS.all_options().values())
    for k, cls in union_keys(SCHEDULES.all_options().values()).items():
        out.setdefault(k, cls)  # `name` is the optimizer's; the schedule's is `schedule`
    return out


def optim_nodes() -> dict:
    """{optimizer: its `optim=<name>` option}: the optimizer's keys at its defaults (its schedule by name, or
    nested with the keys it sets, so that naming another schedule drops them), and every schedule's own
    keys null beside them (`optim.decay_frac=0.3` composes under any schedule; the builder checks it
    against the one chosen)."""
    schedule_keys = [k for k in union_keys(SCHEDULES.all_options().values()) if k != "name"]
    out = {}
    for name, cls in OPTIMIZERS.all_options().items():
        node = {**defaults(cls), "name": name}
        if set(node["schedule"]) == {"name"}:
            node["schedule"] = node["schedule"]["name"]
        out[name] = {**node, **{k: None for k in schedule_keys if k not in node}}
    return out
