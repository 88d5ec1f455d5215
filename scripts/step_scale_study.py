"""The step-scale study: is the gap between Pre-LN and the sphere family the rule, or how large a step
each variant takes relative to its stream at init? (docs/step_scale_study.md)

    python scripts/step_scale_study.py all            # every part in order, then the report
    python scripts/step_scale_study.py run grid       # one part: grid | edge | chaos | trend
    python scripts/step_scale_study.py report         # tables and figures from whatever has finished
    python scripts/step_scale_study.py all -- train.max_steps=8   # any Hydra override, every run (quick check)
    python scripts/step_scale_study.py all --base-experiment <name> --cells pre_ln,proj_spheret-a32 --jobs 8
                                                      # the same study on another setting (GPU users: a gpt_* preset)

Setting: configs/experiment/fidelity.yaml (tiny 4 x 128, byte tokenizer, offline pydocs, 400 steps x
2,048 tokens = 819,200 tokens per run, cosine to 0 after 40 warmup steps, AdamW), stats every 25 steps.
  grid        each cell (CELLS) at three lrs of LADDER around its start (CENTER), seeds 0, 1, 2;
  edge        where a cell's best lr (by the mean over its seeds) is the largest or smallest tried: one
              more lr beyond it, 3 seeds; repeated (at most EDGE_ROUNDS times) until the best is inside;
  chaos       the best point of Pre-LN, of 1-SpheretNorm as published and of the best cell of each sphere
              variant, seed 0 rerun with train.threads=2 (only the floating-point order of the CPU kernels
              changes);
  trend       Pre-LN and the best sphere cell at widths 64 / 256 (depth 4) and depths 8 / 16 (width 128),
              each at three lrs around its best in (a), 3 seeds, bracketed as edge does; one shape
              after the other (cheapest first), so a study stopped part-way has whole shapes;
              `--shapes w64,d8` runs only those.
Two runs at a time with one thread each (`--jobs`), resumable: finished runs are skipped, and each
part's wall time is added up in <runs-root>/step_scale_times.json.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

import runlib
from data.files import atomic_write
from common.provenance import code_commit

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"
TIMES = "step_scale_times.json"
COMMITS = "step_scale_commits.json"   # part -> the code commits its runs were made with
LADDER = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1]   # half-decade lr steps
SEEDS = "0,1,2"
EDGE_ROUNDS = 2
BASE_FIXED = ["logging.stats_interval=25"]

# (a): cell -> (overrides, centre of its lr grid). "small"/"large" = the relative step of the sublayers at init.
CELLS = {
    "pre_ln": ({"norm": "pre_ln"}, 3e-3),                                            # large (stream = the embedding)
    "pre_ln-rms1": ({"norm": "pre_ln", "norm.embed_norm": "scalenorm"}, 3e-3),        # small (stream at RMS 1)
    "proj_spheret": ({"norm": "proj_spheret"}, 3e-3),                                # small (alpha 1)
    "proj_spheret-a8": ({"norm": "proj_spheret", "norm.alpha_init": 8.0}, 3e-3),
    "proj_spheret-a32": ({"norm": "proj_spheret", "norm.alpha_init": 32.0}, 3e-3),
    # GeoNorm's raw-input cells name sublayer_input explicitly, so they keep their meaning whatever the default
    "geonorm": ({"norm": "geonorm", "norm.sublayer_input": "raw"}, 1e-2),            # as in the fidelity study
    "geonorm-r1": ({"norm": "geonorm", "norm.sublayer_input": "raw", "norm.embed_norm": "scalenorm"}, 3e-3),
    "geonorm-r1-a8": ({"norm": "geonorm", "norm.sublayer_input": "raw", "norm.embed_norm": "scalenorm",
                       "norm.a_init": 8.0}, 3e-3),                                    # radius sqrt(d), a 8
    "geonorm-r1-a32": ({"norm": "geonorm", "norm.sublayer_input": "raw", "norm.embed_norm": "scalenorm",
                        "norm.a_init": 32.0}, 3e-3),
    "geonorm-normin": ({"norm": "geonorm", "norm.sublayer_input": "norm"}, 3e-3),    # Norm(h) into F
}
SPHERE_CELLS = [c for c in CELLS if not c.startswith("pre_ln")]
def base_model(experiment: str) -> dict:
    """The base experiment's composed `model` group (its shape) and its tokenizer's vocabulary size."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from data import get_tokenizer
    from trainer.config_store import register_code_configs

    register_code_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        cfg = compose("config", overrides=[f"experiment={experiment}"])
    return {**OmegaConf.to_container(cfg.model, resolve=True), "tokenizer_vocab": get_tokenizer(cfg.data.tokenizer).vocab_size}


def shapes(m: dict) -> dict:
    """(c): shape label -> model overrides, relative to the base model `m` (base_model): width x1/2 and
    x2 (depth kept; heads keep the head size), depth x2 and x4 (width kept), cheapest first. On the
    fidelity setting (4 x 128): w64, d8, w256, d16."""
    d, n, hd = m["n_embd"], m["n_layer"], m["n_embd"] // m["n_head"]
    return {f"w{d // 2}": {"model.n_embd": d // 2, "model.n_head": max(1, d // 2 // hd)},
            f"d{2 * n}": {"model.n_layer": 2 * n},
            f"w{2 * d}": {"model.n_embd": 2 * d, "model.n_head": 2 * d // hd},
            f"d{4 * n}": {"model.n_layer": 4 * n}}
PARTS = ["grid", "edge", "chaos", "trend"]


def lr_label(lr: float) -> str:
    return f"{lr:g}"


def point(cell: str, lr: float, cells: dict) -> tuple[str, dict]:
    ovr, _ = cells[cell]
    return f"{cell}-lr-{lr_label(lr)}", {**ovr, "optim.lr": lr}


def cell_of(label: str) -> str:
    return label.rsplit("-lr-", 1)[0]


def around(lr: float) -> list[float]:
    i = min(range(len(LADDER)), key=lambda k: abs(LADDER[k] / lr - 1))
    return LADDER[max(i - 1, 0):i + 2]


def record_commit(root: Path, part: str) -> None:
    path = root / COMMITS
    done = json.loads(path.read_text()) if path.is_file() else {}
    c = code_commit(REPO) or "unknown"   # this checkout's, whichever copy of the package is installed
    if c not in done.setdefault(part, []):
        done[part].append(c)
    root.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(done, indent=1) + "\n")


def sweep(args, name: str, points: dict, seeds: str, *extra_overrides: str, jobs: int | None = None) -> None:
    if not points:
        return
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(points, f, sort_keys=False)
    cmd = [sys.executable, str(SCRIPTS / "sweep.py"), "--name", name, "--runs-root", str(args.runs_root),
           "--experiment", args.base_experiment, "--points", f.name, "--jobs", str(jobs or args.jobs), "--seeds", seeds,
           "--", "train.threads=1", *BASE_FIXED, *extra_overrides, *args.overrides]
    print("$", " ".join(cmd), flush=True)
    try:
        rc = subprocess.run(cmd, check=False).returncode
    finally:
        Path(f.name).unlink()
    if rc != 0:
        raise SystemExit(f"sweep {name} had failed points (exit {rc}); rerun to resume them")


def finished(args, name: str) -> list[runlib.Run]:
    return [r for r in runlib.load_sweep(args.runs_root / name) if r.finished]


def by_cell(runs: list[runlib.Run]) -> dict[str, list[runlib.Run]]:
    out: dict[str, list] = {}
    for r in runs:
        out.setdefault(cell_of(r.base), []).append(r)
    return out


def best_lrs(runs: list[runlib.Run]) -> dict[str, dict]:
    """cell -> runlib.best_over over optim.lr (the mean over the seeds every lr was run with)."""
    return runlib.best_over(by_cell(runs), "optim.lr")


def edge_points(runs: list[runlib.Run], cells: dict) -> dict:
    """One more lr beyond each cell's best where that best is the largest or smallest lr tried."""
    out = {}
    for cell, b in best_lrs(runs).items():
        tried = sorted(float(v) for v in b["by_value"])
        best = float(b["value"])
        if best not in (tried[0], tried[-1]) or cell not in cells:
            continue
        i = LADDER.index(min(LADDER, key=lambda v: abs(v / best - 1)))
        j = i + 1 if best == tried[-1] else i - 1
        if 0 <= j < len(LADDER):
            lbl, ovr = point(cell, LADDER[j], cells)
            out[lbl] = ovr
    return out


def _mean_at_best(b: dict) -> float:
    return b["by_value"][b["value"]]


def chaos_cells(best: dict) -> list[str]:
    """Pre-LN, 1-SpheretNorm as published (alpha 1: its spread is the question) and the best cell of
    each sphere variant (lowest mean at its best lr)."""
    out = [c for c in ("pre_ln", "proj_spheret") if c in best]
    for family in ("proj_spheret", "geonorm"):
        members = [c for c in SPHERE_CELLS if c.startswith(family) and c in best]
        if members:
            top = min(members, key=lambda c: _mean_at_best(best[c]))
            if top not in out:
                out.append(top)
    return out


def trend_cells(args, shapes: list[str]) -> dict:
    """Pre-LN and the best sphere cell of (a) (lowest mean at its best lr), at each of `shapes`."""
    best = {c: (float(b["value"]), _mean_at_best(b)) for c, b in best_lrs(finished(args, "step_scale_a")).items()}
    recorded = REPO / "docs" / "step_scale" / "a_best.json"   # the report's record, for a checkout without the runs
    if not best and recorded.is_file():
        best = {c: (v["lr"], v["mean"]) for c, v in json.loads(recorded.read_text()).items()}
    sphere = [c for c in SPHERE_CELLS if c in best]
    if "pre_ln" not in best or not sphere:
        raise SystemExit("trend needs part grid/edge finished for pre_ln and at least one sphere cell")
    top = min(sphere, key=lambda c: best[c][1])
    cells = {}
    for shape in shapes:
        for c in ("pre_ln", top):
            cells[f"{shape}-{c}"] = ({**CELLS[c][0], **args.shape_grid[shape]}, best[c][0])
    return cells


def run_part(args, part: str) -> None:
    cells = {c: CELLS[c] for c in args.cells}
    if part == "grid":
        pts = dict(point(c, lr, cells) for c, (_, centre) in cells.items() for lr in around(centre))
        sweep(args, "step_scale_a", pts, SEEDS)
    elif part == "edge":
        for _ in range(EDGE_ROUNDS):
            pts = edge_points(finished(args, "step_scale_a"), cells)
            if not pts:
                break
            sweep(args, "step_scale_a", pts, SEEDS)
    elif part == "chaos":
        best = best_lrs(finished(args, "step_scale_a"))
        pts = {}
        for c in chaos_cells(best):
            if c in cells:
                lbl, ovr = point(c, float(best[c]["value"]), cells)
                pts[lbl] = ovr
        sweep(args, "step_scale_b", pts, "0", "train.threads=2", jobs=max(1, args.jobs // 2))  # 2 threads a run
    elif part == "trend":  # shape by shape, each bracketed before the next starts
        for shape in args.shapes:
            tc = trend_cells(args, [shape])
            sweep(args, "step_scale_c", dict(point(c, lr, tc) for c, (_, centre) in tc.items()
                                             for lr in around(centre)), SEEDS)
            for _ in range(EDGE_ROUNDS):
                pts = edge_points(finished(args, "step_scale_c"), tc)
                if not pts:
                    break
                sweep(args, "step_scale_c", pts, SEEDS)
    else:
        raise SystemExit(f"unknown part {part!r}: valid parts are {', '.join(PARTS)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["all", "run", "report"])
    ap.add_argument("part", nargs="?", help=f"with run: one of {', '.join(PARTS)}")
    ap.add_argument("--runs-root", type=Path, default=Path("runs"))
    ap.add_argument("--docs", type=Path, default=Path("docs"), help="where report writes docs/step_scale/*")
    ap.add_argument("--jobs", type=int, default=2, help="runs at once (one thread each)")
    ap.add_argument("--cells", help=f"comma list of cells (default all: {', '.join(CELLS)})")
    ap.add_argument("--shapes", help="trend: comma list of shapes (default all, cheapest first: on the fidelity "
                    "setting w64, d8, w256, d16; width x1/2 and x2, depth x2 and x4 of the base experiment's model)")
    ap.add_argument("--base-experiment", default="fidelity", help="the experiment file every run starts from")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # Hydra overrides for every run follow `--`
    args = ap.parse_args(argv[:cut])
    args.overrides = argv[cut + 1:]
    args.cells = args.cells.split(",") if args.cells else list(CELLS)
    unknown = [c for c in args.cells if c not in CELLS]
    if unknown:
        raise SystemExit(f"unknown --cells {', '.join(unknown)}: valid are {', '.join(CELLS)}")
    args.shape_grid = shapes(base_model(args.base_experiment))
    args.shapes = args.shapes.split(",") if args.shapes else list(args.shape_grid)
    unknown = [s for s in args.shapes if s not in args.shape_grid]
    if unknown:
        raise SystemExit(f"unknown --shapes {', '.join(unknown)}: valid are {', '.join(args.shape_grid)}")
    if args.action == "run" and args.part not in PARTS:
        raise SystemExit(f"run needs a part: one of {', '.join(PARTS)}")
    parts = PARTS if args.action == "all" else [args.part] if args.action == "run" else []
    for part in parts:
        t0 = time.time()
        record_commit(args.runs_root, part)
        try:
            run_part(args, part)
        finally:  # wall time per part, added up over resumed invocations (the report prints it)
            runlib.add_wall_time(args.runs_root / TIMES, part, time.time() - t0)
        print(f"### part {part}: {time.time() - t0:.0f} s wall", flush=True)
    if args.action in ("all", "report"):
        import step_scale_report
        step_scale_report.report(args.runs_root, args.docs, args.base_experiment)
    return 0


if __name__ == "__main__":
    sys.exit(main())
