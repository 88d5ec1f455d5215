"""The fidelity study: separates a variant's merit from its tuning (docs/fidelity_study.md).

    python scripts/fidelity_study.py all            # every part in order, then the report (~2.5 h on 2 cores)
    python scripts/fidelity_study.py run a          # one part: a | b | c | d | e | ablate
    python scripts/fidelity_study.py report         # figures and tables from whatever has finished
    python scripts/fidelity_study.py all -- train.max_steps=20   # any Hydra override, every run (quick check)

Parts (each a sweep under <runs-root>/fidelity_<part>, resumable: rerun to skip finished points):
  a  every variant at lr 3e-4, 1e-3, 3e-3 (seed 0); where the best is at an edge of that grid, one more
     lr beyond it (1e-4 or 1e-2); then seeds 1 and 2 at each variant's best lr;
  b  variants with step-size scalars: optim.groups.scalars.lr_mult 10, 30, 100 at their best lr (1 is in a);
  c  horizon: six variants at their best setting of (a)/(b), 8x the tokens, seeds 0 and 1;
  d  choice ablations of GeoNorm and 1-SpheretNorm at their best setting, seeds 0 and 1;
  e  known depth results at 24 layers (configs/experiment/fidelity_depth.yaml);
  ablate  scripts/layer_ablation.py on the best-lr models of (a) and the Pre-/Peri-LN models of (e).
Two runs at a time with one thread each (`--jobs`, `train.threads=1`). Choices later parts depend on
(best lr, best multiplier) are read from the finished runs of earlier parts, so a part runs only
after the parts before it.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

import runlib

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"
LR_GRID = ["3e-4", "1e-3", "3e-3"]
LR_EDGES = {"3e-4": "1e-4", "3e-3": "1e-2"}  # one more lr beyond a best value at the grid's edge
MULTS = ["10", "30", "100"]
HORIZON = ["pre_ln", "post_ln", "peri_ln", "geonorm", "proj_spheret", "cay_spheret"]
HORIZON_STEPS = 3200          # 8 x part (a)'s 400 steps
SEEDS_A, SEEDS_C, SEEDS_D = "0", "0,1", "0,1"
PARTS = ["a", "b", "c", "d", "e", "ablate"]
KEY_LR, KEY_MULT = "optim.lr", "optim.groups.scalars.lr_mult"


def experiment_points(name: str, keep: list[str] | None = None) -> dict:
    with open(REPO / "configs" / "experiment" / f"{name}.yaml") as f:
        points = yaml.safe_load(f)["experiment_meta"]["points"]
    return {k: v for k, v in points.items() if not keep or k in keep}


def sweep(args, name: str, *extra: str) -> None:
    cmd = [sys.executable, str(SCRIPTS / "sweep.py"), "--name", name, "--runs-root", args.runs_root,
           "--jobs", str(args.jobs), *extra, "--", "train.threads=1", *args.overrides]
    print("$", " ".join(cmd), flush=True)
    t0 = time.time()
    rc = subprocess.run(cmd, check=False).returncode
    print(f"### sweep {name}: {time.time() - t0:.0f} s wall", flush=True)
    if rc != 0:
        raise SystemExit(f"sweep {name} had failed points (exit {rc}); rerun to resume them")


def load(args, part: str) -> list[runlib.Run]:
    return runlib.load_sweep(Path(args.runs_root) / f"fidelity_{part}")


def best_lr(args) -> dict[str, dict]:
    """Point label -> best_over result for optim.lr over part (a)."""
    runs = load(args, "a")
    groups: dict[str, list] = {}
    for r in runs:
        groups.setdefault(r.base, []).append(r)
    return runlib.best_over(groups, KEY_LR)


def best_setting(args) -> dict[str, dict]:
    """Label -> {lr, lr_mult, loss}: the best lr of (a) and, where (b) ran, the best multiplier
    at that lr (seed 0 of (a) at multiplier 1 against the seed-0 runs of (b))."""
    lrs = best_lr(args)
    out = {lbl: {"lr": b["value"], "lr_mult": 1.0} for lbl, b in lrs.items()}
    groups: dict[str, list] = {}
    for r in load(args, "b"):
        groups.setdefault(r.base, []).append(r)
    for lbl, runs in groups.items():
        seed0 = [r for r in lrs[lbl]["runs"] if str(r.seed) == "0"]
        choice = runlib.best_over({lbl: runs + seed0}, KEY_MULT)[lbl]
        out[lbl]["lr_mult"] = float(choice["value"] if choice["value"] is not None else 1.0)
    return out


def has_scalars(overrides: dict) -> bool:
    from model import GPT, GPTConfig
    norm = {k.split(".", 1)[1]: v for k, v in overrides.items() if k.startswith("norm.")}
    cfg = GPTConfig.from_hydra({"vocab_size": 64, "block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 8},
                               {"name": overrides["norm"], **norm})
    return bool(GPT(cfg).parameter_groups()["scalars"])


def write_points(points: dict) -> str:
    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    yaml.safe_dump(points, f, sort_keys=False)
    f.close()
    return f.name


def fmt(v: float) -> str:
    return f"{v:g}"


def run_part(args, part: str) -> None:
    points = experiment_points("fidelity", args.labels)
    if part == "a":
        grid = ["--grid", f"{KEY_LR}={','.join(['1e-4', *LR_GRID, '1e-2'])}"]
        only = ["--only", ",".join(f"{lbl}-lr-{lr}" for lbl in points for lr in LR_GRID)]
        sweep(args, "fidelity_a", "--experiment", "fidelity", *grid, "--seeds", SEEDS_A, *only)
        # A best lr at the grid's edge may not be the optimum: try one step beyond it (once).
        edge = [f"{lbl}-lr-{LR_EDGES[lbl_lr]}" for lbl, b in best_lr(args).items() if lbl in points
                for lbl_lr in [b["runs"][0].axes.get(KEY_LR)] if lbl_lr in LR_EDGES]
        if edge:
            sweep(args, "fidelity_a", "--experiment", "fidelity", *grid, "--seeds", SEEDS_A, "--only", ",".join(edge))
        best = best_lr(args)
        labels = [r.label for lbl, b in best.items() if lbl in points for r in b["runs"]]
        sweep(args, "fidelity_a", "--experiment", "fidelity", *grid, "--seeds", "1,2", "--only", ",".join(labels))
    elif part == "b":
        best = best_lr(args)
        pts = {lbl: {**ovr, KEY_LR: best[lbl]["value"]} for lbl, ovr in points.items()
               if lbl in best and has_scalars(ovr)}
        sweep(args, "fidelity_b", "--experiment", "fidelity", "--points", write_points(pts),
              "--grid", f"{KEY_MULT}={','.join(MULTS)}", "--seeds", "0")
    elif part == "c":
        best = best_setting(args)
        pts = {lbl: {**points[lbl], KEY_LR: best[lbl]["lr"], KEY_MULT: best[lbl]["lr_mult"],
                     "train.max_steps": HORIZON_STEPS, "train.eval_interval": 100,
                     "train.ckpt_interval": 400} for lbl in HORIZON if lbl in points}  # resumable mid-run
        sweep(args, "fidelity_c", "--experiment", "fidelity", "--points", write_points(pts), "--seeds", SEEDS_C)
    elif part == "d":
        best = best_setting(args)

        def at_best(lbl, **change):
            return {**points[lbl], KEY_LR: best[lbl]["lr"], KEY_MULT: best[lbl]["lr_mult"], **change}
        pts = {
            "geonorm": at_best("geonorm"),
            "geonorm-embed_scalenorm": at_best("geonorm", **{"norm.embed_norm": "scalenorm"}),
            "geonorm-untied": at_best("geonorm", **{"model.tie_embeddings": False}),
            "geonorm-decay_sublayer": at_best("geonorm", **{"norm.decay_index": "sublayer"}),
            "geonorm-a_init_0.5": at_best("geonorm", **{"norm.a_init": 0.5}),
            "proj_spheret": at_best("proj_spheret"),
            "proj_spheret-untied": at_best("proj_spheret", **{"model.tie_embeddings": False}),
            "proj_spheret-decay_sublayer": at_best("proj_spheret", **{"norm.decay_index": "sublayer"}),
            "proj_spheret-fixed_radius": at_best("proj_spheret", **{"norm.learn_radius": False}),
            "proj_spheret-alpha_init_0.5": at_best("proj_spheret", **{"norm.alpha_init": 0.5}),
        }
        sweep(args, "fidelity_d", "--experiment", "fidelity", "--points", write_points(pts), "--seeds", SEEDS_D)
    elif part == "e":
        depth = experiment_points("fidelity_depth", args.labels)
        sweep(args, "fidelity_e", "--experiment", "fidelity_depth", "--only", ",".join(depth))
    elif part == "ablate":
        targets = [r for b in best_lr(args).values() for r in b["runs"] if str(r.seed) == "0"]
        targets += [r for r in load(args, "e") if r.base in ("pre_ln", "peri_ln")]
        for r in targets:
            out = r.path / "layer_ablation.json"
            if out.is_file():
                print(f"# skip (done): {out}")
                continue
            cmd = [sys.executable, str(SCRIPTS / "layer_ablation.py"), str(r.path), "--threads", "1"]
            print("$", " ".join(cmd), flush=True)
            if subprocess.run(cmd, check=False).returncode != 0:
                raise SystemExit(f"layer ablation of {r.path} failed")
    else:
        raise SystemExit(f"unknown part {part!r}: valid parts are {', '.join(PARTS)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["all", "run", "report"])
    ap.add_argument("part", nargs="?", help=f"with run: one of {', '.join(PARTS)}")
    ap.add_argument("--runs-root", default="runs")
    ap.add_argument("--docs", default="docs", help="where report writes docs/fidelity/*")
    ap.add_argument("--jobs", type=int, default=2, help="runs at once (one thread each)")
    ap.add_argument("--labels", help="comma list: only these points of the experiments (a quick partial study)")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # Hydra overrides for every run follow `--`
    args = ap.parse_args(argv[:cut])
    args.overrides = argv[cut + 1:]
    args.labels = args.labels.split(",") if args.labels else None
    if args.action == "run":
        if args.part not in PARTS:
            raise SystemExit(f"run needs a part: one of {', '.join(PARTS)}")
        t0 = time.time()
        try:
            run_part(args, args.part)
        finally:  # wall time per part, added up over resumed invocations (the report prints it)
            runlib.add_wall_time(Path(args.runs_root) / "fidelity_times.json", args.part, time.time() - t0)
        print(f"### part {args.part}: {time.time() - t0:.0f} s wall", flush=True)
        return 0
    if args.action == "all":
        base = [sys.executable, __file__, "--runs-root", args.runs_root, "--docs", args.docs, "--jobs", str(args.jobs)]
        base += ["--labels", ",".join(args.labels)] if args.labels else []
        for part in PARTS:  # one process per part: each reads the finished runs of the parts before it
            rc = subprocess.run(base + ["run", part, "--", *args.overrides], check=False).returncode
            if rc != 0:
                return rc
    import fidelity_report
    fidelity_report.report(Path(args.runs_root), Path(args.docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
