"""Helpers shared by the test modules (imported as `from helpers import ...`)."""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import torch

from model import GPTConfig
from runtime import checkpoint as ck
from trainer.config_store import compose_config
from trainer.loop import train
from trainer.sinks import Sink, wandb_row

MODEL_FIELDS = {f.name for f in fields(GPTConfig)} - {"norm"}


def unregister(registry, name: str) -> None:
    """Remove a component a test registered (the registries have no removal: components are defined
    once, at import)."""
    registry._items.pop(name, None)
    registry._options.pop(name, None)  # its keys, recorded beside it


def gpt_config(norm: str = "pre_ln", **kw) -> GPTConfig:
    """A GPTConfig from keyword arguments: GPTConfig's own fields set the model, every other one is a
    `norm.*` key of the variant `norm` (so `gpt_config("geonorm", n_layer=3, clamp=0.5)`)."""
    model = {k: v for k, v in kw.items() if k in MODEL_FIELDS}
    return GPTConfig(norm={"name": norm, **{k: v for k, v in kw.items() if k not in MODEL_FIELDS}}, **model)


# --- tiny training runs (train.py's loop in-process, on the `pydocs` fixture's corpus) ---

REPO = Path(__file__).resolve().parents[1]
TINY = ["model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=32",
        "train.micro_batch_size=4", "train.batch_tokens=256", "train.eval_tokens=512", "train.eval_interval=1000",
        "train.ckpt_interval=1000", "train.final_eval_tokens=1024", "logging.log_interval=1",
        "logging.stats_interval=1000",
        "logging.wandb.mode=disabled", "logging.console=false", "train.deterministic=true", "optim.warmup_steps=2"]


def make_cfg(run_dir, *overrides):
    """The composed config, as train.py composes it (a composition error: its one-line ConfigError)."""
    return compose_config([*TINY, f"out_dir={run_dir}", *overrides])


def records(run_dir, kind=None):
    rs = [json.loads(s) for s in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rs if kind is None or r["kind"] == kind]


def assert_resume_is_exact(tmp_path, *common):
    """Train 6 steps straight, and 3 + stop + resume to 6: losses, grad norms, LRs and weights must be
    bitwise equal. Returns both final checkpoints for further checks."""
    a, b = tmp_path / "straight", tmp_path / "resumed"
    train(make_cfg(a, *common))
    train(make_cfg(b, *common, "train.stop_at=3"))
    train(make_cfg(b, *common, "train.resume=auto"))
    la = [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in records(a, "train")]
    lb = [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in records(b, "train")]
    assert la == lb and len(la) == 6
    sa, sb = ck.load_checkpoint(ck.find_latest(a)), ck.load_checkpoint(ck.find_latest(b))
    for k, v in sa["model"].items():
        assert torch.equal(v, sb["model"][k]), k
    return sa, sb


def run_with_a_nan_step(tmp_path, *overrides):
    """Train 4 steps with a NaN loss at step 3 and, apart, 2 clean steps; check that the skipped step
    left the model, the update count and the schedule as after step 2. Returns (nan, clean) step-3 and
    step-2 checkpoints for the caller's optimizer-state checks.

    Constant schedule inside its warmup: the LR moves with every applied update, so a skipped step
    that advanced the schedule would show."""
    common = [*overrides, "optim.schedule=constant", "optim.warmup_steps=10", "train.ckpt_interval=1",
              "train.keep_last=9"]
    train(make_cfg(tmp_path / "nan", *common, "train.max_steps=4", "train.inject_nan_at=3"))
    train(make_cfg(tmp_path / "clean", *common, "train.max_steps=2"))
    nan = ck.load_checkpoint(ck.ckpt_path(tmp_path / "nan", 3))
    clean = ck.load_checkpoint(ck.ckpt_path(tmp_path / "clean", 2))
    for k, v in clean["model"].items():
        assert torch.equal(v, nan["model"][k]), k
    assert nan["scheduler"]["updates"] == 2 and nan["scheduler"]["skipped_total"] == 1
    tr = records(tmp_path / "nan", "train")
    # Step 4 runs at the LR step 3 would have had: the schedule did not move.
    assert tr[1]["lr"] < tr[2]["lr"] == tr[3]["lr"]
    return nan, clean


class RecordingSink(Sink):
    """Keeps records in memory, with the keys a wandb sink would log."""

    def __init__(self):
        self.records: list = []
        self.wandb_rows: list = []

    def log(self, record: dict) -> None:
        self.records.append(dict(record))
        row = wandb_row(record)
        if row is not None:
            self.wandb_rows.append(row)


def torchrun(args, env, timeout):
    """`torchrun --standalone --nproc_per_node=2 args` from the repository root -> (exit code,
    stdout + stderr); on a timeout the whole process group is killed (hung ranks included) and the
    test fails with the output."""
    import os
    import signal
    import subprocess
    import sys

    import pytest

    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          *map(str, args)], env=env, cwd=Path(__file__).resolve().parents[1],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        pytest.fail(f"torchrun still running after {timeout} s (a hang?):\n{out[-3000:]}")
    return p.returncode, out
