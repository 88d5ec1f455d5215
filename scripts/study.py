"""Run a study: studies/<name>/study.yaml, part by part, then its report (experiments/study.py says what a
study file holds and what each part kind runs).

    python scripts/study.py step_scale                   # every part in order, then the report
    python scripts/study.py step_scale --part trend      # one part (the parts before it must have run)
    python scripts/study.py step_scale --report          # tables and figures from whatever has finished
    python scripts/study.py step_scale --list            # its parts and cells, what each part would start from
    python scripts/study.py step_scale -- train.max_steps=8   # any Hydra override, every run (a quick check)
    python scripts/study.py step_scale --experiment <name> --cells pre_ln,proj_spheret-a32 --jobs 8
                                                         # the same study on another setting (GPU users)
With another experiment (`--experiment`) or any override, runs and tables go to runs/<study>-custom and its
docs/, apart from the study's own runs (which would skip them as finished points) and docs/<study>/.
Studies: axes, cpu_study, fidelity, horizon, horizon16, methods, step_scale (docs/experiments.md).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import children
from experiments.study import Runner, Study, check_setting, report, run_parts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study", help="configs/study/<name>.yaml (or a path to a study file)")
    ap.add_argument("--part", help="run only this part (default: every part in order, then the report)")
    ap.add_argument("--report", action="store_true", help="only the report, from whatever has finished")
    ap.add_argument("--list", action="store_true", help="print the parts and cells, run nothing")
    ap.add_argument(
        "--runs-root",
        type=Path,
        help="default runs; with another experiment (--experiment) or overrides after --: runs/<study>-custom",
    )
    ap.add_argument("--docs", type=Path, help="where the report and the recorded bests go, <docs>/<study>/* "
                    "(default docs; with another experiment or overrides: <runs-root>/docs)")
    ap.add_argument("--jobs", type=int, default=2, help="runs at once (one thread each)")
    ap.add_argument("--gpus", help="GPU ids the runs are packed onto, one per run (default: CUDA_VISIBLE_DEVICES, else "
                    "every GPU); --jobs may not exceed them unless --oversubscribe")
    ap.add_argument("--oversubscribe", action="store_true", help="let --jobs exceed the GPUs")
    ap.add_argument("--cells", help="comma list: only these cells (a partial study)")
    ap.add_argument("--shapes", help="shapes parts: comma list of shape labels (default all, cheapest first)")
    ap.add_argument("--experiment", help="the experiment every run starts from (default: the study's)")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # Hydra overrides for every run follow `--`
    args = ap.parse_args(argv[:cut])
    if args.jobs < 1:
        raise SystemExit(f"--jobs={args.jobs}: must be >= 1")
    args.overrides = argv[cut + 1:]
    study = Study.load(args.study)
    if args.overrides or args.experiment not in (None, study.experiment):
        # runs unlike the study file's (a quick check, another setting): kept apart from its runs and docs/
        args.runs_root = args.runs_root or Path("runs") / f"{study.name}-custom"
        args.docs = args.docs or args.runs_root / "docs"
        print(f"experiment={args.experiment or study.experiment} {' '.join(args.overrides)}: runs under "
              f"{args.runs_root}, tables under {args.docs}")
    args.runs_root, args.docs = args.runs_root or Path("runs"), args.docs or Path("docs")
    args.experiment = args.experiment or study.experiment
    args.cells = args.cells.split(",") if args.cells else list(study.cells)
    unknown = [c for c in args.cells if c not in study.cells]
    if unknown:
        raise SystemExit(f"unknown --cells {', '.join(unknown)}: valid are {', '.join(study.cells)}")
    args.shapes = args.shapes.split(",") if args.shapes else None
    parts = [study.part(args.part)] if args.part else [] if args.report else study.parts
    if not args.report:
        check_setting(study, args)
    if args.list:
        for p in study.parts:
            where = f"sweep {study.sweep_of(p)}" if study.sweep_of(p) else f"scripts/{p['script']}.py"
            print(f"{p['name']:<8} {p['kind']:<7} {where}" + (f", from {p['of']}" if "of" in p else ""))
        print("cells: " + ", ".join(study.cells))
        return 0
    runner = Runner(study, args)
    with children.forwarding():  # Ctrl-C / SIGTERM: every running train.py checkpoints; rerun to resume
        run_parts(runner, parts, args)
    if not args.part:
        report(study, args.runs_root, args.docs, args.experiment)
    return 0


if __name__ == "__main__":
    from common import report_user_errors

    sys.exit(report_user_errors(main))
