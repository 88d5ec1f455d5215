"""fp16 training (every GeoNorm paper config uses it) through its GradScaler, on CPU: autocast to fp16, the
loss scaled, gradients unscaled before the clip, a step with inf/NaN gradients skipped with the scale
backed off, the scale grown after enough good steps, and its state resumed exactly."""
import functools

import pytest
import torch

from helpers import make_cfg, records
from runtime import checkpoint as ck
from trainer.loop import train

FP16 = ["train.precision=fp16", "train.ckpt_interval=1", "train.keep_last=100"]


@pytest.fixture
def scaler(monkeypatch):
    """The trainer's GradScaler with a chosen start and growth interval (torch's defaults, 2**16 and 2000,
    take 2000 steps to show growth)."""
    def use(init_scale, growth_interval):
        real = torch.amp.GradScaler
        monkeypatch.setattr(torch.amp, "GradScaler", functools.partial(real, init_scale=init_scale,
                                                                       growth_interval=growth_interval))
    return use


def sched(run, step):
    return ck.load_checkpoint(ck.ckpt_path(run, step))["scheduler"]


def weights(run, step):
    return ck.load_checkpoint(ck.ckpt_path(run, step))["model"]


def same_weights(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


def test_fp16_forward_runs_in_half_and_trains(tmp_path):
    from model import GPT

    seen = []
    hook = GPT.forward

    def spy(self, *a, **kw):
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return hook(self, *a, **kw)

    GPT.forward = spy
    try:
        train(make_cfg(tmp_path, *FP16, "train.max_steps=8", "optim.lr=3e-3"))
    finally:
        GPT.forward = hook
    assert seen and all(d == torch.float16 for d in seen[:8])
    losses = [r["loss"] for r in records(tmp_path, "train")]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    assert sched(tmp_path, 8)["scaler"]["scale"] == 2.0 ** 16  # no overflow at torch's default start


def test_forced_overflow_skips_the_step_backs_off_then_grows(tmp_path, scaler):
    """Starting at 2**40 the scaled fp16 backward overflows: each such step leaves the weights as they were,
    counts as skipped, and halves the scale; once it fits, two good steps (growth_interval=2) double it."""
    scaler(2.0 ** 40, 2)
    train(make_cfg(tmp_path, *FP16, "train.max_steps=40", "train.max_skipped=40"))
    scales = [sched(tmp_path, s)["scaler"]["scale"] for s in range(1, 41)]
    skipped = [sched(tmp_path, s)["skipped_total"] for s in range(1, 41)]
    first_good = next(i for i in range(1, 40) if skipped[i] == skipped[i - 1])  # index of the first applied step
    assert first_good >= 2, scales  # the scale 2**40 did overflow
    for i in range(first_good):  # overflowed steps: skipped, scale halved, weights unchanged
        assert skipped[i] == i + 1 and scales[i] == 2.0 ** (39 - i)
    assert same_weights(weights(tmp_path, first_good), weights(tmp_path, 1))
    assert not same_weights(weights(tmp_path, first_good + 1), weights(tmp_path, first_good))
    grew = [i for i in range(1, 40) if scales[i] == 2 * scales[i - 1]]
    assert grew, scales  # growth after growth_interval good steps
    i = grew[0]
    assert skipped[i] == skipped[i - 1] == skipped[i - 2]  # after two applied steps in a row
    losses = [r["loss"] for r in records(tmp_path, "train")]
    assert losses[-1] < losses[0]
    assert records(tmp_path, "summary")[-1]["diverged"] is False


def test_a_nan_step_under_fp16_is_skipped_and_the_scaler_resumes_exactly(tmp_path):
    a, b = tmp_path / "straight", tmp_path / "resumed"
    common = [*FP16, "train.max_steps=6", "train.inject_nan_at=3"]
    train(make_cfg(a, *common))
    assert sched(a, 3)["skipped_total"] == 1 and sched(a, 3)["scaler"]["scale"] == sched(a, 2)["scaler"]["scale"] / 2
    assert same_weights(weights(a, 3), weights(a, 2))
    train(make_cfg(b, *common, "train.stop_at=4"))
    train(make_cfg(b, *common, "train.resume=auto"))
    assert sched(a, 6) == sched(b, 6)
    assert same_weights(weights(a, 6), weights(b, 6))
    la = [(r["step"], r["loss"], r["grad_norm"]) for r in records(a, "train")]
    assert la == [(r["step"], r["loss"], r["grad_norm"]) for r in records(b, "train")]
