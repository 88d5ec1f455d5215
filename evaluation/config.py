"""EvalConfig: eval.py's options, typed and validated once. Every key is also a flag (--token-budget 1000
--tasks piqa,arc_easy --split null), and `--config FILE` reads a YAML of keys to change first."""
from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Optional

import yaml

from common import ConfigError
from common.config import NonNegInt, PosInt, Range, bad, build, check, field_docs, type_hints
from runtime.launch import PRECISION_CHOICES, precision_name

# lm-eval's zero-shot tasks reported by default (docs/evaluation.md).
DEFAULT_TASKS = ("lambada_openai", "wikitext", "hellaswag", "piqa", "arc_easy", "arc_challenge", "winogrande",
                 "boolq", "openbookqa", "sciq", "social_iqa")


class EvalConfigError(ConfigError):
    """One line naming the bad key and what is valid."""


@dataclass
class EvalConfig:
    split: Optional[str] = "val"          # prepared split for loss/perplexity; null: skip perplexity
    #: null: the checkpoint's data dir (prepared again from the run's data config if missing)
    data_dir: Optional[str] = None
    token_budget: Optional[PosInt] = None  # tokens scored for perplexity; null: the whole split
    stride: Optional[PosInt] = None       # new tokens scored per sliding window; null: block_size (non-overlapping)
    batch_size: PosInt = 8                # sequences per forward pass (perplexity and lm-eval)
    #: lm-eval task names; empty (--tasks none): no tasks
    tasks: list = field(default_factory=lambda: list(DEFAULT_TASKS))
    include_path: Optional[str] = None    # directory of extra lm-eval task YAMLs (local JSONL tasks)
    #: lm-eval: at most this many documents per task (int), or a fraction (<1); null: all
    limit: Optional[Annotated[float, Range(0, float("inf"), "()")]] = None
    num_fewshot: Optional[NonNegInt] = None  # lm-eval: null = each task's default (0 for the default list)
    bootstrap_iters: NonNegInt = 1000     # lm-eval stderr bootstrap iterations (0: no stderr)
    max_gen_toks: PosInt = 256            # generate_until default when a task sets none
    seed: int = 1234                      # lm-eval seeds and generation sampling
    device: str = "auto"                  # auto | cpu | cuda | cuda:N (torchrun: one GPU per local rank)
    #: auto (bf16 on CUDA when supported, else fp32) | bf16 | fp16 | fp32, as train.precision
    dtype: str = "auto"
    threads: Optional[PosInt] = None      # CPU threads for torch; null: OMP_NUM_THREADS if set, else the idle cores
    out: Optional[str] = None             # JSON path; null: <run dir>/eval/eval_<step>.json
    wandb: bool = True                    # log to the run's wandb run (its id is in the checkpoint) when there is one

    def __post_init__(self) -> None:
        if self.tasks is None or isinstance(self.tasks, str):  # a flag's comma list; none, null or [] for no tasks
            none = self.tasks is None or self.tasks.strip().lower() in ("none", "[]")
            self.tasks = [] if none else [t.strip() for t in self.tasks.split(",") if t.strip()]
        check(self, "eval", EvalConfigError)
        if self.limit is not None and self.limit >= 1:
            if self.limit != int(self.limit):
                bad("eval.limit", self.limit, "must be an integer when >= 1 (a number of documents; < 1: a fraction)",
                    EvalConfigError)
            self.limit = int(self.limit)
        if not all(isinstance(t, str) and t for t in self.tasks):
            bad("eval.tasks", self.tasks, "must be a list of lm-eval task names (empty: no zero-shot tasks)",
                EvalConfigError)
        if precision_name(self.dtype) is None:
            bad("eval.dtype", self.dtype, f"valid: {', '.join(PRECISION_CHOICES)} (train.precision's names)",
                EvalConfigError)
        self.dtype = precision_name(self.dtype)
        if self.include_path is not None and not Path(self.include_path).is_dir():
            bad("eval.include_path", self.include_path, "must be an existing directory of lm-eval task YAMLs",
                EvalConfigError)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _text_flag(name: str) -> bool:
    """A name, a path or `tasks` (a comma list): the flag's text as it is; any other key: a YAML value."""
    return type_hints(EvalConfig)[name] in (str, Optional[str], list)


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="YAML of eval keys to change (default: none; EvalConfig's defaults)")
    docs, default = field_docs(EvalConfig), EvalConfig()
    for f in fields(EvalConfig):
        shown = (
            ",".join(default.tasks) if f.name == "tasks" else yaml.safe_dump(getattr(default, f.name)).split("\n")[0]
        )
        nullable = type(None) in typing.get_args(type_hints(EvalConfig)[f.name])
        how = ("" if _text_flag(f.name) else "; a YAML value") + ("; null unsets" if nullable else "")
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None, metavar="VALUE",
                            help=f"{docs[f.name]} (default: {shown}{how})".replace("%", "%%"))


def from_args(args: argparse.Namespace) -> EvalConfig:
    """The config: `--config FILE`'s keys, then each flag's value: YAML for a number or a switch (3, 0.5,
    true), the text for a name, a path or `tasks` (a comma list); null for any (for `tasks`: none)."""
    try:
        base = yaml.safe_load(Path(args.config).read_text()) or {} if args.config else {}
    except (OSError, yaml.YAMLError) as e:
        raise EvalConfigError(f"cannot read eval config {args.config}: {e}") from None
    if not isinstance(base, dict):
        raise EvalConfigError(f"eval config {args.config} must be a mapping of keys to values")
    for name, text in ((f.name, getattr(args, f.name)) for f in fields(EvalConfig)):
        if text is not None:
            try:
                v = yaml.safe_load(text)
            except yaml.YAMLError:
                v = text  # no YAML value: a number's or a switch's check names the key
            base[name] = text if _text_flag(name) and v is not None else v
    return build(EvalConfig, base, "eval", error=EvalConfigError)
