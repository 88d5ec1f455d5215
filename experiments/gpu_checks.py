"""The GPU self-check's checks, one generator of table rows each (name, PASS/FAIL/SKIP/OOM, detail, seconds);
scripts/gpu_check.py runs them and says what each one checks."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from model import GPT, VARIANTS, GPTConfig
from model.config import from_spec
from trainer.config import optim_config
from trainer.monitor import peak_flops
from trainer.optim import build_optimizer

ROOT = Path(__file__).resolve().parents[1]  # the checkout: configs/ and train.py


class Ctx:
    def __init__(self, device: str):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.backend = "inductor" if self.cuda else "aot_eager"  # CPU: no C++ toolchain needed

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def autocast(self, dtype=torch.bfloat16):
        return torch.autocast(self.device.type, dtype=dtype)

    def memory_mark(self) -> int:
        """Start a peak-memory measurement; returns the bytes still allocated, which the row's peak does not
        count. A loss or logits tensor kept from the row before holds its autograd graph, and through it that
        model's weights and gradients: on an H200 this counted 7.6 GiB for the tiny model right after
        gpt_760m. The rows drop those tensors; the mark keeps whatever else survives out of the figure."""
        if not self.cuda:
            return 0
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        return torch.cuda.memory_allocated(self.device)

    def peak_gib(self, mark: int) -> float | None:
        """Peak memory since memory_mark() above what was allocated then, in GiB (None on CPU)."""
        return (torch.cuda.max_memory_allocated(self.device) - mark) / 2**30 if self.cuda else None


def _batches(vocab, block, batch, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (batch, block + 1), generator=g) for _ in range(n)]


def _train_steps(ctx, model, batches, compile_backend=None, dtype=torch.bfloat16):
    """Losses of len(batches) AdamW steps (the repo's optimizer, fused where torch has it); fp16 through a
    GradScaler, as the training loop does it."""
    opt = build_optimizer(model, optim_config(dict(lr=1e-3)), ctx.device)
    fwd = torch.compile(model, backend=compile_backend) if compile_backend else model
    scaler = torch.amp.GradScaler(ctx.device.type) if dtype == torch.float16 else None
    losses = []
    for b in batches:
        b = b.to(ctx.device)
        with ctx.autocast(dtype):
            _, loss = fwd(b[:, :-1], b[:, 1:])
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(opt.inner)
        opt.step(None, scaler)
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def check_compile(ctx, args):
    variants = args.variants.split(",") if args.variants else sorted(VARIANTS)
    for v in variants:
        cfg = GPTConfig(vocab_size=512, block_size=128, n_layer=2, n_head=4, n_embd=128, norm=v)
        batches = _batches(512, 128, 8, 3)
        t0 = time.time()
        torch.manual_seed(0)
        eager = _train_steps(ctx, GPT(cfg).to(ctx.device), batches)
        torch._dynamo.reset()
        torch.manual_seed(0)
        compiled = _train_steps(ctx, GPT(cfg).to(ctx.device), batches, ctx.backend)
        diff = max(abs(a - b) for a, b in zip(eager, compiled))
        ok = all(math.isfinite(x) for x in eager + compiled) and diff < 0.05
        yield (f"compile/{v}", "PASS" if ok else "FAIL",
               f"max loss difference {diff:.2e} over 3 steps (eager: {eager[-1]:.4f})", time.time() - t0)


def _arch(name: str) -> dict:
    """The model keys an architecture preset sets (configs/arch/<name>.yaml), for GPTConfig."""
    from dataclasses import fields

    keys = {f.name for f in fields(GPTConfig)}
    model = yaml.safe_load((ROOT / "configs" / "arch" / f"{name}.yaml").read_text())["model"]
    return {k: v for k, v in model.items() if k in keys}  # `arch` itself names the preset


def check_neox(ctx, args):
    """The GeoNorm paper configs' block (arch=neox: partial RoPE, GELU, biases, untied head) in fp16 with the
    GradScaler, compiled (inductor on CUDA) against eager."""
    variants = args.variants.split(",") if args.variants else ["pre_ln", "deepnorm", "sandwich", "geonorm"]
    for v in variants:
        cfg = GPTConfig(vocab_size=512, block_size=128, n_layer=2, n_head=4, n_embd=128, norm=v, **_arch("neox"))
        batches = _batches(512, 128, 8, 3)
        t0 = time.time()
        torch.manual_seed(0)
        eager = _train_steps(ctx, GPT(cfg).to(ctx.device), batches, dtype=torch.float16)
        torch._dynamo.reset()
        torch.manual_seed(0)
        compiled = _train_steps(ctx, GPT(cfg).to(ctx.device), batches, ctx.backend, dtype=torch.float16)
        diff = max(abs(a - b) for a, b in zip(eager, compiled))
        ok = all(math.isfinite(x) for x in eager + compiled) and diff < 0.05
        yield (f"neox/{v}", "PASS" if ok else "FAIL",
               f"fp16 + GradScaler, max loss difference {diff:.2e} over 3 steps (eager: {eager[-1]:.4f})",
               time.time() - t0)


def check_fused_skip(ctx, args):
    t0 = time.time()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=2, n_embd=64)).to(ctx.device)
    opt = build_optimizer(model, optim_config(dict(lr=1e-3)), ctx.device)
    params = [p for p in model.parameters() if p.requires_grad]
    x = torch.randint(0, 256, (4, 33), device=ctx.device)

    def step(nan: bool):  # the training loop's skip, as in trainer/loop.py: `bad` from the grad norm
        with ctx.autocast():
            _, loss = model(x[:, :-1], x[:, 1:])
        (loss * (float("nan") if nan else 1.0)).backward()
        gn = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
        opt.step(~torch.isfinite(gn))  # fused: found_inf on the device
        opt.zero_grad(set_to_none=True)

    if not opt.fused:
        yield "fused_adamw_skip", "FAIL", "AdamW is not fused on this device", time.time() - t0
        return
    step(False)
    before = [p.detach().clone() for p in params]
    state = [{k: v.clone() for k, v in opt.state[p].items()} for p in params]
    step(True)
    same = all(torch.equal(a, p) for a, p in zip(before, params)) and all(
        torch.equal(v, opt.state[p][k]) for s, p in zip(state, params) for k, v in s.items())
    step(False)
    moved = any(not torch.equal(a, p) for a, p in zip(before, params))
    ok = same and moved
    yield ("fused_adamw_skip", "PASS" if ok else "FAIL",
           "NaN step left weights and Adam state unchanged; next step applied" if ok else
           f"unchanged after NaN step: {same}; moved after clean step: {moved}", time.time() - t0)


def _tiny_overrides(data_root, out_dir, device):
    return [f"data.root={data_root}", "model.n_layer=2", "model.n_head=2", "model.n_embd=64", "model.block_size=64",
            "train.micro_batch_size=8", "train.batch_tokens=1024", "train.eval_tokens=2048", "train.eval_interval=3",
            "train.ckpt_interval=3", "logging.log_interval=2", "logging.stats_interval=3",
            "logging.wandb.mode=disabled", "logging.console=false", f"train.device={device}", f"out_dir={out_dir}"]


def check_train_loop(ctx, args):

    from hydra import compose, initialize_config_dir

    from runtime import checkpoint as ck
    from trainer.loop import train

    from trainer.config_store import register_code_configs

    register_code_configs()
    for precision in ("bf16", "fp16"):
        t0 = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            run = Path(tmp) / "run"
            common = [*_tiny_overrides(args.data_root, run, ctx.device.type), f"train.precision={precision}"]
            with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
                cfg = compose("config", overrides=[*common, "train.max_steps=4", "train.stop_at=3",
                                                   "train.inject_nan_at=2"])
                cfg2 = compose("config", overrides=[*common, "train.max_steps=6", "train.resume=auto"])
            train(cfg)
            train(cfg2)  # resume from step 3: mmap + weights-only load, this device's RNG state
            recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            train_recs = [r for r in recs if r["kind"] == "train"]
            summary = [r for r in recs if r["kind"] == "summary"]
            ckpt = ck.load_checkpoint(ck.find_latest(run))
            problems = []
            if not summary or summary[0]["steps"] != 6:
                problems.append("no summary at step 6")
            if ckpt["scheduler"]["skipped_total"] != 1:
                problems.append(f"skipped {ckpt['scheduler']['skipped_total']} steps, expected 1")
            scaler = ckpt["scheduler"].get("scaler")
            if precision == "fp16" and not (scaler and scaler["scale"] < 2.0 ** 16):
                problems.append(f"fp16: the NaN step did not back off the GradScaler ({scaler})")
            if not any(r.get("tokens_per_s") for r in train_recs):
                problems.append("no tokens/s")
            if ctx.cuda and not any("compile_s" in r for r in train_recs):
                problems.append("no compile_s record")
        tps = max((r["tokens_per_s"] or 0) for r in train_recs) if train_recs else 0
        extra = f", GradScaler at {scaler['scale']:g}" if precision == "fp16" and scaler else ""
        yield (f"train_loop/{precision}", "FAIL" if problems else "PASS",
               "; ".join(problems) or f"6 steps with a skipped NaN step and a resume{extra}; {tps:,.0f} tok/s",
               time.time() - t0)


def check_nccl(ctx, args):
    t0 = time.time()
    if not ctx.cuda or torch.cuda.device_count() < 2:
        yield "nccl_2proc", "SKIP", "needs 2 GPUs", 0.0
        return
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py",
               *_tiny_overrides(args.data_root, Path(tmp) / "run", "cuda"), "train.max_steps=4"]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0,1"),
               "WANDB_MODE": "disabled"}
        try:
            p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
            ok, detail = p.returncode == 0, f"exit {p.returncode}"
            if not ok:
                detail += ": " + " | ".join((p.stderr or p.stdout).strip().splitlines()[-3:])[-300:]
        except subprocess.TimeoutExpired:
            ok, detail = False, "timed out after 300 s (a hang in a collective?)"
    yield "nccl_2proc", "PASS" if ok else "FAIL", detail, time.time() - t0


def check_ddp_accum(ctx, args):
    """2 GPUs x accumulation 2 against 1 GPU x accumulation 4 (same global batch, fp32: the sums differ only
    in order), and the 2-GPU run stopped at step 2 and resumed against its straight run."""

    t0 = time.time()
    if not ctx.cuda or torch.cuda.device_count() < 2:
        yield "ddp_accum_resume", "SKIP", "needs 2 GPUs", 0.0
        return
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0,1"),
           "WANDB_MODE": "disabled"}

    def run(out, nproc, *extra):
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        cmd = [*launcher, "train.py", *_tiny_overrides(args.data_root, out, "cuda"), "train.batch_tokens=2048",
               "train.precision=fp32", "train.compile=false", "logging.log_interval=1", "train.max_steps=4", *extra]
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError(" | ".join((p.stderr or p.stdout).strip().splitlines()[-3:])[-300:])
        return [r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
                if r["kind"] == "train"]

    with tempfile.TemporaryDirectory() as tmp:
        one = run(Path(tmp) / "one", 1)
        two = run(Path(tmp) / "two", 2)
        run(Path(tmp) / "resumed", 2, "train.stop_at=2")
        resumed = run(Path(tmp) / "resumed", 2, "train.resume=auto")
    d_accum = max(abs(a - b) for a, b in zip(one, two))
    d_resume = max(abs(a - b) for a, b in zip(two, resumed))
    ok = len(one) == len(two) == len(resumed) == 4 and d_accum < 1e-3 and d_resume < 1e-5
    yield ("ddp_accum_resume", "PASS" if ok else "FAIL",
           f"2 x accum 2 vs 1 x accum 4: max loss difference {d_accum:.1e}; resumed vs straight: {d_resume:.1e}",
           time.time() - t0)


def check_throughput(ctx, args):
    t0 = time.time()
    if ctx.cuda:
        name, (n_layer, n_head, n_embd), block, batch, vocab, steps = "gpt_125m", (12, 12, 768), 1024, 16, 50304, 10
    else:  # the same code on a size a CPU runs in seconds
        name, (n_layer, n_head, n_embd), block, batch, vocab, steps = "tiny", (2, 2, 64), 64, 4, 512, 3
    cfg = GPTConfig(vocab_size=vocab, block_size=block, n_layer=n_layer, n_head=n_head, n_embd=n_embd)
    torch.manual_seed(0)
    model = GPT(cfg).to(ctx.device)
    batches = _batches(vocab, block, batch, 3 + steps)
    opt = build_optimizer(model, optim_config(dict(lr=1e-4)), ctx.device)
    fwd = torch.compile(model, backend=ctx.backend)

    def step(b):
        b = b.to(ctx.device, non_blocking=True)
        with ctx.autocast():
            _, loss = fwd(b[:, :-1], b[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for b in batches[:3]:  # compile, allocator warm-up
        step(b)
    ctx.sync()
    t = time.perf_counter()
    for b in batches[3:]:
        loss = step(b)
    ctx.sync()
    dt = time.perf_counter() - t
    tps = steps * batch * block / dt
    peak = peak_flops(ctx.device, "bf16")
    mfu = model.flops_per_token() * tps / peak if peak else None
    ok = math.isfinite(loss.item()) and (mfu is None or 0.02 < mfu < 0.95)
    detail = f"{name} block {block} x {batch}: {tps:,.0f} tok/s, " + \
        (f"MFU {100 * mfu:.1f}%" if mfu is not None else
         "MFU n/a (GPU not in trainer/monitor.py PEAK_FLOPS)" if ctx.cuda else "MFU n/a on CPU")
    yield "throughput", "PASS" if ok else "FAIL", detail, time.time() - t0


# family -> its variant, `name[:key=value,...]` (model.config.from_spec) for a method that is a key of another
FAMILIES = {"classic": "pre_ln", "peri": "peri_ln", "dyt": "pre_dyt", "geodesic": "geonorm",
            "sphere": "proj_spheret", "ngpt": "ngpt", "streams": "mhc", "siamese": "siamese", "depth_attn": "attnres",
            "depth_attn_block": "attnres:blocks=4", "frac": "frac", "seednorm": "pre_ln:kind=seednorm",
            "value_residual": "pre_ln:value_residual=true", "prores": "pre_ln:prores_steps=100"}


def check_families(ctx, args):
    """One variant per family at the paper shape (gpt_125m, block 1024, micro-batch 16, compiled, bf16):
    tokens/s and peak memory, Pre-LN first so every other row can say its ratio. --variants keeps the
    families of those variants (and Pre-LN)."""
    if ctx.cuda:
        (n_layer, n_head, n_embd), block, batch, vocab, steps = (12, 12, 768), 1024, 16, 50304, 8
    else:
        (n_layer, n_head, n_embd), block, batch, vocab, steps = (2, 2, 64), 64, 4, 512, 2
    base = None
    wanted = set(args.variants.split(",")) if args.variants else set(FAMILIES.values())
    for family, v in FAMILIES.items():
        if v != "pre_ln" and v not in wanted:  # Pre-LN always runs: every other row is a ratio to it
            continue
        t0 = time.time()
        torch._dynamo.reset()
        cfg = from_spec(v, vocab_size=vocab, block_size=block, n_layer=n_layer, n_head=n_head, n_embd=n_embd)
        model = opt = fwd = logits = loss = None
        try:
            torch.manual_seed(0)
            mark = ctx.memory_mark()
            with ctx.device:
                model = GPT(cfg)
            opt = build_optimizer(model, optim_config(dict(lr=1e-4)), ctx.device)
            fwd = torch.compile(model, backend=ctx.backend) if ctx.cuda else model  # CPU: the code path, quickly
            batches = _batches(vocab, block, batch, 2 + steps)
            for i, b in enumerate(batches):
                if i == 2:
                    ctx.sync()
                    t = time.perf_counter()
                b = b.to(ctx.device)
                with ctx.autocast():
                    logits, loss = fwd(b[:, :-1], b[:, 1:])
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                model.after_optimizer_step(torch.ones((), dtype=torch.bool, device=ctx.device))
            ctx.sync()
            tps = steps * batch * block / (time.perf_counter() - t)
            gb = ctx.peak_gib(mark)
            base = base or (tps, gb)
            detail = (f"{v}: {tps:,.0f} tok/s ({tps / base[0]:.2f}x Pre-LN)"
                      + (f", peak {gb:.1f} GiB ({gb / base[1]:.2f}x)" if gb is not None else ""))
            status = "PASS" if math.isfinite(loss.item()) else "FAIL"
        except torch.cuda.OutOfMemoryError:
            status, detail = "OOM", f"{v}: micro-batch {batch} x {block} does not fit"
        finally:
            del model, opt, fwd, logits, loss  # each holds the graph, and through it weights and grads
        yield f"family/{family}", status, detail, time.time() - t0


def paper_experiments() -> list[str]:
    return sorted(p.stem for p in (ROOT / "configs" / "experiment").glob("*.yaml")
                  if p.stem.startswith(("geonorm_", "spheret_")))


def check_smoke(ctx, args):
    """50 steps of each paper experiment as a sweep would launch it (train.py, its model, arch, precision,
    micro-batch; compiled on CUDA), on a small offline sample instead of its corpus. On CPU: the first one,
    shrunk to a tiny width, 3 steps."""
    exps = args.experiments.split(",") if args.experiments else paper_experiments()
    if not ctx.cuda:
        exps = exps[:1]
    # the standard library's sources only: data.packages lists the tested install, which a GPU machine's
    # environment need not match (and the smoke run needs no particular corpus, only GPT-2 BPE text)
    data = ["data=pysrc", "data.packages=[]", "data.tokenizer=gpt2", "data.name=smoke_stdlib", "data.max_docs=3000",
            f"data.root={args.data_root}"]
    for exp in exps:
        t0 = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            steps = 50 if ctx.cuda else 3
            cmd = [sys.executable, "train.py", f"experiment={exp}", *data, f"train.max_steps={steps}",
                   f"train.eval_interval={steps}", "train.eval_tokens=65536", f"train.ckpt_interval={steps}",
                   "optim.warmup_steps=10", "logging.console=false", "logging.wandb.mode=disabled",
                   f"train.device={ctx.device.type}", f"out_dir={Path(tmp) / 'run'}"]
            if not ctx.cuda:
                cmd += ["model.n_layer=2", "model.n_head=2", "model.n_embd=64", "model.block_size=64",
                        "train.batch_tokens=512", "train.micro_batch_size=4", "train.eval_tokens=256",
                        "train.precision=fp32"]
            p = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "WANDB_MODE": "disabled"}, capture_output=True,
                               text=True, timeout=1800)
            summary, tps = None, 0
            metrics = Path(tmp) / "run" / "metrics.jsonl"
            if metrics.is_file():

                recs = [json.loads(line) for line in metrics.read_text().splitlines()]
                summary = next((r for r in recs if r["kind"] == "summary"), None)
                tps = max((r.get("tokens_per_s") or 0 for r in recs if r["kind"] == "train"), default=0)
        oom = "OutOfMemoryError" in p.stderr
        if p.returncode == 0 and summary and not summary.get("diverged"):
            status, detail = "PASS", (f"{steps} steps, final val loss {summary['final_val_loss']:.3f}, "
                                      f"{tps:,.0f} tok/s")
        else:
            tail = " | ".join((p.stderr or p.stdout).strip().splitlines()[-2:])[-300:]
            status, detail = ("OOM" if oom else "FAIL"), f"exit {p.returncode}: {tail}"
        yield f"smoke/{exp}", status, detail, time.time() - t0


def check_memory(ctx, args):
    from model.config import model_group_defaults
    from trainer.config import TrainConfig

    micro = TrainConfig().micro_batch_size
    presets = sorted((ROOT / "configs/model").glob("*.yaml"))
    if not ctx.cuda:
        presets = [p for p in presets if p.stem == "tiny"]
    for path in presets:
        m = {**model_group_defaults(), **yaml.safe_load(path.read_text())}  # a preset states what differs
        vocab = 320 if path.stem == "tiny" else 50304  # tiny's default data is byte-tokenized
        for norm in ("pre_ln", "geonorm"):
            t0 = time.time()
            row = f"memory/{path.stem}/{norm}"
            cfg = GPTConfig(vocab_size=vocab, block_size=m["block_size"], n_layer=m["n_layer"], n_head=m["n_head"],
                            n_embd=m["n_embd"], dropout=0.0, bias=m["bias"], norm=norm)
            model = opt = logits = loss = None
            try:
                mark = ctx.memory_mark()
                with ctx.device:  # initialise on the device: a 1.3B model inits slowly on a CPU
                    model = GPT(cfg)
                opt = build_optimizer(model, optim_config(), ctx.device)
                b = _batches(vocab, m["block_size"], micro, 1)[0].to(ctx.device)
                with ctx.autocast():
                    logits, loss = model(b[:, :-1], b[:, 1:])
                loss.backward()
                opt.step()
                ctx.sync()
                if ctx.cuda:
                    gb = ctx.peak_gib(mark)
                    total = torch.cuda.get_device_properties(ctx.device).total_memory / 2**30
                    detail = f"micro-batch {micro} x {m['block_size']}, eager: peak {gb:.1f} of {total:.0f} GiB"
                else:
                    detail = f"micro-batch {micro} x {m['block_size']}: runs (no memory figure on CPU)"
                status = "PASS" if math.isfinite(loss.item()) else "FAIL"
            except torch.cuda.OutOfMemoryError:
                status, detail = "OOM", f"micro-batch {micro} does not fit: lower train.micro_batch_size"
            finally:
                del model, opt, logits, loss  # the loss's graph holds the weights and grads
            yield row, status, detail, time.time() - t0


CHECKS = {"compile": check_compile, "neox": check_neox, "fused_skip": check_fused_skip,
          "train_loop": check_train_loop, "nccl": check_nccl, "ddp": check_ddp_accum, "throughput": check_throughput,
          "families": check_families, "memory": check_memory, "smoke": check_smoke}


def _graphs_compiled() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
