"""Validation loss and perplexity of a model on a prepared split, with a strided sliding window.

Each shard of the split is a stream of documents, each preceded by the end-of-text token (llm.c
layout), so a shard starts at a document boundary and windows never need to cross shards. Every
token after a shard's first is scored exactly once (see scoring.plan_windows). Under torchrun the
windows are dealt round-robin to ranks and the sums all-reduced: the result does not depend on the
world size (up to float summation order).
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
from tqdm import tqdm

from common import perplexity
from data.errors import DataError

from .scoring import plan_windows, score_batch
from data.files import read_json


def split_shards(data_dir, split: str) -> list[Path]:
    """The split's shard files in order (data's reader: meta.json, else llm.c file names); one clear
    error naming the splits that exist when there are none."""
    from data.loader import split_files

    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError(f"data dir {data_dir} does not exist; prepare it with the run's data config "
                                f"or pass --data-dir")
    files = split_files(data_dir, split)
    if not files:
        meta = data_dir / "meta.json"
        if meta.is_file():
            have = sorted(read_json(meta).get("splits", {}))
        else:
            have = sorted({m[1] for p in data_dir.iterdir() if (m := re.match(r"^(.+)_\d+\.bin$", p.name))})
        raise DataError(f"no '{split}' shards in {data_dir}; splits there: {', '.join(have) or 'none'}")
    return files


def evaluate_perplexity(model, data_dir, split: str = "val", *, stride: Optional[int] = None,
                        token_budget: Optional[int] = None, batch_size: int = 8, rt=None,
                        progress: bool = False, token_bytes=None) -> dict:
    """Mean next-token loss (nats), perplexity and bits per byte over about `token_budget` scored tokens
    of the split, in whole windows spread evenly over it (None: all of it). stride: new tokens scored per
    window (None: block_size, no overlap).
    token_bytes: the UTF-8 bytes of each id (Tokenizer.token_bytes; None: the data dir's tokenizer's)."""
    import numpy as np

    from data import get_tokenizer
    from data.shards import open_shard

    from runtime.distributed import Runtime

    rt = rt or Runtime(next(model.parameters()).device)
    block_size = model.config.block_size
    stride = block_size if stride is None else stride
    if token_budget is not None and token_budget < 1:
        raise ValueError(f"token_budget={token_budget}: must be >= 1 or null (whole split)")
    meta = Path(data_dir) / "meta.json"
    if token_bytes is None and meta.is_file():  # an llm.c dir without meta.json: no tokenizer named, no bpb
        token_bytes = get_tokenizer(read_json(meta)["tokenizer"]).token_bytes()
    token_bytes = None if token_bytes is None else np.asarray(token_bytes, dtype=np.int64)
    nll = torch.zeros((), dtype=torch.float64, device=rt.device)
    count = torch.zeros((), dtype=torch.long, device=rt.device)
    nbytes = torch.zeros((), dtype=torch.long, device=rt.device)  # summed on the host: no sync per batch
    k = 0  # global window index: window k goes to rank k % world_size
    batch = []

    # Every window of the split, shard by shard; a budget takes whole windows spread evenly over the split
    # (data.loader.spread: with stride == block_size, the windows training's validation scores), never its head.
    plan = [(tok, w) for tok in map(open_shard, split_shards(data_dir, split))
            for w in plan_windows(len(tok), 1, block_size, stride)]
    if token_budget is not None:
        from data.loader import spread

        full = [(tok, w) for tok, w in plan if w.end - w.first >= stride]  # a shard's tail scores fewer
        plan = [full[i] for i in spread(len(full), max(1, -(-token_budget // stride)))] if full else plan[:1]
    n_windows = len(plan)
    bar = tqdm(total=n_windows, desc=f"perplexity ({split})", unit="win", disable=not progress)

    def flush():
        lp, _, n = score_batch(model, batch, rt.device, rt.autocast())
        nll.sub_(lp.sum())
        count.add_(n.sum())
        bar.update(len(batch) * rt.world_size)
        batch.clear()

    for tok, w in plan:
        if k % rt.world_size == rt.rank:
            batch.append((tok, w))
            if token_bytes is not None:
                nbytes.add_(int(token_bytes[np.asarray(tok[w.first:w.end], dtype=np.int64)].sum()))
            if len(batch) == batch_size:
                flush()
        k += 1
    if batch:
        flush()
    bar.close()
    if rt.world_size > 1:
        dist.all_reduce(nll)
        dist.all_reduce(count)
        dist.all_reduce(nbytes)
    tokens = int(count.item())
    if tokens == 0:
        raise ValueError(f"split '{split}' of {data_dir} has no tokens to score")
    loss = nll.item() / tokens
    b = int(nbytes.item())
    return {"split": split, "loss": loss, "ppl": perplexity(loss), "bpb": nll.item() / (b * math.log(2)) if b else None,
            "tokens": tokens, "bytes": b if token_bytes is not None else None, "stride": stride,
            "block_size": block_size, "windows": n_windows}
