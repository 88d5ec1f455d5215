"""The train, optim and logging groups and the whole run (`RunConfig`), typed and validated once at
start-up; each default, its doc and its valid values are written once, in the dataclass fields."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Literal, Optional

from omegaconf import DictConfig, OmegaConf

from common.config import PosInt, Range, Seed, bad, build, check

from .optim_options import GroupConfig, GroupsConfig, OptimConfig, optim_config  # noqa: F401  (re-exported)

if TYPE_CHECKING:  # parse_run_config imports them when it builds them
    from data.config import DataConfig
    from model.config import GPTConfig


@dataclass(frozen=True)
class TrainConfig:
    seed: Seed = 1337                     # set once; rank r uses a seed derived from (seed, r)
    max_steps: PosInt = 600               # optimizer steps in the whole run (the LR schedule spans them)
    batch_tokens: PosInt = 8192           # global batch in tokens (grad accumulation makes up the rest)
    micro_batch_size: PosInt = 16         # sequences per rank per forward/backward
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: cuda if available
    #: auto: bf16 on CUDA when supported, else fp32; fp16 with a GradScaler
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    compile: Literal["auto", True, False] = "auto"  # torch.compile (auto: on for CUDA)
    #: the training loss from the head and cross-entropy chunk by chunk, never the batch's fp32 logits
    #: (model/loss.py; auto: on for CUDA, where they cost GBs; the plain path on CPU)
    fused_loss: Literal["auto", True, False] = "auto"
    deterministic: bool = False           # torch.use_deterministic_algorithms (bitwise resume on CPU)
    threads: Optional[PosInt] = None      # CPU threads for torch (null: all cores); several CPU jobs at once: 1 each
    #: CPU: flush subnormal floats to zero (torch.set_flush_denormal). A run whose values drift below 1.2e-38
    #: (a stalled or diverging one) then runs at full speed instead of up to ~2x slower, but computes other
    #: numbers: keep one setting across the runs a study compares. No effect on CUDA.
    flush_denormal: bool = False
    eval_interval: PosInt = 100           # steps between validation passes (also at step 0 and at the end)
    eval_tokens: PosInt = 65536           # validation tokens per evaluation, windows spread evenly over the split
    #: the run's final evaluation (and each cooldown branch's): windows spread over the split (null: all of it)
    final_eval_tokens: Optional[PosInt] = None
    eval_batch_size: Optional[PosInt] = None  # null = micro_batch_size
    ckpt_interval: PosInt = 200           # steps between checkpoints (also at the end and on SIGTERM/SIGUSR1)
    keep_last: PosInt = 3                 # checkpoints kept
    ckpt_steps: tuple = ()                # also checkpoint after these steps, and keep them (cooldown branch points)
    resume: str = "none"                  # none | auto (newest checkpoint in the run dir) | path to a ckpt_*.pt
    resume_force: bool = False            # resume though train.seed, batch_tokens or data.* changed
    overwrite: bool = False               # start fresh in a run dir holding a run (deletes its checkpoints/metrics)
    stop_at: Optional[PosInt] = None      # stop (with a checkpoint) after this step, as if pre-empted
    #: stop after this many consecutive non-finite (skipped) steps (checked at logging steps)
    max_skipped: PosInt = 20
    overfit_batch: bool = False           # train on one fixed batch (debugging, and the per-variant test)
    #: debugging: the loss is NaN from this step on (the non-finite guard; trainer/faults.py)
    inject_nan_at: Optional[PosInt] = None
    inject_nan_steps: PosInt = 1          # ... for this many consecutive steps

    def __post_init__(self) -> None:
        check(self, "train")
        if not self.resume:
            bad("train.resume", self.resume, "none | auto | path to a ckpt_*.pt")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in self.ckpt_steps):
            bad("train.ckpt_steps", list(self.ckpt_steps), "must be a list of positive step numbers")


@dataclass(frozen=True)
class WandbConfig:
    mode: Literal["online", "offline", "disabled"] = "offline"  # configs/logging: $WANDB_MODE
    project: str = "nanonorm"             # wandb project
    entity: Optional[str] = None          # wandb entity (null: your default)
    group: Optional[str] = None           # wandb group
    name: Optional[str] = None            # null = run_name
    tags: tuple = ()                      # wandb tags

    def __post_init__(self) -> None:
        check(self, "logging.wandb")


@dataclass(frozen=True)
class LoggingConfig:
    log_interval: PosInt = 10             # steps between train records (the only per-step host sync)
    stats_interval: PosInt = 100          # steps between stats records (residual RMS, grad norms, sphere stats)
    spike_window: PosInt = 50             # spike detector: window of previous per-step values
    spike_k: Annotated[float, Range(0, float("inf"), "(]")] = 6.0  # a spike = value > mean + k * std of the window
    spike_min_history: int = 20           # no detection until the window holds this many values
    console: bool = True                  # print progress on rank 0
    wandb: WandbConfig = field(default_factory=WandbConfig)  # wandb sink (metrics.jsonl is always written)

    def __post_init__(self) -> None:
        check(self, "logging")
        if not (2 <= self.spike_min_history <= self.spike_window):
            bad("logging.spike_min_history", self.spike_min_history,
                 f"must be in [2, logging.spike_window={self.spike_window}]")


@dataclass(frozen=True)
class RunConfig:
    """The whole run, built by parse_run_config; the Trainer takes only it."""
    train: TrainConfig
    optim: OptimConfig
    logging: LoggingConfig
    model: Optional[GPTConfig] = None     # at the vocabulary of data.tokenizer
    data: Optional[DataConfig] = None
    out_dir: Optional[str] = None         # the run dir
    run_name: Optional[str] = None        # the run's name (wandb)
    composed: dict = field(default_factory=dict)  # the resolved composed config, as config.yaml and checkpoints keep it


def parse_run_config(cfg: DictConfig) -> RunConfig:
    """Every group of the composed config, built and validated (else ConfigError): train, optim, logging,
    and where present data and the model at the data's tokenizer's vocabulary (before any data preparation)."""
    train, optim = build(TrainConfig, cfg.train, "train"), optim_config(cfg.optim)
    if optim.name == "muon" and train.precision == "fp16":
        bad("train.precision", "fp16", "optim=muon runs in bf16 or fp32 (its split Q/K/V updates bypass fp16's "
                                       "gradient scaler); use train.precision=bf16")
    model = data = None
    if "data" in cfg:
        from data.config import DataConfig

        data = DataConfig.from_any(cfg.data)
    if "model" in cfg and "norm" in cfg:
        from data import get_tokenizer
        from model.config import GPTConfig

        vocab = get_tokenizer(data.tokenizer).vocab_size if data is not None else 1
        model = GPTConfig.from_hydra(cfg.model, cfg.norm, vocab_size=vocab)
    composed = OmegaConf.to_container(cfg, resolve=True)
    if train.inject_nan_at is not None and train.inject_nan_at > train.max_steps:
        bad("train.inject_nan_at", train.inject_nan_at, f"is after the run's last step (train.max_steps="
                                                        f"{train.max_steps}): it would inject nothing")
    if "out_dir" in composed and not str(composed["out_dir"] or "").strip():
        bad("out_dir", composed["out_dir"], "is empty: give the run dir (default runs/<run_name>), not the current "
                                            "directory")
    return RunConfig(train, optim, build(LoggingConfig, cfg.logging, "logging"), model, data,
                     composed.get("out_dir"), composed.get("run_name"), composed)


def grad_accum_steps(batch_tokens: int, micro_batch_size: int, block_size: int, world_size: int) -> int:
    per = micro_batch_size * block_size * world_size
    if batch_tokens % per or batch_tokens < per:
        bad("train.batch_tokens", batch_tokens, f"must be a positive multiple of train.micro_batch_size * "
            f"model.block_size * world_size = {micro_batch_size} * {block_size} * {world_size} = {per}")
    return batch_tokens // per
