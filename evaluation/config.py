"""EvalConfig: eval.py's options, typed and validated once. Defaults live in configs/eval/default.yaml;
every key is also a command-line flag (--token-budget 1000 --tasks piqa,arc_easy --split null)."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

import yaml

from common import ConfigError
from trainer.distributed import PRECISION_CHOICES, precision_name

DEFAULT_YAML = Path(__file__).resolve().parent.parent / "configs" / "eval" / "default.yaml"


class EvalConfigError(ConfigError):
    """One line naming the bad key and what is valid."""


@dataclass
class EvalConfig:
    split: Optional[str] = "val"
    data_dir: Optional[str] = None
    token_budget: Optional[int] = None
    stride: Optional[int] = None
    batch_size: int = 8
    tasks: list = field(default_factory=list)
    include_path: Optional[str] = None
    limit: Optional[float] = None
    num_fewshot: Optional[int] = None
    bootstrap_iters: int = 1000
    max_gen_toks: int = 256
    seed: int = 1234
    device: str = "auto"
    dtype: str = "auto"
    threads: Optional[int] = None
    out: Optional[str] = None
    wandb: bool = True

    def __post_init__(self) -> None:
        def bad(key, valid):
            raise EvalConfigError(f"bad eval config {key}={getattr(self, key)!r}: {valid}")

        for key in ("token_budget", "stride", "batch_size", "max_gen_toks", "threads"):
            v = getattr(self, key)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                bad(key, "must be a positive integer" + ("" if key in ("batch_size", "max_gen_toks") else " or null"))
        for key in ("batch_size", "max_gen_toks", "bootstrap_iters", "seed"):
            if getattr(self, key) is None:
                bad(key, "must be set")
        if not isinstance(self.bootstrap_iters, int) or self.bootstrap_iters < 0:
            bad("bootstrap_iters", "must be an integer >= 0")
        if self.num_fewshot is not None and (not isinstance(self.num_fewshot, int) or self.num_fewshot < 0):
            bad("num_fewshot", "must be an integer >= 0 or null")
        if self.limit is not None:
            if not isinstance(self.limit, (int, float)) or isinstance(self.limit, bool) or self.limit <= 0:
                bad("limit", "must be a positive number of documents, a fraction < 1, or null")
            if self.limit >= 1:
                if self.limit != int(self.limit):
                    bad("limit", "must be an integer when >= 1")
                self.limit = int(self.limit)
        if isinstance(self.tasks, str):
            self.tasks = [t for t in self.tasks.split(",") if t]
        if not isinstance(self.tasks, (list, tuple)) or not all(isinstance(t, str) and t for t in self.tasks):
            bad("tasks", "must be a list of lm-eval task names (empty: no zero-shot tasks)")
        self.tasks = list(self.tasks)
        if precision_name(self.dtype) is None:
            bad("dtype", f"valid: {', '.join(PRECISION_CHOICES)} (train.precision's names)")
        self.dtype = precision_name(self.dtype)
        if not isinstance(self.wandb, bool):
            bad("wandb", "must be true or false")
        if self.include_path is not None and not Path(self.include_path).is_dir():
            bad("include_path", "must be an existing directory of lm-eval task YAMLs")

    @classmethod
    def from_dict(cls, d: dict, source: str = "eval config") -> "EvalConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise EvalConfigError(f"unknown key(s) {unknown} in {source}: valid keys are {sorted(known)}")
        return cls(**d)

    @classmethod
    def from_yaml(cls, path=DEFAULT_YAML) -> "EvalConfig":
        path = Path(path)
        try:
            d = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise EvalConfigError(f"cannot read eval config {path}: {e}") from None
        if not isinstance(d, dict):
            raise EvalConfigError(f"eval config {path} must be a mapping of keys to values")
        return cls.from_dict(d, str(path))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _parse_value(key: str, text: str) -> Any:
    """Flag text -> value, read as YAML (null, true, 3, 0.5); `tasks` also takes a comma list."""
    if key == "tasks":
        return [] if text.strip().lower() in ("", "none", "null", "[]") else [t.strip() for t in text.split(",") if t.strip()]
    v = yaml.safe_load(text)
    return str(v) if key in ("split", "data_dir", "include_path", "out", "device") and v is not None else v


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=str(DEFAULT_YAML), help="YAML of eval defaults (default: %(default)s)")
    for f in fields(EvalConfig):
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None, metavar="VALUE",
                            help=f"overrides `{f.name}` (YAML value; 'null' unsets)")


def from_args(args: argparse.Namespace) -> EvalConfig:
    base = EvalConfig.from_yaml(args.config).to_dict()
    for f in fields(EvalConfig):
        text = getattr(args, f.name)
        if text is not None:
            base[f.name] = _parse_value(f.name, text)
    return EvalConfig.from_dict(base)
