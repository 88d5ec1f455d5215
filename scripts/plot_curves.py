"""Loss curves and the residual-stream RMS by depth, per variant, from run directories.

    python scripts/plot_curves.py runs/<sweep> [more run dirs] --out docs/cpu_study_a
        [--group-by norm.decay] [--ema 0.0] [--paper-setting NAME] [--title T]

Writes <out>_loss.png (train and validation loss against tokens: mean over seeds, min-max band,
loss spikes as red ticks, diverged runs as x) and <out>_rms.png (RMS of the residual stream after
the input step and every sublayer, from each run's last `stats` line, mean over seeds; the
"curse of depth" picture). With a paper setting that printed curves, the paper's validation points
are drawn as open circles (only meaningful at the paper's scale).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from data.files import writable_dir
from experiments import runs as runlib

from experiments.curves import plot_loss, plot_rms


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run dirs, or dirs holding run dirs (e.g. runs/<sweep>)")
    ap.add_argument("--out", required=True, help="output prefix: writes <out>_loss.png and <out>_rms.png")
    ap.add_argument("--group-by", default="", help="extra config keys that split curves, e.g. norm.decay")
    ap.add_argument("--ema", type=float, default=0.0, help="EMA smoothing of the train loss (0 = none)")
    ap.add_argument("--paper-setting", help="overlay this paper setting's printed validation curve "
                    "(default: the runs' experiment_meta.paper_setting; 'none' to hide)")
    ap.add_argument("--title", help="figure title (default: the experiment name)")
    args = ap.parse_args(argv)
    if not 0.0 <= args.ema < 1.0:
        raise SystemExit(f"--ema={args.ema}: must be in [0, 1)")

    writable_dir(Path(args.out).parent, "--out")   # before reading the runs
    group_by = [k for k in args.group_by.split(",") if k]
    runs = [runlib.load_run(p, group_by) for p in runlib.find_runs(args.runs)]
    if not any(r.train or r.evals for r in runs):  # rather than two empty figures
        raise SystemExit(f"no training or eval records in {', '.join(str(r.path / 'metrics.jsonl') for r in runs)}: "
                         "nothing to plot (a corrupt or empty metrics.jsonl?)")
    meta = runlib.experiment_meta(runs)
    groups = runlib.group_runs(runs, runlib.label_order(meta))
    setting = args.paper_setting or meta.get("paper_setting")
    paper = runlib.load_paper(None if setting == "none" else setting)
    title = args.title or meta.get("name") or Path(args.out).name
    out = Path(args.out)
    for p in (plot_loss(groups, out, title, args.ema, paper), plot_rms(groups, out, title)):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    from common import report_user_errors

    sys.exit(report_user_errors(main))
