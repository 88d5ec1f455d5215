"""Evaluate a checkpoint: loss/perplexity on a prepared split and zero-shot lm-eval benchmarks.

    python eval.py runs/<run_name>                       # newest checkpoint of a run
    python eval.py runs/<run_name>/checkpoints/ckpt_00010000.pt --tasks piqa,arc_easy --limit 500
    torchrun --standalone --nproc_per_node=8 eval.py runs/<run_name>   # split across ranks

The model is rebuilt from the config stored in the checkpoint. Defaults: evaluation/config.py (EvalConfig)
(every key is a flag). Writes a JSON file with every metric, prints a markdown table, and logs to the
run's wandb run when the checkpoint names one.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from common import report_user_errors
from data.files import read_json


def run_dir_of(ckpt_path: Path):
    return ckpt_path.parent.parent if ckpt_path.parent.name == "checkpoints" else None


def default_out(ckpt_path: Path, step: int) -> Path:
    rd = run_dir_of(ckpt_path)
    return rd / "eval" / f"eval_{step:08d}.json" if rd else ckpt_path.with_suffix(".eval.json")


def resolve_data_dir(cfg, ckpt: dict, rt) -> Path:
    """The checkpoint's prepared data dir; prepared again from the run's data config when missing."""
    from evaluation.config import EvalConfigError

    if cfg.data_dir is not None:
        d = Path(cfg.data_dir)
    else:
        d = Path(ckpt.get("data_dir") or "")
        data_cfg = (ckpt.get("config") or {}).get("data")
        if not (d / "meta.json").is_file() and data_cfg:
            from data import prepare_dataset
            from runtime.distributed import main_first

            # rank 0 prepares, the others wait (gloo, long timeout: not NCCL's watchdog) and find it
            d = Path(main_first(lambda: prepare_dataset(data_cfg)))
    meta = d / "meta.json"
    if meta.is_file():
        tok = read_json(meta).get("tokenizer")
        if tok is not None and tok != ckpt["tokenizer"]:
            raise EvalConfigError(f"data dir {d} is tokenized with {tok!r} but the checkpoint's model uses "
                             f"{ckpt['tokenizer']!r}; pass --data-dir of a split prepared with {ckpt['tokenizer']!r}")
    if rt.is_main and d.is_dir():  # sha256 and token ids of the split's shards (once per shard, recorded)
        from data import check_data_dir, get_tokenizer

        check_data_dir(d, get_tokenizer(ckpt["tokenizer"]).vocab_size, splits=(cfg.split,), tokenizer=ckpt["tokenizer"])
    return d


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("path", help="run directory (its newest checkpoint) or checkpoint file")
    from evaluation.config import add_flags

    add_flags(parser)
    args = parser.parse_args(argv)
    from common.errors import set_interrupt_note

    set_interrupt_note("nothing was written for this evaluation (earlier results are kept); rerun it")
    return report_user_errors(evaluate, args)  # bad input: one line and exit 2; bugs keep their traceback


def evaluate(args) -> int:
    import torch

    from runtime import distributed as runtime
    from evaluation.config import from_args

    cfg = from_args(args)
    from data.files import writable_dir
    from runtime.checkpoint import resolve_checkpoint

    ckpt_path = resolve_checkpoint(args.path)
    if cfg.out:  # before the evaluation: its result must have somewhere to go
        if Path(cfg.out).is_dir():
            from evaluation.config import EvalConfigError

            raise EvalConfigError(f"--out {cfg.out} is a directory: give a file name (e.g. "
                                  f"{Path(cfg.out) / 'eval.json'})")
        writable_dir(Path(cfg.out).parent, "--out")
    if cfg.tasks:  # a task name no lm-eval task file has: say so in seconds, not after a minute's indexing
        from evaluation.config import EvalConfigError
        from evaluation.harness import unknown_tasks

        unknown = unknown_tasks(cfg.tasks, cfg.include_path)
        if unknown:
            close = "; ".join(f"{t}: did you mean {', '.join(c)}?" for t, c in unknown.items() if c)
            raise EvalConfigError(f"bad config eval.tasks: unknown task(s) {', '.join(unknown)} (in no lm-eval task "
                                  f"file{' nor under include_path' if cfg.include_path else ''})"
                                  + (f"; {close}" if close else "") + "; `lm-eval ls tasks` lists them")
        from evaluation.harness import hub_unreachable

        where = None if cfg.include_path else hub_unreachable()  # local task files may need no hub
        if where:
            raise EvalConfigError(
                f"the Hugging Face hub ({where}) cannot be reached, so lm-eval's {len(cfg.tasks)} task(s) cannot fetch "
                "their data: pass --tasks none for perplexity alone, or, with the tasks' datasets in a local cache, "
                "set HF_DATASETS_OFFLINE=1 (and HF_HOME or HF_DATASETS_CACHE to that cache)")
    rt = runtime.init_distributed(cfg.device, "device", cfg.dtype)
    _, before = runtime.set_cpu_threads(cfg.threads, rt.device)
    try:
        return _evaluate(cfg, ckpt_path, rt)
    finally:
        torch.set_num_threads(before)
        runtime.teardown()


def _evaluate(cfg, ckpt_path: Path, rt) -> int:
    import torch

    from data import get_tokenizer
    from evaluation.config import EvalConfigError
    from runtime.checkpoint import load_model

    from evaluation.report import log_wandb, markdown_table, write_merged

    def echo(msg):
        if rt.is_main:
            print(msg, file=sys.stderr, flush=True)

    t0 = time.time()
    model, ckpt = load_model(ckpt_path, device=rt.device)
    if cfg.stride is not None and cfg.stride > model.config.block_size:
        raise EvalConfigError(f"bad config eval.stride={cfg.stride}: must be at most the model's block_size="
                              f"{model.config.block_size} (tokens scored per window)")
    tokenizer = get_tokenizer(ckpt["tokenizer"])
    from evaluation.report import check_out
    from runtime.distributed import main_step

    with main_step("checking --out") as run:  # before any work: a file of other results is refused, not replaced
        if run:
            check_out(cfg.out or default_out(ckpt_path, ckpt["step"]), ckpt_path, ckpt["step"],
                      ckpt.get("wandb_run_id"))
    echo(
        f"eval: {ckpt_path} (step {ckpt['step']}, norm {model.config.norm.name}, "
        f"{model.num_params() / 1e6:.2f}M params) "
        f"on {rt.device} {rt.precision}, world size {rt.world_size}"
        + (f", {torch.get_num_threads()} CPU threads" if rt.device.type == "cpu" else "")
    )
    payload = {"checkpoint": str(ckpt_path), "step": ckpt["step"], "norm": model.config.norm.name,
               "tokenizer": ckpt["tokenizer"], "model_config": ckpt["model_config"],
               "eval_config": cfg.to_dict(), "world_size": rt.world_size, "device": str(rt.device),
               "dtype": rt.precision, "wandb_run_id": ckpt.get("wandb_run_id")}

    if cfg.split is not None:
        from evaluation.perplexity import evaluate_perplexity

        data_dir = resolve_data_dir(cfg, ckpt, rt)
        echo(f"perplexity: split {cfg.split} of {data_dir}, "
             f"{'all tokens' if cfg.token_budget is None else f'{cfg.token_budget} tokens'}, "
             f"stride {cfg.stride or model.config.block_size}")
        payload["data_dir"] = str(data_dir)
        payload["perplexity"] = evaluate_perplexity(model, data_dir, cfg.split, stride=cfg.stride,
                                                    token_budget=cfg.token_budget, batch_size=cfg.batch_size, rt=rt,
                                                    progress=rt.is_main)
        p = payload["perplexity"]
        bpb = f", {p['bpb']:.4f} bits per byte" if p.get("bpb") is not None else ""
        echo(f"perplexity: loss {p['loss']:.4f}, ppl {p['ppl']:.3f}{bpb}")

    if cfg.tasks:
        from evaluation.harness import NanoLM, run_tasks

        for name in ("huggingface_hub", "datasets", "lm_eval"):  # keep failures to our one line per task
            logging.getLogger(name).setLevel(logging.ERROR)
        lm = NanoLM(model, tokenizer, batch_size=cfg.batch_size, max_gen_toks=cfg.max_gen_toks, rt=rt, seed=cfg.seed)
        payload["tasks"], payload["failed_tasks"] = run_tasks(
            lm, cfg.tasks, include_path=cfg.include_path, limit=cfg.limit, num_fewshot=cfg.num_fewshot,
            bootstrap_iters=cfg.bootstrap_iters, seed=cfg.seed, echo=echo)

    payload["time_s"] = round(time.time() - t0, 2)
    failed = payload.get("failed_tasks") or {}
    if rt.is_main:
        print(markdown_table(payload))
        out = Path(cfg.out or default_out(ckpt_path, ckpt["step"]))
        if payload.get("perplexity") is None and not payload.get("tasks"):
            # Nothing measured: a file holding earlier results keeps them untouched.
            echo(
                "nothing written: no evaluation succeeded"
                + (f" ({out} keeps its earlier results)" if out.exists() else "")
            )
        else:
            path, merged = write_merged(out, payload)
            echo(f"wrote {path}" + (" (merged with its earlier results for this checkpoint)" if merged else ""))
            if cfg.wandb and log_wandb(ckpt, run_dir_of(ckpt_path), payload):
                echo(f"logged to wandb run {ckpt['wandb_run_id']}")
        if failed:
            echo(
                f"eval.py: {len(failed)} of {len(cfg.tasks)} requested task(s) failed or are unknown: "
                f"{', '.join(failed)}"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
