"""The LM head and cross-entropy together, chunk by chunk, without the batch's full logits.

The plain path materializes [B*T, V] logits and autocast runs cross-entropy on them in fp32: at GPT-2's
50,304-entry vocabulary and 16 x 1024 tokens that is 3.3 GB, kept for the backward. Here the tokens are taken
`chunk` at a time: a chunk's logits (in fp32) give its loss and, at once, its gradient with respect to the
logits, (softmax - one_hot) / n, which is turned into the gradients of the hidden states and of the head's
weight before the next chunk. Only those two gradients are kept for the backward (B*T x d and V x d), never a
logits tensor: the method of fused linear cross-entropy kernels (Liger's), in plain torch, so that it runs on
any device and compiles. The head matmuls run in the autocast dtype, as the plain path's do; the softmax, the
log-sum-exp and the gradient accumulation of the weight in fp32. Equal to the plain path in fp32 up to
summation order (tests/test_model.py), and within bf16 rounding under autocast.
"""
from __future__ import annotations

import torch

MAX_CHUNK_ELEMENTS = 2 ** 26   # fp32 logits of one chunk: 256 MB (1,334 tokens at GPT-2's padded vocabulary)


def _compute_dtype(h: torch.Tensor) -> torch.dtype:
    dev = h.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype


def _chunks(n: int, vocab: int):
    step = max(1, MAX_CHUNK_ELEMENTS // vocab)
    return ((a, min(n, a + step)) for a in range(0, n, step))


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, targets):
        dt = _compute_dtype(h)
        with torch.autocast(h.device.type, enabled=False):
            w, hh = weight.to(dt), h.to(dt)
            n = (targets >= 0).sum().clamp(min=1)
            loss = torch.zeros((), dtype=torch.float32, device=h.device)
            grad_h = torch.empty_like(hh)
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
            for a, b in _chunks(h.shape[0], weight.shape[0]):
                t = targets[a:b]
                valid = t >= 0
                tc = t.clamp(min=0)
                logits = (hh[a:b] @ w.t()).float()
                lse = torch.logsumexp(logits, dim=-1)
                loss += ((lse - logits.gather(1, tc[:, None]).squeeze(1)) * valid).sum()
                g = torch.exp(logits.sub_(lse[:, None]))           # softmax, in place of the logits
                g[torch.arange(b - a, device=g.device), tc] -= 1.0
                g.mul_(valid[:, None])
                g = g.to(dt)
                grad_h[a:b] = g @ w
                grad_w += (g.t() @ hh[a:b]).float()
        ctx.save_for_backward(grad_h, grad_w, n)
        ctx.dtypes = (h.dtype, weight.dtype)
        return loss / n

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w, n = ctx.saved_tensors
        scale = grad_out / n
        return (grad_h * scale).to(ctx.dtypes[0]), (grad_w * scale).to(ctx.dtypes[1]), None


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits h @ weight.T against `targets` (-1: ignored), without the [N, V] logits.
    h [N, d], weight [V, d], targets [N]. Without gradients (evaluation) nothing but the loss is computed."""
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(h, weight, targets)
    dt = _compute_dtype(h)
    total = torch.zeros((), dtype=torch.float32, device=h.device)
    for a, b in _chunks(h.shape[0], weight.shape[0]):
        logits = (h[a:b].to(dt) @ weight.to(dt).t()).float()
        total += torch.nn.functional.cross_entropy(logits, targets[a:b], ignore_index=-1, reduction="sum")
    return total / (targets >= 0).sum().clamp(min=1)
