"""How stiff is each variant at init? The step-0 geometry and the effect of one optimizer step, per cell.

    python scripts/step_scale.py                                   # the default cells, tiny model, pydocs
    python scripts/step_scale.py --cell pre_ln=norm=pre_ln --cell a32=norm=proj_spheret,norm.alpha_init=32
    python scripts/step_scale.py --lr 1e-3 --random -- model=gpt_125m data.tokenizer=gpt2   # any size, no data

For each cell (a label and its Hydra overrides, on top of the common overrides after `--`): build the
model as train.py would (same seed, init, optimizer and parameter groups), measure on one fixed batch
(the first training batch, or uniform random tokens with `--random`) the stream geometry at step 0
(model/geometry.py: effective angle per sublayer, relative update, ||F||/||h||), then take ONE
optimizer step at the peak lr (`--lr`, default optim.lr; no warmup) and report how far it moved the
logits on the same batch (RMS of the change) and the loss. Seconds per cell on a CPU for the tiny model.
"""
from __future__ import annotations

import argparse
import sys

from experiments.step_scale import DEFAULT_CELLS, measure, table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cell", action="append", metavar="LABEL=OVERRIDES",
                    help="a cell: label=key=value,key=value (repeatable); default: " + ", ".join(DEFAULT_CELLS))
    ap.add_argument("--lr", type=float, help="the step's lr (default: optim.lr of the config)")
    ap.add_argument("--random", action="store_true", help="uniform random tokens instead of the first training batch")
    ap.add_argument("--batch", type=int, help="sequences measured (default: train.micro_batch_size, capped so that "
                                              "the logits stay under 1 GiB)")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    if args.lr is not None and not 0 < args.lr < float("inf"):
        raise SystemExit(f"bad --lr {args.lr}: must be a finite number > 0")
    if args.batch is not None and args.batch < 1:
        raise SystemExit(f"bad --batch {args.batch}: must be >= 1")
    common = argv[cut + 1:] or ["experiment=fidelity"]
    cells = DEFAULT_CELLS
    if args.cell:
        cells = {}
        for c in args.cell:
            label, sep, ovr = c.partition("=")
            if not sep or not ovr:
                raise SystemExit(f"bad --cell {c!r}: write LABEL=key=value[,key=value...]")
            cells[label] = ovr
    from common import UserError

    import time

    results, t_all = {}, time.time()
    for i, (label, ovr) in enumerate(cells.items()):
        t0 = time.time()
        print(f"# [{i + 1}/{len(cells)}] {label}: building the model and measuring ...", file=sys.stderr, flush=True)
        try:
            results[label] = measure([*common, *ovr.split(",")], args.lr, args.random, args.batch)
        except UserError as e:
            raise SystemExit(f"cell {label}: {e}") from None
        print(f"# [{i + 1}/{len(cells)}] {label}: done in {time.time() - t0:.1f} s ({time.time() - t_all:.0f} s in "
              "all)", file=sys.stderr, flush=True)
    shapes = sorted({r["batch"] for r in results.values()})
    print(f"common overrides: {' '.join(common)}; measured batch (sequences x tokens): "
          + ", ".join(f"{b} x {t}" for b, t in shapes))
    print(table(results))
    return 0


if __name__ == "__main__":
    from common import report_user_errors

    sys.exit(report_user_errors(main))
