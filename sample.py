"""Sample from a checkpoint with the KV cache.

    python sample.py runs/<run_name> --prompt "def fibonacci(n):" --num-samples 3 --max-new-tokens 200
    python sample.py runs/<run_name>/checkpoints/ckpt_00010000.pt --prompt-file prompt.txt --temperature 0.8 --top-k 200

The model is rebuilt from the config stored in the checkpoint. The prompt must fit in the model's
context (block_size); when prompt plus new tokens exceed it, generation continues on a cropped window
as nanoGPT does (see model/generate.py), and says so: with the default --crop-keep (the whole window)
every token past the context is a full forward pass of block_size tokens instead of one cached step.
A long generation (over PROGRESS_FROM tokens, or past the context) prints its progress on stderr; many
samples come in batches of --batch-size, each printed when done, with the count so far. An empty prompt
starts a new document (end-of-text token).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from common import ConfigError, report_user_errors
from common.config import seed_arg

PROGRESS_FROM = 2048  # new tokens from which a generation reports its progress


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("path", help="run directory (its newest checkpoint) or checkpoint file")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default="", help="prompt text (default: empty = start of a document)")
    src.add_argument("--prompt-file", default=None, help="read the prompt from this file")
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=16,
                   help="samples generated together; more samples come in batches, each printed when done")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=seed_arg, default=1337)
    p.add_argument("--crop-keep", type=int, default=None,
                   help="tokens kept when the context overflows block_size (default: block_size, as nanoGPT)")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole window every token (slow; for checks)")
    p.add_argument("--device", default="auto")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for torch (default: OMP_NUM_THREADS if set, else the cores not busy with other work)",
    )
    p.add_argument("--dtype", default="auto",
                   help="auto (bf16 on CUDA when supported, else fp32) | bf16 | fp16 | fp32, as train.precision")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from common.errors import set_interrupt_note

    set_interrupt_note("the samples printed so far are all there is")
    return report_user_errors(sample, args)  # bad input: one line and exit 2; bugs keep their traceback


def sample(args) -> int:
    import torch

    from runtime.distributed import init_distributed, set_cpu_threads
    from runtime.checkpoint import resolve_checkpoint
    from runtime.launch import PRECISION_CHOICES, precision_name

    if args.num_samples < 1:
        raise ConfigError(f"--num-samples={args.num_samples}: must be >= 1")
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size={args.batch_size}: must be >= 1")
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads={args.threads}: must be >= 1")
    if precision_name(args.dtype) is None:
        raise ConfigError(f"--dtype={args.dtype}: valid: {', '.join(PRECISION_CHOICES)}")
    prompt = args.prompt
    try:  # argv bytes that are not UTF-8 arrive as surrogates, which no tokenizer can encode
        prompt.encode("utf-8")
    except UnicodeEncodeError:
        raw = prompt.encode("utf-8", "surrogateescape")
        raise ConfigError(f"--prompt {raw!r} is not valid UTF-8 text: pass text, or a UTF-8 file with "
                          "--prompt-file") from None
    if args.prompt_file:
        try:
            prompt = Path(args.prompt_file).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"--prompt-file {args.prompt_file}: cannot read it ({type(e).__name__}: "
                              f"{getattr(e, 'strerror', None) or e}); give a UTF-8 text file") from None
    ckpt_path = resolve_checkpoint(args.path)
    rt = init_distributed(args.device, "device", args.dtype)
    _, before = set_cpu_threads(args.threads, rt.device)
    try:
        return _sample(args, prompt, ckpt_path, rt)
    finally:
        torch.set_num_threads(before)  # in-process callers get theirs back


def _sample(args, prompt: str, ckpt_path, rt) -> int:
    import torch

    from data import get_tokenizer
    from model.generate import check_generate_args, generate
    from runtime.checkpoint import load_model

    model, ckpt = load_model(ckpt_path, device=rt.device)
    tok = get_tokenizer(ckpt["tokenizer"])
    ids = tok.encode(prompt) if prompt else [tok.eot]
    block_size = model.config.block_size
    # validate before any work, with the prompt's length in tokens in the message
    check_generate_args(
        block_size, len(ids), args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.crop_keep
    )
    gen = torch.Generator(device=rt.device).manual_seed(args.seed)
    past = len(ids) + args.max_new_tokens - block_size
    if past > 0:
        keep = args.crop_keep or block_size
        every = "every token" if keep == block_size else f"once every {block_size - keep + 1} tokens"
        print(f"sample: {len(ids)} prompt + {args.max_new_tokens} new tokens exceed the context of {block_size}: "
              f"for the last {past}, the window is cropped to its last {keep} tokens and re-encoded {every} (a full "
              f"forward pass each time; a smaller --crop-keep re-encodes less often, with less context)",
              file=sys.stderr)
    t0 = time.perf_counter()
    long = args.max_new_tokens >= PROGRESS_FROM or past > 0
    done, n_new = 0, 0
    while done < args.num_samples:  # in batches: memory stays that of one, and each is printed when done
        n = min(args.batch_size, args.num_samples - done)
        idx = torch.tensor([ids] * n, dtype=torch.long, device=rt.device)
        progress = _progress(args.max_new_tokens, time.perf_counter()) if long else None
        with rt.autocast():
            out = generate(model, idx, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                           top_p=args.top_p, generator=gen, use_cache=not args.no_cache, crop_keep=args.crop_keep,
                           vocab_size=tok.vocab_size, cache_dtype=rt.cache_dtype, stop=progress)
        for row in out.tolist():  # the host copy waits for the device
            if done:
                print("-" * 40)
            print(tok.decode(row if prompt else row[1:]), flush=True)
            done += 1
        n_new = out.size(1) - idx.size(1)
        if done < args.num_samples:
            rate = done / max(time.perf_counter() - t0, 1e-9)
            print(f"sample: {done}/{args.num_samples} samples ({rate:.2f} samples/s, "
                  f"{(args.num_samples - done) / rate:.0f}s left)", file=sys.stderr, flush=True)
    dt = time.perf_counter() - t0
    print(f"sample: {args.num_samples} x {n_new} new tokens in {dt:.2f}s "
          f"({args.num_samples * n_new / max(dt, 1e-9):.1f} tokens/s, {'no cache' if args.no_cache else 'KV cache'}, "
          f"{rt.device}" + (f", {torch.get_num_threads()} threads" if rt.device.type == "cpu" else "")
          + f"; step {ckpt['step']} of {ckpt_path})", file=sys.stderr)
    return 0


PROGRESS_EVERY_S = 30.0  # a long generation says where it is at least this often


def _progress(total: int, t0: float, every_s: float = PROGRESS_EVERY_S):
    """A `stop` callback of generate() that never stops: a line on stderr at every tenth of `total`, and at
    least every `every_s` seconds (a tenth of 10^8 tokens is hours) (it does not read the tokens, so it adds no
    host sync; the clock is read every 64 tokens)."""
    done, last = [0], [t0]

    def tick(_idx) -> bool:
        done[0] += 1
        n = done[0]
        tenth = n % max(1, total // 10) == 0
        late = n % 64 == 0 and time.perf_counter() - last[0] >= every_s
        if (tenth or late) and n < total:
            last[0] = time.perf_counter()
            rate = n / max(time.perf_counter() - t0, 1e-9)
            print(f"sample: {n}/{total} new tokens ({rate:.1f} tokens/s per sample, {(total - n) / rate:.0f}s left)",
                  file=sys.stderr, flush=True)
        return False
    return tick


if __name__ == "__main__":
    sys.exit(main())
