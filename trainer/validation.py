"""Validation scoring: the loss in nats per token and bits per byte, over a ValLoader's windows.

Bits per byte divide the nats of every scored target by the UTF-8 bytes those targets encode
(`Tokenizer.token_bytes`: 1 per byte id, the decoded length of a BPE id, 0 for end-of-text), times
ln 2. The end-of-text targets count in the nats (a document's end is information) and add no bytes, so
bpb = loss * tokens / (bytes * ln 2) exactly, for any tokenizer: runs with different tokenizers, and
ours with a paper's, compare in it. The final evaluation of a run also keeps each document's nats,
bytes and tokens, for the validation set's own standard error (clustered by document).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from runtime import distributed

LN2 = math.log(2.0)


@dataclass(frozen=True)
class ValResult:
    loss: float          # mean nats per scored token (nan when nothing was scored)
    bpb: float           # bits per byte of the scored text
    tokens: int          # targets scored, over every rank
    bytes: int           # UTF-8 bytes those targets encode
    doc_nats: Optional[np.ndarray] = None     # per document (final evaluation only), float64
    doc_bytes: Optional[np.ndarray] = None
    doc_tokens: Optional[np.ndarray] = None

    def se_bpb(self) -> Optional[float]:
        """The standard error of bpb over the validation set's documents (a ratio estimator's
        linearization, clustered by document); None without per-document sums."""
        if self.doc_nats is None:
            return None
        from common.stats import ratio_se

        keep = self.doc_tokens > 0
        se = ratio_se(self.doc_nats[keep], self.doc_bytes[keep])
        return None if se is None else se / LN2


def bits_per_byte(nats: float, nbytes: float) -> float:
    return nats / (nbytes * LN2) if nbytes > 0 else float("nan")


@torch.no_grad()
def score(model, val, autocast, device, token_bytes: torch.Tensor) -> ValResult:
    """Loss and bpb of `model` over `val` (every rank's share, all-reduced). `token_bytes`: int64 [vocab] on
    `device`. One host sync, at the end. Per-document sums when `val` was built with docs=True."""
    model.eval()
    tot = torch.zeros(3, dtype=torch.float64, device=device)          # nats, tokens, bytes
    docs = torch.zeros(3, val.num_docs, dtype=torch.float64, device=device) if val.num_docs else None
    for batch in val:
        x, y = (t.to(device, non_blocking=True) for t in batch[:2])
        with autocast():
            logits, _ = model(x)
        y = y.flatten()
        nll = F.cross_entropy(logits.float().flatten(0, 1), y, ignore_index=-1, reduction="none").double()
        mask = y >= 0
        nb = (token_bytes[y.clamp(min=0)] * mask).double()
        tot += torch.stack([nll.sum(), mask.double().sum(), nb.sum()])
        if docs is not None:
            d = batch[2].to(device, non_blocking=True).flatten()
            keep = d >= 0
            docs.index_add_(1, d[keep], torch.stack([nll[keep], mask[keep].double(), nb[keep]]))
    model.train()
    distributed.all_reduce_(tot, "sum")
    nats, tokens, nbytes = tot.tolist()
    out = dict(loss=nats / tokens if tokens else float("nan"), bpb=bits_per_byte(nats, nbytes), tokens=int(tokens),
               bytes=int(nbytes))
    if docs is not None:
        distributed.all_reduce_(docs, "sum")
        d = docs.cpu().numpy()
        out.update(doc_nats=d[0], doc_tokens=d[1].astype(np.int64), doc_bytes=d[2].astype(np.int64))
    return ValResult(**out)


def write_final(path, record: dict, r: ValResult) -> None:
    """The final evaluation with its per-document sums (documents in split order), written atomically."""
    import json

    from data.files import atomic_write

    docs = {"nats": [round(float(v), 6) for v in r.doc_nats], "bytes": r.doc_bytes.tolist(),
            "tokens": r.doc_tokens.tolist()}
    atomic_write(path, json.dumps({**{k: v for k, v in record.items() if k != "kind"}, "docs": docs}) + "\n")
