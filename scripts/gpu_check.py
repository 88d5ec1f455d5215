"""GPU checks: what the CPU test suite cannot exercise. Run it first on a new GPU machine.

    bash scripts/gpu_check.sh                     # one GPU: < 10 minutes; two GPUs add an NCCL run
    python -m scripts.gpu_check --device cpu      # the same code on CPU, small (what the tests run)

(From the repository root; `-m` imports this checkout's packages.)

Checks (one table row each, PASS / FAIL / SKIP / OOM; --only picks some):
  compile/<variant>   bf16 autocast, torch.compile vs eager, every variant: 3 AdamW steps from the
                      same weights on the same batches, losses within 0.05
  neox/<variant>      the same for the GeoNorm configs' block (arch=neox) in fp16 with a GradScaler
  fused_adamw_skip    a NaN gradient: fused AdamW with found_inf leaves weights and state unchanged
  train_loop/<prec>   train.py's loop on the device in bf16 and in fp16 (GradScaler): compile, fused,
                      NaN skip, timing, resume
  nccl_2proc          torchrun with 2 processes on 2 GPUs (SKIP with fewer)
  ddp_accum_resume    2 GPUs, accumulation 2: equals 1 GPU at accumulation 4, and resumes exactly
  throughput          gpt_125m at block 1024: tokens/s and MFU of a bare compiled step
  family/<variant>    one variant per family at gpt_125m, block 1024: tokens/s and peak memory beside
                      Pre-LN's (the sphere variants' extra elementwise work is memory-bound)
  memory/<model>      peak memory of one training step per model preset at train.micro_batch_size
  smoke/<experiment>  50 steps of each paper experiment (its model, arch, precision, micro-batch, compile)
                      on a small offline sample (stdlib sources, GPT-2 BPE, data.max_docs): what a sweep would run
Exit status: 1 if any row is FAIL, else 0. OOM rows are reported, not failures. The last line counts
the graphs torch.compile built in this process (the smoke runs compile in their own).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from experiments.gpu_checks import CHECKS, ROOT, Ctx, _graphs_compiled


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) | cpu (a small dry run of the same code)")
    ap.add_argument("--only", default=None, help=f"comma-separated subset of {','.join(CHECKS)}")
    ap.add_argument("--variants", default=None, help="compile, neox and families checks: comma-separated variants "
                                                     "(default: every variant; neox: the GeoNorm table's; "
                                                     "families: those variants' rows, Pre-LN always)")
    ap.add_argument("--experiments", default=None, help="smoke check: comma-separated experiments "
                                                        "(default: every geonorm_* and spheret_* one)")
    ap.add_argument("--data-root", default=os.environ.get("NANONORM_DATA", str(ROOT / "data_cache")),
                    help="where train_loop prepares the offline pydocs corpus")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: error: torch sees no CUDA device (use --device cpu for a dry run)", file=sys.stderr)
        return 2
    ctx = Ctx(args.device)
    only = args.only.split(",") if args.only else list(CHECKS)
    unknown = [c for c in only if c not in CHECKS]
    if unknown:
        print(f"gpu_check: error: unknown check(s) {unknown}; valid: {', '.join(CHECKS)}", file=sys.stderr)
        return 2
    dev = torch.cuda.get_device_name(ctx.device) if ctx.cuda else "cpu"
    print(f"gpu_check: torch {torch.__version__}, device {dev}", flush=True)
    rows, t_start = [], time.time()
    for name in only:
        it = CHECKS[name](ctx, args)
        while True:
            t0 = time.time()
            try:
                row = next(it)
            except StopIteration:
                break
            except Exception as e:  # a crash is a failed row, and the other checks still run
                msg = " ".join(str(e).split())[:200]
                row = (name, "FAIL", f"{type(e).__name__}: {msg}", time.time() - t0)
                rows.append(row)
                print(f"  {row[0]:<28} {row[1]:<5} {row[2]}", flush=True)
                break
            rows.append(row)
            print(f"  {row[0]:<28} {row[1]:<5} {row[2]}", flush=True)
    w = max(len(r[0]) for r in rows)
    print(f"\n| {'check':<{w}} | result | seconds | detail |\n|{'-' * (w + 2)}|--------|---------|--------|")
    for n, status, detail, secs in rows:
        print(f"| {n:<{w}} | {status:<6} | {secs:7.1f} | {detail} |")
    failed = [r[0] for r in rows if r[1] == "FAIL"]
    graphs = _graphs_compiled()
    print(f"\n{len(rows)} checks in {time.time() - t_start:.0f} s, {graphs} graph(s) compiled in this process: "
          + (f"{len(failed)} FAILED ({', '.join(failed)})" if failed else "no failures"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
