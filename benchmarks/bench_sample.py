"""Sampling speed with and without the KV cache: batch 1, 256 new tokens, greedy.

    python benchmarks/bench_sample.py                      # tiny, 6x384 bytes, 6x384 GPT-2 vocab on the default device
    python benchmarks/bench_sample.py --device cuda --repeats 5 --norm geonorm

Without the cache every token re-encodes the whole context (quadratic in length); with it, each token
is one position (linear). The LM head runs on the last position only in both cases, so with GPT-2's
50k vocabulary it is a fixed per-token cost that bounds the gain. Also checks that both paths
produce the same tokens.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from common import report_user_errors
from model import GPT, GPTConfig
from model.generate import generate
from runtime import distributed as D

CASES = {  # name: (n_layer, n_head, n_embd, block_size, tokenizer vocab)
    "tiny": (4, 4, 128, 256, 257),            # configs/model/tiny.yaml, byte tokenizer
    "6x384-bytes": (6, 6, 384, 512, 257),
    "6x384-gpt2": (6, 6, 384, 512, 50257),
}


def timed(fn, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3, help="median of this many timed runs per path")
    p.add_argument("--norm", default="pre_ln")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="as train.precision")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = p.parse_args()
    if min(args.repeats, args.new_tokens) < 1:
        raise SystemExit(f"--repeats={args.repeats}, --new-tokens={args.new_tokens}: each must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    ctx = D.autocast(device, args.dtype)
    cache_dtype = None if args.dtype == "fp32" else D.PRECISIONS[args.dtype]
    print(f"# bench_sample: batch 1, {args.new_tokens} new tokens, greedy, norm={args.norm}, {device} {args.dtype}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    print("| model | vocab | block | cache tok/s | no-cache tok/s | speedup |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.cases.split(","):
        n_layer, n_head, n_embd, block, vocab = CASES[name]
        padded = -(-vocab // 64) * 64
        torch.manual_seed(0)
        model = GPT(GPTConfig(norm=args.norm, vocab_size=padded, block_size=block, n_layer=n_layer,
                              n_head=n_head, n_embd=n_embd)).to(device).eval()
        prompt = torch.zeros(1, 1, dtype=torch.long, device=device)
        new = args.new_tokens  # 1 + 256 tokens fit every case's block_size: no crop
        res, outs = {}, {}
        for use_cache in (True, False):
            def run(n=new):
                with ctx():
                    outs[use_cache] = generate(model, prompt, n, temperature=0, use_cache=use_cache,
                                               vocab_size=vocab, cache_dtype=cache_dtype)
            run(16)  # warm-up
            res[use_cache] = statistics.median(timed(run, device) for _ in range(args.repeats))
        same = torch.equal(outs[True], outs[False])
        tps = {k: new / v for k, v in res.items()}
        print(f"| {name} ({n_layer}x{n_embd}) | {vocab} | {block} | {tps[True]:.0f} | {tps[False]:.0f} | "
              f"{tps[True] / tps[False]:.1f}x{'' if same else ' (outputs differ!)'} |", flush=True)


if __name__ == "__main__":
    report_user_errors(main)  # a bad variant or option: one line
