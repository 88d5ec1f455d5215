"""Tokenization throughput and peak memory: data/prepare.py vs nanoGPT's prepare.py recipe.

    python benchmarks/bench_data.py                 # corpora of 50 and 100 MB (repeated pydocs), GPT-2 BPE
    python benchmarks/bench_data.py --sizes 50 --workers 8

Both methods read the same JSONL file through `datasets` and tokenize with the same GPT-2 BPE:
- baseline (nanoGPT data/openwebtext/prepare.py): load_dataset -> Dataset.map(encode_ordinary per document,
  append eot, num_proc=cores) -> concatenate every document into one .bin with a memmap.
- ours: prepare_dataset (batched worker processes, ordered streaming into fixed-size shards).
Each run is a fresh subprocess; peak RSS is ru_maxrss of the main process and the largest of its
children (forked workers share pages with the parent, so the sum would overcount). Our memory is
bounded by one shard buffer per split (--shard-size), not by the corpus: compare the two sizes.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_corpus(path: Path, mb: int) -> int:
    from data.sources import pydocs_documents
    docs = pydocs_documents()
    size, n, rep = 0, 0, 0
    with open(path, "w") as f:
        while size < mb * 1_000_000:
            for d in docs:
                line = json.dumps({"text": d if rep == 0 else f"[{rep}] {d}"}) + "\n"
                f.write(line)
                size += len(d.encode())
                n += 1
            rep += 1
    return n


def peak_mb() -> dict:
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"peak_rss_main_mb": round(self_kb / 1024, 1), "peak_rss_child_mb": round(kids_kb / 1024, 1)}


def run_ours(corpus: str, work: str, workers: int, shard_size: int) -> dict:
    from data import prepare_dataset
    cfg = dict(name="bench", tokenizer="gpt2", root=work, source="local", files=[corpus], streaming=True,
               num_workers=workers, shard_size=shard_size, val_fraction=0.0005, cache_dir=work + "/hf")
    t = time.perf_counter()
    out = prepare_dataset(cfg, progress=False)
    dt = time.perf_counter() - t
    meta = json.loads((out / "meta.json").read_text())
    tokens = sum(s["tokens"] for s in meta["splits"].values())
    return {"seconds": dt, "tokens": tokens, **peak_mb()}


def run_baseline(corpus: str, work: str, workers: int) -> dict:
    # nanoGPT data/openwebtext/prepare.py, minus its train/val split (which would only add time)
    import numpy as np
    from datasets import load_dataset
    from data import get_tokenizer
    enc = get_tokenizer("gpt2").enc

    def process(example):
        ids = enc.encode_ordinary(example["text"])
        ids.append(enc.eot_token)
        return {"ids": ids, "len": len(ids)}

    t = time.perf_counter()
    ds = load_dataset("json", data_files=corpus, split="train", cache_dir=work + "/hf")
    tokenized = ds.map(process, remove_columns=["text"], desc="tokenizing", num_proc=workers)
    arr_len = int(np.sum(tokenized["len"], dtype=np.uint64))
    arr = np.memmap(os.path.join(work, "train.bin"), dtype=np.uint16, mode="w+", shape=(arr_len,))
    total_batches = min(1024, len(tokenized))  # Dataset.shard cannot make more shards than rows
    idx = 0
    for batch_idx in range(total_batches):
        batch = tokenized.shard(num_shards=total_batches, index=batch_idx, contiguous=True).with_format("numpy")
        arr_batch = np.concatenate(batch["ids"])
        arr[idx: idx + len(arr_batch)] = arr_batch
        idx += len(arr_batch)
    arr.flush()
    dt = time.perf_counter() - t
    return {"seconds": dt, "tokens": arr_len, **peak_mb()}


def child(args) -> None:
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    fn = run_ours if args.method == "ours" else run_baseline
    kw = {"shard_size": args.shard_size} if args.method == "ours" else {}
    print("RESULT " + json.dumps(fn(args.corpus, args.work, args.workers, **kw)), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="50,100", help="corpus sizes in MB of text, comma separated")
    ap.add_argument("--workers", type=int, default=os.cpu_count(), help="processes for both methods")
    ap.add_argument("--shard-size", type=int, default=10_000_000, help="our tokens per shard")
    ap.add_argument("--methods", default="baseline,ours")
    ap.add_argument("--repeat", type=int, default=2, help="runs per method and size, interleaved; best kept "
                    "(the reference machine is shared, so the best run is the least disturbed)")
    ap.add_argument("--method", help=argparse.SUPPRESS)
    ap.add_argument("--corpus", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.method:
        return child(args)
    print(f"cores={os.cpu_count()} workers={args.workers} shard_size={args.shard_size:,} tokens "
          f"python={sys.version.split()[0]}")
    tmp = Path(tempfile.mkdtemp(prefix="bench_data_"))
    try:
        rows = []
        for mb in (int(s) for s in args.sizes.split(",")):
            corpus = tmp / f"corpus_{mb}mb.jsonl"
            ndocs = make_corpus(corpus, mb)
            best = {}
            for method in [m for _ in range(args.repeat) for m in args.methods.split(",")]:
                work = tmp / f"{method}_{mb}"
                work.mkdir()
                r = subprocess.run([sys.executable, __file__, "--method", method, "--corpus", str(corpus),
                                    "--work", str(work), "--workers", str(args.workers),
                                    "--shard-size", str(args.shard_size)],
                                   capture_output=True, text=True, cwd=ROOT)
                line = [s for s in r.stdout.splitlines() if s.startswith("RESULT ")]
                if r.returncode or not line:
                    sys.exit(f"{method} failed:\n{r.stderr[-3000:]}")
                res = json.loads(line[0][7:])
                res.update(method=method, mb=mb, docs=ndocs, tok_per_s=res["tokens"] / res["seconds"])
                if method not in best or res["seconds"] < best[method]["seconds"]:
                    best[method] = res
                print(f"{mb:>5} MB {method:>8}: {res['tokens']:>12,} tokens {res['seconds']:7.1f} s "
                      f"{res['tok_per_s'] / 1e6:6.2f} M tok/s  peak RSS main {res['peak_rss_main_mb']:7.1f} MB, "
                      f"largest child {res['peak_rss_child_mb']:7.1f} MB", flush=True)
                shutil.rmtree(work, ignore_errors=True)
            rows += best.values()
            corpus.unlink()
        print(f"best of {args.repeat}:")
        for r in rows:
            print(f"{r['mb']:>5} MB {r['method']:>8}: {r['tok_per_s'] / 1e6:6.2f} M tok/s, peak RSS main "
                  f"{r['peak_rss_main_mb']:.0f} MB, largest child {r['peak_rss_child_mb']:.0f} MB")
        for mb in sorted({r["mb"] for r in rows}):
            by = {r["method"]: r for r in rows if r["mb"] == mb}
            if {"ours", "baseline"} <= set(by):
                print(
                    f"{mb} MB: ours / baseline throughput = "
                    f"{by['ours']['tok_per_s'] / by['baseline']['tok_per_s']:.2f}x"
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
