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


def _identity(p: dict) -> tuple:
    """The same checkpoint: same file, step and training run (however the path was given)."""
    return (str(Path(p["checkpoint"]).resolve()), p["step"], p.get("wandb_run_id"))


def check_out(path, checkpoint, step: int, wandb_run_id) -> bool:
    """Whether `path` already holds results of this checkpoint (to be merged); False when it does not exist.
    A file of another checkpoint's results, or one that is no eval.py result, is refused in one line: its
    results are never replaced."""
    from .config import EvalConfigError

    path = Path(path)
    if not path.is_file():
        return False
    try:
        old = read_json(path)
        held = _identity(old)
    except Exception:  # noqa: BLE001  (not JSON, or JSON without a checkpoint: not ours to overwrite)
        raise EvalConfigError(f"--out {path} exists and is not an eval.py result file: it is left as it is; pass "
                              "another --out") from None
    if held != _identity({"checkpoint": checkpoint, "step": step, "wandb_run_id": wandb_run_id}):
        raise EvalConfigError(f"--out {path} holds the results of another checkpoint ({old['checkpoint']}, step "
                              f"{old['step']}): they are kept; pass another --out (the default, "
                              "<run dir>/eval/eval_<step>.json, is one file per checkpoint)")
    return True


def merge_results(path, new: dict) -> dict:
    """`new` (one eval.py invocation) merged into what `path` already holds for the same checkpoint, so
    successive evaluations keep every result: a task's newest result wins, a failure never replaces a
    result, `perplexity` is the newest measurement, and `runs` lists every invocation with what it
    measured (each perplexity setting included) and what failed."""
    run = {"time": datetime.datetime.now().isoformat(timespec="seconds"), "eval_config": new.get("eval_config"),
           "perplexity": new.get("perplexity"), "tasks": sorted(new.get("tasks") or {}),
           "failed_tasks": new.get("failed_tasks") or {}, "time_s": new.get("time_s")}
    path = Path(path)
    if not check_out(path, new["checkpoint"], new["step"], new.get("wandb_run_id")):
        return {**new, "runs": [run]}
    old = read_json(path)
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


def write_merged(path, payload: dict) -> tuple[Path, bool]:
    """merge_results + write_json, under an exclusive lock on the directory (two eval.py at once on one
    checkpoint must not lose each other's results). Returns (the path, whether earlier results were merged)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        merged = path.is_file()
        return write_json(path, merge_results(path, payload)), merged
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
