"""train.py as a program: torchrun/gloo DDP, SIGTERM pre-emption, CLI errors, wandb offline."""
import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from test_train import REPO, TINY, make_cfg, records
from trainer import checkpoint as ck
from trainer.loop import train

pytestmark = pytest.mark.usefixtures("pydocs")


def env():
    """The test process's environment (with the session's $NANONORM_DATA), no wandb, one thread."""
    return {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}


def run_cli(args, **kw):
    return subprocess.run(args, cwd=REPO, env=env(), capture_output=True, text=True, timeout=240, **kw)


def test_ddp_two_processes_equal_one_process_with_accumulation(tmp_path):
    common = ["train.max_steps=3", "train.micro_batch_size=4", "train.batch_tokens=256"]  # block 32
    # 1 process: accumulation 2. 2 processes (gloo): accumulation 1 each. Same global batch per step.
    train(make_cfg(tmp_path / "one", *common))
    p = run_cli([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py",
                 *TINY, *common, f"out_dir={tmp_path / 'two'}"])
    assert p.returncode == 0, p.stderr[-3000:]
    one, two = ck.load_checkpoint(ck.find_latest(tmp_path / "one")), ck.load_checkpoint(ck.find_latest(tmp_path / "two"))
    assert two["step"] == 3 and two["rng"]["world_size"] == 2 and len(two["rng"]["per_rank"]) == 2
    for k, v in one["model"].items():
        torch.testing.assert_close(two["model"][k], v, rtol=0, atol=1e-5, msg=k)
    moved = sum((one["model"][k] - v).abs().max().item() for k, v in ck.load_model(tmp_path / "one")[0].state_dict().items())
    assert moved == 0  # load_model returns the saved weights
    # Losses are means over ranks: the same numbers as one process.
    l1 = [r["loss"] for r in records(tmp_path / "one", "train")]
    l2 = [r["loss"] for r in records(tmp_path / "two", "train")]
    assert max(abs(a - b) for a, b in zip(l1, l2)) < 1e-5 and len(l2) == 3
    # loss_max is the largest rank's loss: above the mean when the ranks' batches differ
    two = records(tmp_path / "two", "train")
    assert all(r["loss_max"] >= r["loss"] - 1e-6 for r in two) and all(r["loss_max"] > r["loss"] + 1e-4 for r in two)


def test_sigterm_checkpoints_at_the_next_step_and_exits(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "train.py", *TINY, "train.max_steps=100000", f"out_dir={run}"],
                            cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            m = run / "metrics.jsonl"
            if m.exists() and any(json.loads(l)["kind"] == "train" for l in m.read_text().splitlines()):
                break
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert "SIGTERM received" in out
    latest = ck.find_latest(run)
    step = ck.load_checkpoint(latest)["step"]
    rs = records(run)
    assert 0 < step < 100000 and rs[-1]["kind"] == "train" and rs[-1]["step"] == step  # logged, then saved
    assert not [r for r in rs if r["kind"] == "summary"]  # not finished: no summary line


def test_cli_bad_overrides_print_one_line(tmp_path):
    p = run_cli([sys.executable, "train.py", *TINY, f"out_dir={tmp_path}", "train.precision=fp8"])
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1] == \
        "error: bad config train.precision='fp8': valid: auto, bf16, fp16, fp32"
    p = run_cli([sys.executable, "train.py", f"out_dir={tmp_path}", "train.max_step=5"])  # Hydra: not in struct
    assert p.returncode != 0 and "train.max_step" in p.stderr


def test_wandb_offline_run_has_the_logged_keys_and_keeps_its_id(tmp_path):
    common = ["logging.wandb.mode=offline", "train.eval_interval=2", "logging.stats_interval=2"]
    train(make_cfg(tmp_path, *common, "train.max_steps=2"))
    rid = ck.load_checkpoint(ck.find_latest(tmp_path))["wandb_run_id"]
    assert rid
    train(make_cfg(tmp_path, *common, "train.max_steps=4", "train.resume=auto"))
    assert ck.load_checkpoint(ck.find_latest(tmp_path))["wandb_run_id"] == rid  # the resumed run is the same run
    files = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "*.wandb"))
    assert files and all(rid in f for f in files)
    blob = b"".join(Path(f).read_bytes() for f in files)
    for key in (b"train/loss", b"train/loss_max", b"train/lr", b"train/grad_norm", b"train/tokens_per_s",
                b"eval/val_loss", b"eval/val_ppl", b"stats/rms/0", b"stats/grad_norm/block0", b"final_val_loss"):
        assert key in blob, key
