"""Typed train/optim/logging config groups, validated once at start-up.

Each group becomes a frozen dataclass; a bad value raises ConfigError with one line naming the key
and what is valid (the same error type the model config uses, so train.py reports both alike).
"""
from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Union

from omegaconf import DictConfig, OmegaConf

from common import ConfigError

from .schedules import SCHEDULES

__all__ = ["ConfigError", "TrainConfig", "OptimConfig", "LoggingConfig", "WandbConfig", "RunConfig",
           "parse_run_config"]


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 1337
    max_steps: int = 600
    batch_tokens: int = 8192
    micro_batch_size: int = 16
    device: str = "auto"
    precision: str = "auto"
    compile: Union[str, bool] = "auto"
    deterministic: bool = False
    threads: Optional[int] = None
    eval_interval: int = 100
    eval_tokens: int = 65536
    eval_batch_size: Optional[int] = None
    ckpt_interval: int = 200
    keep_last: int = 3
    resume: str = "none"
    resume_force: bool = False
    overwrite: bool = False
    stop_at: Optional[int] = None
    max_skipped: int = 20
    overfit_batch: bool = False
    inject_nan_at: Optional[int] = None
    inject_nan_steps: int = 1

    def validate(self) -> None:
        _choice("train.device", self.device, ("auto", "cpu", "cuda"))
        _choice("train.precision", self.precision, ("auto", "bf16", "fp16", "fp32"))
        _choice("train.compile", self.compile, ("auto", True, False))
        for k in ("max_steps", "batch_tokens", "micro_batch_size", "eval_interval", "eval_tokens",
                  "ckpt_interval", "keep_last", "max_skipped", "inject_nan_steps"):
            _positive(f"train.{k}", getattr(self, k))
        if self.threads is not None:
            _positive("train.threads", self.threads)
        if self.eval_batch_size is not None:
            _positive("train.eval_batch_size", self.eval_batch_size)
        if self.stop_at is not None:
            _positive("train.stop_at", self.stop_at)
        if self.inject_nan_at is not None:
            _positive("train.inject_nan_at", self.inject_nan_at)
        if not isinstance(self.resume, str) or not self.resume:
            _bad("train.resume", self.resume, "none | auto | path to a ckpt_*.pt")


@dataclass(frozen=True)
class GroupConfig:
    """One optimizer parameter group: lr = the schedule's lr x lr_mult; weight_decay null = optim.weight_decay."""
    lr_mult: float = 1.0
    weight_decay: Optional[float] = None

    def validate(self, key: str) -> None:
        if not (0 < self.lr_mult < math.inf):
            _bad(f"{key}.lr_mult", self.lr_mult, "must be a finite number > 0")
        if self.weight_decay is not None and not (self.weight_decay >= 0):
            _bad(f"{key}.weight_decay", self.weight_decay, "must be >= 0 (or null: optim.weight_decay)")


@dataclass(frozen=True)
class GroupsConfig:
    """The model's parameter groups (GPT.parameter_groups). Defaults = plain AdamW with decay on
    matrices and embeddings only (nanoGPT's p.dim() >= 2 rule)."""
    matrices: GroupConfig = field(default_factory=GroupConfig)
    embeddings: GroupConfig = field(default_factory=GroupConfig)
    vectors: GroupConfig = field(default_factory=lambda: GroupConfig(weight_decay=0.0))
    scalars: GroupConfig = field(default_factory=lambda: GroupConfig(weight_decay=0.0))

    @staticmethod
    def names() -> tuple:
        return tuple(f.name for f in dataclasses.fields(GroupsConfig))

    def validate(self) -> None:
        for name in self.names():
            getattr(self, name).validate(f"optim.groups.{name}")


@dataclass(frozen=True)
class MuonConfig:
    """optim=muon: torch.optim.Muon's settings for the matrices group (lr x the schedule's shape)."""
    lr: float = 0.05
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5

    def validate(self) -> None:
        if not (0 < self.lr < math.inf):
            _bad("optim.muon.lr", self.lr, "must be a finite number > 0")
        if not (0 <= self.momentum < 1):
            _bad("optim.muon.momentum", self.momentum, "must be in [0, 1)")
        _positive("optim.muon.ns_steps", self.ns_steps)


@dataclass(frozen=True)
class OptimConfig:
    name: str = "adamw"
    lr: float = 1e-3
    min_lr: float = 1e-4
    betas: tuple = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    schedule: str = "cosine"
    warmup_steps: int = 50
    decay_frac: float = 0.2
    fused: Union[str, bool] = "auto"
    groups: GroupsConfig = field(default_factory=GroupsConfig)
    muon: MuonConfig = field(default_factory=MuonConfig)

    def validate(self) -> None:
        _choice("optim.name", self.name, ("adamw", "muon"))
        self.muon.validate()
        SCHEDULES[self.schedule]  # an unknown name raises one line listing the valid ones
        _choice("optim.fused", self.fused, ("auto", True, False))
        if not (self.lr > 0):
            _bad("optim.lr", self.lr, "must be > 0")
        if not (0 <= self.min_lr <= self.lr):
            _bad("optim.min_lr", self.min_lr, f"must be in [0, optim.lr={self.lr}]")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            _bad("optim.betas", list(self.betas), "must be two numbers in [0, 1)")
        if not (self.eps > 0):
            _bad("optim.eps", self.eps, "must be > 0")
        if not (self.weight_decay >= 0):
            _bad("optim.weight_decay", self.weight_decay, "must be >= 0")
        if not (self.grad_clip >= 0):
            _bad("optim.grad_clip", self.grad_clip, "must be >= 0 (0 = no clipping)")
        if self.warmup_steps < 0:
            _bad("optim.warmup_steps", self.warmup_steps, "must be >= 0")
        if not (0 < self.decay_frac <= 1):
            _bad("optim.decay_frac", self.decay_frac, "must be in (0, 1]")
        self.groups.validate()


@dataclass(frozen=True)
class WandbConfig:
    mode: str = "offline"
    project: str = "nanonorm"
    entity: Optional[str] = None
    group: Optional[str] = None
    name: Optional[str] = None
    tags: tuple = ()

    def validate(self) -> None:
        _choice("logging.wandb.mode", self.mode, ("online", "offline", "disabled"))


@dataclass(frozen=True)
class LoggingConfig:
    log_interval: int = 10
    stats_interval: int = 100
    spike_window: int = 50
    spike_k: float = 6.0
    spike_min_history: int = 20
    console: bool = True
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def validate(self) -> None:
        for k in ("log_interval", "stats_interval", "spike_window"):
            _positive(f"logging.{k}", getattr(self, k))
        if not (self.spike_k > 0):
            _bad("logging.spike_k", self.spike_k, "must be > 0")
        if not (2 <= self.spike_min_history <= self.spike_window):
            _bad("logging.spike_min_history", self.spike_min_history,
                 f"must be in [2, logging.spike_window={self.spike_window}]")
        self.wandb.validate()


@dataclass(frozen=True)
class RunConfig:
    train: TrainConfig
    optim: OptimConfig
    logging: LoggingConfig


def parse_run_config(cfg: DictConfig) -> RunConfig:
    """Build and validate the three groups from the composed Hydra config (raises ConfigError)."""
    for g in ("train", "optim", "logging"):
        if g not in cfg or cfg[g] is None:
            raise ConfigError(f"missing config group '{g}' (configs/{g}/)")
    rc = RunConfig(train=_build(TrainConfig, cfg.train, "train"), optim=_build(OptimConfig, cfg.optim, "optim"),
                   logging=_build(LoggingConfig, cfg.logging, "logging"))
    rc.train.validate()
    rc.optim.validate()
    rc.logging.validate()
    if rc.optim.name == "muon" and rc.train.precision == "fp16":
        _bad("train.precision", "fp16", "optim=muon runs in bf16 or fp32 (its split Q/K/V updates bypass fp16's "
                                        "gradient scaler); use train.precision=bf16")
    return rc


# --- helpers -------------------------------------------------------------------------------------

def _bad(key: str, value: Any, valid: str) -> None:
    raise ConfigError(f"bad config {key}={value!r}: {valid}")


def _choice(key: str, value: Any, valid: tuple) -> None:
    # `True == 1` in Python, so compare types too (compile=1 is not compile=true).
    if not any(value == v and type(value) is type(v) for v in valid):
        _bad(key, value, "valid: " + ", ".join(str(v).lower() if isinstance(v, bool) else str(v) for v in valid))


def _positive(key: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        _bad(key, value, "must be a positive integer")


def _build(cls, node: Any, prefix: str):
    """Dataclass from a config node: unknown keys and wrong types fail with the full key name."""
    data = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(prefix + '.' + k for k in unknown)}: valid keys are {', '.join(names)}")
    kw = {}
    for name in names:
        if name not in data:
            continue
        key, v, t = f"{prefix}.{name}", data[name], hints[name]
        if dataclasses.is_dataclass(t):
            if not isinstance(v, Mapping):
                _bad(key, v, "must be a group of keys")
            kw[name] = _build(t, v, key)
        else:
            kw[name] = _coerce(key, v, t)
    return cls(**kw)


def _coerce(key: str, v: Any, t: Any) -> Any:
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is Union:
        if v is None:
            if type(None) in args:
                return None
            _bad(key, v, "must not be null")
        options = [a for a in args if a is not type(None)]
        for a in options:
            try:
                return _coerce(key, v, a)
            except ConfigError:
                if len(options) == 1:
                    raise
        return v  # several types (e.g. auto|true|false): the group's validate() names the valid values
    if v is None:
        _bad(key, v, "must not be null")
    if t is bool:
        if isinstance(v, bool):
            return v
        _bad(key, v, "must be true or false")
    if t is int:
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        _bad(key, v, "must be an integer")
    if t is float:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v):
            return float(v)
        _bad(key, v, "must be a number")
    if t is str:
        if isinstance(v, str):
            return v
        _bad(key, v, "must be a string")
    if t is tuple:
        if isinstance(v, (list, tuple)):
            return tuple(v)
        _bad(key, v, "must be a list")
    return v
