"""Many horizons for the price of one: a constant-lr trunk and a WSD cooldown branch at each horizon.

Run it with scripts/branches.py (--horizons, --out, the overrides after --); the horizon part kind of a study
(experiments/horizon.py) calls `run` per trunk.

A `wsd` run of H steps holds the peak lr until step H - round(decay_frac * H) and then decays linearly to
optim.min_lr (trainer/schedules.py). Up to that step it is the same run whatever H is, so one trunk run of
the longest horizon (itself the longest horizon's `wsd` run) checkpoints at each shorter horizon's decay
start (`train.ckpt_steps`), and a branch resumed from that checkpoint with `train.max_steps=H` is the
`wsd` run of H steps, bitwise (same seed, same data order: the loader's order is a pure function of the
step; tests/test_branches.py checks it). Hagele et al. 2024 (arXiv 2405.18392) show that such cooldowns
match cosine runs of the same length. The cost is the trunk plus decay_frac of every shorter horizon:
1 + decay_frac * sum(H) / max(H) of the longest run (1.13x for 1, 4, 16, 32 at decay_frac 0.2).

Layout under --out: trunk/ (the run of max(H) steps), h<H>/ (a branch per shorter horizon), and
horizons.json (per horizon: steps, tokens, final validation loss, run dir, training seconds). Rerunning
resumes: a finished run is skipped, an interrupted one continues from its own checkpoint.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from common import children
from experiments import runs as runlib
from data.files import atomic_write

REPO = Path(__file__).resolve().parent.parent


def decay_start(horizon: int, decay_frac: float) -> int:
    """The step after which a `wsd` run of `horizon` steps starts to decay (trainer/schedules.py)."""
    return horizon - max(1, round(decay_frac * horizon))


def plan(horizons: list[int], decay_frac: float, warmup: int = 0) -> dict:
    """{"trunk": longest horizon, "branches": {H: decay start of H}} for the shorter horizons."""
    hs = sorted(set(int(h) for h in horizons))
    if not hs or hs[0] < 1:
        raise SystemExit(f"--horizons {horizons}: give positive step counts")
    if not 0 < decay_frac < 1:
        raise SystemExit(f"--decay-frac {decay_frac}: must be in (0, 1)")
    branches = {h: decay_start(h, decay_frac) for h in hs[:-1]}
    if branches and min(branches.values()) <= warmup:
        h = min(branches)
        raise SystemExit(f"horizon {h} starts its decay at step {branches[h]}, inside optim.warmup_steps={warmup}: "
                         "give longer horizons or fewer warmup steps")
    return {"trunk": hs[-1], "branches": branches}


def trunk_args(p: dict, decay_frac: float, out: Path) -> list[str]:
    from runtime.checkpoint import find_latest

    steps = sorted(p["branches"].values())
    fresh = find_latest(out / "trunk") is None  # killed before its first checkpoint: its records go
    return ["optim.schedule=wsd", f"optim.decay_frac={decay_frac}", f"train.max_steps={p['trunk']}",
            f"train.ckpt_steps=[{','.join(map(str, steps))}]", f"out_dir={out / 'trunk'}", "train.resume=auto",
            *(["train.overwrite=true"] if fresh else [])]


def branch_args(horizon: int, start: int, decay_frac: float, out: Path) -> list[str]:
    """A branch continues from the trunk's checkpoint at its decay start; once it has a checkpoint of its
    own (it was interrupted), from that."""
    from runtime.checkpoint import ckpt_path, find_latest

    run_dir = out / f"h{horizon}"
    resume = "auto" if find_latest(run_dir) is not None else str(ckpt_path(out / "trunk", start))
    return ["optim.schedule=wsd", f"optim.decay_frac={decay_frac}", f"train.max_steps={horizon}",
            "train.ckpt_steps=[]", f"out_dir={run_dir}", f"train.resume={resume}",
            *(["train.overwrite=true"] if resume != "auto" else [])]  # records of a branch killed before its first save


def run_dir_of(out: Path, horizon: int, p: dict) -> Path:
    return out / ("trunk" if horizon == p["trunk"] else f"h{horizon}")


def train(args: list[str], log: Path | None, env: dict | None = None) -> None:
    cmd = [sys.executable, str(REPO / "train.py"), *args]
    if log is None:
        print("$", " ".join(cmd), flush=True)
    with open(log, "a") if log else open("/dev/null") as f:
        rc = children.run(cmd, cwd=REPO, stdout=f if log else None, stderr=subprocess.STDOUT if log else None, env=env)
    if rc != 0:
        where = f" (log {log})" if log else ""
        raise RuntimeError(f"train.py {' '.join(args)} failed with exit {rc}{where}")


def run(out: Path, horizons: list[int], decay_frac: float, overrides: list[str], warmup: int = 0,
        log: Path | None = None, env: dict | None = None) -> dict:
    """Train the trunk and every branch of `out` not yet finished; write and return horizons.json."""
    p = plan(horizons, decay_frac, warmup)
    out = Path(out).resolve()  # train.py runs in its checkout's root: a relative out_dir would land there
    out.mkdir(parents=True, exist_ok=True)
    if not runlib.is_finished(out / "trunk"):
        train([*overrides, *trunk_args(p, decay_frac, out)], log, env)
        if not runlib.is_finished(out / "trunk"):  # stopped by a signal (saved): rerun to resume
            raise RuntimeError(f"{out / 'trunk'} stopped before its end; rerun to resume it")
    for h, start in p["branches"].items():
        if not runlib.is_finished(out / f"h{h}"):
            train([*overrides, *branch_args(h, start, decay_frac, out)], log, env)
            if not runlib.is_finished(out / f"h{h}"):
                raise RuntimeError(f"{out / f'h{h}'} stopped before its end; rerun to resume it")
    return summarize(out, p, decay_frac)


def summarize(out: Path, p: dict, decay_frac: float) -> dict:
    rows = {}
    for h in [*p["branches"], p["trunk"]]:
        d = run_dir_of(out, h, p)
        if not runlib.is_finished(d):
            continue
        r = runlib.load_run(d)
        rows[h] = {"steps": h, "tokens": h * int(runlib.get_key(r.config, "train.batch_tokens")),
                   "final_val_loss": r.final_val_loss, "final_val_bpb": r.final_val_bpb,
                   "final_val_se_bpb": (r.summary or {}).get("final_val_se_bpb"),
                   "final_val_tokens": (r.summary or {}).get("final_val_tokens"),
                   "spikes_loss": r.spike_count("loss"), "spikes_grad_norm": r.spike_count("grad_norm"),
                   "max_grad_norm": max((t["grad_norm"] for t in r.train if t.get("grad_norm") is not None),
                                        default=None),
                   "diverged": r.diverged, "run_dir": str(d),
                   "train_s": r.summary.get("train_s"),
                   "branch_from": None if h == p["trunk"] else decay_start(h, decay_frac)}
    result = {"decay_frac": decay_frac, "trunk_steps": p["trunk"], "horizons": rows,
              "cost_vs_longest": cost(p)}
    atomic_write(out / "horizons.json", json.dumps(result, indent=1) + "\n")
    return result


def cost(p: dict) -> float:
    """Steps trained over the longest horizon's: the trunk plus each branch's cooldown."""
    return (p["trunk"] + sum(h - s for h, s in p["branches"].items())) / p["trunk"]
