"""train.py's loop in-process (Hydra compose API + trainer.loop.train): resume, guard, variants, metrics.

Tiny models (2 layers, d=32, block 32) on the byte-tokenized pydocs corpus, prepared once per test session
(the `pydocs` fixture of conftest.py, which points $NANONORM_DATA at it).
"""
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch


from runtime import checkpoint as ck
from trainer import resume
from common import ConfigError
from trainer.loop import train
from trainer.monitor import SpikeDetector
from trainer.optim import LRSchedule, build_optimizer
from trainer.config import optim_config, parse_run_config
from runtime.distributed import flushing_denormals
from trainer.sinks import Sink, wandb_row

from helpers import RecordingSink, make_cfg, records, run_with_a_nan_step

pytestmark = pytest.mark.usefixtures("pydocs")


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize("norm", sorted(__import__("model").VARIANTS))
def test_every_variant_overfits_one_batch(tmp_path, norm):
    rec = RecordingSink()
    train(make_cfg(tmp_path, f"norm={norm}", "train.overfit_batch=true", "optim.schedule=constant",
                   "optim.warmup_steps=0", "optim.lr=3e-3", "train.max_steps=10", "train.eval_tokens=128"), sinks=[rec])
    losses = [r["loss"] for r in rec.records if r["kind"] == "train"]
    assert len(losses) == 10 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.1, (norm, losses)


@pytest.mark.slow
def test_nonfinite_step_is_skipped_without_touching_state(tmp_path):
    # A NaN loss at step 3 must leave everything as after step 2.
    nan, clean = run_with_a_nan_step(tmp_path)
    for pid, st in clean["optimizer"]["state"].items():
        for name, t in st.items():
            assert torch.equal(t, nan["optimizer"]["state"][pid][name]), (pid, name)
    tr = records(tmp_path / "nan", "train")
    assert [r["skipped_steps"] for r in tr] == [0, 0, 1, 1]
    assert tr[2]["loss"] is None and tr[3]["loss"] is not None  # NaN is written as null


def test_nan_injection_wraps_the_forward_once_and_only_when_asked():
    from trainer.config import TrainConfig
    from trainer.faults import NanLoss, wrap_training_forward

    def forward(x, y):
        return x, torch.tensor(2.0)

    assert wrap_training_forward(forward, TrainConfig(), lambda: 1) is forward  # default: nothing in the way
    step = [0]
    wrapped = wrap_training_forward(forward, TrainConfig(inject_nan_at=2, inject_nan_steps=2), lambda: step[0])
    assert isinstance(wrapped, NanLoss)
    nan_at = []
    for step[0] in range(1, 6):
        nan_at += [step[0]] if math.isnan(wrapped("x", "y")[1].item()) else []
    assert nan_at == [2, 3]


def test_consecutive_nonfinite_steps_stop_the_run_with_a_checkpoint(tmp_path):
    res = train(make_cfg(tmp_path, "train.max_steps=50", "train.inject_nan_at=2", "train.inject_nan_steps=100",
                         "train.max_skipped=3"))
    assert res["diverged"] and "3 consecutive non-finite" in res["message"]
    assert res["steps"] == 4 and Path(res["checkpoint"]).name == "ckpt_00000004.pt"
    summary = records(tmp_path)[-1]
    assert summary["kind"] == "summary" and summary["diverged"] is True and summary["skipped_steps"] == 3
    assert math.isfinite(summary["final_val_loss"])  # skipped steps never touched the weights


@pytest.mark.slow
def test_the_skip_limit_is_read_at_logging_steps_and_the_stop_says_where_it_was_reached(tmp_path):
    res = train(make_cfg(tmp_path, "train.max_steps=50", "train.inject_nan_at=2", "train.inject_nan_steps=100",
                         "train.max_skipped=5", "logging.log_interval=5"))
    # skips at steps 2..10; the 5th (the limit) at step 6; read at the logging step 10
    assert res["diverged"] and res["steps"] == 10
    assert ("9 consecutive non-finite steps were skipped (train.max_skipped=5 was reached at step 6; it is "
            "checked at logging steps, every logging.log_interval=5)") in res["message"]
    assert "its weights are those after step 1" in res["message"]
    assert records(tmp_path)[-1]["skipped_steps"] == 9


@pytest.mark.slow
def test_a_resumed_run_reports_its_training_time_over_all_segments(tmp_path, caplog):
    common = ["train.max_steps=4", "logging.console=true"]
    train(make_cfg(tmp_path, *common, "train.stop_at=2"))
    first = ck.load_checkpoint(ck.find_latest(tmp_path))["train_s"]
    assert first > 0
    with caplog.at_level("INFO", logger="nanonorm.train"):
        train(make_cfg(tmp_path, *common, "train.resume=auto"))
    s = records(tmp_path, "summary")[0]
    assert s["train_s"] == pytest.approx(first + s["wall_s"], rel=0.2) and s["train_s"] > s["wall_s"]
    assert first < ck.load_checkpoint(ck.find_latest(tmp_path))["train_s"] <= s["train_s"]  # saved just before
    assert any("all segments" in r.getMessage() and "(resumed)" in r.getMessage() for r in caplog.records)


class FlushProbe(Sink):
    """Records, at each logging step, whether CPU ops flush subnormals: in the loop's thread, or in all of
    torch's threads."""

    def __init__(self, every_thread=False):
        self.every_thread, self.seen = every_thread, []

    def log(self, record):
        self.seen.append(flushing_denormals(self.every_thread))


def start_torch_threads() -> None:
    """Start torch's CPU threads now, so that none starts inside a run with subnormals flushed (a thread
    inherits the flag from the one that starts it, and would keep it for the tests after)."""
    (torch.ones(1 << 22) * 2.0).sum()


@pytest.mark.slow
def test_flush_denormal_flushes_subnormals_while_the_run_trains_and_only_then(tmp_path):
    start_torch_threads()
    assert not flushing_denormals()
    on, off = FlushProbe(), FlushProbe()
    train(make_cfg(tmp_path / "on", "train.max_steps=2", "train.flush_denormal=true"), sinks=[on])
    assert on.seen and all(on.seen)
    assert not flushing_denormals()  # the caller gets its subnormals back
    train(make_cfg(tmp_path / "off", "train.max_steps=2"), sinks=[off])
    assert off.seen and not any(off.seen)


@pytest.mark.slow
def test_flush_denormal_reaches_every_cpu_thread_of_a_fresh_run_and_says_when_it_cannot(tmp_path, caplog):
    # a fresh process (train.py): the flag is set before torch starts its threads, which inherit it
    script = (f"import test_train as t; p = t.FlushProbe(every_thread=True); t.train(t.make_cfg("
              f"{str(tmp_path / 'fresh')!r}, 'train.max_steps=2', 'train.threads=2', 'train.flush_denormal=true'), "
              "sinks=[p]); print(p.seen)")
    out = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parent,  # `-c` imports from its cwd
                         capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == str([True] * 7)  # 2 train records, 3 evals, 2 summaries
    # in a process whose threads already run, only the loop's thread flushes: said in one line
    was = torch.get_num_threads()
    torch.set_num_threads(2)
    start_torch_threads()
    try:
        probe = FlushProbe(every_thread=True)
        with caplog.at_level("WARNING", logger="nanonorm.train"):
            train(make_cfg(tmp_path / "late", "train.max_steps=2", "train.threads=2", "train.flush_denormal=true"),
                  sinks=[probe])
    finally:
        torch.set_num_threads(was)
    assert not any(probe.seen)
    assert any("threads started before it was set" in r.getMessage() for r in caplog.records)


def test_metrics_jsonl_schema_and_sink_keys(tmp_path):
    rec = RecordingSink()
    train(make_cfg(tmp_path, "norm=spheret", "train.max_steps=4", "logging.log_interval=2",
                   "train.eval_interval=2", "logging.stats_interval=2", "train.seed=7"), sinks=[rec])
    rs = records(tmp_path)
    # stats at step 0 (the geometry at init, right after the first eval), then every stats_interval
    assert [r["kind"] for r in rs] == ["eval", "stats", "stats", "train", "eval", "stats", "train", "eval",
                                       "final_eval", "summary"]
    st0 = [r for r in rs if r["kind"] == "stats"][0]
    assert st0["step"] == 0 and {f"geo/angle/{j}" for j in range(4)} | {f"geo/grad/{j}" for j in range(5)} <= set(st0)
    assert not any(k.startswith(("update_ratio/", "grad_norm/")) for k in st0)  # no step has been taken yet
    for r in rs:
        assert isinstance(r["step"], int) and r["tokens"] == r["step"] * 256
    train_keys = {"loss", "loss_max", "lr", "grad_norm", "tokens_per_s", "step_time", "mfu", "skipped_steps",
                  "spikes_loss", "spikes_grad_norm"}
    t = [r for r in rs if r["kind"] == "train"][-1]
    assert train_keys <= set(t) and t["mfu"] is None
    assert t["loss_max"] == t["loss"]  # one process: the max over ranks is the loss itself
    e = [r for r in rs if r["kind"] == "eval"][-1]
    assert e["val_ppl"] == pytest.approx(math.exp(e["val_loss"]))
    assert e["val_bpb"] == pytest.approx(e["val_loss"] / math.log(2), rel=0.01)  # bytes: ~1 byte per token
    f = [r for r in rs if r["kind"] == "final_eval"][0]
    st = [r for r in rs if r["kind"] == "stats"][-1]
    assert {f"rms/{j}" for j in range(5)} | {"grad_norm/block0", "grad_norm/block1"} <= set(st)
    assert any(k.startswith("angle_mean/") for k in st) and any(k.startswith("step/") for k in st)
    assert {"update_ratio/matrices", "update_ratio/scalars", "geo/transmission", "angle_above_1rad/0"} <= set(st)
    assert 0 < st["update_ratio/matrices"] < 1 and 0 < st["geo/transmission"] <= 1
    s = rs[-1]
    assert {"final_val_loss", "final_val_ppl", "best_val_loss", "spikes_loss", "spikes_grad_norm", "skipped_steps",
            "diverged", "steps", "tokens", "norm", "seed"} <= set(s)
    assert (s["norm"], s["seed"], s["steps"], s["diverged"]) == ("spheret", 7, 4, False)
    assert s["final_val_loss"] == f["val_loss"] and s["final_val_bpb"] == f["val_bpb"]
    assert s["best_val_loss"] <= e["val_loss"]
    cfg_text = (tmp_path / "config.yaml").read_text()
    assert "name: spheret" in cfg_text and "seed: 7" in cfg_text
    # The recording sink saw exactly the file's records; wandb would get '<kind>/<key>' rows.
    assert [r["kind"] for r in rec.records] == [r["kind"] for r in rs]
    keys = set().union(*rec.wandb_rows)
    assert {"train/loss", "train/loss_max", "train/lr", "train/grad_norm", "train/tokens_per_s", "eval/val_loss",
            "eval/val_ppl", "eval/val_bpb", "final_eval/val_bpb", "stats/rms/0", "stats/grad_norm/block1"} <= keys
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
    cos = LRSchedule(optim_config(dict(schedule="cosine", **base)), max_steps=110)
    assert cos(0.0) == pytest.approx(1 / 11) and cos(10.0) == pytest.approx(1.0) and cos(110.0) == pytest.approx(0.1)
    assert cos(60.0) == pytest.approx(0.55)
    wsd = LRSchedule(optim_config(dict(schedule="wsd", decay_frac=0.2, **base)), max_steps=100)
    assert (
        wsd(50.0) == 1.0 and wsd(80.0) == 1.0 and wsd(90.0) == pytest.approx(0.55) and wsd(100.0) == pytest.approx(0.1)
    )
    const = LRSchedule(optim_config(dict(schedule="constant", **base)), max_steps=100)
    assert const(99.0) == 1.0
    # The tensor path (the hot loop) computes the same values.
    for s in (cos, wsd, const):
        for u in (0.0, 5.0, 37.0, 95.0):
            assert s(torch.tensor(u, dtype=torch.float64)).item() == pytest.approx(s(u))
    from model import GPT, GPTConfig
    m = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=1, n_embd=8))
    opt = build_optimizer(m, optim_config(dict(weight_decay=0.1)), torch.device("cpu"))
    wd = {g["group"]: g["weight_decay"] for g in opt.param_groups}
    assert wd == {"matrices": 0.1, "embeddings": 0.1, "vectors": 0.0}  # pre_ln has no scalars


@pytest.mark.parametrize(
    "override, match",
    [
        ("train.precision=fp8", r"train\.precision='fp8'.*bf16, fp16, fp32"),
        ("optim.schedule=linear", r"unknown optim\.schedule='linear': valid are cosine, wsd, constant"),
        ("train.batch_tokens=300", r"train\.batch_tokens=300.*multiple of .* = 4 \* 32 \* 1 = 128"),
        ("logging.wandb.mode=sometimes", r"logging\.wandb\.mode"),
        ("train.max_steps=0", r"train\.max_steps=0: must be a positive integer"),
        ("+train.max_step=5", r"unknown key\(s\) train\.max_step"),
        ("+model.foo=1", r"^unknown key\(s\) model\.foo: valid keys are block_size, "),
        ("+norm.clamps=1", r"^unknown key\(s\) norm\.clamps: valid keys are name, kind, "),
        ("model.n_embd=33", r"n_embd"),
        (
            "train.resume=/nonexistent/ckpt.pt",
            r"^bad config train\.resume='/nonexistent/ckpt\.pt': checkpoint .* does not exist",
        ),
    ],
)
def test_bad_overrides_fail_with_one_clear_line(tmp_path, override, match):
    with pytest.raises(ConfigError, match=match) as e:
        train(make_cfg(tmp_path, override))
    assert "\n" not in str(e.value)


@pytest.mark.slow
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
    with pytest.raises(
        ck.CheckpointError, match=r"ckpt_00000004\.pt is incompatible.*model_config\.n_embd is 32 .* but 64"
    ):
        train(make_cfg(tmp_path, "train.max_steps=8", "train.resume=auto", "model.n_embd=64"))
    # Corrupt newest checkpoint: named, with the way out.
    latest = ck.find_latest(tmp_path)
    latest.write_bytes(latest.read_bytes()[:1000])
    with pytest.raises(ck.CheckpointError, match=r"ckpt_00000004\.pt is corrupt"):
        train(make_cfg(tmp_path, "train.max_steps=8", "train.resume=auto"))
    with pytest.raises(ck.CheckpointError, match="not a nanonorm checkpoint"):
        torch.save({"a": 1}, tmp_path / "other.pt")
        ck.load_checkpoint(tmp_path / "other.pt")


def _flip_a_weight_bit(path):
    """Flip one bit inside the data of the checkpoint's largest tensor record (not in a header or padding)."""
    import struct
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
    b = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack("<HH", b[info.header_offset + 26:info.header_offset + 30])
    b[info.header_offset + 30 + name_len + extra_len + info.file_size // 2] ^= 0x10
    path.write_bytes(bytes(b))


def test_resume_and_load_refuse_a_damaged_or_foreign_checkpoint_by_name(tmp_path, monkeypatch):
    import data

    train(make_cfg(tmp_path, "train.max_steps=2", "train.ckpt_interval=1", "train.keep_last=2"))
    # Another variant is named by norm.name, not by the first of its options that differs.
    with pytest.raises(
        ck.CheckpointError, match=r"model_config\.norm\.name is 'pre_ln' in the checkpoint but 'geonorm'"
    ):
        train(make_cfg(tmp_path, "train.max_steps=4", "train.resume=auto", "norm=geonorm"))
    # Another tokenizer is refused before its data is prepared (which can take hours).
    monkeypatch.setattr(data, "prepare_dataset", lambda cfg: pytest.fail("prepared before the check"))
    with pytest.raises(ck.CheckpointError, match=r"tokenizer 'bytes' in the checkpoint but 'gpt2' now"):
        train(make_cfg(tmp_path, "train.max_steps=4", "train.resume=auto", "data.tokenizer=gpt2"))
    monkeypatch.undo()
    # A state dict without one of the model's keys names it.
    latest = ck.find_latest(tmp_path)
    state = ck.load_checkpoint(latest)
    state = {**state, "model": {k: v.clone() for k, v in state["model"].items() if k != "lm_head.weight"}}
    torch.save(state, tmp_path / "partial.pt")
    with pytest.raises(
        ck.CheckpointError, match=r"partial\.pt: weights do not match its model_config \(missing: lm_head\.weight\)"
    ):
        ck.load_model(tmp_path / "partial.pt")
    # A flipped bit in the weights fails the checksum, for resume and for eval/sample alike.
    _flip_a_weight_bit(latest)
    with pytest.raises(
        ck.CheckpointError, match=r"ckpt_00000002\.pt fails its checksum \(record .*CRC-32 mismatch\).*delete it"
    ):
        train(make_cfg(tmp_path, "train.max_steps=4", "train.resume=auto"))
    with pytest.raises(ck.CheckpointError, match="fails its checksum"):
        ck.load_model(latest)
    ck.load_model(ck.ckpt_path(tmp_path, 1))  # the previous one is intact


def test_a_ddp_resume_reads_the_checksums_on_rank_0_only(tmp_path, monkeypatch):
    """Every rank loads the checkpoint, but only rank 0 reads the whole file for its CRC-32s; the others
    take its answer (broadcast), so a damaged file is refused on every rank with rank 0's reason."""
    import torch.distributed as dist

    from runtime import distributed as D

    train(make_cfg(tmp_path, "train.max_steps=2", "train.ckpt_interval=2"))
    latest, cfg = ck.find_latest(tmp_path), parse_run_config(make_cfg(tmp_path))
    reads = []
    real = ck.failed_record
    monkeypatch.setattr(ck, "failed_record", lambda p: reads.append(p) or real(p))
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    for rank, told in ((1, None), (0, None), (1, "record x: CRC-32 mismatch")):
        monkeypatch.setattr(dist, "get_rank", lambda: rank)
        monkeypatch.setattr(D, "broadcast_object", lambda obj, src=0: obj if rank == 0 else told)
        reads.clear()
        if told:
            with pytest.raises(ck.CheckpointError, match=r"fails its checksum \(record x: CRC-32 mismatch\)"):
                resume.load_compatible(latest, cfg.model, cfg.data.tokenizer)
        else:
            assert resume.load_compatible(latest, cfg.model, cfg.data.tokenizer)["step"] == 2
        assert reads == ([latest] if rank == 0 else [])


def test_sigusr1_and_sigterm_only_set_a_flag():
    import signal
    stop = resume.StopSignal().install()
    try:
        assert stop.received is None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.received == "SIGUSR1"  # the loop, not the handler, checkpoints (at a step boundary)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.received == "SIGTERM"
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


@pytest.mark.slow
def test_run_dir_is_claimed_for_the_whole_run(tmp_path):
    """A second run into a run dir that a live run holds is refused at once, even before the first
    has written anything; the claim is released when the first ends."""
    from runtime import distributed as D
    from trainer.config import parse_run_config
    from trainer.loop import Trainer

    cfg = make_cfg(tmp_path, "train.max_steps=2")
    first = Trainer(parse_run_config(cfg), D.init_distributed("cpu", precision=cfg.train.precision))
    first.setup()  # claimed, nothing trained or logged yet
    try:
        for extra in ([], ["train.resume=auto"], ["train.overwrite=true"]):
            with pytest.raises(ConfigError, match=r"run dir .* is in use by another train.py \(pid \d+"):
                train(make_cfg(tmp_path, "train.max_steps=2", *extra))
        first.run()
    finally:
        first.close()
    assert len(records(tmp_path, "summary")) == 1
    train(make_cfg(tmp_path, "train.max_steps=3", "train.resume=auto"))  # free again


def test_stale_checkpoint_temp_files_are_removed_when_the_run_dir_is_claimed(tmp_path):
    train(make_cfg(tmp_path, "train.max_steps=2"))
    stale = [tmp_path / "checkpoints" / ".ckpt_00000004.pt.12345.tmp", tmp_path / ".config.yaml.12345.tmp",
             tmp_path / "checkpoints" / ".ckpt_00000003.pt.tmp999"]  # (the last: an older version's name)
    for p in stale:
        p.write_bytes(b"half a file from a killed write")
    train(make_cfg(tmp_path, "train.max_steps=3", "train.resume=auto"))
    assert not any(p.exists() for p in stale)


@pytest.mark.slow
def test_resume_reports_config_changes_and_guards_exactness(tmp_path, caplog):
    train(make_cfg(tmp_path, "train.max_steps=2", "train.ckpt_interval=1"))
    old_cfg = (tmp_path / "config.yaml").read_text()
    # a changed seed (or data, or batch) would not continue the same data order: refused, naming the key
    with pytest.raises(
        ConfigError,
        match=r"ckpt_00000002\.pt with train\.seed 1337 -> 7 would not continue the same data order: "
        r"pass train\.resume_force=true",
    ):
        train(make_cfg(tmp_path, "train.max_steps=3", "train.resume=auto", "train.seed=7"))
    with pytest.raises(ConfigError, match=r"with train\.batch_tokens 256 -> 512 would"):
        train(make_cfg(tmp_path, "train.max_steps=3", "train.resume=auto", "train.batch_tokens=512"))
    assert (tmp_path / "config.yaml").read_text() == old_cfg  # a refused resume changes nothing
    # a changed LR is allowed, and said
    with caplog.at_level("WARNING", logger="nanonorm.train"):
        train(make_cfg(tmp_path, "train.max_steps=3", "train.resume=auto", "optim.lr=0.002"))
    assert "changed config: optim.lr 0.001 -> 0.002" in caplog.text
    assert "lr: 0.002" in (tmp_path / "config.yaml").read_text()
    assert (tmp_path / "config_until_00000002.yaml").read_text() == old_cfg  # the old config kept beside
    caplog.clear()
    with caplog.at_level("WARNING", logger="nanonorm.train"):
        train(make_cfg(tmp_path, "train.max_steps=4", "train.resume=auto", "optim.lr=0.002", "train.seed=7",
                       "train.resume_force=true"))
    assert "train.seed 1337 -> 7" in caplog.text and "data order differs" in caplog.text
    assert ck.load_checkpoint(ck.find_latest(tmp_path))["step"] == 4


def test_resume_reads_the_older_flat_spelling_of_a_nested_schedule_as_the_same_config(tmp_path, caplog):
    import copy
    from omegaconf import OmegaConf

    now = OmegaConf.to_container(make_cfg(tmp_path, "optim=muon"), resolve=True)
    assert now["optim"]["schedule"] == {"name": "wsd", "decay_frac": 0.4}
    saved = copy.deepcopy(now)
    saved["optim"].update(schedule="wsd", decay_frac=0.4)  # how a run of optim=muon saved it when it was flat
    with caplog.at_level("WARNING", logger="nanonorm.train"):
        assert not resume.check_config_changes(tmp_path, now, saved, resume_force=False)
        saved["optim"]["decay_frac"] = 0.2
        assert resume.check_config_changes(tmp_path, now, saved, resume_force=False)
    assert "changed config: optim.decay_frac 0.2 -> 0.4" in caplog.text


def test_resume_reads_a_run_saved_with_every_sources_data_keys_as_the_same_config(tmp_path):
    """Runs saved before the sources took their own keys hold hf's and local's keys at their defaults
    (`data.split: train`); today's composition holds them null. Same data: no change, no refusal."""
    import copy
    from omegaconf import OmegaConf

    from common import ConfigError

    now = OmegaConf.to_container(make_cfg(tmp_path), resolve=True)
    assert now["data"]["split"] is None and now["data"]["source"] == "pydocs"
    saved = copy.deepcopy(now)
    saved["data"].update(split="train", text_column="text", streaming=False, txt_sample_by="document", path=None)
    assert not resume.check_config_changes(tmp_path, now, saved, resume_force=False)
    saved["data"]["val_fraction"] = 0.01          # a key this source reads still counts
    with pytest.raises(ConfigError, match=r"data.val_fraction 0.01 -> 0.0"):
        resume.check_config_changes(tmp_path, now, saved, resume_force=False)


def test_resume_reads_a_key_added_since_the_checkpoint_at_its_default_as_unchanged(tmp_path, caplog):
    """A checkpoint written before a key existed lacks it: the key at its default is how that run trained (no
    change, no warning); set to another value, it is a change, named with the checkpoint's side as None."""
    import copy
    from omegaconf import OmegaConf

    now = OmegaConf.to_container(make_cfg(tmp_path), resolve=True)
    saved = copy.deepcopy(now)
    del saved["train"]["flush_denormal"], saved["optim"]["eps"]  # as a checkpoint of older code holds them
    with caplog.at_level("WARNING", logger="nanonorm.train"):
        assert not resume.check_config_changes(tmp_path, now, saved, resume_force=False)
        assert "changed config" not in caplog.text
        now["train"]["flush_denormal"] = True
        assert resume.check_config_changes(tmp_path, now, saved, resume_force=False)
    assert "changed config: train.flush_denormal None -> True" in caplog.text and "optim.eps" not in caplog.text


def test_warmup_longer_than_the_run_warns(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="nanonorm.train"):
        train(make_cfg(tmp_path, "train.max_steps=3", "optim.warmup_steps=10"))
    assert "optim.warmup_steps=10 >= train.max_steps=3" in caplog.text and "never reaches the peak" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="nanonorm.train"):
        train(make_cfg(tmp_path / "ok", "train.max_steps=3", "optim.warmup_steps=2"))
    assert "warmup" not in caplog.text


def test_console_has_an_eta_and_an_end_of_training_summary(tmp_path, caplog):
    with caplog.at_level("INFO", logger="nanonorm.train"):
        train(make_cfg(tmp_path, "train.max_steps=4", "logging.console=true", "train.eval_interval=2"))
    steps = [m for m in caplog.messages if m.startswith("step ") and "/4 |" in m]
    assert len(steps) == 4 and all(re.search(r"\| eta \d+", m) for m in steps[:-1])
    text = "\n".join(caplog.messages)
    s = records(tmp_path, "summary")[0]
    assert "finished: 4 steps, 1,024 tokens" in text and "tok/s" in text
    assert (f"final {s['final_val_loss']:.4f} (ppl {s['final_val_ppl']:.2f}), {s['final_val_bpb']:.4f} bits per byte; "
            f"best of the sampled evals {s['best_val_loss']:.4f}") in text
    assert "spikes: loss 0, grad norm 0 | skipped steps 0" in text
    assert f"checkpoint {tmp_path / 'checkpoints' / 'ckpt_00000004.pt'}" in text
    assert f"metrics {tmp_path / 'metrics.jsonl'}" in text and "wandb disabled" in text
    for cmd in (
        f"python eval.py {tmp_path}",
        f"python sample.py {tmp_path}",
        f"python scripts/plot_curves.py {tmp_path}",
    ):
        assert cmd in text


def test_resuming_a_finished_run_says_it_is_complete(tmp_path, caplog):
    train(make_cfg(tmp_path, "train.max_steps=2"))
    with caplog.at_level("WARNING", logger="nanonorm.train"):
        r = train(make_cfg(tmp_path, "train.max_steps=2", "train.resume=auto"))
    assert r["steps"] == 2
    assert "is already complete (step 2, train.max_steps=2)" in caplog.text
    assert "pass a larger train.max_steps with train.resume=auto" in caplog.text


def test_cuda_device_without_cuda_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"^bad config train\.device='cuda': torch sees no CUDA device"):
        train(make_cfg(tmp_path, "train.device=cuda"))


def test_training_and_evaluation_share_precision_names_and_auto(monkeypatch):
    """train.precision and eval's/sample's --dtype: one set of names, one meaning of `auto`."""
    from evaluation.config import EvalConfig
    from runtime import distributed as D
    from runtime.launch import PRECISION_CHOICES

    assert PRECISION_CHOICES == ("auto", *D.PRECISIONS)  # the torch-free names and their dtypes agree
    assert D.PRECISIONS == {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    from common.config import literal_choices, type_hints
    from trainer.config import TrainConfig
    assert literal_choices(type_hints(TrainConfig)["precision"]) == PRECISION_CHOICES  # train.precision's Literal

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert D.resolve_precision("auto", cpu) == "fp32"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert D.resolve_precision("auto", cuda) == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert D.resolve_precision("auto", cuda) == "fp32"
    assert [D.resolve_precision(n, cpu) for n in ("bf16", "fp16", "fp32")] == ["bf16", "fp16", "fp32"]
    assert [EvalConfig(dtype=n).dtype for n in ("bfloat16", "float16", "float32", "auto")] == [
        "bf16",
        "fp16",
        "fp32",
        "auto",
    ]
    assert D.autocast(cpu, "fp32")().__class__.__name__ == "nullcontext"
    with D.autocast(cpu, "bf16")():
        assert (torch.zeros(2, 2) @ torch.zeros(2, 2)).dtype == torch.bfloat16


def _prepared_copy(tmp_path):
    """A private copy of the test corpus's prepared dir (the shared one must stay intact)."""
    import shutil
    from data import prepare_dataset

    src = prepare_dataset(make_cfg(tmp_path / "unused").data)
    dst = tmp_path / "data" / src.name
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock", "verified.json"))
    return dst


@pytest.mark.slow
def test_bit_flipped_shard_is_caught_once_and_checks_are_recorded(tmp_path, monkeypatch):
    from data import DataError
    import data.verify as V

    d = _prepared_copy(tmp_path)
    root = [f"data.root={d.parent}"]
    train(make_cfg(tmp_path / "ok", *root, "train.max_steps=1"))
    assert (d / "verified.json").exists()
    # a second run only stats the files: no shard is read again
    monkeypatch.setattr(V, "_scan", lambda p: pytest.fail(f"{p} read again"))
    train(make_cfg(tmp_path / "ok2", *root, "train.max_steps=1"))
    monkeypatch.undo()
    shard = d / "train_000000.bin"
    raw = bytearray(shard.read_bytes())
    raw[5000] ^= 0x01  # one bit, same size: only the sha256 can tell
    shard.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"train_000000\.bin: sha256 does not match .*meta\.json"):
        train(make_cfg(tmp_path / "flip", *root, "train.max_steps=1"))


def test_token_ids_outside_the_vocabulary_name_the_shard(tmp_path):
    import numpy as np
    from data import DataError
    from data.shards import write_shard

    src = tmp_path / "llmc"
    src.mkdir()
    write_shard(src / "x_train_000000.bin", np.arange(4000, dtype=np.uint16) % 257)
    write_shard(src / "x_val_000000.bin", np.where(np.arange(2000) == 1500, 300, 7).astype(np.uint16))
    data = ["data=shards", f"data.path={src}", "data.name=llmc", "data.tokenizer=bytes",
            f"data.root={tmp_path / 'cache'}"]
    with pytest.raises(
        DataError, match=r"x_val_000000\.bin: token id 300 is outside the vocabulary of bytes \(257 ids\)"
    ):
        train(make_cfg(tmp_path / "run", *data, "train.max_steps=1"))


def test_eval_tokens_rounded_to_whole_sequences_is_said_once(tmp_path, caplog):
    import logging
    with caplog.at_level(logging.WARNING, logger="nanonorm.train"):
        train(make_cfg(tmp_path, "train.max_steps=1", "train.eval_tokens=20"))
    said = [r.getMessage() for r in caplog.records if "train.eval_tokens=20" in r.getMessage()]
    assert said == ["train.eval_tokens=20 is scored as 1 whole sequence(s) of 32 tokens = 32 tokens"]


def test_the_fused_loss_trains_as_the_plain_loss(tmp_path):
    """train.fused_loss=true (the CUDA default) on CPU: the same steps as the plain loss, up to fp32 rounding."""
    for fused in ("false", "true"):
        train(make_cfg(tmp_path / fused, "train.max_steps=4", f"train.fused_loss={fused}"))
    a, b = (records(tmp_path / f, "train") for f in ("false", "true"))
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b):
        assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-5) and ra["grad_norm"] == pytest.approx(
            rb["grad_norm"], rel=1e-4)


def test_what_a_variant_fixes_is_said_and_recorded(tmp_path, caplog):
    """norm=ngpt trains without weight decay and warmup whatever the user gave: config.yaml used to keep the
    user's values while the run ignored them."""
    import yaml

    with caplog.at_level("WARNING", logger="nanonorm.train"):
        train(make_cfg(tmp_path, "norm=ngpt", "optim.weight_decay=0.1", "optim.warmup_steps=2", "train.max_steps=1"))
    assert any("norm=ngpt fixes optim.weight_decay=0.0 (given 0.1), optim.warmup_steps=0 (given 2)" in m
               for m in caplog.messages)
    optim = yaml.safe_load((tmp_path / "config.yaml").read_text())["optim"]
    assert optim["weight_decay"] == 0.0 and optim["warmup_steps"] == 0
    assert all(g["weight_decay"] == 0.0 for g in optim["groups"].values() if "weight_decay" in g)


def test_a_sweep_dir_and_a_fault_after_the_last_step_are_refused(tmp_path):
    from common import ConfigError

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"out_dir .*sweep is a sweep directory \(it holds sweep.json\)"):
        train(make_cfg(sweep, "train.resume=auto", "train.max_steps=1"))
    assert sorted(p.name for p in sweep.iterdir()) == ["sweep.json"]
    with pytest.raises(ConfigError, match=r"train.inject_nan_at=100: is after the run's last step \(train.max_steps"
                                          r"=3\): it would inject nothing"):
        train(make_cfg(tmp_path / "r", "train.max_steps=3", "train.inject_nan_at=100"))


def test_wandb_online_without_a_login_is_one_line_before_any_data(tmp_path, monkeypatch):
    from common import ConfigError

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))
    with pytest.raises(ConfigError, match=r"logging.wandb.mode=online needs a wandb API key .* run `wandb login`, "
                                          r"or set WANDB_API_KEY, or pass logging.wandb.mode=offline"):
        train(make_cfg(tmp_path / "r", "logging.wandb.mode=online", "data.name=never_prepared"))
    assert not (tmp_path / "r").exists()
