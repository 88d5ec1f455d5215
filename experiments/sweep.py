"""Sweeps as data: the points of an experiment (or of a points file, a grid), each point's train.py command,
the manifest a sweep dir keeps, the checks before anything starts, local execution packed onto GPUs and the
Slurm array script. scripts/sweep.py is the command line (its --help says what a sweep is)."""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from experiments import runs as runlib
from common import UserError, children
from common.children import GpuSlots
from data.files import atomic_write, read_json, read_yaml, writable_dir

REPO = Path(__file__).resolve().parent.parent  # the checkout: configs/ and train.py
EXPERIMENTS = REPO / "configs" / "experiment"
# Config keys this script sets on every point (defined in configs/{train,logging}).
KEY_SEED, KEY_RESUME = "train.seed", "train.resume"
KEY_GROUP = "logging.wandb.group"


def fmt_value(v) -> str:
    """A YAML value as a Hydra command-line override value."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, float):
        return ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(fmt_value(x) for x in v) + "]"
    return str(v)


def split_values(text: str) -> list[str]:
    """'a,b,[0.9,0.95]' -> ['a', 'b', '[0.9,0.95]'] (commas inside brackets or quotes stay)."""
    out, depth, cur, quote = [], 0, "", None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        cur += ch
    out.append(cur)
    return [v.strip() for v in out if v.strip()]


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "x"


def load_meta(name: str) -> dict:
    path = EXPERIMENTS / f"{name}.yaml"
    if not path.is_file():
        valid = ", ".join(sorted(p.stem for p in EXPERIMENTS.glob("*.yaml")))
        raise SystemExit(f"unknown experiment {name!r} (no {path.relative_to(REPO)}); valid: {valid}")
    with open(path) as f:
        meta = (yaml.safe_load(f) or {}).get("experiment_meta")
    if not isinstance(meta, dict):
        raise SystemExit(f"{path.relative_to(REPO)}: no experiment_meta mapping (variants/points, seeds)")
    return meta


def load_points(path) -> dict:
    """--points: a YAML file label -> {key: value}, or that mapping itself (a study's sweep, in process)."""
    if isinstance(path, dict):
        return path
    try:
        points = read_yaml(path, "--points: a mapping label -> {key: value}")
    except OSError as e:
        raise SystemExit(f"--points {path}: {e.strerror}") from None
    if not all(isinstance(v, (dict, type(None))) for v in points.values()):
        raise SystemExit(f"--points {path}: expected a mapping label -> {{key: value}}")
    if not points:
        raise SystemExit(f"--points {path}: no points (the file is empty): a mapping label -> {{key: value}}")
    return points


def _repeated(values: list[str]) -> tuple[str, str] | None:
    """Two spellings of one value (1e-3, 0.001; 3, 3.0), or None."""
    seen = {}
    for v in values:
        try:
            k = float(v)
        except ValueError:
            k = v
        if k in seen:
            return seen[k], v
        seen[k] = v
    return None


def build_points(meta: dict, grid: list[str], seeds: str | None, variants: str | None,
                 points_file: str | dict | None = None) -> list[dict]:
    """The grid as a list of {label, seed, overrides (ordered list of 'k=v')}."""
    # Axis of (label, overrides) for the variants/points.
    if meta.get("points"):
        base = [(lbl, [f"{k}={fmt_value(v)}" for k, v in (ovr or {}).items()])
                for lbl, ovr in meta["points"].items()]
    elif meta.get("variants"):
        base = [(v, [f"norm={v}"]) for v in meta["variants"]]
    else:
        base = [("base", [])]
    seed_list = [str(s) for s in meta.get("seeds", [0])]
    # label -> further seeds for some points only (e.g. a second seed of a few variants, as seed noise)
    extra_seeds = {str(k): [str(s) for s in v] for k, v in (meta.get("extra_seeds") or {}).items()}
    if variants and meta.get("points"):  # a subset of the labelled points, each with all its overrides
        labels = dict(base)
        unknown = [v for v in split_values(variants) if v not in labels]
        if unknown:
            raise SystemExit(f"--variants: {', '.join(unknown)} not among the experiment's points; "
                             f"valid: {', '.join(labels)}")
        base = [(v, labels[v]) for v in split_values(variants)]
    elif variants:
        base = [(v, [f"norm={v}"]) for v in split_values(variants)]
    if points_file:
        base = [(lbl, [f"{k}={fmt_value(v)}" for k, v in (ovr or {}).items()])
                for lbl, ovr in load_points(points_file).items()]
    if seeds:  # explicit seeds replace both seeds and extra_seeds
        seed_list, extra_seeds = split_values(seeds), {}
    extra_axes: list[list[tuple[str, str]]] = []
    for spec in grid:
        if "=" not in spec:
            raise SystemExit(f"--grid {spec!r}: expected key=v1,v2,...")
        key, vals = spec.split("=", 1)
        values = split_values(vals)
        if not values:
            raise SystemExit(f"--grid {spec!r}: no values")
        same = _repeated(values)
        if same:  # 1e-3 and 0.001 are one point: it would run twice, and count twice in a mean
            raise SystemExit(f"--grid {spec!r}: {same[0]} and {same[1]} are the same value; give each value once")
        if key == "norm":
            base = [(v, [f"norm={v}"]) for v in values]
        elif key == KEY_SEED:
            seed_list, extra_seeds = values, {}
        else:
            extra_axes.append([(key, v) for v in values])
    points = []
    for (label, ovr), *extras in itertools.product(base, *extra_axes):
        full_label = label + "".join(f"-{slug(k.split('.')[-1])}-{slug(v)}" for k, v in extras)
        more = [s for s in extra_seeds.get(label, []) if s not in seed_list]
        for seed in seed_list + more:
            points.append({"label": full_label, "seed": seed, "base": label, "axes": dict(extras),
                           "overrides": ovr + [f"{k}={v}" for k, v in extras],
                           "dir": f"{slug(full_label)}-s{slug(seed)}"})
    # Every point's first seed before any second seed: a study stopped half-way still covers all points.
    order = list(dict.fromkeys(seed_list + [s for v in extra_seeds.values() for s in v]))
    points.sort(key=lambda p: order.index(p["seed"]))
    dirs = [p["dir"] for p in points]
    if len(set(dirs)) != len(dirs):
        raise SystemExit("two grid points map to the same run directory; give distinct values")
    return points


def point_status(run_dir: Path) -> str:
    """done (summary written) | resume (has a checkpoint) | restart (died before its first
    checkpoint: train.resume=auto starts it over, dropping its stale records) | new."""
    if runlib.is_finished(run_dir):
        return "done"
    if any((run_dir / "checkpoints").glob("ckpt_*.pt")):
        return "resume"
    if (run_dir / "metrics.jsonl").exists() or (run_dir / "config.yaml").exists():
        return "restart"
    return "new"


def command(point: dict, args, sweep_dir: Path, sweep: str) -> list[str]:
    train_py = os.path.relpath(REPO / "train.py")  # relative to where the sweep is started
    launcher = ([args.python, train_py] if args.nproc == 1 else
                ["torchrun", "--standalone", f"--nproc_per_node={args.nproc}", train_py])
    ovr = [f"experiment={args.experiment}"] if args.experiment else []
    ovr += point["overrides"] + [f"{KEY_SEED}={point['seed']}"] + list(args.overrides)
    ovr += [f"run_name={sweep}-{point['dir']}", f"out_dir={sweep_dir / point['dir']}",
            f"{KEY_GROUP}={sweep}", f"{KEY_RESUME}=auto"]
    return launcher + ovr


def sbatch_script(jobs: list[tuple[dict, list[str]]], args, sweep_dir: Path, sweep: str) -> str:
    """An array job, one task per unfinished point, with the pre-emption handling of scripts/slurm_train.sh:
    SIGUSR1 120 s before the time limit (train.py checkpoints and exits 0), then the task requeues itself
    and train.resume=auto continues; a task whose point finished meanwhile exits at once."""
    lines = ["#!/bin/bash", f"#SBATCH --job-name={sweep}",
             f"#SBATCH --array=0-{len(jobs) - 1}" + (f"%{args.max_parallel}" if args.max_parallel else ""),
             "#SBATCH --nodes=1", "#SBATCH --ntasks=1", f"#SBATCH --gpus-per-node={args.nproc}",
             f"#SBATCH --cpus-per-task={args.cpus_per_task}", f"#SBATCH --time={args.time}",
             f"#SBATCH --output={sweep_dir}/slurm-%A_%a.out", "#SBATCH --requeue", "#SBATCH --signal=USR1@120"]
    if args.partition:
        lines.append(f"#SBATCH --partition={args.partition}")
    lines += [f"#SBATCH {x}" for x in args.sbatch_extra]
    lines += [
        "# generated by scripts/sweep.py; one array task per unfinished grid point",
        "set -euo pipefail",
        f"cd {shlex.quote(os.getcwd())}",
        'finished() { grep -Eqs \'"kind": ?"summary"\' "$1"; }',
        "run_point() {  # metrics.jsonl of the point, then its command",
        "  local metrics=$1; shift",
        '  if finished "$metrics"; then echo "point finished already"; return 0; fi',
        # srun signals every process of the step; torchrun would die of SIGUSR1, so it ignores it (its
        # Python workers install their own handler, which replaces the inherited 'ignore')
        "  set +e",
        "  srun --kill-on-bad-exit=1 bash -c \"trap '' USR1; exec $(printf '%q ' \"$@\")\"; local rc=$?",
        "  set -e",
        '  if [ $rc -eq 0 ] && ! finished "$metrics"; then',
        '    echo "point not finished (pre-empted): requeueing ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
        '    scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
        "  fi",
        "  return $rc",
        "}",
        'case "$SLURM_ARRAY_TASK_ID" in',
    ]
    for i, (p, cmd) in enumerate(jobs):
        lines.append(
            f"  {i}) run_point {shlex.quote(str(sweep_dir / p['dir'] / 'metrics.jsonl'))} {shlex.join(cmd)} ;;"
        )
    lines += ["  *) echo \"no grid point $SLURM_ARRAY_TASK_ID\" >&2; exit 1 ;;", "esac"]
    return "\n".join(lines) + "\n"


def run_local(jobs: list[tuple[dict, list[str]]], n_jobs: int, sweep_dir: Path, stop_on_error: bool,
              gpus: GpuSlots | None = None) -> list[str]:
    """Run the points, `n_jobs` at a time, each on its own GPUs where there are GPUs; returns the failed
    points' dirs. With several jobs each point's output goes to <run dir>/sweep.log instead of the console.
    A SIGINT/SIGTERM is forwarded to the running points (they checkpoint) and nothing more starts."""
    gpus = gpus or GpuSlots([], 1, n_jobs)
    failed: list[str] = []
    queue, running = list(enumerate(jobs)), []
    while queue or running:
        while queue and len(running) < n_jobs and not (failed and stop_on_error) and not children.stopped():
            i, (p, cmd) = queue.pop(0)
            slot, env = gpus.acquire()
            where = f" on CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}" if env else ""
            print(f"\n=== [{i + 1}/{len(jobs)}] {p['dir']}{where} ===\n{shlex.join(cmd)}", flush=True)
            log = None
            if n_jobs > 1:
                (sweep_dir / p["dir"]).mkdir(parents=True, exist_ok=True)
                log = open(sweep_dir / p["dir"] / "sweep.log", "a")
            try:
                proc = children.popen(cmd, stdout=log, stderr=subprocess.STDOUT if log else None, env=env)
            except children.Stopped:
                gpus.release(slot)
                break
            running.append((i, p, proc, log, slot))
        if not running:
            break  # stop_on_error (or a signal) with nothing left running
        time.sleep(0.2)
        for item in [r for r in running if r[2].poll() is not None]:
            i, p, proc, log, slot = item
            running.remove(item)
            children.wait(proc)
            gpus.release(slot)
            if log:
                log.close()
            rc = proc.returncode
            why = ""
            if rc != 0 and log:  # its output went to its log: say why, and where the rest is
                path = sweep_dir / p["dir"] / "sweep.log"
                why = f": {_last_error(path)} (log {path})"
            if rc == 0:  # a point stopped by a signal checkpoints and exits 0 too: only a summary says done
                done = runlib.is_finished(sweep_dir / p["dir"])
                status = "done" if done else "stopped before its end (checkpointed; rerun the same command to resume)"
            else:
                status = f"failed (exit {rc}){why}"
            print(f"# [{i + 1}/{len(jobs)}] {p['dir']}: {status}", flush=True)
            if rc != 0 and not children.stopped():
                failed.append(p["dir"])
    if children.stopped():
        raise children.Stopped(children.stopped())
    return failed


def write_manifest(sweep_dir: Path, sweep: str, args, points: list[dict]) -> None:
    path = sweep_dir / "sweep.json"
    old = read_json(path) if path.is_file() else {}
    by_dir = {p["dir"]: p for p in old.get("points", [])}
    by_dir.update({p["dir"]: p for p in points})  # a re-run with more seeds adds points
    data = {"name": sweep, "experiment": args.experiment, "fixed_overrides": list(args.overrides),
            "points": list(by_dir.values())}
    sweep_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(data, indent=1) + "\n")


def check_fixed_overrides(sweep_dir: Path, args) -> None:
    """The runs of a sweep dir share its experiment and fixed overrides: a run made with others (a quick
    check's train.max_steps=8) would otherwise count as a finished point of this sweep."""
    path = sweep_dir / "sweep.json"
    old = read_json(path) if path.is_file() else {}
    before, made_with = old.get("fixed_overrides", []), old.get("experiment")
    made = [p["dir"] for p in old.get("points", []) if (sweep_dir / p["dir"]).is_dir()]
    if made and (sorted(before) != sorted(args.overrides) or made_with != args.experiment):
        raise SystemExit(f"{sweep_dir} holds runs made with experiment={made_with} and the fixed overrides "
                         f"[{' '.join(before)}], not experiment={args.experiment} and [{' '.join(args.overrides)}]: "
                         "pass those to continue them, or another --runs-root")


def sweep_name(args, meta: dict) -> str:
    """--name, else the experiment's name; the experiment's required keys must be given."""
    sweep = args.name or (args.experiment if args.experiment else None)
    if not sweep:
        raise SystemExit("--name is required without --experiment")
    given = {o.split("=", 1)[0].lstrip("+~") for o in list(args.overrides) + list(args.grid)}
    for key, why in (meta.get("requires") or {}).items():
        if key not in given:
            raise SystemExit(f"experiment {args.experiment} needs {key}: {why}")
    return slug(sweep)


def select_points(args, meta: dict) -> list[dict]:
    """The grid (with --tune-lr's axis), narrowed by --only."""
    if args.tune_lr:
        if not meta.get("lr_grid"):
            raise SystemExit(f"--tune-lr: experiment {args.experiment!r} has no experiment_meta.lr_grid; "
                             "give the values with --grid optim.lr=v1,v2,...")
        args.grid = list(args.grid) + ["optim.lr=" + ",".join(fmt_value(v) for v in meta["lr_grid"])]
    points = build_points(meta, args.grid, args.seeds, args.variants, args.points)
    cells = getattr(args, "cells", None) or {}   # a study's sweep: the cell of each label, kept in the manifest
    for p in points:
        if p["base"] in cells:
            p["cell"] = cells[p["base"]]
    if args.only:
        keep = set(split_values(args.only))
        points = [p for p in points if p["label"] in keep]
        if not points:
            raise SystemExit(f"--only {args.only!r} matches no point label")
    return points


def plan_jobs(points: list[dict], args, sweep_dir: Path, sweep: str) -> list[tuple[dict, list[str]]]:
    """(point, command) of every unfinished point; prints each point's status and the totals."""
    jobs, counts = [], {"done": 0, "resume": 0, "restart": 0, "new": 0}
    for p in points:
        status = point_status(sweep_dir / p["dir"])
        counts[status] += 1
        cmd = command(p, args, sweep_dir, sweep)
        if status == "done":
            print(f"# skip (finished): {p['dir']}")
        else:
            jobs.append((p, cmd))
            if not args.slurm:
                print(f"# {status}: {p['dir']}")
                print(shlex.join(cmd))
    print(f"# sweep {sweep}: {len(points)} points, {counts['done']} finished, "
          f"{counts['resume']} to resume, {counts['restart']} to restart, {counts['new']} new", flush=True)
    check_points(jobs, check_data=not (args.slurm or args.dry_run))  # a --slurm array runs where its data is
    return jobs


COST_MFU = 0.4  # the MFU the printed cost assumes (scripts/paper.py --mfu chooses it per table)


def check_points(jobs: list[tuple[dict, list[str]]], check_data: bool = True) -> None:
    """Compose and validate each unfinished point's config as train.py will, before anything runs (also
    with --dry-run): a point that can never run is one line naming it, and nothing is started."""
    if not jobs:
        return
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    from common import UserError
    from trainer.config import parse_run_config
    from trainer.config_store import composition_error, register_code_configs

    from experiments.cost import gpu_hours, gpu_name, run_cost

    register_code_configs()
    bad, costs, data_seen = [], [], {}
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        for p, cmd in jobs:
            overrides = cmd[next(i for i, c in enumerate(cmd) if c.endswith("train.py")) + 1:]
            try:
                cfg = compose("config", overrides=overrides)
                rc = parse_run_config(cfg)
                costs.append(run_cost(p["dir"], cfg, rc))  # the model on the meta device
                key = json.dumps(rc.data.content(), sort_keys=True, default=str)
                if key not in data_seen:  # what points share (their data) is checked once, for a launch here
                    data_seen[key] = _data_problem(rc.data) if check_data else None
                if data_seen[key]:
                    bad.append((p["dir"], data_seen[key]))
            except UserError as e:
                bad.append((p["dir"], " ".join(str(e).split())))
            except HydraException as e:
                bad.append((p["dir"], composition_error(e, overrides)))
    shared = {msg for _, msg in bad}
    if len(bad) > 1 and len(shared) == 1:  # every bad point for the same reason: one line, not one per point
        print(f"error: all {len(bad)} point(s) to run share this problem, nothing started: {bad[0][1]}",
              file=sys.stderr)
        raise SystemExit(2)
    if costs and not bad:  # the cost before anything starts (experiments/cost.py)
        gpu = gpu_name(None)
        hours = sum(gpu_hours(c["flops"], gpu, c["precision"], COST_MFU) for c in costs)
        print(f"# cost of the {len(costs)} point(s) to run: {sum(c['flops'] for c in costs) / 1e15:,.1f} PFLOP, "
              f"{hours:,.2f} GPU-hours at {COST_MFU:.0%} MFU of {gpu}, checkpoints "
              f"{sum(c['ckpt_disk'] for c in costs) / 1e9:,.1f} GB", flush=True)
    for d, msg in bad:
        print(f"# bad point {d}: {msg}")
    if bad:
        print(f"error: {len(bad)} of {len(jobs)} point(s) cannot run, nothing started: {bad[0][0]}: {bad[0][1]}"
              + (" (the others are listed above)" if len(bad) > 1 else ""), file=sys.stderr)
        raise SystemExit(2)


def _data_problem(data_cfg) -> str | None:
    """What stops a point's data before it is prepared, found without the network: local files that match
    nothing. None when nothing is wrong (or the data is prepared already)."""
    from data.sources import resolve_files

    if data_cfg.source != "local" or (data_cfg.out_dir / "meta.json").is_file():
        return None
    try:
        for key in ("files", "val_files"):
            if getattr(data_cfg, key):
                resolve_files(key, getattr(data_cfg, key))
    except UserError as e:
        return " ".join(str(e).split())
    return None


def _last_error(log: Path) -> str:
    """The line of a failed point's log that says why: its last `error:` line, else its last line."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    errors = [ln for ln in lines if ln.startswith("error:")]
    return (errors or lines or [""])[-1][:300]


def write_slurm(jobs: list[tuple[dict, list[str]]], args, sweep_dir: Path, sweep: str, points: list[dict]) -> int:
    """--slurm: the sbatch script (printed with --dry-run, else written, and submitted with --submit)."""
    if not jobs:
        return 0
    script = sbatch_script(jobs, args, sweep_dir, sweep)
    if args.dry_run:
        print(script, end="")
        return 0
    write_manifest(sweep_dir, sweep, args, points)
    path = sweep_dir / "sweep.sbatch"
    path.write_text(script)
    if args.submit:
        if shutil.which("sbatch") is None:
            raise SystemExit(f"--submit: no sbatch on PATH (not a SLURM login node?); the script is written at "
                             f"{path}: submit it where SLURM runs with: sbatch {path}")
        return subprocess.run(["sbatch", str(path)], check=False).returncode
    print(f"# wrote {path}; submit with: sbatch {path}")
    return 0


def run(args) -> int:
    """The sweep of parsed `args` (parser()): plan every point, then print the plan (--dry-run), write the Slurm
    array (--slurm) or run the points here; 1 when some point failed."""
    check_args(args)
    meta = load_meta(args.experiment) if args.experiment else {}
    sweep = sweep_name(args, meta)
    points = select_points(args, meta)
    sweep_dir = Path(args.runs_root) / sweep
    check_fixed_overrides(sweep_dir, args)
    jobs = plan_jobs(points, args, sweep_dir, sweep)
    if args.slurm:
        return write_slurm(jobs, args, sweep_dir, sweep, points)
    if args.dry_run:
        return 0
    slots = GpuSlots(children.visible_gpus(args.gpus), args.nproc, args.jobs, args.oversubscribe)
    writable_dir(sweep_dir, "--runs-root")   # before any run starts (one line, not a traceback per point)
    write_manifest(sweep_dir, sweep, args, points)
    with children.forwarding():
        failed = run_local(jobs, args.jobs, sweep_dir, args.stop_on_error, slots)
    if failed:
        print(f"# {len(failed)} point(s) failed: {', '.join(failed)}; rerun the same command to resume them")
        return 1
    return 0


def parser(description: str | None = None) -> argparse.ArgumentParser:
    """The sweep's options (scripts/sweep.py's command line; a study builds its sweeps' args with it too)."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experiment", help="configs/experiment/<name>.yaml: its overrides and experiment_meta grid")
    ap.add_argument("--name", help="sweep name (run dir and wandb group; default: the experiment name)")
    ap.add_argument("--grid", nargs="+", default=[], metavar="KEY=V1,V2",
                    help="grid axes; norm=... and train.seed=... replace the experiment's variants/seeds")
    ap.add_argument("--tune-lr", action="store_true",
                    help="add an optim.lr axis with the experiment's recommended experiment_meta.lr_grid")
    ap.add_argument("--seeds", help="comma list, replaces experiment_meta.seeds")
    ap.add_argument(
        "--variants",
        help="comma list: of the experiment's point labels where it has points (each keeps its "
        "overrides), else of norm names (replacing its variants)",
    )
    ap.add_argument("--points", help="YAML file label -> {key: value}: replaces the experiment's points")
    ap.add_argument("--only", help="comma list of point labels to keep (e.g. rerun one variant)")
    ap.add_argument("--jobs", type=int, default=1, help="local points run at once (default 1: in turn)")
    ap.add_argument("--nproc", type=int, default=1, help="processes (GPUs) per point: torchrun when > 1")
    ap.add_argument("--gpus", help="GPU ids to pack the points onto, --nproc per point (default: "
                    "CUDA_VISIBLE_DEVICES, else every GPU); --jobs may not exceed the GPUs unless --oversubscribe")
    ap.add_argument("--oversubscribe", action="store_true", help="let --jobs exceed the GPUs (runs share them)")
    ap.add_argument("--runs-root", default="runs", help="sweeps live in <runs-root>/<sweep>/")
    ap.add_argument("--python", default=sys.executable, help="python for single-process points")
    ap.add_argument("--dry-run", action="store_true", help="print the commands (or sbatch script), run nothing")
    ap.add_argument("--stop-on-error", action="store_true", help="stop at the first failed point (local)")
    ap.add_argument("--slurm", action="store_true", help="write <sweep dir>/sweep.sbatch (an array job)")
    ap.add_argument("--submit", action="store_true", help="with --slurm: sbatch it")
    ap.add_argument("--partition")
    ap.add_argument("--time", default="48:00:00")
    ap.add_argument("--cpus-per-task", type=int, default=16)
    ap.add_argument("--max-parallel", type=int, default=0, help="array throttle (%%N); 0 = no limit")
    ap.add_argument("--sbatch-extra", action="append", default=[], help="extra '#SBATCH' line, e.g. --account=x")
    ap.add_argument("overrides", nargs="*", help="fixed Hydra overrides for every point (put them after --)")
    return ap


def check_args(args) -> None:
    if args.nproc < 1:
        raise SystemExit(f"--nproc={args.nproc}: must be >= 1")
    if args.jobs < 1:
        raise SystemExit(f"--jobs={args.jobs}: must be >= 1")
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        raise SystemExit(f"override {bad[0]!r}: expected key=value")
