"""Step time and activation memory of every variant relative to pre_ln.

    python benchmarks/bench_variants.py                 # eager, CPU, 6 layers d=384 T=256 batch 8 vocab 256
    python benchmarks/bench_variants.py --compile       # also torch.compile'd, with each first call's time
    python benchmarks/bench_variants.py --variants geonorm proj_spheret --repeats 15
    python benchmarks/bench_variants.py --arch llama --variants pre_ln ngpt   # on a preset (configs/arch/)
    python benchmarks/bench_variants.py --compile --threads 1 --n-layer 4 --n-embd 64 --n-head 2 --batch 4 \
        --variants geonorm hc          # the horizon studies' shape: compiled against eager, per variant
    python benchmarks/bench_variants.py --variants pre_ln:attn_gate=headwise hc:dynamic=true   # name:key=value,...

Time: median of forward+backward over interleaved repeats (variant, pre_ln, pre_ln, variant, ...)
after warm-up, since a shared machine's speed drifts by several percent; the ratio is taken per
pair, then the median of the ratios. Memory: bytes saved for backward, counted with
torch.autograd.graph.saved_tensors_hooks, each storage once (a tensor saved by two ops is one
allocation), parameters excluded: exact and comparable within one process.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import yaml

from common import report_user_errors
from model import GPT, VARIANTS
from model.config import from_spec


def saved_bytes(model, x, y) -> int:
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _, loss = model(x, y)
    del loss
    return sum(seen.values())


def arch_preset(name: str) -> dict:
    """The GPTConfig fields and the norm keys a configs/arch/<name>.yaml preset sets (its model.* axes
    and norm.kind)."""
    path = Path(__file__).resolve().parents[1] / "configs" / "arch" / f"{name}.yaml"
    if not path.is_file():
        valid = ", ".join(sorted(p.stem for p in path.parent.glob("*.yaml")))
        raise SystemExit(f"bench_variants.py: unknown --arch {name!r}: valid are {valid}")
    cfg = yaml.safe_load(path.read_text())
    kw = {k: v for k, v in cfg["model"].items() if k != "arch"}
    return kw, {k: v for k, v in cfg.get("norm", {}).items() if k == "kind"}


def step(model, x, y):
    _, loss = model(x, y)
    loss.backward()
    model.zero_grad(set_to_none=True)


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def interleaved(models, x, y, repeats: int):
    """Step times of each model over `repeats` rounds in rotating order (a shared machine's speed drifts, and
    no model always runs right after another): one list per model."""
    out = [[] for _ in models]
    for i in range(repeats):
        k = i % len(models)
        for j in list(range(k, len(models))) + list(range(k)):
            out[j].append(timed(lambda: step(models[j], x, y)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="*", default=[*(v for v in VARIANTS if v != "pre_ln"),
                                                      "attnres:blocks=2", "pre_ln:kind=seednorm",
                                                      "pre_ln:value_residual=true", "pre_ln:prores_steps=100"])
    ap.add_argument("--n-layer", type=int, default=6)
    ap.add_argument("--n-embd", type=int, default=384)
    ap.add_argument("--n-head", type=int, default=6)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile'd models")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's); a study runs 1")
    ap.add_argument("--arch", default="gpt2", help="architecture preset, a file of configs/arch/ (default gpt2)")
    args = ap.parse_args()
    if args.repeats < 1 or args.warmup < 0:
        raise SystemExit(f"--repeats={args.repeats}, --warmup={args.warmup}: need repeats >= 1, warmup >= 0")
    arch_kw, arch_norm = arch_preset(args.arch)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    def config(spec):
        """A row `name[:key=value,...]`: model keys (GPTConfig fields) and the variant's norm.* keys."""
        return from_spec(spec, arch_norm, vocab_size=args.vocab, block_size=args.seq, n_layer=args.n_layer,
                         n_head=args.n_head, n_embd=args.n_embd, **arch_kw)

    def build(spec):
        torch.manual_seed(0)
        return GPT(config(spec))

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    y = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    modes = ["eager"] + (["compiled"] if args.compile else [])
    # Every row compiles GPT.forward again (another model, other guards): past dynamo's limit of 8 a row would
    # silently run eager, so the limit grows with the rows.
    dyn = torch._dynamo.config
    limit = "recompile_limit" if hasattr(dyn, "recompile_limit") else "cache_size_limit"  # its older name
    setattr(dyn, limit, max(getattr(dyn, limit), 2 * len(args.variants) + 2))
    args.variants = [v for v in args.variants if v != "pre_ln"]  # the baseline every row is measured against
    for spec in args.variants:
        config(spec)  # a bad row: one line before the table starts
    print(
        f"# arch={args.arch}: {args.n_layer} layers, d={args.n_embd}, T={args.seq}, batch {args.batch}, "
        f"vocab {args.vocab}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.repeats} interleaved repeats"
    )
    print("| variant | mode | time ratio | ms/step | pre_ln ms | saved MiB | memory ratio | first call s "
          "| compiled / eager |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = build("pre_ln")
    base_mem = saved_bytes(base, x, y)
    ref_first = None
    for mode in modes:
        ref = torch.compile(base) if mode == "compiled" else base
        if mode == "compiled":  # pre_ln's compile first, so the one-time start-up cost is the baseline's
            ref_first = timed(lambda: step(ref, x, y))
        for name in args.variants:
            model = build(name)
            mem = saved_bytes(model, x, y)
            run = torch.compile(model) if mode == "compiled" else model
            first_call = timed(lambda: step(run, x, y)) if mode == "compiled" else None   # compile time, mostly
            # compiled rows also time the same variant eager, interleaved: what compiling buys that variant
            models = [run, ref] + ([model] if mode == "compiled" else [])
            for _ in range(args.warmup):
                for m in models:
                    step(m, x, y)
            ts, tb, *te = interleaved(models, x, y, args.repeats)
            ratio = statistics.median(a / b for a, b in zip(ts, tb))
            vs_eager = f"{statistics.median(a / b for a, b in zip(ts, te[0])):.3f}" if te else "—"
            print(f"| {name} | {mode} | {ratio:.3f} | {1e3 * statistics.median(ts):.1f} | "
                  f"{1e3 * statistics.median(tb):.1f} | {mem / 2**20:.1f} | {mem / base_mem:.3f} | "
                  f"{'—' if first_call is None else f'{first_call:.1f}'} | {vs_eager} |", flush=True)
        if mode == "compiled":  # pre_ln's own compiled / eager, interleaved the same way
            tc, te = interleaved([ref, base], x, y, args.repeats)
            ref_vs_eager = statistics.median(a / b for a, b in zip(tc, te))
    print(f"pre_ln saved for backward: {base_mem / 2**20:.1f} MiB"
          + ("" if ref_first is None else f"; pre_ln's first compiled call {ref_first:.1f} s, its compiled step "
             f"{ref_vs_eager:.3f} of its eager step"))


if __name__ == "__main__":
    report_user_errors(main)  # a bad variant or option: one line
