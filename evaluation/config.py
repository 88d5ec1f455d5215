"""EvalConfig: eval.py's options, typed and validated once. Each default and its doc are written here
once; every key is also a command-line flag (--token-budget 1000 --tasks piqa,arc_easy --split null), and
`--config FILE` reads a YAML of keys to change first."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any, Optional

import yaml

from common import ConfigError
from common.config import NonNegInt, PosInt, Range, bad as common_bad, build, check, field_docs
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
    token_budget: Optional[PosInt] = None  # tokens scored for perplexity; null: the whole split
    stride: Optional[PosInt] = None       # new tokens scored per sliding window; null: block_size (non-overlapping)
    batch_size: PosInt = 8                # sequences per forward pass (perplexity and lm-eval)
    tasks: list = field(default_factory=lambda: list(DEFAULT_TASKS))  # lm-eval task names; empty (--tasks none): no tasks
    include_path: Optional[str] = None    # directory of extra lm-eval task YAMLs (local JSONL tasks)
    limit: Optional[Annotated[float, Range(0, float("inf"), "()")]] = None  # lm-eval: at most this many documents per task (int), or a fraction (<1); null: all
    num_fewshot: Optional[NonNegInt] = None  # lm-eval: null = each task's default (0 for the default list)
    bootstrap_iters: NonNegInt = 1000     # lm-eval stderr bootstrap iterations (0: no stderr)
    max_gen_toks: PosInt = 256            # generate_until default when a task sets none
    seed: int = 1234                      # lm-eval seeds and generation sampling
    device: str = "auto"                  # auto | cpu | cuda | cuda:N (torchrun: one GPU per local rank)
    dtype: str = "auto"                   # auto (bf16 on CUDA when supported, else fp32) | bf16 | fp16 | fp32, as train.precision
    threads: Optional[PosInt] = None      # CPU threads for torch; null: OMP_NUM_THREADS if set, else the idle cores
    out: Optional[str] = None             # JSON path; null: <run dir>/eval/eval_<step>.json
    wandb: bool = True                    # log to the run's wandb run (its id is in the checkpoint) when there is one

    def __post_init__(self) -> None:
        def bad(key, valid):
            common_bad(f"eval.{key}", getattr(self, key), valid, EvalConfigError)

        if isinstance(self.tasks, str):
            self.tasks = [t for t in self.tasks.split(",") if t]
        check(self, "eval", EvalConfigError)
        if self.limit is not None and self.limit >= 1:
            if self.limit != int(self.limit):
                bad("limit", "must be an integer when >= 1 (a number of documents; < 1: a fraction)")
            self.limit = int(self.limit)
        if not all(isinstance(t, str) and t for t in self.tasks):
            bad("tasks", "must be a list of lm-eval task names (empty: no zero-shot tasks)")
        if precision_name(self.dtype) is None:
            bad("dtype", f"valid: {', '.join(PRECISION_CHOICES)} (train.precision's names)")
        self.dtype = precision_name(self.dtype)
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
