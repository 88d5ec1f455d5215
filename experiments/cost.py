"""What a paper table costs before it runs: per row (an experiment) and run (a point), the model's own FLOP
count over the run's tokens, GPU-hours at a stated MFU of a GPU's dense peak, checkpoint and data disk, and
an estimate of the memory per GPU at the experiment's micro-batch. Used by scripts/paper.py.

The memory estimate (no activation checkpointing, fp16/bf16 autocast, SDPA's fused attention so no T x T
scores are kept): 16 bytes per parameter (fp32 weights, gradients, Adam's two moments), 34 * d bytes per
token per layer of activations (Korthikanti et al. 2022, arXiv 2205.05198, Sec. 4.1, without its attention
term), and 10 bytes per token per vocabulary entry for the logits (half-precision logits, their fp32 copy
in the loss, its gradient). It is an estimate to choose micro-batches by, not a measurement.
"""
from __future__ import annotations

from common import ConfigError

GPUS = {"H100": "NVIDIA H100 80GB HBM3", "A100": "NVIDIA A100-SXM4-80GB", "H200": "NVIDIA H200"}
GPU_MEMORY_GB = {"NVIDIA H100 80GB HBM3": 80, "NVIDIA A100-SXM4-80GB": 80, "NVIDIA H200": 141}
DEFAULT_GPU = GPUS["H100"]


def gpu_name(asked: str | None) -> str:
    """torch's name of the GPU to cost for: --gpu (a short name or torch's), else the visible GPU, else H100."""
    from trainer.monitor import PEAK_FLOPS

    if asked is None:
        import torch

        asked = torch.cuda.get_device_name(0) if torch.cuda.is_available() else DEFAULT_GPU
    name = GPUS.get(asked, asked)
    if name not in PEAK_FLOPS:
        raise ConfigError(f"--gpu={asked!r}: no dense peak known for it; valid: {', '.join(GPUS)} or one of "
                          f"trainer/monitor.py PEAK_FLOPS ({', '.join(PEAK_FLOPS)})")
    return name


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose, initialize_config_dir

    from trainer.config_store import CONFIG_DIR, register_code_configs

    register_code_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra_compose("config", overrides=overrides)


def points(meta: dict) -> dict[str, list[str]]:
    """label -> overrides of an experiment's points (experiment_meta.points, else one per variant)."""
    if meta.get("points"):
        return {label: [f"{k}={v}" for k, v in p.items()] for label, p in meta["points"].items()}
    return {v: [f"norm={v}"] for v in meta.get("variants") or []}


def memory_bytes(n_params: int, n_layer: int, n_embd: int, micro: int, block: int, vocab: int) -> float:
    """Estimated peak memory of one GPU (the module docstring says what is counted)."""
    return 16 * n_params + micro * block * (34 * n_layer * n_embd + 10 * vocab)


def run_cost(label: str, cfg, rc=None) -> dict:
    """The numbers of one run of an experiment (a composed config; `rc` its RunConfig where the caller has
    parsed it already), from its model built on the meta device."""
    import torch
    from omegaconf import OmegaConf

    from model import GPT
    from trainer.config import parse_run_config

    rc = rc or parse_run_config(cfg)
    with torch.device("meta"):  # shapes only: nothing is allocated
        model = GPT(rc.model)
    n_all = sum(p.numel() for p in model.parameters())
    t, m = rc.train, rc.model
    tokens = t.max_steps * t.batch_tokens
    fpt = float(model.flops_per_token())
    n_evals = t.max_steps // t.eval_interval + 1  # and at step 0
    flops = fpt * tokens + n_evals * t.eval_tokens * fpt / 3  # an evaluation is a forward: a third of a step
    ckpt = n_all * 12  # fp32 weights and Adam's two moments
    precision = "bf16" if t.precision == "auto" else t.precision
    meta = cfg.get("experiment_meta")
    meta = OmegaConf.to_container(meta, resolve=True) if meta is not None else {}  # an ad-hoc sweep has none
    return {"label": label, "params": n_all, "tokens": tokens, "flops": flops, "precision": precision,
            "ckpt_bytes": ckpt, "ckpt_disk": ckpt * (t.keep_last + len(t.ckpt_steps)),
            "micro": t.micro_batch_size, "block": m.block_size, "batch_seqs": t.batch_tokens // m.block_size,
            "memory": memory_bytes(n_all, m.n_layer, m.n_embd, t.micro_batch_size, m.block_size, m.vocab_size),
            "data_bytes": tokens * (2 if m.vocab_size <= 65536 else 4), "data": rc.data.name,
            "seeds": len(meta.get("seeds") or [0]), "lr_grid": len(meta.get("lr_grid") or [])}


def plan_row(row: str, overrides: list[str], stand_ins: dict, files: dict) -> dict:
    """Every run of experiment `row` with the user's overrides: a stand-in data config, or data.files, where
    asked. The cost needs no data: a local corpus not given yet is a placeholder path."""
    base = compose([f"experiment={row}", *overrides])
    data = base.data.name
    if data in stand_ins:
        swap = [f"data={stand_ins[data]}"]
    elif base.data.source == "local" and not base.data.files:
        swap = [f"data.files={files.get(data, f'/path/to/{data}/*.jsonl')}"]
    else:
        swap = []
    from omegaconf import OmegaConf

    meta = base.get("experiment_meta")
    meta = OmegaConf.to_container(meta, resolve=True) if meta is not None else {}
    runs = [run_cost(label, compose([f"experiment={row}", *swap, *p, *overrides]))
            for label, p in points(meta).items()]
    return {"data": data, "runs": runs}


def gpu_hours(flops: float, gpu: str, precision: str, mfu: float) -> float:
    from trainer.monitor import PEAK_FLOPS

    return flops / (mfu * PEAK_FLOPS[gpu][precision]) / 3600


def summary(spec: dict, plans: dict, gpu: str, mfu: float) -> dict:
    """Totals of a table: GPU-hours at one seed and one lr, at its seeds, and at every lr of its grid."""
    one = sum(gpu_hours(r["flops"], gpu, r["precision"], mfu) for p in plans.values() for r in p["runs"])
    seeded = sum(
        gpu_hours(r["flops"], gpu, r["precision"], mfu) * r["seeds"] for p in plans.values() for r in p["runs"]
    )
    grid = max((r["lr_grid"] for p in plans.values() for r in p["runs"]), default=0)
    data = {}
    for p in plans.values():
        for r in p["runs"]:
            data[r["data"]] = max(data.get(r["data"], 0), r["data_bytes"])  # one prepared corpus per data config
    ckpt = sum(r["ckpt_disk"] * r["seeds"] for p in plans.values() for r in p["runs"])
    return {"gpu_hours": one, "gpu_hours_seeds": seeded, "lr_grid": grid, "data_bytes": data, "ckpt_bytes": ckpt,
            "runs": sum(len(p["runs"]) for p in plans.values())}


def render_cost(spec: dict, plans: dict, gpu: str, mfu: float) -> str:
    from trainer.monitor import PEAK_FLOPS

    gb = 1e9
    mem_gb = GPU_MEMORY_GB.get(gpu)
    lines = [f"cost of {spec['title']}: at {mfu:.0%} MFU of {gpu} (dense peak {PEAK_FLOPS[gpu]['bf16'] / 1e12:.0f} "
             "TFLOP/s in bf16/fp16); FLOPs are the model's own count (GPT.flops_per_token: 6N + 12 L d T per token) "
             "over the training tokens, plus the evaluation forwards", "",
             "| row | run | params | tokens | PFLOP | GPU-h | checkpoint | micro-batch | memory/GPU (est.) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row, plan in plans.items():
        for r in plan["runs"]:
            mem = r["memory"] / gb
            warn = " (over!)" if mem_gb and mem > 0.9 * mem_gb else ""
            lines.append(f"| {row} | {r['label']} | {r['params'] / 1e6:,.0f}M | {r['tokens'] / 1e9:.3g}B | "
                         f"{r['flops'] / 1e15:,.0f} | {gpu_hours(r['flops'], gpu, r['precision'], mfu):,.1f} | "
                         f"{r['ckpt_bytes'] / gb:.1f} GB | {r['micro']} x {r['block']} of {r['batch_seqs']} | "
                         f"{mem:.0f} GB{warn} |")
    s = summary(spec, plans, gpu, mfu)
    data = ", ".join(f"{k} >= {v / gb:.1f} GB" for k, v in s["data_bytes"].items())
    lines += ["", f"total: {s['runs']} runs, {s['gpu_hours']:,.1f} GPU-hours at one seed and one lr "
              f"({s['gpu_hours_seeds']:,.1f} at the experiments' seeds"
              + (f"; x{s['lr_grid']} with --tune-lr over experiment_meta.lr_grid" if s["lr_grid"] else "") + "); "
              f"disk: checkpoints {s['ckpt_bytes'] / gb:,.0f} GB (keep_last each), prepared data {data} "
              "(2 bytes a token, at least the tokens one run reads)"]
    return "\n".join(lines) + "\n"

