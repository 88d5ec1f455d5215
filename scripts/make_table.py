"""Final validation loss / perplexity per variant (mean ± std over seeds), spikes, divergence, and the
paper's numbers beside ours. Markdown and LaTeX.

    python scripts/make_table.py runs/<sweep> [more run dirs] [--paper-setting NAME]
                                 [--format md|latex|both] [--out docs/table.md] [--group-by norm.decay]
                                 [--best-over optim.lr]

The paper column appears when the runs' experiment_meta.paper_setting (or --paper-setting) names a
setting of scripts/paper_results.yaml. Failed runs (diverged: summary.diverged or a non-finite final
loss; or a final validation loss above the initial one) are counted and left out of the mean;
unfinished runs use their last eval and are marked.

Statistics (common/stats.py, scipy): each row gives its per-seed values, mean ± std and the t-based
95% interval of the mean; the last column compares the row with the best row by Welch's test and says
"ahead" only where p < 0.05, else "not separated". The code commits of the runs close the table.

--best-over KEY (any swept config key, e.g. optim.lr after `sweep.py --grid optim.lr=...`): one row
per variant (the sweep label without that axis) at its best value of KEY, by mean final validation
loss over the seeds every value was run with; the row shows the chosen value, the mean ± std over
all seeds at it, and each value's mean beside it. A best value at the edge of what was tried is
marked (edge) and its row is not ranked: the optimum may lie beyond it, so run one more value first.
A choice made on fewer seeds than the row has is marked too (run every seed at every value).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import report_user_errors
from data.files import atomic_write, writable_dir
from experiments import runs as runlib
from experiments.tables import add_comparisons, best_rows, build_rows, to_latex, to_markdown


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run dirs, or dirs holding run dirs (e.g. runs/<sweep>)")
    ap.add_argument("--paper-setting", help="scripts/paper_results.yaml setting to show beside ours "
                    "(default: the runs' experiment_meta.paper_setting; 'none' to hide)")
    ap.add_argument("--format", choices=["md", "latex", "both"], default="md")
    ap.add_argument("--out", help="write here (.md; LaTeX goes to the same stem + .tex) instead of stdout")
    ap.add_argument("--group-by", default="", help="extra config keys that split rows, e.g. norm.decay")
    ap.add_argument("--title", help="table title")
    ap.add_argument("--best-over", metavar="KEY", help="per variant, the best value of this swept config key")
    args = ap.parse_args(argv)

    if args.out:
        if Path(args.out).is_dir():
            raise SystemExit(f"--out {args.out} is a directory: give a file name (e.g. {Path(args.out) / 'table.md'})")
        report_user_errors(writable_dir, Path(args.out).parent, "--out")
    group_by = [k for k in args.group_by.split(",") if k]
    runs = [runlib.load_run(p, group_by) for p in runlib.find_runs(args.runs)]
    missing = object()
    for key in group_by:  # a key no run has would label every row (key=None)
        if runs and all(runlib.get_key(r.config, key, missing) is missing for r in runs):
            raise SystemExit(f"--group-by {key}: no run's config.yaml has that key (e.g. norm.decay, optim.lr)")
    meta = runlib.experiment_meta(runs)
    setting = args.paper_setting or meta.get("paper_setting")
    if setting == "none":
        setting = None
    paper = runlib.load_paper(setting)
    if args.best_over:
        rows = best_rows(runs, args.best_over, runlib.label_order(meta), paper)
    else:
        rows = build_rows(runlib.group_runs(runs, runlib.label_order(meta)), paper)
    add_comparisons(rows)
    title = args.title or meta.get("name")

    outputs = []
    if args.format in ("md", "both"):
        outputs.append((".md", to_markdown(rows, paper, setting, title, args.best_over)))
    if args.format in ("latex", "both"):
        outputs.append((".tex", to_latex(rows, paper, setting, title, args.best_over)))
    for suffix, text in outputs:
        if args.out:
            dest = Path(args.out).with_suffix(suffix)
            dest.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(dest, text)
            print(f"wrote {dest}")
        else:
            print(text)
    return 0


if __name__ == "__main__":
    sys.exit(report_user_errors(main))
