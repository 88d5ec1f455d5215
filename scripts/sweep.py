"""Run a grid of training runs: variants x seeds x any other override, one train.py job per point.

    python scripts/sweep.py --experiment geonorm_125m_books3_512 --nproc 8           # local, in turn
    python scripts/sweep.py --experiment cpu_study --seeds 0,1 --dry-run             # print commands
    python scripts/sweep.py --experiment fidelity --grid optim.lr=3e-4,1e-3,3e-3 --jobs 2 -- train.threads=1
    python scripts/sweep.py --name lr_scan --grid norm=pre_ln,geonorm optim.lr=3e-4,6e-4,1e-3 \
        -- model=tiny train.max_steps=200                                            # fixed overrides after --
    python scripts/sweep.py --experiment spheret_fineweb_edu_24l --nproc 8 --slurm [--submit]

Points come from the experiment file's `experiment_meta` (`variants` or labelled `points`, and
`seeds`), or from `--points FILE.yaml` (label -> {key: value}); `--grid key=v1,v2` adds an axis (a
`norm` or `train.seed` axis replaces the experiment's). `--jobs N` runs N points at once (CPU studies:
add `train.threads=1` so they do not oversubscribe the cores); on GPUs each point gets its own `--nproc` of
them (CUDA_VISIBLE_DEVICES, or `--gpus 0,1,...`), and `--jobs` may not exceed what they hold. Ctrl-C or
SIGTERM tells the running points to checkpoint and waits for them; a point never outlives the sweep.
Each point runs in `<runs-root>/<sweep>/<label>-s<seed>` with wandb group `<sweep>`; a point whose
metrics.jsonl ends with a `summary` line is skipped, any other is (re)started with train.resume=auto,
which resumes from its latest checkpoint (or starts over, if the point died before its first one).
`<runs-root>/<sweep>/sweep.json` records each point's
label, seed and overrides, which plot_curves.py and make_table.py use to group runs, and the fixed
overrides and experiment: a sweep dir holding runs made with others is refused, not mixed in.
"""
from __future__ import annotations

import sys

from experiments.sweep import parser, run


def main(argv: list[str] | None = None) -> int:
    return run(parser(__doc__).parse_args(argv))


if __name__ == "__main__":
    from common import report_user_errors

    sys.exit(report_user_errors(main))
