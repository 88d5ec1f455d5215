"""The residual stream's geometry over training, by depth: one column of panels per run.

    python scripts/plot_geometry.py RUN_DIR [RUN_DIR ...] --out docs/step_scale/geometry.png [--title T]
    python scripts/plot_geometry.py RUN_DIR [RUN_DIR ...] --scalars --out scalars.png   # the learned scalars

Rows: the effective rotation angle(h_j, h_{j+1}) of every sublayer j (radians, log scale), the relative
update ||h_{j+1} - h_j|| / ||h_j||, and the gradient reaching each depth ||dL/dh_j||, against tokens,
from the run's `stats` records (model/geometry.py; step 0 is the initialised model). One line per
depth, in the run's variant colour from light (first sublayer) to dark (last).

With --scalars, one row per kind of learned scalar instead (GeoNorm's a and b, SpheretNorm's alpha, Derf's
alpha and shift, hyper-connections' off-diagonal mixing mass and distance of H_res from I, the attention
gates' means; runlib.scalar_series), one line per sublayer or module: whether the scalars moved at all.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from experiments import runs as runlib

from experiments.geometry_plots import depth_series, plot, plot_scalars


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run directories (each with metrics.jsonl)")
    ap.add_argument("--out", required=True, help="the figure (.png)")
    ap.add_argument("--title")
    ap.add_argument("--scalars", action="store_true", help="plot the learned scalars instead of the geometry")
    args = ap.parse_args(argv)
    runs = [runlib.load_run(p) for p in runlib.find_runs(args.runs)]
    if args.scalars:
        without = [str(r.path) for r in runs if not runlib.scalar_series(r.stats)]
        if without:
            raise SystemExit(f"no learned scalars in the stats of {', '.join(without)}: a variant without any "
                             "(pre_ln), or logging.stats_interval longer than the run")
        plot_scalars(runs, Path(args.out), args.title)
        print(f"wrote {args.out}")
        return 0
    missing = [str(r.path) for r in runs if not depth_series(r.stats, "geo/angle")]
    if missing:
        raise SystemExit(f"no geometry stats (geo/angle/*) in {', '.join(missing)}: runs from before the "
                         "instruments, or logging.stats_interval longer than the run")
    plot(runs, Path(args.out), args.title)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    from common import report_user_errors

    sys.exit(report_user_errors(main))
