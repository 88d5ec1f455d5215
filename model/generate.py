"""Autoregressive generation with the model's KV cache (sample.py, the lm-eval adapter, benchmarks).

The model knows `block_size` positions (learned, or RoPE's tables), so the context can never be longer. When the
prompt plus the new tokens outgrow it, generation continues on a cropped window as nanoGPT does
(`idx[:, -block_size:]`): the window is re-encoded from position 0, which with a cache means
resetting it and recomputing it for the window. `crop_keep` (default `block_size`, nanoGPT exactly)
is how many tokens the window keeps after a crop; a smaller value trades context for speed, since
then the next `block_size - crop_keep` steps are cached again instead of re-encoding every step.
The cache and no-cache paths follow the same window schedule, so they agree token for token.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

from common import ConfigError


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: Optional[int] = None,
                top_p: Optional[float] = None, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Pick the next token from logits [B, V]; returns [B, 1]. temperature 0 means greedy (argmax)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = F.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens before it already cover top_p (so the top token always stays)
        drop_sorted = (probs.cumsum(dim=-1) - probs) > top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)


def check_generate_args(block_size: int, prompt_len: int, max_new_tokens: int, temperature: float,
                        top_k: Optional[int], top_p: Optional[float], crop_keep: Optional[int]) -> int:
    """Validate once, with one clear line per problem; returns the effective crop_keep."""
    if prompt_len < 1:
        raise ConfigError("the prompt is empty: generation needs at least one token of context")
    if prompt_len > block_size:
        raise ConfigError(f"the prompt is {prompt_len} tokens, longer than the model's context "
                         f"(block_size={block_size}); shorten it")
    if max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens={max_new_tokens}: must be >= 0")
    if not 0 <= temperature < float("inf"):  # inf divides every logit to 0: uniform noise, not a sample
        raise ConfigError(f"temperature={temperature}: must be a finite number >= 0 (0 = greedy)")
    if top_k is not None and top_k < 1:
        raise ConfigError(f"top_k={top_k}: must be >= 1 or unset")
    if top_p is not None and not 0 < top_p <= 1:
        raise ConfigError(f"top_p={top_p}: must be in (0, 1] or unset")
    keep = block_size if crop_keep is None else crop_keep
    if not 1 <= keep <= block_size:
        raise ConfigError(f"crop_keep={crop_keep}: must be in [1, block_size={block_size}]")
    return keep


@torch.no_grad()
def generate(model, idx: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
             top_k: Optional[int] = None, top_p: Optional[float] = None,
             generator: Optional[torch.Generator] = None, use_cache: bool = True,
             crop_keep: Optional[int] = None, vocab_size: Optional[int] = None,
             cache_dtype: Optional[torch.dtype] = None,
             stop: Optional[Callable[[torch.Tensor], bool]] = None) -> torch.Tensor:
    """Extend idx [B, T] by up to max_new_tokens tokens; returns [B, T + n].

    vocab_size: the tokenizer's size; logits of the padding ids above it are never sampled.
    stop: called with the whole sequence after each new token; True ends generation early. One that
      reads the tokens costs a host sync per token (the lm-eval adapter's stop strings); sample.py's
      progress report never reads them.
    cache_dtype: the dtype of cached keys/values (the autocast dtype under autocast).
    """
    block_size = model.config.block_size
    keep = check_generate_args(block_size, idx.size(1), max_new_tokens, temperature, top_k, top_p, crop_keep)
    if max_new_tokens == 0:
        return idx

    def pick(logits: torch.Tensor) -> torch.Tensor:
        logits = logits[:, -1, :]
        if vocab_size is not None and vocab_size < logits.size(-1):
            logits = logits[:, :vocab_size]
        return sample_next(logits, temperature, top_k, top_p, generator)

    cache = model.new_kv_cache(idx.size(0), device=idx.device, dtype=cache_dtype) if use_cache else None
    start = 0  # the window is idx[:, start:]; the same schedule with and without the cache
    logits, _ = model(idx, kv_cache=cache, last_only=True) if use_cache else model(idx, last_only=True)
    for i in range(max_new_tokens):
        nxt = pick(logits)
        idx = torch.cat((idx, nxt), dim=1)
        if i == max_new_tokens - 1 or (stop is not None and stop(idx)):
            break
        if idx.size(1) - start > block_size:  # the new token does not fit: crop and re-encode the window
            start = idx.size(1) - keep
            if use_cache:
                cache.reset()
                logits, _ = model(idx[:, start:], kv_cache=cache, last_only=True)
            else:
                logits, _ = model(idx[:, start:], last_only=True)
        elif use_cache:
            logits, _ = model(nxt, kv_cache=cache, last_only=True)
        else:
            logits, _ = model(idx[:, start:], last_only=True)
    return idx
