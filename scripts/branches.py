"""Many horizons for the price of one: a constant-lr trunk and a WSD cooldown branch at each horizon
(experiments/branches.py says why a branch is the direct run of its horizon, bitwise).

    python scripts/branches.py --horizons 250,1000,4000 --out runs/hz/pre_ln -- norm=pre_ln optim.lr=3e-3
    python scripts/branches.py --horizons 250,1000,4000 --out runs/hz/pre_ln --dry-run -- ...   # the plan

Layout under --out: trunk/, h<H>/ per shorter horizon, horizons.json (per horizon: steps, tokens, final
validation loss, run dir, training seconds). Rerunning resumes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from experiments.branches import branch_args, cost, plan, run, trunk_args


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--horizons", required=True, help="comma list of run lengths in optimizer steps")
    ap.add_argument("--decay-frac", type=float, default=0.2, help="the cooldown's fraction of each horizon")
    ap.add_argument("--out", type=Path, required=True, help="the directory of the trunk and its branches")
    ap.add_argument("--dry-run", action="store_true", help="print the train.py commands, run nothing")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    overrides = argv[cut + 1:]
    try:
        horizons = [int(float(h)) for h in args.horizons.split(",")]
    except ValueError:
        raise SystemExit(
            f"--horizons {args.horizons!r}: give a comma list of step counts, e.g. 250,1000,4000"
        ) from None
    warmup = next((int(o.split("=", 1)[1]) for o in overrides if o.startswith("optim.warmup_steps=")), 0)
    p = plan(horizons, args.decay_frac, warmup)
    print(
        f"trunk of {p['trunk']} steps, branches at "
        + (", ".join(f"h{h} from step {s}" for h, s in p["branches"].items()) or "none")
        + f"; cost {cost(p):.2f}x the longest run"
    )
    if args.dry_run:
        print("$ python train.py", " ".join([*overrides, *trunk_args(p, args.decay_frac, args.out)]))
        for h, s in p["branches"].items():
            print("$ python train.py", " ".join([*overrides, *branch_args(h, s, args.decay_frac, args.out)]))
        return 0
    try:
        result = run(args.out, horizons, args.decay_frac, overrides, warmup)
    except RuntimeError as e:
        raise SystemExit(str(e)) from None
    for h, row in result["horizons"].items():
        print(f"h{h}: {row['tokens']:,} tokens, final val loss {row['final_val_loss']:.4f} ({row['run_dir']})")
    return 0


if __name__ == "__main__":
    from common import report_user_errors
    from common.errors import set_interrupt_note

    set_interrupt_note("the running train.py saved a checkpoint; rerun the same command to resume the trunk and "
                       "its branches")
    sys.exit(report_user_errors(main))
