"""Train a GPT with one residual-stream normalization variant.

    python train.py                                   # tiny model on pydocs, ~5 min on 2 CPU cores
    python train.py norm=spheret norm.p=1 model=gpt_125m data=fineweb_edu train.max_steps=20000
    torchrun --nproc_per_node=8 train.py norm=geonorm  # DDP (NCCL on CUDA, gloo on CPU)
    python train.py train.resume=auto                 # continue the run dir's newest checkpoint
"""
import sys

import hydra
from omegaconf import DictConfig

from common import report_user_errors
from runtime.launch import env_rank, hydra_argv_for_rank


def main(cfg: DictConfig) -> dict:
    from trainer.loop import train

    return train(cfg)


@hydra.main(config_path="configs", config_name="config", version_base=None)
def _hydra_main(cfg: DictConfig) -> None:
    # A user error (bad override, missing data, unusable checkpoint) is one line and exit 2; a
    # diverged run has logged why, and exits 0 with its checkpoint and summary.
    report_user_errors(main, cfg)


if __name__ == "__main__":
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        from pathlib import Path

        from trainer.cli_help import config_help

        print(config_help(Path(__file__).resolve().parent / "configs"))  # the schema is torch-free: no torch
        sys.exit(0)
    sys.argv = hydra_argv_for_rank(sys.argv, env_rank())
    from trainer.config_store import register_code_configs, run_hydra

    register_code_configs()  # the schema and the `norm=<name>` options, read without torch
    run_hydra(_hydra_main)   # a bad override is one line, like every other user error
