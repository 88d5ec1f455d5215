"""Figures and tables of the fidelity study (studies/fidelity/study.yaml) from its run dirs: its report.

    python scripts/study.py fidelity --report [--runs-root runs] [--docs docs]

Writes <docs>/fidelity/*.png and <docs>/fidelity/tables.md. Parts that have not run are left out
(the tables say so); a part that is still running is reported from its finished runs.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments import runs as runlib  # noqa: E402
from experiments.runs import ok_losses, pm  # noqa: E402
from data.files import atomic_write  # noqa: E402

KEY_LR, KEY_MULT = "optim.lr", "optim.groups.scalars.lr_mult"


# ---- helpers ---------------------------------------------------------------------------------------

def variant_colour(label: str):
    """One stable colour per variant, in the registry's order (labels like 'spheret_p_inf' or
    'geonorm-untied' take their variant's colour)."""
    names = runlib.variant_order()
    base = max((n for n in names if label == n or label.startswith(n + "-") or label.startswith(n + "_")),
               key=len, default=None)
    cmap = plt.get_cmap("tab20")
    return cmap(names.index(base) % 20) if base else "black"


def by(runs, study) -> dict:
    """Runs grouped by their study cell, groups in the variant registry's order, seeds in order."""
    out: dict = {}
    for r in runs:
        out.setdefault(study.cell_of_run(r), []).append(r)
    return {k: sorted(out[k], key=lambda r: str(r.seed)) for k in runlib.sort_labels(out)}


def cell(run) -> str:
    if run is None:
        return "—"
    if not run.finished:
        return "running"
    if run.failed:
        return "failed" if run.diverged else f"failed ({run.final_val_loss:.2f})"
    return f"{run.final_val_loss:.3f}"


def wall(runs) -> float:
    """Sum of the runs' wall times (s): the summary's when it has one, else from the run dir's file
    times (config.yaml written at start, metrics.jsonl's last line at the end)."""
    total = 0.0
    for r in runs:
        w = (r.summary or {}).get("wall_time_s")
        if w is None:
            start, end = r.path / "config.yaml", r.path / "metrics.jsonl"
            w = end.stat().st_mtime - start.stat().st_mtime if start.is_file() and end.is_file() else 0.0
        total += float(w)
    return total


def last_stats(run) -> dict:
    return run.stats[-1] if run.stats else {}


# ---- (a) learning-rate sensitivity -------------------------------------------------------------------

def part_a(runs, out: Path, study) -> list[str]:
    groups = by(runs, study)
    best = runlib.best_over(groups, KEY_LR)
    lrs = sorted({float(runlib.get_key(r.config, KEY_LR)) for r in runs})
    fig, ax = plt.subplots(figsize=(7.5, 5))
    shown: list[float] = []
    for i, (label, rs) in enumerate(groups.items()):
        seed0 = {float(runlib.get_key(r.config, KEY_LR)): r for r in rs if str(r.seed) == "0"}
        xs = [lr for lr in lrs if lr in seed0 and seed0[lr].finished]
        ys = [seed0[lr].final_val_loss if not seed0[lr].failed else math.nan for lr in xs]
        shown += [y for y in ys if math.isfinite(y)]
        ax.plot(xs, ys, marker="osD^v<>"[i % 7], ls="--" if "spheret" in label or "geonorm" in label else "-",
                label=label, color=variant_colour(label), ms=4)
        b = best[label]
        losses = ok_losses(b["runs"])
        if len(losses) > 1:
            ax.errorbar([float(b["value"])], [statistics.fmean(losses)], yerr=[statistics.stdev(losses)],
                        color=variant_colour(label), capsize=3, fmt="none")
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("final validation loss (nats)")
    if shown:
        ax.set_ylim(min(shown) - 0.05, min(max(shown) + 0.05, min(shown) + 1.5))
    ax.set_title("(a) lr sensitivity: 4 x 128, 819k tokens/run, seed 0 (bars: 3 seeds at best lr)", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "a_lr_sensitivity.png", dpi=120)
    plt.close(fig)

    rows = []
    for label, b in best.items():
        losses = ok_losses(b["runs"])
        mean = statistics.fmean(losses) if losses else math.inf
        seed0 = {float(runlib.get_key(r.config, KEY_LR)): r for r in groups[label] if str(r.seed) == "0"}
        rows.append((mean, label, b, losses, seed0))
    rows.sort(key=lambda t: t[0])
    lines = ["### (a) Each variant at its own best lr", "",
             "| rank | variant | best lr | final val loss, mean ± std (seeds) | "
             + " | ".join(f"lr {lr:g} (seed 0)" for lr in lrs) + " |",
             "|---" * (4 + len(lrs)) + "|"]
    for i, (_mean, label, b, losses, seed0) in enumerate(rows, 1):
        seeds = ",".join(str(r.seed) for r in b["runs"])
        tried = [float(v) for v in b["by_value"]]
        edge = " (edge)" if len(tried) > 1 and float(b["value"]) in (min(tried), max(tried)) else ""
        lines.append(f"| {i} | {label} | {float(b['value']):g}{edge} | {pm(losses)} ({seeds}) | "
                     + " | ".join(cell(seed0.get(lr)) for lr in lrs) + " |")
    n_tok = runlib.tokens_per_run(runs)
    lines += ["", f"Tokens per run: {n_tok:,}; {len(runs)} runs; summed training wall time "
              f"{wall(runs) / 3600:.2f} h of one core (two runs at a time). The best lr is chosen on seed 0; "
              "the mean ± std is over every seed run at it. *failed* = final loss above the initial one "
              "or non-finite. *(edge)*: the best lr is the smallest or largest tried for that variant, so its "
              "optimum may lie beyond (a best lr at an edge of 3e-4..3e-3 got one more lr beyond it).", ""]
    return lines


# ---- (b) step-size scalars ------------------------------------------------------------------------

def final_scalars(run) -> dict[str, list[float]]:
    """The learned step sizes at the end, read from the final checkpoint: GeoNorm a, b; SpheretNorm
    alpha = softplus(rho); ScaleNorm g; DyT alpha (name -> values over sublayers)."""
    import torch
    ckpts = sorted((run.path / "checkpoints").glob("ckpt_*.pt"))
    if not ckpts:
        return {}
    state = torch.load(ckpts[-1], map_location="cpu", weights_only=False)["model"]
    out: dict[str, list[float]] = {}
    for key, v in state.items():
        name = key.rsplit(".", 1)[-1]
        if v.dim() != 0 or name not in ("a", "b", "rho", "g", "alpha"):
            continue
        label = {"rho": "alpha", "alpha": "dyt alpha"}.get(name, name)
        out.setdefault(label, []).append(float(torch.nn.functional.softplus(v) if name == "rho" else v))
    return out


def scalar_summary(run) -> tuple[str, str]:
    st = last_stats(run)
    parts = []
    for name, vals in final_scalars(run).items():
        parts.append(f"{name} {vals[0]:.2f}" if len(vals) == 1 else
                     f"{name} {min(vals):.2f}..{max(vals):.2f} (mean {statistics.fmean(vals):.2f})")
    angles = [v for k, v in st.items() if k.startswith("angle_mean/")]
    amax = [v for k, v in st.items() if k.startswith("angle_max/")]
    ang = (f"{statistics.fmean(angles):.3f} / {max(amax):.3f}" if angles else "—")
    return "; ".join(parts) or "—", ang


def part_b(runs_b, runs_a, out: Path, study) -> list[str]:
    best = runlib.best_over(by(runs_a, study), KEY_LR)
    groups = by(runs_b, study)
    lines = [
        "### (b) Step-size scalars: `optim.groups.scalars.lr_mult` at each variant's best lr (seed 0)",
        "",
        "| variant | lr | lr_mult | final val loss | final scalars (min..max over sublayers; from the checkpoint) | "
        "angle: mean / max (rad) |",
        "|---|---|---|---|---|---|",
    ]
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, rs in groups.items():
        seed0 = [r for r in best[label]["runs"] if str(r.seed) == "0"]
        series = sorted(seed0 + rs, key=lambda r: float(runlib.get_key(r.config, KEY_MULT) or 1.0))
        for r in series:
            sc, ang = scalar_summary(r)
            lines.append(
                f"| {label} | {float(best[label]['value']):g} | {float(runlib.get_key(r.config, KEY_MULT) or 1):g} "
                f"| {cell(r)} | {sc} | {ang} |"
            )
        xs = [float(runlib.get_key(r.config, KEY_MULT) or 1.0) for r in series if r.finished]
        ys = [r.final_val_loss if not r.failed else math.nan for r in series if r.finished]
        ax.plot(xs, ys, "o-", label=label, color=variant_colour(label), ms=4)
    ax.set_xscale("log")
    ax.set_xlabel("scalars lr_mult")
    ax.set_ylabel("final validation loss (nats)")
    ax.set_title("(b) step-size scalars' learning rate, at each variant's best lr", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "b_scalars.png", dpi=120)
    plt.close(fig)
    lines += [
        "",
        f"lr_mult 1 is part (a)'s seed-0 run. Angles: the monitor's mean rotation angle per sublayer "
        "(last stats step, one batch), averaged over sublayers / the largest per-sublayer maximum. "
        f"{len(runs_b)} runs of {runlib.tokens_per_run(runs_b):,} tokens; {wall(runs_b) / 3600:.2f} h of one core.",
        "",
    ]
    return lines


# ---- (c) horizon -----------------------------------------------------------------------------------

def curve(runs) -> tuple[list[int], list[float], list[float]]:
    """Mean and std over seeds of the validation loss at each evaluated token count all runs share."""
    per = [{e["tokens"]: e["val_loss"] for e in r.evals} for r in runs]
    common = sorted(set.intersection(*(set(p) for p in per)))
    means = [statistics.fmean(p[t] for p in per) for t in common]
    stds = [statistics.stdev([p[t] for p in per]) if len(per) > 1 else 0.0 for t in common]
    return common, means, stds


def part_c(runs, out: Path, study) -> list[str]:
    groups = by(runs, study)
    curves = {lbl: curve(rs) for lbl, rs in groups.items()}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for lbl, (ts, ms, ss) in curves.items():
        ts2 = [t for t in ts if t > 0]
        m2 = [m for t, m in zip(ts, ms) if t > 0]
        s2 = [s for t, s in zip(ts, ss) if t > 0]
        c = variant_colour(lbl)
        ax.plot(ts2, m2, label=lbl, color=c)
        ax.fill_between(ts2, [m - s for m, s in zip(m2, s2)], [m + s for m, s in zip(m2, s2)], color=c, alpha=0.2)
    ax.set_xscale("log")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("validation loss (nats)")
    finals = [ms[-1] for _, ms, _ in curves.values() if ms]
    if finals:
        ax.set_ylim(min(finals) - 0.1, min(finals) + 1.5)
    ax.set_title("(c) horizon: best setting of (a)/(b), mean ± std over seeds", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "c_horizon.png", dpi=120)
    plt.close(fig)

    marks = [t for t in (204_800, 409_600, 819_200, 1_638_400, 3_276_800, 6_553_600)
             if all(t in ts for ts, _, _ in curves.values())]
    lines = ["### (c) Horizon: validation loss (mean ± std over seeds) at token counts", "",
             "| variant | lr | lr_mult | seeds | " + " | ".join(f"{t / 1e6:.2f}M" for t in marks) + " |",
             "|---" * (4 + len(marks)) + "|"]
    for lbl, rs in groups.items():
        per = [{e["tokens"]: e["val_loss"] for e in r.evals} for r in rs]
        cells = [pm([p[t] for p in per if t in p]) for t in marks]
        lines.append(f"| {lbl} | {float(runlib.get_key(rs[0].config, KEY_LR)):g} | "
                     f"{float(runlib.get_key(rs[0].config, KEY_MULT) or 1):g} | {','.join(str(r.seed) for r in rs)} | "
                     + " | ".join(cells) + " |")
    rank_lines = []
    for t in marks:
        order = sorted(curves, key=lambda c: dict(zip(curves[c][0], curves[c][1]))[t])
        rank_lines.append(f"- {t / 1e6:.2f}M tokens: " + " < ".join(order))
    lines += ["", "Ranking (lowest loss first) at each token count:", ""] + rank_lines
    lines += [
        "",
        "Crossings (the sign of the difference of the seed means changes between two evaluations, "
        "after the first 5% of training; *within noise* when |difference| < the larger seed std at both ends):",
        "",
    ]
    labels = list(curves)
    found = False
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            ta, ma, sa = curves[a]
            tb, mb, sb = curves[b]
            common = [t for t in ta if t in set(tb) and t >= 0.05 * max(ta)]
            da, db = dict(zip(ta, ma)), dict(zip(tb, mb))
            sda, sdb = dict(zip(ta, sa)), dict(zip(tb, sb))
            one_seed = min(len(groups[a]), len(groups[b])) < 2
            cross = []
            for t0, t1 in zip(common, common[1:]):
                d0, d1 = da[t0] - db[t0], da[t1] - db[t1]
                if d0 * d1 < 0:
                    noisy = all(abs(da[t] - db[t]) < max(sda[t], sdb[t]) for t in (t0, t1))
                    cross.append((t0, t1, a if d1 < 0 else b, noisy))
            if not cross:
                continue
            found = True
            note = " (one seed: noise not measured)" if one_seed else ""
            if len(cross) <= 2:
                for t0, t1, lead, noisy in cross:
                    lines.append(f"- {a} / {b}: between {t0 / 1e6:.2f}M and {t1 / 1e6:.2f}M tokens, {lead} moves ahead"
                                 + (" (within noise)" if noisy else note))
            else:
                lines.append(f"- {a} / {b}: {len(cross)} crossings between {cross[0][0] / 1e6:.2f}M and "
                             f"{cross[-1][1] / 1e6:.2f}M tokens: the two track each other; last ahead: {cross[-1][2]}"
                             + note)
    if not found:
        lines.append("- none")
    lines += [
        "",
        f"Tokens per run: {runlib.tokens_per_run(runs):,}; {len(runs)} runs; {wall(runs) / 3600:.2f} h of one core.",
        "",
    ]
    return lines


# ---- (d) choice ablations ---------------------------------------------------------------------------

def part_d(runs, out: Path, study) -> list[str]:
    groups = by(runs, study)
    groups = {k: groups[k] for k in sorted(groups, key=lambda g: (g.split("-")[0], "-" in g, g))}
    lines = [
        "### (d) Choice ablations at the best setting (seeds 0, 1)",
        "",
        "| variant / change | final val loss | Δ vs its baseline | Δ beyond the seed spread? |",
        "|---|---|---|---|",
    ]
    for lbl, rs in groups.items():
        base_lbl = lbl.split("-")[0]
        base = ok_losses(groups.get(base_lbl, []))
        xs = ok_losses(rs)
        if lbl == base_lbl or not base or not xs:
            lines.append(f"| {lbl} | {pm(xs)} | — | — |")
            continue
        delta = statistics.fmean(xs) - statistics.fmean(base)
        spread = max([statistics.stdev(v) for v in (xs, base) if len(v) > 1] or [0.0])
        verdict = "yes" if abs(delta) > 2 * spread else ("no" if abs(delta) < spread else "unclear")
        lines.append(f"| {lbl} | {pm(xs)} | {delta:+.3f} | {verdict} (spread {spread:.3f}) |")
    lines += [
        "",
        "Seed spread = the larger of the two rows' std over 2 seeds; *yes* when |Δ| > 2x spread, "
        "*no* when |Δ| < spread, *unclear* between. "
        f"Tokens per run: {runlib.tokens_per_run(runs):,}; {len(runs)} runs; {wall(runs) / 3600:.2f} h of one core.",
        "",
    ]
    return lines


# ---- (e) depth --------------------------------------------------------------------------------------

def part_e(runs, out: Path, study) -> list[str]:
    groups = by(runs, study)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    lines = ["### (e) Known depth results, 24 layers x d=128, lr 1e-3", "",
             "| point | warmup steps | initial val loss | final val loss | residual RMS: after input / last sublayer |",
             "|---|---|---|---|---|"]
    for i, (lbl, rs) in enumerate(groups.items()):
        r = rs[0]
        c = plt.get_cmap("tab10")(i)
        ax1.plot([e["tokens"] for e in r.evals], [e["val_loss"] for e in r.evals], label=lbl, color=c)
        st = last_stats(r)
        rms = [st[f"rms/{j}"] for j in range(len(st)) if f"rms/{j}" in st]
        if rms:
            ax2.plot(range(len(rms)), rms, label=lbl, color=c)
        lines.append(f"| {lbl} | {runlib.get_key(r.config, 'optim.warmup_steps')} | "
                     f"{(r.initial_val_loss or math.nan):.3f} | {cell(r)} | "
                     + (f"{rms[0]:.2f} / {rms[-1]:.2f}" if rms else "—") + " |")
    ax1.set_xlabel("training tokens")
    ax1.set_ylabel("validation loss (nats)")
    ax1.legend(fontsize=8)
    ax2.set_yscale("log")
    ax2.set_xlabel("sublayer j (0 = after the input step)")
    ax2.set_ylabel("residual-stream RMS (end of training)")
    ax2.legend(fontsize=8)
    fig.suptitle("(e) 24 x 128: loss curves and residual RMS by depth", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "e_depth.png", dpi=120)
    plt.close(fig)
    lines += [
        "",
        f"Tokens per run: {runlib.tokens_per_run(runs):,}; seed 0; {wall(runs) / 3600:.2f} h of one core.",
        "",
    ]
    return lines


def part_ablate(results: list[tuple[str, dict]], out: Path) -> list[str]:
    import json  # noqa: F401
    n = len(results)
    cols = 4
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False)
    lines = ["### (e4) Layer ablation: validation-loss increase when one block is skipped", "",
             "| model | base loss | increase per skipped block (block 1 first) | first half / second half mean |",
             "|---|---|---|---|"]
    for ax, (name, res) in zip(axes.flat, results):
        inc = res["increase"]
        ax.bar(range(1, len(inc) + 1), inc, color=variant_colour(res["norm"]))
        ax.set_title(name, fontsize=8)
        ax.set_yscale("symlog", linthresh=1e-2)
        ax.tick_params(labelsize=6)
        h = len(inc) // 2
        lines.append(f"| {name} | {res['base_loss']:.3f} | " + ", ".join(f"{x:+.2f}" for x in inc) +
                     f" | {statistics.fmean(inc[:h]):+.3f} / {statistics.fmean(inc[h:]):+.3f} |")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle("val loss increase (nats, symlog) when block k is skipped", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "e_layer_ablation.png", dpi=110)
    plt.close(fig)
    lines += [""]
    return lines


def report(study, root: Path, docs: Path, experiment: str | None = None) -> None:
    import json
    out = docs / "fidelity"
    out.mkdir(parents=True, exist_ok=True)
    sweeps = {p["name"]: study.sweep_of(p) for p in study.parts}
    a, b, c, d, e = (runlib.load_sweep(root / sweeps[p]) for p in ("grid", "scalars", "horizon", "choices", "depth"))
    lines = ["# Fidelity study: generated tables", "",
             "Written by `python scripts/study.py fidelity` (`python scripts/study.py fidelity`: "
             "`studies/fidelity/study.yaml`, `studies/fidelity/report.py`); the discussion is in "
             "`docs/fidelity_study.md`.", ""]
    def done(name, runs):  # a part still running is reported from its finished runs, and says so
        if runs and not all(r.finished for r in runs):
            finished = [r for r in runs if r.finished]
            lines.extend([f"Part ({name}): in progress, {len(finished)} of {len(runs)} started runs finished; "
                          "the table below uses the finished ones only.", ""])
            runs[:] = finished
        return bool(runs)
    if done("a", a):
        lines += part_a(a, out, study)
        if done("b", b):
            lines += part_b(b, a, out, study)
    if done("c", c):
        lines += part_c(c, out, study)
    if done("d", d):
        lines += part_d(d, out, study)
    if done("e", e):
        lines += part_e(e, out, study)
    abl = []
    for r in a + e:
        p = r.path / "layer_ablation.json"
        if p.is_file():
            prefix = "24L " if r in e else ""
            abl.append((prefix + study.cell_of_run(r), json.loads(p.read_text())))
    if abl:
        lines += part_ablate(abl, out)
    t = runlib.study_times(root, study.name)
    if t:
        lines += ["### Wall time per part (two runs at a time, one thread each; summed over resumed invocations)", "",
                  "| part | wall time |", "|---|---|"] + [f"| {k} | {v / 60:.0f} min |" for k, v in t.items()] + [""]
    missing = [name for name, runs in zip("abcde", (a, b, c, d, e)) if not runs]  # not started
    if missing:
        lines += [f"Parts not run yet: {', '.join(missing)}.", ""]
    atomic_write(out / "tables.md", "\n".join(lines).rstrip() + "\n")
    print(f"wrote {out / 'tables.md'} and the figures beside it")
