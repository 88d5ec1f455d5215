"""train.py's loop in-process (Hydra compose API + trainer.loop.train): resume, guard, variants, metrics.

Tiny models (2 layers, d=32, block 32) on the byte-tokenized pydocs corpus, prepared once per test session
(the `pydocs` fixture of conftest.py, which points $NANONORM_DATA at it).
"""
import json
import math
import os
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from trainer import checkpoint as ck
from trainer.config import ConfigError
from trainer.loop import train
from trainer.monitor import SpikeDetector
from trainer.optim import LRSchedule, build_optimizer
from trainer.config import OptimConfig
from trainer.sinks import RecordingSink, wandb_row

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("pydocs")
TINY = ["model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=32",
        "train.micro_batch_size=4", "train.batch_tokens=256", "train.eval_tokens=512", "train.eval_interval=1000",
        "train.ckpt_interval=1000", "logging.log_interval=1", "logging.stats_interval=1000",
        "logging.wandb.mode=disabled", "logging.console=false", "train.deterministic=true", "optim.warmup_steps=2"]


def make_cfg(run_dir, *overrides):
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        return compose("config", overrides=[*TINY, f"out_dir={run_dir}", *overrides])


def records(run_dir, kind=None):
    rs = [json.loads(l) for l in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rs if kind is None or r["kind"] == kind]


def test_resume_is_bitwise_exact(tmp_path):
    common = ["train.max_steps=6", "optim.schedule=cosine", "train.micro_batch_size=2"]  # accum 2
    a, b = tmp_path / "straight", tmp_path / "resumed"
    train(make_cfg(a, *common))
    r1 = train(make_cfg(b, *common, "train.stop_at=3"))
    assert r1["stopped"] == "stop_at" and Path(r1["checkpoint"]).name == "ckpt_00000003.pt"
    assert not records(b, "summary")  # a pre-empted run has no summary yet
    r2 = train(make_cfg(b, *common, "train.resume=auto"))
    assert r2["steps"] == 6
    la = [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in records(a, "train")]
    lb = [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in records(b, "train")]
    assert la == lb and len(la) == 6  # bitwise: JSON floats round-trip exactly
    assert records(a, "eval") == records(b, "eval")
    sa, sb = ck.load_checkpoint(ck.find_latest(a)), ck.load_checkpoint(ck.find_latest(b))
    for k, v in sa["model"].items():
        assert torch.equal(v, sb["model"][k]), k
    assert sa["scheduler"]["updates"] == sb["scheduler"]["updates"] == 6


@pytest.mark.parametrize("norm", sorted(__import__("model").VARIANTS))
def test_every_variant_overfits_one_batch(tmp_path, norm):
    rec = RecordingSink()
    train(make_cfg(tmp_path, f"norm={norm}", "train.overfit_batch=true", "optim.schedule=constant",
                   "optim.warmup_steps=0", "optim.lr=3e-3", "train.max_steps=10", "train.eval_tokens=128"), sinks=[rec])
    losses = [r["loss"] for r in rec.records if r["kind"] == "train"]
    assert len(losses) == 10 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.1, (norm, losses)


def test_nonfinite_step_is_skipped_without_touching_state(tmp_path):
    # Constant schedule inside its warmup: the LR moves with every applied update, so a skipped step
    # that advanced the schedule would show. A NaN loss at step 3 must leave everything as after step 2.
    common = ["optim.schedule=constant", "optim.warmup_steps=10", "train.ckpt_interval=1", "train.keep_last=9"]
    train(make_cfg(tmp_path / "nan", *common, "train.max_steps=4", "train.inject_nan_at=3"))
    train(make_cfg(tmp_path / "clean", *common, "train.max_steps=2"))
    nan = ck.load_checkpoint(ck.ckpt_path(tmp_path / "nan", 3))
    clean = ck.load_checkpoint(ck.ckpt_path(tmp_path / "clean", 2))
    for k, v in clean["model"].items():
        assert torch.equal(v, nan["model"][k]), k
    for pid, st in clean["optimizer"]["state"].items():
        for name, t in st.items():
            assert torch.equal(t, nan["optimizer"]["state"][pid][name]), (pid, name)
    assert nan["scheduler"]["updates"] == 2 and nan["scheduler"]["skipped_total"] == 1
    tr = records(tmp_path / "nan", "train")
    assert [r["skipped_steps"] for r in tr] == [0, 0, 1, 1]
    assert tr[2]["loss"] is None and tr[3]["loss"] is not None  # NaN is written as null
    # Step 4 runs at the LR step 3 would have had: the schedule did not move.
    assert tr[1]["lr"] < tr[2]["lr"] == tr[3]["lr"]


def test_consecutive_nonfinite_steps_stop_the_run_with_a_checkpoint(tmp_path):
    res = train(make_cfg(tmp_path, "train.max_steps=50", "train.inject_nan_at=2", "train.inject_nan_steps=100",
                         "train.max_skipped=3"))
    assert res["diverged"] and "3 consecutive non-finite" in res["message"]
    assert res["steps"] == 4 and Path(res["checkpoint"]).name == "ckpt_00000004.pt"
    summary = records(tmp_path)[-1]
    assert summary["kind"] == "summary" and summary["diverged"] is True and summary["skipped_steps"] == 3
    assert math.isfinite(summary["final_val_loss"])  # skipped steps never touched the weights


def test_metrics_jsonl_schema_and_sink_keys(tmp_path):
    rec = RecordingSink()
    train(make_cfg(tmp_path, "norm=spheret", "train.max_steps=4", "logging.log_interval=2",
                   "train.eval_interval=2", "logging.stats_interval=2", "train.seed=7"), sinks=[rec])
    rs = records(tmp_path)
    assert [r["kind"] for r in rs] == ["eval", "stats", "train", "eval", "stats", "train", "eval", "summary"]
    for r in rs:
        assert isinstance(r["step"], int) and r["tokens"] == r["step"] * 256
    train_keys = {"loss", "loss_max", "lr", "grad_norm", "tokens_per_s", "step_time", "mfu", "skipped_steps",
                  "spikes_loss", "spikes_grad_norm"}
    t = [r for r in rs if r["kind"] == "train"][-1]
    assert train_keys <= set(t) and t["mfu"] is None
    assert t["loss_max"] == t["loss"]  # one process: the max over ranks is the loss itself
    e = [r for r in rs if r["kind"] == "eval"][-1]
    assert e["val_ppl"] == pytest.approx(math.exp(e["val_loss"]))
    st = [r for r in rs if r["kind"] == "stats"][-1]
    assert {f"rms/{j}" for j in range(5)} | {"grad_norm/block0", "grad_norm/block1"} <= set(st)
    assert any(k.startswith("angle_mean/") for k in st) and any(k.startswith("step/") for k in st)
    s = rs[-1]
    assert {"final_val_loss", "final_val_ppl", "best_val_loss", "spikes_loss", "spikes_grad_norm", "skipped_steps",
            "diverged", "steps", "tokens", "norm", "seed"} <= set(s)
    assert (s["norm"], s["seed"], s["steps"], s["diverged"]) == ("spheret", 7, 4, False)
    assert s["final_val_loss"] == e["val_loss"] and s["best_val_loss"] <= e["val_loss"]
    cfg_text = (tmp_path / "config.yaml").read_text()
    assert "name: spheret" in cfg_text and "seed: 7" in cfg_text
    # The recording sink saw exactly the file's records; wandb would get '<kind>/<key>' rows.
    assert [r["kind"] for r in rec.records] == [r["kind"] for r in rs]
    keys = set().union(*rec.wandb_rows)
    assert {"train/loss", "train/loss_max", "train/lr", "train/grad_norm", "train/tokens_per_s", "eval/val_loss",
            "eval/val_ppl", "stats/rms/0", "stats/grad_norm/block1"} <= keys
    assert wandb_row({"kind": "spike", "step": 3, "tokens": 9, "metric": "loss", "value": 9.0, "z": 7.0}) == \
        {"spike/loss": 9.0, "spike/loss_z": 7.0, "tokens": 9}


def test_spike_detector_on_synthetic_series():
    g = torch.Generator().manual_seed(0)
    series = (2.0 + 0.01 * torch.randn(200, generator=g)).tolist()
    series[120] = 2.5      # ~50 sigma: a spike
    series[150] = float("nan")  # skipped step: ignored
    det = SpikeDetector(window=50, k=6.0, min_history=20)
    hits = [(i, z) for i, v in enumerate(series) if (z := det.update(v)) is not None]
    assert [i for i, _ in hits] == [120] and hits[0][1] > 6 and det.count == 1
    # Too little history: nothing is flagged.
    det2 = SpikeDetector(window=50, k=6.0, min_history=20)
    assert all(det2.update(v) is None for v in [1.0] * 5 + [100.0])
    # A value below the mean is never a spike (one-sided), and state round-trips.
    det3 = SpikeDetector(window=10, k=3.0, min_history=5)
    for v in [1.0, 1.1, 0.9, 1.0, 1.05]:
        det3.update(v)
    det4 = SpikeDetector(window=10, k=3.0, min_history=5)
    det4.load_state_dict(det3.state_dict())
    z = det3.update(9.0)
    assert z is not None and det4.update(9.0) == z and det4.count == 1
    assert det3.update(-50.0) is None


def test_lr_schedules_and_weight_decay_groups():
    base = dict(lr=1.0, min_lr=0.1, warmup_steps=10)
    cos = LRSchedule(OptimConfig(schedule="cosine", **base), max_steps=110)
    assert cos(0.0) == pytest.approx(1 / 11) and cos(10.0) == pytest.approx(1.0) and cos(110.0) == pytest.approx(0.1)
    assert cos(60.0) == pytest.approx(0.55)
    wsd = LRSchedule(OptimConfig(schedule="wsd", decay_frac=0.2, **base), max_steps=100)
    assert wsd(50.0) == 1.0 and wsd(80.0) == 1.0 and wsd(90.0) == pytest.approx(0.55) and wsd(100.0) == pytest.approx(0.1)
    const = LRSchedule(OptimConfig(schedule="constant", **base), max_steps=100)
    assert const(99.0) == 1.0
    # The tensor path (the hot loop) computes the same values.
    for s in (cos, wsd, const):
        for u in (0.0, 5.0, 37.0, 95.0):
            assert s(torch.tensor(u, dtype=torch.float64)).item() == pytest.approx(s(u))
    from model import GPT, GPTConfig
    m = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=1, n_embd=8))
    opt = build_optimizer(m, OptimConfig(weight_decay=0.1), torch.device("cpu"))
    wd = {g["group"]: g["weight_decay"] for g in opt.param_groups}
    assert wd == {"matrices": 0.1, "embeddings": 0.1, "vectors": 0.0}  # pre_ln has no scalars


@pytest.mark.parametrize("override, match", [
    ("train.precision=fp8", r"train\.precision='fp8'.*bf16, fp16, fp32"),
    ("optim.schedule=linear", r"unknown optim\.schedule='linear': valid are cosine, wsd, constant"),
    ("train.batch_tokens=300", r"train\.batch_tokens=300.*multiple of .* = 4 \* 32 \* 1 = 128"),
    ("logging.wandb.mode=sometimes", r"logging\.wandb\.mode"),
    ("train.max_steps=0", r"train\.max_steps=0: must be a positive integer"),
    ("+train.max_step=5", r"unknown key\(s\) train\.max_step"),
    ("+model.foo=1", r"unknown model key\(s\) \['foo'\]"),
    ("+norm.clamps=1", r"unknown norm key\(s\) \['clamps'\]"),
    ("model.n_embd=33", r"n_embd"),
])
def test_bad_overrides_fail_with_one_clear_line(tmp_path, override, match):
    with pytest.raises(ConfigError, match=match) as e:
        train(make_cfg(tmp_path, override))
    assert "\n" not in str(e.value)


def test_run_dir_checkpoints_keep_last_and_errors(tmp_path):
    train(make_cfg(tmp_path, "train.max_steps=4", "train.ckpt_interval=1", "train.keep_last=2"))
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["ckpt_00000003.pt", "ckpt_00000004.pt"]  # last K kept, no temp files left
    ckpt = ck.load_checkpoint(ck.find_latest(tmp_path))
    assert ckpt["format"] == "nanonorm-ckpt" and ckpt["step"] == 4 and ckpt["tokenizer"] == "bytes"
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in ckpt["model"])
    for k in ("optimizer", "scheduler", "rng", "loader", "config", "wandb_run_id", "data_dir", "model_config"):
        assert k in ckpt
    model, _ = ck.load_model(tmp_path)
    assert not model.training and model.config.n_embd == 32
    # Starting over in a used run dir without saying how is refused.
    with pytest.raises(ConfigError, match="already holds a run.*train.resume=auto"):
        train(make_cfg(tmp_path, "train.max_steps=4"))
    # Incompatible: another width names the field and the file.
    with pytest.raises(ck.CheckpointError, match=r"ckpt_00000004\.pt is incompatible.*model_config\.n_embd is 32 .* but 64"):
        train(make_cfg(tmp_path, "train.max_steps=8", "train.resume=auto", "model.n_embd=64"))
    # Corrupt newest checkpoint: named, with the way out.
    latest = ck.find_latest(tmp_path)
    latest.write_bytes(latest.read_bytes()[:1000])
    with pytest.raises(ck.CheckpointError, match=r"ckpt_00000004\.pt is corrupt"):
        train(make_cfg(tmp_path, "train.max_steps=8", "train.resume=auto"))
    with pytest.raises(ck.CheckpointError, match="not a nanonorm checkpoint"):
        torch.save({"a": 1}, tmp_path / "other.pt")
        ck.load_checkpoint(tmp_path / "other.pt")


def test_sigusr1_and_sigterm_only_set_a_flag():
    import signal
    stop = ck.StopSignal().install()
    try:
        assert stop.received is None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.received == "SIGUSR1"  # the loop, not the handler, checkpoints (at a step boundary)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.received == "SIGTERM"
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
