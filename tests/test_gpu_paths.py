"""CPU tests of code paths that matter most on GPUs and under torchrun: RNG state per device,
memory-mapped checkpoint loading, interval timing and the peak-FLOPs table, waiting for rank 0's
data preparation, and lm-eval tasks that fail on one rank only."""
import re

import pytest
import torch

from runtime import checkpoint as ck
from helpers import torchrun


# --- RNG state: the current GPU's generator only ---------------------------------------------------

class FakeCuda:
    """torch.cuda's RNG functions for `n` visible GPUs, this process on `current`; out-of-range
    device indices fail as torch's do."""

    def __init__(self, monkeypatch, n, current):
        self.n, self.current = n, current
        self.states = {i: torch.tensor([100 * n + i], dtype=torch.int64) for i in range(n)}
        for name in ("is_available", "current_device", "device_count", "get_rng_state", "set_rng_state",
                     "get_rng_state_all", "set_rng_state_all"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))

    def is_available(self):
        return True

    def current_device(self):
        return self.current

    def device_count(self):
        return self.n

    def _index(self, device):
        i = self.current if device == "cuda" else int(str(device).split(":")[-1])
        if i >= self.n:
            raise IndexError(f"device index {i} out of range ({self.n} GPUs)")
        return i

    def get_rng_state(self, device="cuda"):
        return self.states[self._index(device)].clone()

    def set_rng_state(self, state, device="cuda"):
        self.states[self._index(device)] = state.clone()

    def get_rng_state_all(self):
        return [self.get_rng_state(i) for i in range(self.n)]

    def set_rng_state_all(self, states):
        for i, st in enumerate(states):
            self.set_rng_state(st, i)


def test_rng_restore_with_a_different_number_of_gpus_per_process(monkeypatch):
    """Saved by rank 5 of 1 node x 8 GPUs (cuda:5), resumed as rank 5 of 2 nodes x 4 (cuda:1)."""
    saver = FakeCuda(monkeypatch, n=8, current=5)
    saver.states[5] = torch.tensor([55])  # rank 5's advanced stream
    state = ck.rng_state()
    loader = FakeCuda(monkeypatch, n=4, current=1)
    ck.set_rng_state(state)  # before: IndexError (8 saved states set on 4 devices)
    assert loader.states[1].tolist() == [55]  # this process's generator continues rank 5's stream
    assert [loader.states[i].tolist() for i in (0, 2, 3)] == [[400], [402], [403]]  # others untouched


def test_rng_restore_of_an_older_checkpoint_with_every_gpus_state(monkeypatch):
    old = ck.rng_state()
    old["cuda"] = [torch.tensor([i]) for i in range(8)]  # the former format
    loader = FakeCuda(monkeypatch, n=4, current=1)
    ck.set_rng_state(old)
    assert loader.states[1].tolist() == [1]
    FakeCuda(monkeypatch, n=16, current=12)
    ck.set_rng_state(old)  # no state for cuda:12: a warning, not a crash


# --- checkpoint loading: memory-mapped, weights only -----------------------------------------------

def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def _big_checkpoint(tmp_path, mb=192):
    from model import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2, n_embd=16))
    big = torch.ones(mb * 2**18)  # stands in for Adam's state of a large model
    state = {"model": model.state_dict(), "model_config": model.config.to_dict(), "tokenizer": "bytes",
             "optimizer": {"state": {0: {"exp_avg": big}}, "param_groups": []}, "scheduler": {},
             "rng": ck.rng_state(), "loader": {}, "config": {}}
    path = ck.save_checkpoint(state, tmp_path, 1, keep_last=1)
    del big, state
    return path


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_checkpoints_load_memory_mapped_and_inference_reads_weights_only(tmp_path):
    path = _big_checkpoint(tmp_path)
    before = _rss_mb()
    ckpt = ck.load_checkpoint(path)
    assert _rss_mb() - before < 64  # before: +192 MB, the whole file in this process's memory
    assert ckpt["optimizer"]["state"][0]["exp_avg"][-1].item() == 1.0  # still readable, on demand
    del ckpt
    before = _rss_mb()
    model, ckpt = ck.load_model(path)
    assert _rss_mb() - before < 64 and "optimizer" not in ckpt
    assert sum(p.numel() for p in model.parameters()) > 0


def test_checkpoints_load_with_weights_only_true(tmp_path):
    """Everything a checkpoint holds is a tensor or a plain value (numpy's RNG state included),
    so plain torch.load(weights_only=True) reads it; a pickled foreign object is refused."""
    path = _big_checkpoint(tmp_path, mb=1)
    assert torch.load(path, weights_only=True)["step"] == 1
    bad = ck.load_checkpoint(path)
    bad["config"] = {"x": re.compile("code")}  # any non-allowlisted global
    torch.save(bad, tmp_path / "bad.pt")
    with pytest.raises(ck.CheckpointError, match=r"bad\.pt is corrupt or unreadable .*it pickles re\._compile"):
        ck.load_checkpoint(tmp_path / "bad.pt")


@pytest.mark.parametrize("numpy_module", ["numpy._core", "numpy.core"])  # as numpy 2 / numpy 1 pickle it
def test_older_checkpoints_with_numpy_rng_arrays_still_load(tmp_path, numpy_module):
    import random
    import zipfile

    import numpy as np

    path = _big_checkpoint(tmp_path, mb=1)
    old = ck.load_checkpoint(path)
    np.random.seed(3)
    old["rng"] = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    expected = np.random.rand(3)
    torch.save(old, tmp_path / "np.pt")
    with zipfile.ZipFile(tmp_path / "np.pt") as zin, zipfile.ZipFile(tmp_path / "old.pt", "w") as zout:
        for item in zin.infolist():  # the pickle names numpy's module as the writing numpy did
            data = zin.read(item.filename)
            if item.filename.endswith("data.pkl"):
                data = data.replace(b"numpy._core.multiarray", numpy_module.encode() + b".multiarray")
            zout.writestr(item, data)
    ck.set_rng_state(ck.load_checkpoint(tmp_path / "old.pt")["rng"])
    assert (np.random.rand(3) == expected).all()


# --- host syncs of a training step --------------------------------------------------------------

def _syncs_per_step(monkeypatch, tmp_path, *overrides):
    """Tensor-to-Python reads (a host sync on CUDA) in one train_step: aten._local_scalar_dense
    (.item(), float(t), a tensor passed as a number) and .tolist(); not counting the for-loop
    AdamW's reads of its per-parameter step counts, which live on the CPU."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from helpers import make_cfg
    from runtime import distributed as D
    from trainer.config import parse_run_config
    from trainer.loop import Trainer

    cfg = make_cfg(tmp_path, *overrides)
    t = Trainer(parse_run_config(cfg), D.init_distributed("cpu", precision=cfg.train.precision))
    try:
        t.setup()
        t.train_step(1, False, 0)
        cpu_counts = {id(st["step"]) for st in t.opt.state.values()}

        class Count(TorchDispatchMode):
            n = 0

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func.overloadpacket.__name__ == "_local_scalar_dense" and id(args[0]) not in cpu_counts:
                    Count.n += 1
                return func(*args, **(kwargs or {}))

        tolist = torch.Tensor.tolist

        def counting_tolist(self):
            Count.n += 1
            return tolist(self)

        with Count(), monkeypatch.context() as m:
            m.setattr(torch.Tensor, "tolist", counting_tolist)
            t.train_step(2, False, 0)
        return Count.n, len(t.params)
    finally:
        t.close()


@pytest.mark.usefixtures("pydocs")
def test_host_syncs_per_step_fused_none_for_loop_one(monkeypatch, tmp_path):
    assert _syncs_per_step(monkeypatch, tmp_path / "fused", "optim.fused=true")[0] == 0
    n, n_params = _syncs_per_step(monkeypatch, tmp_path / "loop", "optim.fused=false")
    assert n == 1, (n, n_params)  # before: 1 + one per parameter (the tensor LR read back)


@pytest.mark.usefixtures("pydocs")
def test_the_loop_syncs_only_at_log_eval_stats_and_checkpoint_steps(monkeypatch, tmp_path):
    """Whole loop iterations on a simulated device: every host sync (a tensor read, or the interval timer's
    device synchronize) is counted with the step it follows; none may fall inside a step or after a step
    that logs, evaluates, records stats or checkpoints nothing."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from helpers import make_cfg
    from runtime import distributed as D
    from trainer.config import parse_run_config
    from trainer.loop import Trainer

    where = {"phase": "setup", "step": 0}
    syncs = []

    def note():
        syncs.append((where["phase"], where["step"]))

    step = Trainer.train_step

    def tagged_step(self, s, *a):
        where.update(phase="step", step=s)
        try:
            return step(self, s, *a)
        finally:
            where.update(phase="event", step=s)

    monkeypatch.setattr(Trainer, "train_step", tagged_step)
    monkeypatch.setattr(Trainer, "_device_sync", lambda self: note)   # the CUDA synchronize, simulated

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ == "_local_scalar_dense":
                note()
            return func(*args, **(kwargs or {}))

    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: (note(), tolist(self))[1])
    cfg = make_cfg(tmp_path, "optim.fused=true", "train.max_steps=12", "logging.log_interval=4",
                   "train.eval_interval=6", "train.ckpt_interval=1000", "logging.stats_interval=1000")
    t = Trainer(parse_run_config(cfg), D.init_distributed("cpu", precision=cfg.train.precision))
    try:
        t.setup()
        where["phase"] = "event"
        with Count():
            t.run()
    finally:
        t.close()
    assert not [s for phase, s in syncs if phase == "step"]          # a step itself never syncs
    assert {s for phase, s in syncs if phase == "event"} <= {0, 4, 6, 8, 12}   # log, eval, the end


@pytest.mark.usefixtures("pydocs")
def test_for_loop_adamw_trains_like_fused_and_skips_nonfinite_steps(tmp_path):
    from helpers import make_cfg, records
    from trainer.loop import train

    common = ["train.max_steps=4", "train.inject_nan_at=3", "optim.warmup_steps=10"]
    train(make_cfg(tmp_path / "fused", *common, "optim.fused=true"))
    train(make_cfg(tmp_path / "loop", *common, "optim.fused=false"))
    a, b = (ck.load_checkpoint(ck.find_latest(tmp_path / r)) for r in ("fused", "loop"))
    assert a["scheduler"]["updates"] == b["scheduler"]["updates"] == 3  # step 3 skipped in both
    for k, v in a["model"].items():
        torch.testing.assert_close(b["model"][k], v, rtol=0, atol=1e-5, msg=k)
    assert [r["lr"] for r in records(tmp_path / "fused", "train")] == \
        pytest.approx([r["lr"] for r in records(tmp_path / "loop", "train")], rel=1e-6)


# --- throughput and MFU ---------------------------------------------------------------------------

@pytest.mark.parametrize("name, peak", [("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12),
                                        ("NVIDIA H100 NVL", 835e12), ("NVIDIA H200", 989e12),
                                        ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA A100 80GB PCIe", 312e12)])
def test_peak_flops_matches_the_exact_gpu_name(monkeypatch, name, peak):
    from trainer import monitor

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert monitor.peak_flops(torch.device("cuda", 0), "bf16") == peak  # before: PCIe and NVL got 989e12


def test_unknown_gpu_has_no_mfu_and_one_warning(monkeypatch, caplog):
    from trainer import monitor

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 Future Edition")
    with caplog.at_level("WARNING", logger="nanonorm.train"):
        assert monitor.peak_flops(torch.device("cuda", 0), "bf16") is None
        assert monitor.peak_flops(torch.device("cuda", 1), "bf16") is None
    assert len([r for r in caplog.records if "Future Edition" in r.getMessage()]) == 1
    assert monitor.peak_flops(torch.device("cpu"), "bf16") is None


class FakeDevice:
    """A clock and an asynchronous device: `launch` queues device work and returns at once,
    `sync` waits for the queue (as torch.cuda.synchronize or a .tolist() would)."""

    def __init__(self):
        self.now, self.busy_until = 0.0, 0.0

    def clock(self):
        return self.now

    def host(self, seconds):
        self.now += seconds

    def launch(self, seconds):
        self.busy_until = max(self.busy_until, self.now) + seconds

    def sync(self):
        self.now = max(self.now, self.busy_until)


def test_interval_timer_charges_queued_steps_to_the_interval_not_the_excluded_region():
    from trainer.monitor import IntervalTimer

    dev = FakeDevice()
    timer = IntervalTimer(sync=dev.sync, clock=dev.clock)
    for _ in range(3):  # three steps: 10 ms of host work each, 1 s of queued device work
        dev.host(0.01)
        dev.launch(1.0)
        timer.steps += 1
    with timer.exclude() as stats:  # a stats step: its .tolist() waits for the queue, then 0.1 s
        dev.sync()
        dev.host(0.1)
    assert stats.seconds == pytest.approx(0.1)
    elapsed, steps = timer.read()
    assert steps == 3 and elapsed == pytest.approx(3.01)  # without the syncs: 0.03 s, tokens/s 100x too high
    timer.start()
    assert timer.read() == (0.0, 0)


@pytest.mark.slow
@pytest.mark.usefixtures("pydocs")
def test_the_compiling_first_step_is_reported_apart(monkeypatch, tmp_path):
    """compile_s in the first train record; that step is in no tokens/s (null where it is alone)."""
    import time

    from helpers import make_cfg, records
    from trainer import loop

    def slow_compile(model, **kw):  # stands in for torch.compile: the first call takes 1 s
        calls = []

        def run(*a, **k):
            if not calls and model.training:
                calls.append(1)
                time.sleep(1.0)
            return model(*a, **k)

        run.train, run.eval = model.train, model.eval
        return run

    monkeypatch.setattr(loop.torch, "compile", slow_compile)
    loop.train(make_cfg(tmp_path, "train.compile=true", "train.max_steps=4", "logging.log_interval=2"))
    first, second = records(tmp_path, "train")
    assert first["compile_s"] >= 1.0 and "compile_s" not in second
    assert first["step_time"] < 0.5 and first["tokens_per_s"] == pytest.approx(256 / first["step_time"])


# --- ranks waiting for rank 0's data preparation ------------------------------------------------

@pytest.mark.slow
def test_ranks_wait_for_rank0s_data_preparation_beyond_the_collective_timeout():
    import os

    code, out = torchrun(["-m", "tests.torchrun_scripts", "wait"], {**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
    assert "rank 0: prepared, 2" in out and "rank 1: found ready, 2" in out, out[-3000:]
    # the test's premise: the same wait on the default group fails
    assert "rank 1: default-group barrier failed" in out and code == 0, out[-3000:]


def test_the_barrier_after_a_save_waits_on_the_gloo_group(monkeypatch):
    """The default group's barrier is NCCL's on GPUs: a long checkpoint write would trip its watchdog."""
    from runtime import distributed as D

    seen = []
    monkeypatch.setattr(D.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(D.dist, "barrier", lambda group=None: seen.append(group))
    monkeypatch.setattr(D, "_wait_group", "the gloo wait group")
    D.barrier()
    assert seen == ["the gloo wait group"]


def test_mfu_is_recorded_in_both_conventions():
    from helpers import gpt_config
    from model import GPT
    from trainer.monitor import train_record

    m = GPT(gpt_config("pre_ln", n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=257))
    full, causal = m.flops_per_token(), m.flops_per_token(causal=True)
    assert full - causal == 6 * 2 * 32 * 64                      # the causal half of the attention matmuls
    h = {"loss": [2.0], "loss_max": [2.0], "lr": [1e-3], "grad_norm": [1.0], "skipped": [0]}
    r = train_record(10, 1000, h, elapsed=2.0, timed=4, world=1, flops_per_token=(full, causal), peak=1e9,
                     spike_counts={})
    assert r["mfu"] == pytest.approx(full * 2000 / 1e9) and r["mfu_causal"] == pytest.approx(causal * 2000 / 1e9)


@pytest.mark.slow
@pytest.mark.usefixtures("pydocs")
def test_a_compiled_cpu_run_resumes_exactly(tmp_path):
    """train.compile=true on CPU, which a study may set: stop and resume gives the straight run's losses and
    weights bitwise, for GeoNorm, whose compiled sphere step is the traced expression, not the eager op."""
    from helpers import assert_resume_is_exact

    assert_resume_is_exact(tmp_path, "norm=geonorm", "train.compile=true", "model.n_layer=1", "train.max_steps=6")
