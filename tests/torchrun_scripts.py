"""Programs the multi-process tests run under torchrun, from the repository root:

    python -m torch.distributed.run --standalone --nproc_per_node=2 -m tests.torchrun_scripts NAME [ARGS]

(`-m` from the root: the workers import this checkout's packages.)"""
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def wait():
    """Ranks > 0 wait for rank 0's data preparation beyond the default group's timeout."""
    from runtime import distributed as D

    d = D.init_distributed("cpu")
    # after set-up (whose own waits depend on how fast each process starts): 1 s stands in for
    # the default group's 30 minutes
    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=1))
    # rank 0 "prepares the data" for 2.5 s, beyond the default group's timeout
    out = D.main_first(lambda: time.sleep(2.5) or "prepared" if d.rank == 0 else "found ready")
    t = torch.ones(1)
    D.all_reduce_(t)  # the default group still works afterwards
    print(f"rank {d.rank}: {out}, {t.item():.0f}", flush=True)
    if d.rank == 0:  # the former way, a barrier on the default group, times out
        time.sleep(2.5)
    try:
        dist.barrier()
    except Exception:
        print(f"rank {d.rank}: default-group barrier failed", flush=True)
    # a group whose collective timed out may abort in its destructors at exit ("terminate called without
    # an active exception"); the premise is shown, so leave without running them
    os._exit(0)


def one_rank_fails(task_dir):
    """lm-eval tasks that fail on rank 1 only: one before any collective (its data cannot be
    fetched), one after the first (scoring raises)."""
    import datasets

    from data import get_tokenizer
    from runtime import distributed as runtime
    from evaluation.harness import NanoLM, run_tasks
    from model import GPT, GPTConfig

    rt = runtime.init_distributed("cpu", "device", "fp32")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=320, block_size=16, n_layer=2, n_head=2, n_embd=32)).eval()
    lm = NanoLM(model, get_tokenizer("bytes"), batch_size=2, rt=rt)
    if rt.rank == 1:
        load = datasets.load_dataset

        def failing_load(*a, **kw):
            if "toy_load" in str(kw.get("data_files")):
                raise ConnectionError("simulated download failure")
            return load(*a, **kw)

        datasets.load_dataset = failing_load
        score, calls = lm._score, []

        def failing_score(*a, **kw):
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("simulated out of memory")
            return score(*a, **kw)

        lm._score = failing_score
    results, failures = run_tasks(lm, ["toy_load", "toy_score", "toy_mc"], include_path=task_dir,
                                  bootstrap_iters=0, echo=lambda m: None)
    with open(f"{task_dir}/result_{rt.rank}.json", "w") as f:  # a file: stdout lines of two ranks interleave
        json.dump({"rank": rt.rank, "results": results, "failures": failures}, f)
    runtime.teardown()


def rank_disagrees(run_dir):
    """Rank 1 alone counts train.max_skipped skipped steps in a row from step 3 (its counter disagrees with
    rank 0's): every rank must stop at the same logging step, diverged, with no collective left waiting."""
    import os

    from tests.helpers import make_cfg
    from trainer.loop import Trainer, train

    rank, step = int(os.environ["RANK"]), Trainer.train_step

    def disagreeing(self, s, *a):
        out = step(self, s, *a)
        if rank == 1 and s >= 3:
            self.consecutive.fill_(self.train_cfg.max_skipped)
        return out

    Trainer.train_step = disagreeing
    res = train(make_cfg(run_dir, "train.max_steps=20", "train.max_skipped=3", "logging.log_interval=2",
                         "logging.console=true"))
    print(f"rank {rank}: diverged={res['diverged']} steps={res['steps']}", flush=True)


if __name__ == "__main__":
    {"wait": wait, "one_rank_fails": one_rank_fails, "rank_disagrees": rank_disagrees}[sys.argv[1]](*sys.argv[2:])
