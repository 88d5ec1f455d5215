"""Throughput of train.py's loop (full harness) vs a bare loop over the same model, data and optimizer.

    python benchmarks/bench_train.py                      # tiny model, pydocs, default intervals, 100 steps x 3
    python benchmarks/bench_train.py --steps 200 --repeats 5 model=gpt_125m train.device=cuda

Trailing arguments are Hydra overrides (as for train.py). Runs alternate bare/harness so that drift in a
shared machine's load hits both alike; medians are reported. The harness figure excludes the time of
validation passes and checkpoints (real work, not overhead; they are reported separately); it includes
everything else: LR on device, non-finite guard, per-step device buffers, log-step sync + all-reduce,
spike detection, JSONL/wandb sinks, stats steps.
"""
import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from common import report_user_errors
from runtime import distributed as D
from trainer.config import parse_run_config
from trainer.loop import Trainer
from trainer.optim import LRSchedule


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def bare_loop(trainer: Trainer, steps: int) -> float:
    """The minimum: batches, forward/backward with accumulation, clip, AdamW step. Returns seconds."""
    model, opt, dev = trainer.train_model, trainer.opt, trainer.device
    sched = LRSchedule(trainer.optim_cfg, steps)
    sync(dev)
    t0 = time.perf_counter()
    for step in range(steps):
        opt.set_lr(torch.tensor(sched(float(step))))
        for micro in range(trainer.accum):
            x, y = trainer.loader.get_batch(step, micro)
            if dev.type == "cuda":
                x, y = x.pin_memory().to(dev, non_blocking=True), y.pin_memory().to(dev, non_blocking=True)
            with trainer.autocast():
                _, loss = model(x, y)
            (loss / trainer.accum).backward()
        torch.nn.utils.clip_grad_norm_(trainer.params, trainer.optim_cfg.grad_clip, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync(dev)
    return time.perf_counter() - t0


def harness_loop(trainer: Trainer) -> tuple:
    """Trainer.run() with eval/checkpoint time measured apart. Returns (seconds excl., eval+ckpt seconds)."""
    spent = [0.0]

    def timed(fn):
        def wrapper(*a, **k):
            sync(trainer.device)
            t = time.perf_counter()
            out = fn(*a, **k)
            sync(trainer.device)
            spent[0] += time.perf_counter() - t
            return out
        return wrapper

    trainer.evaluate, trainer.save = timed(trainer.evaluate), timed(trainer.save)
    sync(trainer.device)
    t0 = time.perf_counter()
    trainer.run()
    sync(trainer.device)
    return time.perf_counter() - t0 - spent[0], spent[0]


def make_trainer(overrides, out_dir):
    from trainer.config_store import compose_config

    cfg = compose_config([*overrides, f"out_dir={out_dir}", "train.overwrite=true"])  # errors: one line
    trainer = Trainer(parse_run_config(cfg), D.init_distributed(cfg.train.device, precision=cfg.train.precision))
    trainer.setup()
    return trainer


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3, help="untimed bare steps first (allocator, compile)")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    if a.repeats < 1 or a.warmup < 0:
        raise SystemExit(f"--repeats={a.repeats}, --warmup={a.warmup}: need repeats >= 1, warmup >= 0")
    ov = [*a.overrides, f"train.max_steps={a.steps}"]
    tmp = Path(tempfile.mkdtemp(prefix="bench_train_"))
    try:
        run(a, ov, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # run dirs with checkpoints: never worth keeping


def run(a, ov, tmp: Path) -> None:
    bare_s, harn_s, extra_s = [], [], []
    trainer = make_trainer(ov, tmp / "warm")
    bare_loop(trainer, a.warmup)
    tokens = a.steps * trainer.train_cfg.batch_tokens
    m, t, lg = trainer.model_cfg, trainer.train_cfg, trainer.log_cfg
    print(
        f"model {m.n_layer}L d={m.n_embd} T={m.block_size} norm={m.norm.name} | "
        f"{t.batch_tokens} tok/step | {a.steps} steps x {a.repeats} repeats | log/{lg.log_interval} "
        f"stats/{lg.stats_interval} eval/{t.eval_interval} ckpt/{t.ckpt_interval} | "
        f"wandb {lg.wandb.mode} | {trainer.device} {trainer.precision} threads={torch.get_num_threads()}",
        flush=True,
    )
    trainer.close()
    for r in range(a.repeats):
        trainer = make_trainer(ov, tmp / f"bare{r}")
        bare_s.append(bare_loop(trainer, a.steps))
        trainer.close()
        trainer = make_trainer(ov, tmp / f"harness{r}")
        h, e = harness_loop(trainer)
        trainer.close()
        harn_s.append(h)
        extra_s.append(e)
        print(f"repeat {r}: bare {tokens / bare_s[-1]:,.0f} tok/s ({1000 * bare_s[-1] / a.steps:.1f} ms/step) | "
              f"harness {tokens / h:,.0f} tok/s ({1000 * h / a.steps:.1f} ms/step) | eval+ckpt {e:.2f} s", flush=True)
    b, h, e = statistics.median(bare_s), statistics.median(harn_s), statistics.median(extra_s)
    print(f"median: bare {tokens / b:,.0f} tok/s, {1000 * b / a.steps:.1f} ms/step | harness {tokens / h:,.0f} tok/s, "
          f"{1000 * h / a.steps:.1f} ms/step | harness overhead {100 * (h / b - 1):+.2f}% | "
          f"with eval+ckpt {100 * ((h + e) / b - 1):+.2f}%")
    D.teardown()


if __name__ == "__main__":
    report_user_errors(main)
