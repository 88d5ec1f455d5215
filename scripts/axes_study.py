"""The axes study: does the fidelity study's ranking depend on the block or on the optimizer?
(docs/axes_study.md)

    python scripts/axes_study.py all            # every part, then the report (~80 min on 2 cores)
    python scripts/axes_study.py run grid       # one part: grid | edge | seeds
    python scripts/axes_study.py report         # table and figure from whatever has finished
    python scripts/axes_study.py all -- train.max_steps=20   # any Hydra override, every run (quick check)

Setting: the fidelity study's (configs/experiment/fidelity.yaml: tiny 4 x 128, byte tokenizer,
offline pydocs, 400 steps x 2,048 tokens = 819,200 tokens per run, cosine schedule, warmup 40).
  grid   arch gpt2 | llama | speedrun x {pre_ln, peri_ln, geonorm, proj_spheret, ngpt} with AdamW at
         lr = best x 1/2, 1 and 2, where best is the variant's best setting in the fidelity study
         (FIDELITY_BEST; nGPT was not in it and takes Pre-LN's); and on llama, Muon for the matrices of
         pre_ln, geonorm and proj_spheret at Muon lr 0.025, 0.05 (modded-nanogpt's) and 0.1, every
         other group on AdamW exactly as in the AdamW runs (same lr, multipliers, schedule); seed 0;
  edge   where the best of the grid is its largest or smallest lr: one more lr beyond it (x2 or /2), seed 0;
  seeds  seed 1 at each row's best point of grid + edge.
Two runs at a time with one thread each; resumable (finished runs are skipped).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

import runlib

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"
SWEEP = "axes"
TIMES = "axes_times.json"   # wall time per part, summed over resumed invocations
ARCHS = ["llama", "speedrun", "gpt2"]   # run order: the modern blocks first
ARCHS_REPORT = ["gpt2", "llama", "speedrun"]   # table and figure order: the fidelity study's block first
VARIANTS = ["pre_ln", "peri_ln", "geonorm", "proj_spheret", "ngpt"]
MUON_VARIANTS = ["pre_ln", "geonorm", "proj_spheret"]
# Best setting per variant in the fidelity study (docs/fidelity_study.md, tables (a) and (b)).
FIDELITY_BEST = {"pre_ln": {"lr": 3e-3}, "peri_ln": {"lr": 3e-3}, "proj_spheret": {"lr": 1e-3},
                 "geonorm": {"lr": 1e-2, "optim.groups.scalars.lr_mult": 100.0,
                             "norm.sublayer_input": "raw"},   # as run (GeoNorm's default is now norm)
                 "ngpt": {"lr": 3e-3}}       # not in the fidelity study: Pre-LN's best
LR_FACTORS = [0.5, 1.0, 2.0]
MUON_LRS = [0.025, 0.05, 0.1]
PARTS = ["grid", "edge", "seeds"]


def row_key(arch: str, variant: str, optim: str) -> str:
    return f"{arch}-{variant}" + ("-muon" if optim == "muon" else "")


def row_of(label: str) -> str:
    """The row of a point label: llama-geonorm-muon-lr-0.1 -> llama-geonorm-muon."""
    return label.rsplit("-lr-", 1)[0]


def grid_points(rows_kept: list[str] | None = None) -> dict[str, dict]:
    """Label -> overrides for every grid point; a row is (arch, variant, optimizer), e.g. llama-geonorm-muon."""
    points = {}

    def add(arch, variant, optim, key, value):
        best = FIDELITY_BEST[variant]
        ovr = {"arch": arch, "norm": variant, "optim.lr": best["lr"],
               **{k: v for k, v in best.items() if k != "lr"}}
        if optim == "muon":
            # Only the matrices change optimizer: the AdamW groups keep the AdamW runs' multipliers.
            ovr.update({"optim": "muon", "optim.groups.vectors.lr_mult": 1.0,
                        "optim.groups.embeddings.lr_mult": 1.0,
                        "optim.groups.scalars.lr_mult": best.get("optim.groups.scalars.lr_mult", 1.0)})
        ovr[key] = value
        points[f"{row_key(arch, variant, optim)}-lr-{value:g}"] = ovr

    for arch in ARCHS:
        for variant in VARIANTS:
            for f in LR_FACTORS:
                add(arch, variant, "adamw", "optim.lr", FIDELITY_BEST[variant]["lr"] * f)
        if arch == "llama":
            for variant in MUON_VARIANTS:
                for lr in MUON_LRS:
                    add(arch, variant, "muon", "optim.muon.lr", lr)
    if rows_kept:
        points = {lbl: p for lbl, p in points.items() if row_of(lbl) in rows_kept}
    return points


def tuned_key(run: runlib.Run) -> str:
    return "optim.muon.lr" if runlib.get_key(run.config, "optim.name") == "muon" else "optim.lr"


def rows(runs: list[runlib.Run]) -> dict[str, list[runlib.Run]]:
    out: dict[str, list] = {}
    for r in runs:
        cfg = r.config
        key = row_key(runlib.get_key(cfg, "model.arch"), runlib.get_key(cfg, "norm.name"),
                      runlib.get_key(cfg, "optim.name"))
        out.setdefault(key, []).append(r)
    return out


def best_points(runs: list[runlib.Run]) -> dict[str, dict]:
    """Row -> best_over result over the row's tuned lr (seed-0 runs decide; see runlib.best_over)."""
    return {row: runlib.best_over({row: rs}, tuned_key(rs[0]))[row] for row, rs in rows(runs).items()}


def edge_points(runs: list[runlib.Run]) -> dict[str, dict]:
    """One more point beyond each row's best grid value (seed-0 runs), in the direction it is better."""
    grid = grid_points()
    out = {}
    for row, b in best_points([r for r in runs if str(r.seed) == "0"]).items():
        key = tuned_key(b["runs"][0])
        tried = sorted(v for v in b["by_value"])
        if len(tried) < 2 or b["value"] not in (tried[0], tried[-1]):
            continue  # a best value inside what was tried needs no further point
        value = b["value"] * 2 if b["value"] == tried[-1] else b["value"] / 2
        label = f"{row}-lr-{value:g}"
        base = grid[f"{row}-lr-{b['value']:g}"]
        out[label] = {**base, key: value}
    return out


def sweep(args, points: dict, *extra: str) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(points, f, sort_keys=False)
    cmd = [sys.executable, str(SCRIPTS / "sweep.py"), "--name", SWEEP, "--runs-root", str(args.runs_root),
           "--experiment", "fidelity", "--points", f.name, "--jobs", str(args.jobs), *extra,
           "--", "train.threads=1", *args.overrides]
    print("$", " ".join(cmd), flush=True)
    try:
        rc = subprocess.run(cmd, check=False).returncode
    finally:
        Path(f.name).unlink()
    if rc != 0:
        raise SystemExit(f"sweep {SWEEP} had failed points (exit {rc}); rerun to resume them")


def run_part(args, part: str) -> None:
    if part == "grid":
        sweep(args, grid_points(args.rows), "--seeds", "0")
        return
    runs = [r for r in runlib.load_sweep(args.runs_root / SWEEP) if r.finished]
    if args.rows:
        runs = [r for r in runs if row_of(r.base) in args.rows]
    grid = grid_points()
    edge = edge_points([r for r in runs if r.base in grid])  # from the grid's runs only: one step, once
    if part == "edge":
        if edge:
            sweep(args, edge, "--seeds", "0")
    elif part == "seeds":
        best = best_points(runs)
        labels = {r.base for b in best.values() for r in b["runs"]}
        points = {lbl: p for lbl, p in {**grid, **edge}.items() if lbl in labels}
        if points:
            sweep(args, points, "--seeds", "1")


# ---- report ----------------------------------------------------------------------------------------

def _tokens(runs) -> int:
    cfg = runs[0].config if runs else {}
    return int(runlib.get_key(cfg, "train.max_steps", 0)) * int(runlib.get_key(cfg, "train.batch_tokens", 0))


def report(root: Path, docs: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from data.files import atomic_write

    runs = [r for r in runlib.load_sweep(root / SWEEP) if r.finished]
    out = docs / "axes"
    out.mkdir(parents=True, exist_ok=True)
    best = best_points(runs)
    times = json.loads((root / TIMES).read_text()) if (root / TIMES).is_file() else {}
    lines = ["# Axes study: tables", "",
             "Generated by `python scripts/axes_study.py report` from the run dirs; see docs/axes_study.md.",
             f"Runs finished: {len(runs)}. Tokens per run: {_tokens(runs):,}. Wall time per part (2 runs at a time): "
             + ", ".join(f"{k} {v / 60:.0f} min" for k, v in times.items()) + ".", "",
             "Final validation loss (bytes, lower is better) at each row's best lr, mean ± std over the "
             "seeds run there; every lr tried (seed 0) in the last column; (edge): the best is the largest or "
             "smallest lr tried, so the optimum may lie beyond it.", "",
             "| arch | variant | optimizer | best lr | loss (seeds) | each lr, seed 0 |", "|---|---|---|---|---|---|"]
    order = [(a, v, "adamw") for a in ("gpt2", "llama", "speedrun") for v in VARIANTS]
    order += [("llama", v, "muon") for v in MUON_VARIANTS]
    table: dict[tuple, float] = {}
    for arch, variant, optim in order:
        row = row_key(arch, variant, optim)
        if row not in best:
            continue
        b = best[row]
        losses = runlib.ok_losses(b["runs"])
        seeds = ",".join(sorted(str(r.seed) for r in b["runs"]))
        each = ", ".join(f"{v:g}: {'failed' if s == float('inf') else f'{s:.3f}'}"
                         for v, s in sorted(b["by_value"].items()))
        edge = " (edge)" if b["value"] in (min(b["by_value"]), max(b["by_value"])) else ""
        lines.append(f"| {arch} | {variant} | {optim} | {b['value']:g}{edge} | {runlib.pm(losses) if losses else 'failed'} (s{seeds}) | {each} |")
        if losses:
            table[(arch, variant, optim)] = statistics.fmean(losses)
    lines += ["", "Rank of each variant within its block (AdamW, 1 = lowest loss):", "",
              "| variant | " + " | ".join(ARCHS_REPORT) + " |", "|---|" + "---|" * len(ARCHS_REPORT)]
    for variant in VARIANTS:
        cells = []
        for arch in ARCHS_REPORT:
            col = sorted((table[(arch, v, "adamw")], v) for v in VARIANTS if (arch, v, "adamw") in table)
            cells.append(str([v for _, v in col].index(variant) + 1) if (arch, variant, "adamw") in table else "—")
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    atomic_write(out / "tables.md", "\n".join(lines) + "\n")

    fig, ax = plt.subplots(figsize=(8, 4.5))
    cols = [(a, "adamw") for a in ARCHS_REPORT] + [("llama", "muon")]
    names = [f"{a}\n{o}" for a, o in cols]
    from plot_curves import VARIANT_COLORS  # the registry's colour of each variant, as in every figure
    for i, variant in enumerate(VARIANTS):
        xs, ys, es = [], [], []
        for j, (arch, optim) in enumerate(cols):
            row = row_key(arch, variant, optim)
            losses = runlib.ok_losses(best[row]["runs"]) if row in best else []
            if losses:
                xs.append(j + (i - 2) * 0.08)
                ys.append(statistics.fmean(losses))
                es.append(statistics.stdev(losses) if len(losses) > 1 else 0.0)
        ax.errorbar(xs, ys, yerr=es, fmt="o", color=VARIANT_COLORS[variant], label=variant, capsize=3)
    ax.set_xticks(range(len(cols)), names)
    ax.set_ylabel("final val loss at best lr (mean ± std, seeds)")
    ax.set_title(f"Axes study: 4 x 128, {_tokens(runs):,} tokens per run")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "axes.png", dpi=120)
    plt.close(fig)
    print(f"wrote {out / 'tables.md'} and {out / 'axes.png'}")



def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["all", "run", "report", "points"])
    ap.add_argument("part", nargs="?", help=f"with run: one of {', '.join(PARTS)}")
    ap.add_argument("--runs-root", type=Path, default=Path("runs"))
    ap.add_argument("--docs", type=Path, default=Path("docs"), help="where report writes docs/axes/*")
    ap.add_argument("--jobs", type=int, default=2, help="runs at once (one thread each)")
    ap.add_argument("--rows", help="comma list of rows (e.g. llama-pre_ln,llama-geonorm-muon): a partial study")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # Hydra overrides for every run follow `--`
    args = ap.parse_args(argv[:cut])
    args.overrides = argv[cut + 1:]
    args.rows = args.rows.split(",") if args.rows else None
    if args.action == "points":
        print(yaml.safe_dump(grid_points(args.rows), sort_keys=False))
        return 0
    parts = PARTS if args.action == "all" else [args.part] if args.action == "run" else []
    if args.action == "run" and args.part not in PARTS:
        raise SystemExit(f"run needs a part: one of {', '.join(PARTS)}")
    for part in parts:
        t0 = time.time()
        try:
            run_part(args, part)
        finally:  # wall time per part, added up over resumed invocations (the report prints it)
            runlib.add_wall_time(args.runs_root / TIMES, part, time.time() - t0)
        print(f"### part {part}: {time.time() - t0:.0f} s wall", flush=True)
    if args.action in ("all", "report"):
        report(args.runs_root, args.docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
