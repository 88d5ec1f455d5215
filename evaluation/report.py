"""eval.py's outputs: one JSON file with every metric, a markdown table, and the run's wandb run."""
from __future__ import annotations

import datetime
import fcntl
import json
import math
import os
from pathlib import Path
from typing import Optional

from data.files import atomic_write, read_json


def write_json(path, payload: dict) -> Path:
    """Write atomically, so a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n")


def merge_results(path, new: dict) -> dict:
    """`new` (one eval.py invocation) merged into what `path` already holds for the same checkpoint, so
    successive evaluations keep every result: a task's newest result wins, a failure never replaces a
    result, `perplexity` is the newest measurement, and `runs` lists every invocation with what it
    measured (each perplexity setting included) and what failed."""
    run = {"time": datetime.datetime.now().isoformat(timespec="seconds"), "eval_config": new.get("eval_config"),
           "perplexity": new.get("perplexity"), "tasks": sorted(new.get("tasks") or {}),
           "failed_tasks": new.get("failed_tasks") or {}, "time_s": new.get("time_s")}
    path = Path(path)
    old = read_json(path) if path.is_file() else None
    def same(p):  # the same checkpoint: same file, step and training run (however the path was given)
        return (str(Path(p["checkpoint"]).resolve()), p["step"], p.get("wandb_run_id"))

    if not old or same(old) != same(new):
        return {**new, "runs": [run]}
    earlier = old.get("runs") or [
        {
            "eval_config": old.get("eval_config"),
            "perplexity": old.get("perplexity"),
            "tasks": sorted(old.get("tasks") or {}),
            "failed_tasks": old.get("failed_tasks") or {},
        }
    ]
    merged = {**old, **new}
    merged["perplexity"] = new.get("perplexity") or old.get("perplexity")
    merged["tasks"] = {**(old.get("tasks") or {}), **(new.get("tasks") or {})}
    failed = {**(old.get("failed_tasks") or {}), **(new.get("failed_tasks") or {})}
    merged["failed_tasks"] = {t: why for t, why in failed.items() if t not in merged["tasks"]}
    merged["runs"] = earlier + [run]
    return merged


def write_merged(path, payload: dict) -> Path:
    """merge_results + write_json, under an exclusive lock on the directory (two eval.py at once on one
    checkpoint must not lose each other's results)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return write_json(path, merge_results(path, payload))
    finally:
        os.close(fd)  # drops the lock


def _fmt(v) -> str:
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        return f"{v:.4f}" if abs(v) < 1e4 else f"{v:.4g}"
    return str(v)


def markdown_table(payload: dict) -> str:
    """One row per (task, metric); stderr in its own column when lm-eval reports one."""
    lines = [f"checkpoint `{payload['checkpoint']}` (step {payload['step']}, {payload['norm']}, "
             f"tokenizer {payload['tokenizer']})", "", "| task | metric | value | stderr |", "|---|---|---:|---:|"]
    ppl = payload.get("perplexity")
    if ppl:
        what = f"{ppl['split']} ({ppl['tokens']} tokens, stride {ppl['stride']})"
        lines.append(f"| {what} | loss | {_fmt(ppl['loss'])} | |")
        lines.append(f"| {what} | ppl | {_fmt(ppl['ppl'])} | |")
        if ppl.get("bpb") is not None:
            lines.append(f"| {what} | bits per byte | {_fmt(ppl['bpb'])} | |")
    for task, metrics in payload.get("tasks", {}).items():
        for name, v in metrics.items():
            if name.endswith("_stderr") or "_stderr[" in name or name == "samples":
                continue
            err = metrics.get(name.replace("[", "_stderr[", 1) if "[" in name else f"{name}_stderr")
            lines.append(f"| {task} | {name} | {_fmt(v)} | {'' if err is None else _fmt(err)} |")
    for task, why in payload.get("failed_tasks", {}).items():
        lines.append(f"| {task} | failed | {why.replace('|', '/')} | |")
    return "\n".join(lines)


def flat_metrics(payload: dict) -> dict:
    """wandb keys: ppl/<split>/{loss,ppl}, zeroshot/<task>/<metric>."""
    out = {}
    ppl = payload.get("perplexity")
    if ppl:
        out[f"ppl/{ppl['split']}/loss"] = ppl["loss"]
        out[f"ppl/{ppl['split']}/ppl"] = ppl["ppl"]
        if ppl.get("bpb") is not None:
            out[f"ppl/{ppl['split']}/bpb"] = ppl["bpb"]
    for task, metrics in payload.get("tasks", {}).items():
        for name, v in metrics.items():
            out[f"zeroshot/{task}/{name}"] = v
    return out


def log_wandb(ckpt: dict, run_dir: Optional[Path], payload: dict) -> Optional[str]:
    """Log to the training run's wandb run (same id, resume="allow"). Returns the run id, or None when
    the checkpoint has no run or wandb is disabled. WANDB_MODE wins over the run's stored mode.

    The metrics get their own x-axis, ckpt_step, so evaluating an old checkpoint after training has
    logged later steps is not dropped as a step going backwards."""
    run_id = ckpt.get("wandb_run_id")
    wcfg = ((ckpt.get("config") or {}).get("logging") or {}).get("wandb") or {}
    mode = os.environ.get("WANDB_MODE") or wcfg.get("mode") or "offline"
    if not run_id or mode == "disabled":
        return None
    import wandb  # slow import: only when used

    run = wandb.init(id=run_id, resume="allow", mode=mode, project=wcfg.get("project") or "nanonorm",
                     entity=wcfg.get("entity"), dir=str(run_dir) if run_dir else None,
                     settings=wandb.Settings(console="off", silent=True))
    try:
        run.define_metric("ckpt_step")
        for prefix in ("ppl/*", "zeroshot/*"):
            run.define_metric(prefix, step_metric="ckpt_step")
        metrics = flat_metrics(payload)
        run.log({**metrics, "ckpt_step": payload["step"]})
        for k, v in metrics.items():
            run.summary[k] = v
    finally:
        run.finish()
    return run_id
