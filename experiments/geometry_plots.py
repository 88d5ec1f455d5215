"""The residual stream's geometry over training by depth, and the learned scalars, from loaded runs
(scripts/plot_geometry.py is the command line)."""
from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.colors as mcolors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

from experiments import runs as runlib  # noqa: E402
from data.files import atomic_open  # noqa: E402
from experiments.curves import OTHER_COLORS, variant_colors  # noqa: E402

ROWS = [("geo/angle", "effective angle (rad)", True), ("geo/rel_update", "‖Δh‖ / ‖h‖", True),
        ("geo/grad", "‖dL/dh_j‖", True)]


def depth_series(stats: list[dict], prefix: str) -> dict[int, tuple[list, list]]:
    """j -> (tokens, values) for every key `prefix/j` in the stats records."""
    pat = re.compile(re.escape(prefix) + r"/(\d+)$")
    out: dict[int, tuple[list, list]] = {}
    for rec in stats:
        for k, v in rec.items():
            m = pat.match(k)
            if m and v is not None:
                xs, ys = out.setdefault(int(m.group(1)), ([], []))
                xs.append(rec["tokens"])
                ys.append(v)
    return dict(sorted(out.items()))


def shades(color, n: int) -> list:
    """n shades of `color`, from pale (first sublayer) to the full colour (last)."""
    rgb = mcolors.to_rgb(color)
    ts = [0.3 + 0.7 * i / max(n - 1, 1) for i in range(n)]
    return [tuple(1 - t * (1 - c) for c in rgb) for t in ts]


def save(fig, out: Path, title: str | None) -> None:
    """Title, layout and an atomic write of the figure (a killed run leaves no half-written png)."""
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(out, "wb") as f:
        fig.savefig(f, dpi=110, format="png")
    plt.close(fig)


def _frame(ax, run: runlib.Run, r: int, c: int, rows: int, ylabel: str) -> None:
    """A panel of the grid (row r, column c = one run): the run on top, the row's quantity on the left,
    tokens along the bottom."""
    if r == 0:
        ax.set_title(f"{run.label} (seed {run.seed})", fontsize=9)
    if c == 0:
        ax.set_ylabel(ylabel)
    if r == rows - 1:
        ax.set_xlabel("tokens")
    ax.grid(alpha=0.3)


def plot(runs: list[runlib.Run], out: Path, title: str | None = None) -> None:
    fig, axes = plt.subplots(len(ROWS), len(runs), figsize=(3.4 * len(runs), 2.6 * len(ROWS)), squeeze=False,
                             sharex="col")
    for c, run in enumerate(runs):
        norm = runlib.get_key(run.config, "norm.name")
        color = variant_colors().get(norm, OTHER_COLORS[c % len(OTHER_COLORS)])
        for r, (prefix, ylabel, logy) in enumerate(ROWS):
            ax = axes[r][c]
            series = depth_series(run.stats, prefix)
            for (j, (xs, ys)), col in zip(series.items(), shades(color, len(series))):
                ax.plot(xs, ys, color=col, lw=1.2, label=f"j={j}" if c == 0 or r == 0 else None)
            if logy and series:
                ax.set_yscale("log")
            _frame(ax, run, r, c, len(ROWS), ylabel)
        if depth_series(run.stats, ROWS[0][0]):
            axes[0][c].legend(fontsize=6, ncol=2, title="sublayer", title_fontsize=6)
    save(fig, out, title)


def plot_scalars(runs: list[runlib.Run], out: Path, title: str | None = None) -> None:
    kinds = sorted({k for r in runs for k in runlib.scalar_series(r.stats)})
    fig, axes = plt.subplots(len(kinds), len(runs), figsize=(3.4 * len(runs), 2.4 * len(kinds)), squeeze=False,
                             sharex="col")
    for c, run in enumerate(runs):
        color = variant_colors().get(runlib.get_key(run.config, "norm.name"), OTHER_COLORS[c % len(OTHER_COLORS)])
        series = runlib.scalar_series(run.stats)
        for r, kind in enumerate(kinds):
            ax = axes[r][c]
            lines = series.get(kind, {})
            for (xs, ys), col in zip(lines.values(), shades(color, len(lines))):
                ax.plot(xs, ys, color=col, lw=1.2)
            _frame(ax, run, r, c, len(kinds), kind)
    save(fig, out, title)
