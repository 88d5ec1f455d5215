"""The widened stream's two mixing forms (model/variants/streams.py) against Pre-LN, eager, side by side.

    python benchmarks/bench_stream_mixing.py                       # mhc, 6 layers d=384 T=256, batch 8
    python benchmarks/bench_stream_mixing.py --variant hc --batch 4 --repeats 11

hc and mHC read and mix their n copies of the stream with einsum contractions where autocast is off, and
with broadcast products under autocast (which keep the stream in float32). This times both forms of one
model, selected by what `torch.is_autocast_enabled` answers, interleaved with Pre-LN's step (a shared
machine's speed drifts): forward + backward, median over repeats after the first.
"""
from __future__ import annotations

import argparse
import statistics

import torch

from bench_variants import step, timed   # the same forward + backward and its timer as every variant's row
from model import GPT, GPTConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", default="mhc", choices=["hc", "mhc"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.manual_seed(0)
    shape = dict(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=256)
    models = {v: GPT(GPTConfig(**shape, norm={"name": v})) for v in ("pre_ln", args.variant)}
    x, y = (torch.randint(0, 256, (args.batch, 256)) for _ in range(2))
    real = torch.is_autocast_enabled
    times = {"pre_ln": [], "broadcast": [], "einsum": []}
    try:
        for _ in range(args.repeats):
            torch.is_autocast_enabled = real
            times["pre_ln"].append(timed(lambda: step(models["pre_ln"], x, y)))
            for form, autocast in (("broadcast", True), ("einsum", False)):
                torch.is_autocast_enabled = lambda *a, on=autocast: on
                times[form].append(timed(lambda: step(models[args.variant], x, y)))
    finally:
        torch.is_autocast_enabled = real
    med = {k: statistics.median(v[1:]) for k, v in times.items()}
    print(f"# {args.variant}, {shape['n_layer']} layers d={shape['n_embd']} T=256 batch {args.batch}, eager, "
          f"{torch.get_num_threads()} threads, {args.repeats} interleaved repeats")
    print("| form | ms/step | / Pre-LN |\n|---|---|---|")
    for form in ("broadcast", "einsum"):
        print(f"| {form} | {med[form] * 1e3:.0f} | {med[form] / med['pre_ln']:.3f} |")
    print(f"| (pre_ln) | {med['pre_ln'] * 1e3:.0f} | 1 |")


if __name__ == "__main__":
    main()
