"""Token scoring shared by perplexity and the lm-eval adapter: sliding windows and batched log-probs.

A token sequence `tok` is scored from index `first` on: target t is predicted from tok[:t], with at
most `block_size` tokens of context (positions are absolute, so no more fit). Windows score up to
`stride` new targets each; the first one scores everything it can see with full context, as in the
Hugging Face strided-perplexity recipe. With stride == block_size and first == 1 the windows are the
non-overlapping chunks training's validation loss uses; a smaller stride gives every target at least
block_size - stride tokens of context at the cost of more forward passes.
"""
from __future__ import annotations

from typing import Iterator, NamedTuple, Sequence

import numpy as np
import torch
import torch.nn.functional as F


class Window(NamedTuple):
    start: int   # input = tok[start:end-1], targets = tok[start+1:end]
    first: int   # first target index scored in this window (targets [first, end) are scored)
    end: int


def plan_windows(n_tokens: int, first: int, block_size: int, stride: int) -> Iterator[Window]:
    """Windows that score every target in [first, n_tokens) exactly once, each with maximal context."""
    if not 1 <= stride <= block_size:
        raise ValueError(f"stride={stride}: must be in [1, block_size={block_size}]")
    first = max(first, 1)  # token 0 has no context to be predicted from
    a = first
    end = min(n_tokens, max(first + stride, block_size + 1))
    while a < n_tokens:
        yield Window(max(0, end - 1 - block_size), a, end)
        a, end = end, min(n_tokens, end + stride)


def count_windows(n_tokens: int, first: int, block_size: int, stride: int) -> int:
    first = max(first, 1)
    if first >= n_tokens:
        return 0
    end0 = min(n_tokens, max(first + stride, block_size + 1))
    return 1 + -(-(n_tokens - end0) // stride)


@torch.no_grad()
def score_batch(
    model, items: Sequence[tuple[Sequence[int], Window]], device, autocast
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Score windows of token sequences in one forward pass (right-padded; causal, so padding is harmless).

    items: (tok, window) pairs. Returns, per item, on `device` (no host sync):
    sum of log-probs of its scored targets (float64), whether each was the argmax (bool), and the count.
    """
    L = max(w.end - 1 - w.start for _, w in items)
    x = torch.zeros(len(items), L, dtype=torch.long)
    y = torch.full((len(items), L), -1, dtype=torch.long)
    for i, (tok, w) in enumerate(items):
        n = w.end - 1 - w.start
        x[i, :n] = torch.from_numpy(np.asarray(tok[w.start:w.end - 1], dtype=np.int64))  # copies memmap slices
        k = w.end - w.first  # score only the last k targets of the window
        y[i, n - k:n] = torch.from_numpy(np.asarray(tok[w.first:w.end], dtype=np.int64))
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    with autocast:
        logits, _ = model(x)
    logits = logits.float()
    mask = y >= 0
    tok_lp = -F.cross_entropy(logits.transpose(1, 2), y.clamp(min=0), reduction="none")  # [B, L]
    lp = (tok_lp * mask).sum(dim=1, dtype=torch.float64)
    greedy = ((logits.argmax(dim=-1) == y) | ~mask).all(dim=1)
    return lp, greedy, mask.sum(dim=1)
