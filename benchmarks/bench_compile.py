"""torch.compile time of variants against pre_ln's, each compile in a fresh process with inductor's caches off.

    python benchmarks/bench_compile.py                          # mhc hc; 12 layers d=64 T=64 batch 2, CPU
    python benchmarks/bench_compile.py --variants mhc ngpt --repeats 2 --autocast   # bf16 autocast (GPU's path)

A compile is timed as the first forward+backward of a fresh model under torch.compile (inductor), in wall
seconds and in CPU seconds (the process's and its C++ compiler's, inductor compiling in-process:
`TORCHINDUCTOR_COMPILE_THREADS=1`). On a busy machine the wall time swings with the load and the CPU time
much less, so the ratio is taken from CPU time. Each process first compiles a one-layer pre_ln, so the
one-time start-up (imports, inductor's set-up) is paid before the timed compile and is not charged to
whichever variant a process compiles first. Each repeat runs pre_ln and the variant in alternating order,
the ratio is taken per repeat, then the median. "nodes" counts the torch-level graph dynamo hands to
inductor (forward only); "graphs" is how many dynamo made (1: no graph break).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from common import report_user_errors


def one(args) -> dict:
    """In this (fresh) process: pay the start-up on a one-layer pre_ln, then time the variant's compile."""
    import torch
    from torch._inductor.compile_fx import compile_fx

    from model import GPT
    from model.config import from_spec
    torch.set_num_threads(args.threads)
    stats = {"nodes": 0, "graphs": 0}

    def counting(gm, example_inputs):
        stats["nodes"] += len(gm.graph.nodes)
        stats["graphs"] += 1
        return compile_fx(gm, example_inputs)

    def first_step(spec, n_layer, count):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = GPT(from_spec(spec, {}, vocab_size=args.vocab, block_size=args.seq, n_layer=n_layer,
                              n_head=args.n_head, n_embd=args.n_embd))
        run = torch.compile(model, backend=counting if count else "inductor")
        x = torch.randint(0, args.vocab, (args.batch, args.seq))
        t0 = time.perf_counter()
        with torch.autocast("cpu", torch.bfloat16, enabled=args.autocast):
            _, loss = run(x, x)
        loss.backward()
        return time.perf_counter() - t0

    first_step("pre_ln", 1, count=False)
    cpu0 = cpu_seconds()
    wall = first_step(args.one, args.n_layer, count=True)
    return {"compile_s": wall, "compile_cpu_s": cpu_seconds() - cpu0, **stats}


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the C++ compiler)."""
    import resource
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def spawn(spec: str, args) -> dict:
    cmd = [sys.executable, __file__, "--one", spec, "--n-layer", str(args.n_layer), "--n-embd", str(args.n_embd),
           "--n-head", str(args.n_head), "--seq", str(args.seq), "--batch", str(args.batch),
           "--vocab", str(args.vocab), "--threads", str(args.threads)] + (["--autocast"] if args.autocast else [])
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1", "TORCHINDUCTOR_CACHE_DIR": cache,
               "TORCHINDUCTOR_COMPILE_THREADS": "1"}
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"bench_compile.py: compiling {spec!r} failed: {tail}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="*", default=["mhc", "hc"], help="rows, name[:key=value,...]")
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--n-embd", type=int, default=64)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--threads", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--autocast", action="store_true", help="bf16 autocast, the path a GPU run compiles")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args)))
        return
    if args.repeats < 1:
        raise SystemExit(f"bench_compile.py: --repeats={args.repeats}: need at least 1")
    from model.config import from_spec
    for spec in args.variants:  # a bad row: one line before anything compiles
        from_spec(spec, {}, vocab_size=args.vocab, block_size=args.seq, n_layer=args.n_layer, n_head=args.n_head,
                  n_embd=args.n_embd)
    print(f"# {args.n_layer} layers, d={args.n_embd}, T={args.seq}, batch {args.batch}, {args.threads} threads, "
          f"{'bf16 autocast' if args.autocast else 'float32'}, {args.repeats} repeat(s), fresh process per compile")
    print("| variant | compile CPU s | pre_ln CPU s | ratio (CPU) | wall s | pre_ln wall s | nodes | pre_ln nodes "
          "| graphs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for spec in args.variants:
        rows = []
        for i in range(args.repeats):
            order = [spec, "pre_ln"] if i % 2 == 0 else ["pre_ln", spec]
            got = {s: spawn(s, args) for s in order}
            rows.append((got[spec], got["pre_ln"]))
        ratio = statistics.median(v["compile_cpu_s"] / b["compile_cpu_s"] for v, b in rows)
        v, b = rows[-1]

        def med(i, key):
            return statistics.median(r[i][key] for r in rows)

        print(f"| {spec} | {med(0, 'compile_cpu_s'):.1f} | {med(1, 'compile_cpu_s'):.1f} | {ratio:.2f} | "
              f"{med(0, 'compile_s'):.1f} | {med(1, 'compile_s'):.1f} | {v['nodes']} | {b['nodes']} | "
              f"{v['graphs']} |", flush=True)


if __name__ == "__main__":
    report_user_errors(main)  # a bad variant or option: one line
