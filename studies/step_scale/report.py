"""Tables and figures of the step-scale study, its report (studies/step_scale/study.yaml names it).

    python scripts/study.py step_scale --report [--runs-root runs] [--docs docs]

Writes docs/step_scale/tables.md (every cell's lr grid, its best lr by the mean over seeds, per-seed
values, 95% CI, Welch comparisons, the 2x2, the chaos control and the trend) and the figures
docs/step_scale/{a_lr.png, a_geometry.png, c_trend.png}. Only finished runs count.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path

from experiments import runs as runlib
from common.stats import diff_ci, slope_t_interval, summarize, verdict, welch_p
from data.files import atomic_write


def _losses(runs) -> list[float]:
    """Final val losses, a failed run counting as its final value (kept: a failure is part of the spread)."""
    return [r.final_val_loss for r in sorted(runs, key=lambda r: str(r.seed)) if r.final_val_loss is not None
            and math.isfinite(r.final_val_loss)]


def _step0(runs, key: str) -> float | None:
    """Mean over the sublayers of a step-0 geometry key, mean over the runs."""
    vals = []
    for r in runs:
        st0 = next((s for s in r.stats if s.get("step") == 0), None)
        if st0:
            xs = [v for k, v in st0.items() if k.startswith(key + "/") and v is not None]
            if xs:
                vals.append(statistics.fmean(xs))
    return statistics.fmean(vals) if vals else None


def _last_stat(runs, key: str, reduce=max) -> float | None:
    vals = []
    for r in runs:
        if r.stats:
            xs = [v for k, v in r.stats[-1].items() if k.startswith(key + "/") and v is not None]
            if xs:
                vals.append(reduce(xs))
    return statistics.fmean(vals) if vals else None


def cell_rows(study, runs: list[runlib.Run]) -> dict[str, dict]:
    """cell -> its best lr (mean over the seeds every lr ran with), the runs there and the edge flag."""
    out = {}
    for cell, b in study.best(runs).items():
        value = float(b["value"])
        losses = _losses(b["runs"])
        out[cell] = {"lr": value, "by_value": {float(k): v for k, v in b["by_value"].items()},
                     "edge": runlib.at_edge(b), "runs": b["runs"],
                     "losses": losses, "summary": summarize(losses), "n_failed": sum(r.failed for r in b["runs"]),
                     "angle0": _step0(b["runs"], "geo/angle"), "rel0": _step0(b["runs"], "geo/rel_update"),
                     "sat": _last_stat(b["runs"], "angle_above_1rad")}
    return out


def _run_commits(root: Path) -> str:
    """'part (sweep): commit xN, ...' over every finished run's summary ('unrecorded' before runs recorded it)."""
    out = []
    for sweep in ("step_scale_a", "step_scale_b", "step_scale_c"):
        counts: dict[str, int] = {}
        for r in runlib.load_sweep(root / sweep):
            if r.finished:
                c = str((r.summary or {}).get("commit") or "unrecorded")
                counts[c] = counts.get(c, 0) + 1
        if counts:
            out.append(f"{sweep}: " + ", ".join(f"{c} ×{n}" for c, n in sorted(counts.items())))
    return "; ".join(out) or "—"


def _fmt(x, digits=3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _fmt_g(x) -> str:
    return "—" if x is None else f"{x:.2g}"


def table_a(rows: dict[str, dict], order: list[str]) -> list[str]:
    ref = rows.get("pre_ln")
    lines = [
        "| cell | angle at init (rad) | lr: mean loss (over the seeds run at every lr) | best lr | per seed | "
        "mean ± std | 95% CI | "
        "vs pre_ln (Welch) | share > 1 rad at end |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in order:
        if cell not in rows:
            continue
        r = rows[cell]
        s = r["summary"]
        grid = ", ".join(
            f"{lr:g}: {'failed' if not math.isfinite(v) else f'{v:.3f}'}" for lr, v in sorted(r["by_value"].items())
        )
        if cell == "pre_ln" or ref is None:
            vs = "—"
        elif r["edge"] or ref["edge"]:
            vs = "not ranked (best at the grid edge)"
        else:
            vs = verdict(r["losses"], ref["losses"], cell, "pre_ln")
        lines.append(f"| {cell} | {_fmt_g(r['angle0'])} | {grid} | {r['lr']:g}{' (edge)' if r['edge'] else ''} | "
                     f"{s.per_seed()} | {s.mean_std()} | {s.ci()} | {vs} | {_fmt(r['sat'], 2)} |")
    return lines


def table_2x2(rows: dict[str, dict]) -> list[str]:
    """{Pre-LN, 1-SpheretNorm} x {large, small relative step at init}."""
    large_sphere = min((c for c in ("proj_spheret-a8", "proj_spheret-a32") if c in rows),
                       key=lambda c: rows[c]["summary"].mean, default=None)
    cells = {("pre_ln", "large"): "pre_ln", ("pre_ln", "small"): "pre_ln-rms1",
             ("proj_spheret", "small"): "proj_spheret", ("proj_spheret", "large"): large_sphere}
    lines = ["| | large step at init | small step at init |", "|---|---|---|"]
    for v in ("pre_ln", "proj_spheret"):
        out = []
        for size in ("large", "small"):
            c = cells[(v, size)]
            if c is None or c not in rows:
                out.append("—")
                continue
            r = rows[c]
            out.append(f"{c} @ {r['lr']:g}{' (edge)' if r['edge'] else ''}: {r['summary'].mean_std()} "
                       f"{r['summary'].ci()}, angle {_fmt_g(r['angle0'])} rad")
        lines.append(f"| {v} | " + " | ".join(out) + " |")
    return lines


def chaos_lines(study, root: Path, rows: dict[str, dict]) -> list[str]:
    twins = [r for r in runlib.load_sweep(root / "step_scale_b") if r.finished]
    if not twins:
        return ["(not run yet)"]
    lines = ["| cell @ best lr | seed 0, 1 thread | seed 0, 2 threads | abs. difference | std over seeds 0-2 | "
             "reading |", "|---|---|---|---|---|---|"]
    for t in sorted(twins, key=lambda r: r.base):
        cell = study.cell_of_run(t)
        if cell not in rows:
            continue
        one = next((r for r in rows[cell]["runs"] if str(r.seed) == "0"), None)
        if one is None or t.final_val_loss is None or one.final_val_loss is None:
            continue
        d = abs(t.final_val_loss - one.final_val_loss)
        std = rows[cell]["summary"].std
        reading = "—" if std is None else (
            "chaotic: FP order alone moves it by a large part of the seed spread" if d > 0.25 * std
            else "stable to FP order: the seed spread is the seeds'")
        lines.append(f"| {cell} @ {rows[cell]['lr']:g} | {one.final_val_loss:.4f} | {t.final_val_loss:.4f} | "
                     f"{d:.4f} | {_fmt(std, 4)} | {reading} |")
    return lines


def trend_lines(study, root: Path, rows_a: dict[str, dict], n_params: dict, grid: dict) -> tuple[list[str], dict]:
    """The trend table: the base shape (part (a)'s runs) and each shape of `grid` (study.shapes)."""
    runs = [r for r in runlib.load_sweep(root / "step_scale_c") if r.finished]
    if not runs:
        return ["(not run yet)"], {}
    rows_c = cell_rows(study, runs)
    base = next(iter(n_params))
    prefixes = {base: "", **{s: s + "-" for s in grid}}  # shape -> its cells' label prefix (the base: part (a))
    sphere = next((c.split("-", 1)[1] for c in rows_c if not c.split("-", 1)[1].startswith("pre_ln")), None)
    lines = ["| shape | params | pre_ln: best lr, mean ± std [CI] | " + f"{sphere}: best lr, mean ± std [CI] | "
             "gap (sphere - pre_ln) [95% CI] | Welch |", "|---|---|---|---|---|---|"]
    fit: dict = {}
    for shape, prefix in prefixes.items():
        pre = rows_a.get("pre_ln") if shape == base else rows_c.get(prefix + "pre_ln")
        sph = rows_a.get(sphere) if shape == base else rows_c.get(prefix + sphere)
        if not pre or not sph or sphere is None:
            continue
        params = n_params.get(shape)
        if min(len(pre["losses"]), len(sph["losses"])) < len(study.seeds):  # still running
            done = sum(1 for r in runs if r.base.startswith(prefix))
            lines.append(f"| {shape} | {f'{params:,}' if params else '—'} | (running: {done} runs finished) | | | |")
            continue
        d, lo, hi = diff_ci(sph["losses"], pre["losses"])
        p = welch_p(sph["losses"], pre["losses"])
        edge = " (edge)" if pre["edge"] or sph["edge"] else ""
        lines.append(
            f"| {shape} | {f'{params:,}' if params else '—'} | {pre['lr']:g}{' (edge)' if pre['edge'] else ''}: "
            f"{pre['summary'].mean_std()} {pre['summary'].ci()} | {sph['lr']:g}{' (edge)' if sph['edge'] else ''}: "
            f"{sph['summary'].mean_std()} {sph['summary'].ci()} | {d:+.3f} [{_fmt(lo)}, {_fmt(hi)}]{edge} | "
            f"{'—' if p is None else f'p={p:.2g}'} |"
        )
        fit[shape] = (pre, sph)
    return lines, {"sphere": sphere, "points": fit}


def _axes(n_params: dict) -> tuple[list[str], list[str]]:
    """(width points, depth points) in order, the base shape (labelled by its width, w<d>) in both."""
    base, *rest = list(n_params)
    widths = sorted([base] + [s for s in rest if s.startswith("w")], key=lambda s: int(s[1:]))
    return widths, [base] + sorted((s for s in rest if s.startswith("d")), key=lambda s: int(s[1:]))


def _width_fit(fit: dict, n_params: dict) -> list[str]:
    """Loss against parameters over the width points, per variant, with the exponent's t interval (every
    per-seed value a replicate; a percentile bootstrap over three seeds comes out far too narrow)."""
    all_widths = _axes(n_params)[0]
    widths = [s for s in all_widths if s in fit.get("points", {})]
    if len(widths) < 3:
        return [f"(the width fit needs {', '.join(all_widths)} finished)"]
    out = [
        f"| variant | exponent b of loss = a N^-b (widths {', '.join(widths)}) | 95% t interval |",
        "|---|---|---|",
    ]
    for i, name in enumerate(("pre_ln", fit["sphere"])):
        b, lo, hi = slope_t_interval([n_params[w] for w in widths], [fit["points"][w][i]["losses"] for w in widths])
        out.append(f"| {name} | {b:.4f} | " + ("—" if lo is None else f"[{lo:.4f}, {hi:.4f}]") + " |")
    return out


def _params(model: dict, overrides: dict) -> int:
    """Non-embedding parameters of Pre-LN at the base experiment's model group with `overrides`."""
    from model import GPTConfig
    from model.gpt import GPT

    cfg = GPTConfig.from_hydra({k: v for k, v in {**model, **overrides}.items() if k != "tokenizer_vocab"},
                               {"name": "pre_ln"}, vocab_size=model["tokenizer_vocab"])
    return GPT(cfg).num_params()


def figures(out: Path, rows: dict[str, dict], order: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments.curves import OTHER_COLORS, variant_colors

    fig, ax = plt.subplots(figsize=(8, 4.8))
    for i, cell in enumerate(c for c in order if c in rows):
        r = rows[cell]
        norm = runlib.get_key(r["runs"][0].config, "norm.name")
        plain = cell == norm
        color = variant_colors().get(norm) if plain else OTHER_COLORS[i % len(OTHER_COLORS)]
        xs = sorted(v for v in r["by_value"] if math.isfinite(r["by_value"][v]))
        ax.plot(xs, [r["by_value"][x] for x in xs], "o-" if plain else "s--", color=color, label=cell, ms=4)
    ax.set_xscale("log")
    ax.set_xlabel("peak lr")
    ax.set_ylabel("final val loss, mean over seeds 0-2")
    ax.set_ylim(top=min(3.6, ax.get_ylim()[1]))
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "a_lr.png", dpi=120)
    plt.close(fig)

    from experiments import geometry_plots as plot_geometry
    picks = [c for c in ("pre_ln", "pre_ln-rms1", "proj_spheret", "proj_spheret-a8", "geonorm", "geonorm-normin")
             if c in rows]
    seed0 = [next((r for r in rows[c]["runs"] if str(r.seed) == "0"), rows[c]["runs"][0]) for c in picks]
    seed0 = [r for r in seed0 if r.stats]
    if seed0:
        plot_geometry.plot(seed0, out / "a_geometry.png", "Geometry by depth at each cell's best lr (seed 0)")


def trend_figure(out: Path, fit: dict, n_params: dict) -> None:
    if not fit.get("points"):
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments.curves import variant_colors

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    widths, depths = _axes(n_params)
    for ax, shapes, xlabel in ((axes[0], widths, f"non-embedding parameters (widths {', '.join(widths)})"),
                               (axes[1], depths, f"non-embedding parameters (depths {', '.join(depths)})")):
        for i, name in enumerate(("pre_ln", fit["sphere"])):
            pts = [(n_params[s], fit["points"][s][i]["summary"]) for s in shapes if s in fit["points"]]
            if not pts:
                continue
            any_point = next(iter(fit["points"].values()))[i]
            norm = runlib.get_key(any_point["runs"][0].config, "norm.name")
            ax.errorbar([p for p, _ in pts], [s.mean for _, s in pts],
                        yerr=[[s.mean - (s.lo or s.mean) for _, s in pts], [(s.hi or s.mean) - s.mean for _, s in pts]],
                        fmt="o-", color=variant_colors().get(norm), label=name, capsize=3)
        ax.set_xscale("log")
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel("final val loss (mean, 95% CI)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "c_trend.png", dpi=120)
    plt.close(fig)


def report(study, root: Path, docs: Path, experiment: str) -> None:
    """docs/step_scale/*: study is scripts/study.py's Study; experiment the base every run started from."""
    out = docs / "step_scale"
    out.mkdir(parents=True, exist_ok=True)
    runs_a = [r for r in runlib.load_sweep(root / "step_scale_a") if r.finished]
    if not runs_a:  # a fresh checkout without the run dirs: keep the committed tables
        print(f"no finished runs under {root / 'step_scale_a'}: tables left as they are")
        return
    rows = cell_rows(study, runs_a)
    order = list(study.cells)
    times = runlib.study_times(root, study.name)
    model = study.base_model(experiment)
    grid = study.shapes(model, study.part("trend")["shapes"])
    n_params = {f"w{model['n_embd']}": _params(model, {})}  # the base shape first: part (a)'s runs
    for s, m in grid.items():
        n_params[s] = _params(model, {k.split(".", 1)[1]: v for k, v in m.items()})
    lines = [
        "# Step-scale study: tables",
        "",
        "Generated by `python scripts/study.py step_scale --report`; read with docs/step_scale_study.md.",
        f"Runs finished: (a) {len(runs_a)}. Tokens per run: {runlib.tokens_per_run(runs_a):,}. "
        "Seeds 0, 1, 2 at every lr. "
        "Wall time per part (two runs at a time, one thread each): "
        + (", ".join(f"{k} {v / 60:.0f} min" for k, v in times.items()) or "—")
        + ". Code commits of the runs "
        "(from their summaries): " + _run_commits(root) + ".",
        "",
        "## (a) Each cell at its own best lr",
        "",
        "Final validation loss (bytes). The best lr is the lowest mean over the three seeds; (edge): it is the "
        "largest or smallest lr tried, so the cell is not ranked. 'angle at init': the mean over sublayers of "
        "angle(h_j, h_{j+1}) at step 0. 'vs pre_ln': Welch's test, 'ahead' only where p < 0.05. "
        "'share > 1 rad': the sphere rules' share of tokens turned by more than 1 rad at the last stats step "
        "(largest over sublayers).",
        "",
        *table_a(rows, order),
        "",
        "## (a) The 2x2",
        "",
        "Each cell at its own best lr; mean ± std over 3 seeds, [95% CI]; the large-start "
        "1-SpheretNorm cell is the better of alpha_init 8 and 32.",
        "",
        *table_2x2(rows),
        "",
        "## (b) Chaos control",
        "",
        "Seed 0 at the best lr rerun with train.threads=2: only the floating-point "
        "order of the CPU kernels differs. A difference above a quarter of the seed std reads as chaotic.",
        "",
        *chaos_lines(study, root, rows),
        "",
    ]
    trend, fit = trend_lines(study, root, rows, n_params, grid)
    lines += [
        "## (c) Trend with size",
        "",
        "Pre-LN and the best sphere cell of (a), each at its own best lr, "
        f"3 seeds; {next(iter(n_params))} is part (a)'s setting. "
        "Gap = sphere minus Pre-LN (positive: the sphere cell trails), "
        "with its Welch-Satterthwaite 95% interval.",
        "",
        *trend,
        "",
        *_width_fit(fit, n_params),
        "",
    ]
    atomic_write(out / "tables.md", "\n".join(lines) + "\n")
    if rows:
        figures(out, rows, order)
    trend_figure(out, fit, n_params)
    print(f"wrote {out / 'tables.md'}")
