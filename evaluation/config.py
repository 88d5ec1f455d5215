"""EvalConfig: eval.py's options, typed and validated once. Each default and its doc are written here
once; every key is also a command-line flag (--token-budget 1000 --tasks piqa,arc_easy --split null), and
`--config FILE` reads a YAML of keys to change first."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

import yaml

from common import ConfigError
from common.config import bad as common_bad, build, field_docs
from runtime.distributed import PRECISION_CHOICES, precision_name

# lm-eval's zero-shot tasks reported by default (README "Evaluation").
DEFAULT_TASKS = ("lambada_openai", "wikitext", "hellaswag", "piqa", "arc_easy", "arc_challenge", "winogrande",
                 "boolq", "openbookqa", "sciq", "social_iqa")


class EvalConfigError(ConfigError):
    """One line naming the bad key and what is valid."""


@dataclass
class EvalConfig:
    split: Optional[str] = "val"          # prepared split for loss/perplexity; null: skip perplexity
    data_dir: Optional[str] = None        # null: the checkpoint's data dir (prepared again from the run's data config if missing)
    token_budget: Optional[int] = None    # tokens scored for perplexity; null: the whole split
    stride: Optional[int] = None          # new tokens scored per sliding window; null: block_size (non-overlapping)
    batch_size: int = 8                   # sequences per forward pass (perplexity and lm-eval)
    tasks: list = field(default_factory=lambda: list(DEFAULT_TASKS))  # lm-eval task names; empty (--tasks none): no tasks
    include_path: Optional[str] = None    # directory of extra lm-eval task YAMLs (local JSONL tasks)
    limit: Optional[float] = None         # lm-eval: at most this many documents per task (int), or a fraction (<1); null: all
    num_fewshot: Optional[int] = None     # lm-eval: null = each task's default (0 for the default list)
    bootstrap_iters: int = 1000           # lm-eval stderr bootstrap iterations (0: no stderr)
    max_gen_toks: int = 256               # generate_until default when a task sets none
    seed: int = 1234                      # lm-eval seeds and generation sampling
    device: str = "auto"                  # auto | cpu | cuda | cuda:N (torchrun: one GPU per local rank)
    dtype: str = "auto"                   # auto (bf16 on CUDA when supported, else fp32) | bf16 | fp16 | fp32, as train.precision
    threads: Optional[int] = None         # CPU threads for torch; null: OMP_NUM_THREADS if set, else the idle cores
    out: Optional[str] = None             # JSON path; null: <run dir>/eval/eval_<step>.json
    wandb: bool = True                    # log to the run's wandb run (its id is in the checkpoint) when there is one

    def __post_init__(self) -> None:
        def bad(key, valid):
            common_bad(f"eval.{key}", getattr(self, key), valid, EvalConfigError)

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
    def from_dict(cls, d: dict) -> "EvalConfig":
        """From a mapping of keys to values; absent keys take the defaults above."""
        return build(cls, d, "eval", error=EvalConfigError)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _parse_value(key: str, text: str) -> Any:
    """Flag text -> value, read as YAML (null, true, 3, 0.5); `tasks` also takes a comma list."""
    if key == "tasks":
        return [] if text.strip().lower() in ("", "none", "null", "[]") else [t.strip() for t in text.split(",") if t.strip()]
    v = yaml.safe_load(text)
    return str(v) if key in ("split", "data_dir", "include_path", "out", "device") and v is not None else v


def _read_yaml(path) -> dict:
    path = Path(path)
    try:
        d = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise EvalConfigError(f"cannot read eval config {path}: {e}") from None
    if not isinstance(d, dict):
        raise EvalConfigError(f"eval config {path} must be a mapping of keys to values")
    return d


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="YAML of eval keys to change (default: none; EvalConfig's defaults)")
    docs, default = field_docs(EvalConfig), EvalConfig()
    for f in fields(EvalConfig):
        shown = ",".join(default.tasks) if f.name == "tasks" else yaml.safe_dump(getattr(default, f.name)).split("\n")[0]
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None, metavar="VALUE",
                            help=f"{docs.get(f.name, f.name)} (default: {shown}; a YAML value, 'null' unsets)"
                            .replace("%", "%%"))


def from_args(args: argparse.Namespace) -> EvalConfig:
    base = _read_yaml(args.config) if args.config else {}
    for f in fields(EvalConfig):
        text = getattr(args, f.name)
        if text is not None:
            base[f.name] = _parse_value(f.name, text)
    return EvalConfig.from_dict(base)
