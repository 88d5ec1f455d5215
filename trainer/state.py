"""What a checkpoint holds of a run, owned by the Trainer: `state_dict` gathers it, `load_state_dict` puts it
back, bitwise (the model, the optimizer and its GradScaler, the schedule's counters, the monitors, every
rank's RNG streams, the data position, the config and the training time so far). trainer/resume.py keeps
the policy around it: which checkpoint, whether it fits, which config changes are allowed."""
from __future__ import annotations

import logging
from pathlib import Path

from runtime import checkpoint

log = logging.getLogger("nanonorm.train")


class TrainerState:
    """The checkpoint half of trainer.loop.Trainer (a mixin: the attributes are the Trainer's own)."""

    def state_dict(self, rng_per_rank: list) -> dict:
        """The checkpoint (on rank 0); `rng_per_rank`: every rank's RNG streams, gathered by the caller."""
        return {
            "model": self.model.state_dict(),
            "model_config": self.model_cfg.to_dict(),
            "tokenizer": self.tokenizer_name,
            "data_dir": str(self.data_dir),
            "optimizer": self.opt.state_dict(),
            "scheduler": {
                "updates": self.updates.item(),
                "skipped_total": int(self.skipped.item()),
                "consecutive_skipped": int(self.consecutive.item()),
                "scaler": self.scaler.state_dict() if self.scaler else None,
            },
            "monitor": {**self.spikes.state_dict(), "best_val_loss": self.best_val, "last_val": self.last_val},
            "rng": {"world_size": self.dist.world_size, "per_rank": rng_per_rank},
            "loader": self.loader.state_dict(),
            "config": self.run_cfg.composed,
            "wandb_run_id": self.wandb_run_id,
            "train_s": self._train_s(),  # all segments up to this checkpoint (the summary's train_s)
        }

    def load_state_dict(self, ckpt: dict, path: Path) -> None:
        """Continue from checkpoint `ckpt` (read from `path`, named in errors), already checked to be of this
        model and tokenizer (resume.load_compatible)."""
        checkpoint.load_weights(self.model, ckpt["model"], path, "this model")
        try:
            self.opt.load_state_dict(ckpt["optimizer"])  # and its groups' LR tensors and settings again
        except (RuntimeError, ValueError, KeyError) as e:
            raise checkpoint.CheckpointError(
                f"checkpoint {path} does not fit this optimizer: {str(e).splitlines()[0]}"
            ) from None
        s = ckpt["scheduler"]
        self.updates.fill_(s["updates"])
        self.skipped.fill_(s["skipped_total"])
        self.consecutive.fill_(s["consecutive_skipped"])
        if self.scaler is not None and s.get("scaler"):
            self.scaler.load_state_dict(s["scaler"])
        m = ckpt.get("monitor") or {}
        if m:
            self.spikes.load_state_dict(m)
            self.best_val, self.last_val = m["best_val_loss"], m["last_val"]
        self.loader.load_state_dict(ckpt["loader"])
        rng = ckpt["rng"]
        if rng.get("world_size") == self.dist.world_size:
            checkpoint.set_rng_state(rng["per_rank"][self.dist.rank])
        else:  # a different world size cannot continue every rank's streams: derive fresh ones
            log.warning(f"resuming {path} with world size {self.dist.world_size} (saved with {rng.get('world_size')}): "
                        f"RNG streams re-derived; data order is unchanged")
            checkpoint.seed_all(checkpoint.rank_seed(self.train_cfg.seed + ckpt["step"], self.dist.rank))
        self.step = int(ckpt["step"])
        self.wandb_run_id = ckpt.get("wandb_run_id")
        self.train_s_before = float(ckpt.get("train_s") or 0.0)  # absent in older checkpoints
