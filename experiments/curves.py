"""Loss curves and the residual-stream RMS by depth, per variant group, from loaded runs (scripts/plot_curves.py
is the command line)."""
from __future__ import annotations

import functools
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from experiments import runs as runlib  # noqa: E402
from data.files import atomic_open  # noqa: E402

# One colour per variant, fixed by its place in the registry, so a variant looks the same in every
# figure. tab10 plus enough distinct extras for every registered variant.
PALETTE = list(plt.get_cmap("tab10").colors) + ["#000000", "#b8860b", "#00a6a6", "#7b68ee", "#9acd32", "#8b4513",
                                                 "#ff1493", "#2f4f4f", "#6b8e23", "#4682b4", "#800000", "#000080",
                                                 "#40e0d0", "#daa520"]


@functools.cache
def variant_colors() -> dict:
    """One colour per variant, in the registry's order (looked up on first use: see runlib.variant_order)."""
    return dict(zip(runlib.variant_order(), PALETTE))


# Curves that are not one variant each (an ablation's points, all of one variant): these, in turn.
OTHER_COLORS = list(plt.get_cmap("Dark2").colors) + list(plt.get_cmap("Set1").colors)


def group_colors(groups: dict[str, list[runlib.Run]]) -> dict[str, object]:
    """label -> colour. A group whose runs are all one variant, the only group of that variant in
    the figure, gets the variant's own colour; any other group the next of OTHER_COLORS."""
    norms = {label: {runlib.get_key(r.config, "norm.name") for r in runs} for label, runs in groups.items()}
    single = [next(iter(n)) for n in norms.values() if len(n) == 1]
    colors, spare = {}, 0
    for label in groups:
        norm = next(iter(norms[label])) if len(norms[label]) == 1 else None
        if norm in variant_colors() and single.count(norm) == 1:
            colors[label] = variant_colors()[norm]
        else:
            colors[label] = OTHER_COLORS[spare % len(OTHER_COLORS)]
            spare += 1
    return colors


def series(lines: list[dict], key: str, ema: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    x = np.array([float(r["tokens"]) for r in lines if key in r and r[key] is not None])
    y = np.array([float(r[key]) for r in lines if key in r and r[key] is not None])
    if ema > 0 and len(y):
        out, acc = np.empty_like(y), y[0]
        for i, v in enumerate(y):
            acc = ema * acc + (1 - ema) * v if math.isfinite(v) and math.isfinite(acc) else v
            out[i] = acc
        y = out
    return x, y


def band(curves: list[tuple[np.ndarray, np.ndarray]]):
    """Mean, min, max of several curves on the first curve's x grid (seeds log at the same tokens
    when only the seed differs; interpolation covers the rest). Non-finite points are dropped."""
    curves = [(x[np.isfinite(y)], y[np.isfinite(y)]) for x, y in curves]
    curves = [(x, y) for x, y in curves if len(x)]
    if not curves:
        return None
    hi = min(x[-1] for x, _ in curves)
    grid = curves[0][0][curves[0][0] <= hi]
    ys = np.stack([np.interp(grid, x, y) for x, y in curves])
    return grid, ys.mean(0), ys.min(0), ys.max(0)


def _ylim(ax, values: list[np.ndarray]) -> None:
    """Keep a diverged run from flattening everyone else's curve."""
    v = np.concatenate([a[np.isfinite(a)] for a in values if len(a)] or [np.zeros(0)])
    if len(v) > 4:
        lo, hi = np.percentile(v, 1), np.percentile(v, 97)
        pad = 0.05 * (hi - lo + 1e-9)
        ax.set_ylim(lo - pad, hi + 3 * pad)


def plot_loss(groups: dict[str, list[runlib.Run]], out: Path, title: str, ema: float,
              paper: dict | None) -> Path:
    fig, (ax_t, ax_v) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = group_colors(groups)
    # validation in bits per byte (comparable across tokenizers) where every run recorded it and no paper curve,
    # whose points are nats per token of its tokenizer, shares the panel; else nats per token
    every = [r for runs in groups.values() for r in runs]
    val_key = "val_bpb" if every and not paper and all(
        e.get("val_bpb") is not None for r in every for e in r.evals) else "val_loss"
    seen_t, seen_v = [], []
    for label, runs in groups.items():
        c = colors[label]
        n = len(runs)
        name = f"{label} (n={n})" if n > 1 else label
        for ax, kind, key, seen in ((ax_t, "train", "loss", seen_t), (ax_v, "evals", val_key, seen_v)):
            curves = [series(getattr(r, kind), key, ema if kind == "train" else 0.0) for r in runs]
            seen.extend(y for _, y in curves)
            b = band(curves)
            if b is None:
                continue
            grid, mean, lo, hi = b
            ax.plot(grid, mean, color=c, lw=1.4, label=name, marker="o" if len(grid) < 15 else None, ms=3)
            if n > 1:
                ax.fill_between(grid, lo, hi, color=c, alpha=0.2, lw=0)
            for r, (x, y) in zip(runs, curves):
                if r.diverged and len(x):
                    fin = np.isfinite(y)
                    xd = x[fin][-1] if fin.any() else x[0]
                    yd = y[fin][-1] if fin.any() else ax.get_ylim()[1]
                    ax.plot([xd], [yd], marker="x", color=c, ms=9, mew=2)
        spike_tok = [s["tokens"] for r in runs for s in r.spikes if s.get("metric") == "loss"]
        if spike_tok:  # ticks along the bottom of the train panel, in the variant's colour
            ax_t.plot(spike_tok, [0.02] * len(spike_tok), "|", color=c, ms=12, mew=1.5,
                      transform=ax_t.get_xaxis_transform())
    if paper:
        for label in groups:
            curve = (paper.get("curve") or {}).get(label)
            tokens_per_step = _tokens_per_step(groups[label]) if curve else None
            if tokens_per_step:
                # Only the paper's points within our runs' length (a short run is not its 50k steps).
                last = max(r.last_step or 0 for r in groups[label])
                pts = [(st, v) for st, v in zip(curve["steps"], curve["val_loss"]) if st <= 1.05 * last]
                if pts:
                    st, v = map(np.array, zip(*pts))
                    seen_v.append(v)
                    ax_v.plot(st * tokens_per_step, v, "o", mfc="none", color=colors[label],
                              label=f"{label} (paper)")
    _ylim(ax_t, seen_t)
    _ylim(ax_v, seen_v)
    val_unit = "bits per byte" if val_key == "val_bpb" else "nats per token"
    for ax, t, unit in ((ax_t, "train loss", "nats per token"), (ax_v, "validation loss", val_unit)):
        ax.set_xlabel("tokens")
        ax.set_ylabel(f"loss ({unit})")
        ax.set_title(t + (" (| = loss spike, x = diverged)" if ax is ax_t else ""), fontsize=9)
        ax.grid(alpha=0.3)
    ax_v.legend(fontsize=7, ncol=2)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return _save(fig, out.with_name(out.name + "_loss.png"))


def _tokens_per_step(runs: list[runlib.Run]) -> float | None:
    for r in runs:
        for line in r.train:
            if line.get("step"):
                return line["tokens"] / line["step"]
    return None


def rms_profile(run: runlib.Run) -> np.ndarray | None:
    if not run.stats:
        return None
    last = run.stats[-1]
    js = sorted(int(k.split("/")[1]) for k in last if k.startswith("rms/"))
    return np.array([float(last[f"rms/{j}"]) for j in js]) if js else None


def plot_rms(groups: dict[str, list[runlib.Run]], out: Path, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    colors = group_colors(groups)
    drawn = 0
    for label, runs in groups.items():
        profs = [p for p in map(rms_profile, runs) if p is not None]
        profs = [p for p in profs if len(p) == len(profs[0])] if profs else []
        if not profs:
            continue
        P = np.stack(profs)
        P = np.where(np.isfinite(P) & (P > 0), P, np.nan)
        c = colors[label]
        j = np.arange(P.shape[1])
        ax.plot(j, np.nanmean(P, 0), color=c, marker=".", lw=1.4, label=label)
        if len(profs) > 1:
            ax.fill_between(j, np.nanmin(P, 0), np.nanmax(P, 0), color=c, alpha=0.2, lw=0)
        drawn += 1
    ax.set_yscale("log")
    ax.set_xlabel("depth j (0 = after input step, then every sublayer)")
    ax.set_ylabel("residual stream RMS")
    ax.set_title(title + "\nresidual-stream RMS by depth, end of training", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    if drawn:
        ax.legend(fontsize=7, ncol=2)
    else:
        ax.text(0.5, 0.5, "no `stats` lines in these runs", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    return _save(fig, out.with_name(out.name + "_rms.png"))


def _save(fig, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(dest, "wb") as f:
        fig.savefig(f, dpi=90, format="png")
    plt.close(fig)
    return dest
