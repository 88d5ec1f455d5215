"""train.py as a program: torchrun/gloo DDP, SIGTERM pre-emption, CLI errors, wandb offline."""
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import REPO, TINY, make_cfg, records
from runtime import checkpoint as ck
from trainer.loop import train

pytestmark = pytest.mark.usefixtures("pydocs")


def env():
    """The test process's environment (with the session's $NANONORM_DATA), no wandb, one thread."""
    return {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}


def run_cli(args, timeout=240, **kw):
    return subprocess.run(args, cwd=REPO, env=env(), capture_output=True, text=True, timeout=timeout, **kw)


@pytest.mark.slow
@pytest.mark.parametrize(
    "model", [[], ["norm=hybridnorm", "model.attn_gate=headwise"]], ids=["pre_ln", "hybridnorm-gated"]
)
def test_ddp_two_processes_equal_one_process_with_accumulation(tmp_path, model):
    common = ["train.max_steps=3", "train.micro_batch_size=4", "train.batch_tokens=256", *model]  # block 32
    # 1 process: accumulation 2. 2 processes (gloo): accumulation 1 each. Same global batch per step.
    train(make_cfg(tmp_path / "one", *common))
    p = run_cli([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py",
                 *TINY, *common, f"out_dir={tmp_path / 'two'}"])
    assert p.returncode == 0, p.stderr[-3000:]
    one, two = (
        ck.load_checkpoint(ck.find_latest(tmp_path / "one")),
        ck.load_checkpoint(ck.find_latest(tmp_path / "two")),
    )
    assert two["step"] == 3 and two["rng"]["world_size"] == 2 and len(two["rng"]["per_rank"]) == 2
    for k, v in one["model"].items():
        torch.testing.assert_close(two["model"][k], v, rtol=0, atol=1e-5, msg=k)
    moved = sum(
        (one["model"][k] - v).abs().max().item() for k, v in ck.load_model(tmp_path / "one")[0].state_dict().items()
    )
    assert moved == 0  # load_model returns the saved weights
    # Losses are means over ranks: the same numbers as one process.
    l1 = [r["loss"] for r in records(tmp_path / "one", "train")]
    l2 = [r["loss"] for r in records(tmp_path / "two", "train")]
    assert max(abs(a - b) for a, b in zip(l1, l2)) < 1e-5 and len(l2) == 3
    # loss_max is the largest rank's loss: above the mean when the ranks' batches differ
    two = records(tmp_path / "two", "train")
    assert all(r["loss_max"] >= r["loss"] - 1e-6 for r in two) and all(r["loss_max"] > r["loss"] + 1e-4 for r in two)


@pytest.mark.slow
def test_ddp_with_accumulation_on_every_rank_equals_one_process_and_resumes_exactly(tmp_path):
    """2 ranks x accumulation 2 (no_sync on the first micro-step) against 1 process x accumulation 4; then a
    DDP run stopped at step 2 and resumed to 3 against the straight DDP run."""
    common = ["train.micro_batch_size=2", "train.batch_tokens=256"]  # block 32: 8 sequences per step
    train(make_cfg(tmp_path / "one", "train.max_steps=3", *common))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py", *TINY,
                *common]
    p = run_cli([*torchrun, "train.max_steps=3", f"out_dir={tmp_path / 'two'}"])
    assert p.returncode == 0, p.stderr[-3000:]
    one, two = (
        ck.load_checkpoint(ck.find_latest(tmp_path / "one")),
        ck.load_checkpoint(ck.find_latest(tmp_path / "two")),
    )
    for k, v in one["model"].items():
        torch.testing.assert_close(two["model"][k], v, rtol=0, atol=1e-5, msg=k)
    run = [
        *torchrun,
        "train.max_steps=3",
        "train.ckpt_interval=1",
        "train.keep_last=5",
        f"out_dir={tmp_path / 'resumed'}",
    ]
    assert run_cli(run).returncode == 0
    last = ck.find_latest(tmp_path / "resumed")
    last.unlink()                                          # as if killed after the save of step 2
    p = run_cli([*run, "train.resume=auto"])
    assert p.returncode == 0, p.stderr[-3000:]
    resumed = ck.load_checkpoint(ck.find_latest(tmp_path / "resumed"))
    assert resumed["step"] == 3
    for k, v in two["model"].items():
        assert torch.equal(resumed["model"][k], v), k      # bitwise: resume is exact under DDP too


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])   # SIGINT: Ctrl-C saves too (it was a traceback, no save)
def test_sigterm_checkpoints_at_the_next_step_and_exits(tmp_path, sig):
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "train.py", *TINY, "train.max_steps=100000", f"out_dir={run}"],
                            cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            m = run / "metrics.jsonl"
            if m.exists() and any(json.loads(s)["kind"] == "train" for s in m.read_text().splitlines()):
                break
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            time.sleep(0.2)
        proc.send_signal(getattr(signal, sig))
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert f"{sig} received" in out and "Traceback" not in out
    latest = ck.find_latest(run)
    step = ck.load_checkpoint(latest)["step"]
    rs = records(run)
    assert 0 < step < 100000 and rs[-1]["kind"] == "train" and rs[-1]["step"] == step  # logged, then saved
    assert not [r for r in rs if r["kind"] == "summary"]  # not finished: no summary line


@pytest.mark.slow
def test_cli_bad_overrides_print_one_line(tmp_path):
    p = run_cli([sys.executable, "train.py", *TINY, f"out_dir={tmp_path}", "train.precision=fp8"])
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1] == \
        "error: bad config train.precision='fp8': valid: auto, bf16, fp16, fp32"
    p = run_cli([sys.executable, "train.py", f"out_dir={tmp_path}", "train.max_step=5"])  # Hydra: not in struct
    assert p.returncode != 0 and "train.max_step" in p.stderr
    # an empty key (Hydra: a ValueError traceback) and a seed beyond torch's range (an overflow in manual_seed)
    for arg, line in (("=1", "error: bad override '=1': the key before '=' is empty (write key=value, e.g. "
                                "train.seed=1)"),
                      ("train.seed=18446744073709551616", "error: bad config train.seed=18446744073709551616: must "
                       "be an integer in [0, 18446744073709551615] (the range torch.manual_seed takes)")):
        p = run_cli([sys.executable, "train.py", *TINY, f"out_dir={tmp_path}", arg])
        assert p.returncode == 2 and p.stderr.strip().splitlines() == [line], p.stderr[-2000:]
    # interpolations that cannot resolve (OmegaConf tracebacks before)
    for arg, line in (("run_name=${nope}", "error: bad interpolation in run_name=${nope}: Interpolation key 'nope' "
                                           "not found"),
                      ("optim.lr=${oc.env:NANONORM_UNSET_VAR}", "error: bad interpolation in optim.lr=${oc.env:"
                       "NANONORM_UNSET_VAR}: KeyError raised while resolving interpolation: \"Environment variable "
                       "'NANONORM_UNSET_VAR' not found\"")):
        p = run_cli([sys.executable, "train.py", *TINY, f"out_dir={tmp_path}", arg])
        assert p.returncode == 2 and p.stderr.strip().splitlines() == [line], p.stderr[-2000:]


@pytest.mark.slow
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


def _worker_pid(parent: int, rank: int) -> int:
    """The pid of torchrun's worker of a given rank (its child with RANK=<rank> in the environment)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            env = (stat.parent / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(fields[1]) == parent and f"RANK={rank}".encode() in env:
            return int(stat.parent.name)
    raise AssertionError(f"no rank {rank} worker under pid {parent}")


@pytest.mark.slow
def test_ddp_sigterm_is_acted_on_within_two_steps(tmp_path):
    """Only rank 1 gets SIGTERM, between log steps (log_interval 1000): every rank must stop at the same
    step, one or two steps later, with a checkpoint; the message is printed once."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             "train.py", *TINY, "train.max_steps=100000", "logging.log_interval=1000",
                             "train.eval_interval=100000", "train.ckpt_interval=5", "train.keep_last=1000",
                             "logging.console=true", f"out_dir={run}"],
                            cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 180
        while not ck.ckpt_path(run, 5).exists():
            assert proc.poll() is None and time.time() < deadline, proc.stdout.read()[-3000:]
            time.sleep(0.02)
        os.kill(_worker_pid(proc.pid, 1), signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    m = re.findall(r"received at step (\d+): checkpoint saved at step (\d+)", out)
    assert len(m) == 1, out[-3000:]  # printed once, by rank 0
    got, saved = map(int, m[0])
    assert 5 <= got <= saved <= got + 2, (got, saved)  # the step it came in, or one or two later
    assert ck.load_checkpoint(ck.find_latest(run))["step"] == saved
    assert records(run)[-1] == {**records(run)[-1], "kind": "train", "step": saved}  # logged, then saved


@pytest.mark.slow
def test_train_help_lists_groups_and_documented_options():
    p = run_cli([sys.executable, "train.py", "--help"])
    assert p.returncode == 0, p.stderr
    out = p.stdout
    for needle in ("model=", "tiny", "gpt_125m", "norm=", "geonorm", "data=", "fineweb_edu", "experiment=",
                   "train.max_steps", "train.batch_tokens", "global batch in tokens", "optim.lr",
                   "optim.schedule", "cosine | wsd | constant", "logging.log_interval", "logging.wandb.mode",
                   "train.resume", "newest checkpoint in the run dir"):
        assert needle in out, needle


@pytest.mark.slow
def test_two_runs_started_together_into_one_run_dir(tmp_path):
    """Started in the same instant, before either has written anything: one runs, the other is refused
    at once in one line; the run dir then holds the one run."""
    cmd = [sys.executable, "train.py", *TINY, "train.max_steps=100000", f"out_dir={tmp_path}"]
    procs = [subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        deadline = time.time() + 180
        while all(p.poll() is None for p in procs):
            assert time.time() < deadline, "neither run was refused"
            time.sleep(0.1)
        loser = next(p for p in procs if p.poll() is not None)
        winner = next(p for p in procs if p is not loser)
        _, err = loser.communicate()
        assert loser.returncode == 2 and winner.poll() is None, err[-2000:]
        assert err.strip().splitlines()[-1].startswith(f"error: run dir {tmp_path} is in use by another train.py "
                                                       f"(pid {winner.pid} holds")
        winner.send_signal(signal.SIGTERM)
        winner.communicate(timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert winner.returncode == 0
    step = ck.load_checkpoint(ck.find_latest(tmp_path))["step"]
    assert [r["step"] for r in records(tmp_path, "eval")] == [0]  # one run's records only
    assert records(tmp_path, "train")[-1]["step"] == step


@pytest.mark.slow
def test_when_rank_0_fails_before_training_every_other_rank_says_so_in_one_line(tmp_path):
    """Rank 0 fails preparing the data (a glob that matches nothing): rank 1, waiting for it, used to die in
    the gloo barrier with a ~40-line traceback."""
    p = run_cli([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py",
                 *TINY, "data=local", f"data.files={tmp_path}/nothing/*.jsonl", f"data.root={tmp_path}/data",
                 f"out_dir={tmp_path / 'run'}"], timeout=180)
    out = p.stdout + p.stderr
    assert p.returncode != 0
    assert "error: data.files: no file matches" in out, out[-3000:]
    assert re.search(r"^error: rank 0 failed while preparing the data \(DataError; its error is printed above\); "
                     r"rank 1 stops with it$", out, re.M), out[-3000:]
    assert "[rank1]: Traceback" not in out and "exitcode  : 2" in out      # one line and exit 2, no traceback


@pytest.mark.slow
def test_ranks_that_disagree_on_divergence_stop_together(tmp_path):
    """A rank whose skipped-step counter alone reaches the limit used to stop and enter the eval and save
    collectives by itself, leaving the other rank in its next step's gradient all-reduce: a hang."""
    p = run_cli([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
                 "tests.torchrun_scripts", "rank_disagrees", str(tmp_path / "run")], timeout=180)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert sorted(re.findall(r"rank (\d): diverged=True steps=(\d+)", out)) == [("0", "4"), ("1", "4")], out[-3000:]
    assert out.count("consecutive non-finite steps were skipped") == 1      # one line, from rank 0


@pytest.mark.slow
def test_divergence_is_reported_once(tmp_path):
    p = run_cli([sys.executable, "train.py", *TINY, "train.max_steps=50", "train.inject_nan_at=2",
                 "train.inject_nan_steps=100", "train.max_skipped=3", f"out_dir={tmp_path}"])
    assert p.returncode == 0, p.stderr[-2000:]
    assert (p.stdout + p.stderr).count("consecutive non-finite steps were skipped") == 1


@pytest.mark.slow
def test_a_refused_command_writes_nothing_into_the_run_dir(tmp_path):
    """A refused train.py (a bad value; a run the resume finds complete) used to rewrite the run's Hydra record
    (.hydra/overrides.yaml with the refused override), its train.log and its config.yaml; an empty out_dir
    trained into the current directory."""
    run = tmp_path / "run"
    p = run_cli([sys.executable, "train.py", *TINY, "train.max_steps=3", "logging.console=true", f"out_dir={run}"])
    assert p.returncode == 0, p.stderr[-2000:]
    files = [run / ".hydra" / n for n in ("config.yaml", "hydra.yaml", "overrides.yaml")]
    files += [run / "train.log", run / "config.yaml", run / "metrics.jsonl"]
    before = {f: f.read_bytes() for f in files}
    assert b"train.max_steps=3" in before[run / ".hydra" / "overrides.yaml"] and before[run / "train.log"]
    p = run_cli([sys.executable, "train.py", *TINY, "train.max_steps=0", f"out_dir={run}"])
    assert p.returncode == 2 and "train.max_steps=0" in p.stderr
    assert {f: f.read_bytes() for f in files} == before
    p = run_cli([sys.executable, "train.py", *TINY, "train.max_steps=2", "train.resume=auto", "logging.console=true",
                 f"out_dir={run}"])
    assert p.returncode == 0 and "already complete" in p.stdout + p.stderr
    log = run / "train.log"   # the run's log gains the line that says so; every record stays as it was
    assert log.read_bytes().startswith(before.pop(log)) and b"already complete" in log.read_bytes()
    assert {f: f.read_bytes() for f in files if f != log} == before
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    p = subprocess.run([sys.executable, str(REPO / "train.py"), *TINY, "out_dir=", "train.max_steps=1"], cwd=cwd,
                       env=env(), capture_output=True, text=True, timeout=240)
    assert p.returncode == 2 and "bad config out_dir=''" in p.stderr and not any(cwd.iterdir())
