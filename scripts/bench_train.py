"""Throughput of train.py's loop (full harness) vs a bare loop over the same model, data and optimizer.

    python scripts/bench_train.py                      # tiny model, pydocs, default intervals, 100 steps x 3
    python scripts/bench_train.py --steps 200 --repeats 5 model=gpt_125m train.device=cuda

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
from hydra import compose, initialize_config_dir

from common import ConfigError, report_user_errors
from runtime import distributed as D
from trainer.config import parse_run_config
from trainer.loop import Trainer
from trainer.optim import LRSchedule


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def bare_loop(tr: Trainer, steps: int) -> float:
    """The minimum: batches, forward/backward with accumulation, clip, AdamW step. Returns seconds."""
    model, opt, dev = tr.train_model, tr.opt, tr.device
    sched = LRSchedule(tr.optim_cfg, steps)
    sync(dev)
    t0 = time.perf_counter()
    for step in range(steps):
        opt.set_lr(torch.tensor(sched(float(step))))
        for micro in range(tr.accum):
            x, y = tr.loader.get_batch(step, micro)
            if dev.type == "cuda":
                x, y = x.pin_memory().to(dev, non_blocking=True), y.pin_memory().to(dev, non_blocking=True)
            with tr.autocast():
                _, loss = model(x, y)
            (loss / tr.accum).backward()
        torch.nn.utils.clip_grad_norm_(tr.params, tr.optim_cfg.grad_clip, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync(dev)
    return time.perf_counter() - t0


def harness_loop(tr: Trainer) -> tuple:
    """Trainer.run() with eval/checkpoint time measured apart. Returns (seconds excl., eval+ckpt seconds)."""
    spent = [0.0]

    def timed(fn):
        def wrapper(*a, **k):
            sync(tr.device)
            t = time.perf_counter()
            out = fn(*a, **k)
            sync(tr.device)
            spent[0] += time.perf_counter() - t
            return out
        return wrapper

    tr.evaluate, tr.save = timed(tr.evaluate), timed(tr.save)
    sync(tr.device)
    t0 = time.perf_counter()
    tr.run()
    sync(tr.device)
    return time.perf_counter() - t0 - spent[0], spent[0]


def make_trainer(overrides, out_dir):
    from hydra.errors import ConfigCompositionException, OverrideParseException

    from common.config import composition_error_line
    from trainer.config_store import group_defaults, register_code_configs

    register_code_configs()
    try:
        with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "configs"), version_base=None):
            cfg = compose("config", overrides=[*overrides, f"out_dir={out_dir}", "train.overwrite=true"])
    except (ConfigCompositionException, OverrideParseException) as e:
        raise ConfigError(composition_error_line(e, group_defaults())) from None  # one line, as train.py says it
    tr = Trainer(parse_run_config(cfg), D.init_distributed(cfg.train.device, precision=cfg.train.precision))
    tr.setup()
    return tr


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
    tr = make_trainer(ov, tmp / "warm")
    bare_loop(tr, a.warmup)
    tokens = a.steps * tr.train_cfg.batch_tokens
    print(
        f"model {tr.mcfg.n_layer}L d={tr.mcfg.n_embd} T={tr.mcfg.block_size} norm={tr.mcfg.norm.name} | "
        f"{tr.train_cfg.batch_tokens} tok/step | {a.steps} steps x {a.repeats} repeats | log/{tr.log_cfg.log_interval} "
        f"stats/{tr.log_cfg.stats_interval} eval/{tr.train_cfg.eval_interval} ckpt/{tr.train_cfg.ckpt_interval} | "
        f"wandb {tr.log_cfg.wandb.mode} | {tr.device} {tr.precision} threads={torch.get_num_threads()}",
        flush=True,
    )
    tr.close()
    for r in range(a.repeats):
        tr = make_trainer(ov, tmp / f"bare{r}")
        bare_s.append(bare_loop(tr, a.steps))
        tr.close()
        tr = make_trainer(ov, tmp / f"harness{r}")
        h, e = harness_loop(tr)
        tr.close()
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
