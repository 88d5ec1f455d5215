"""Sinkhorn-Knopp projection onto the doubly stochastic matrices (mHC's H_res), in the log domain.

Compiled on CPU it is one opaque op with its backward in closed form: traced, the `iters` row and column steps
unroll into ~80 reductions forward and ~40 backward, each a kernel inductor must generate and compile
(at 2 layers x d=64 mHC's compile took 115 s against 65 s with one iteration). On CUDA the loop stays in
the graph, where its kernels are fused and compiled in parallel, and an opaque op would launch ~500 tiny
kernels per step."""
from __future__ import annotations

from typing import List, Tuple

import torch


def _steps(logits: torch.Tensor, iters: int) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """Every iteration's row-normalised a_t = z - lse_row(z) and column-normalised z_t = a_t - lse_col(a_t)."""
    rows, cols, z = [], [], logits
    for _ in range(iters):
        a = z - torch.logsumexp(z, dim=-1, keepdim=True)
        z = a - torch.logsumexp(a, dim=-2, keepdim=True)
        rows.append(a)
        cols.append(z)
    return rows, cols


def sinkhorn_reference(logits: torch.Tensor, iters: int) -> torch.Tensor:
    """The traced form (autograd differentiates the loop): rows, then columns normalised `iters` times; the
    last step makes the columns sum to 1 exactly."""
    return _steps(logits, iters)[1][-1].exp()


@torch.library.custom_op("nanonorm::sinkhorn", mutates_args=())
def _sinkhorn_op(logits: torch.Tensor, iters: int) -> torch.Tensor:
    return sinkhorn_reference(logits, iters)


@_sinkhorn_op.register_fake
def _(logits, iters):
    return torch.empty_like(logits)


@torch.library.custom_op("nanonorm::sinkhorn_backward", mutates_args=())
def _sinkhorn_backward(logits: torch.Tensor, grad: torch.Tensor, iters: int) -> torch.Tensor:
    """d/dlogits of <grad, exp(z_T)>, from the recomputed steps (a few [.., n, n] tensors each): the output is
    exp(z_T), and each step y = x - lse(x) along a dim passes g back as g - exp(y) * sum(g) along that dim."""
    rows, cols = _steps(logits, iters)
    g = grad * cols[-1].exp()
    for a, z in zip(reversed(rows), reversed(cols)):
        g = g - z.exp() * g.sum(-2, keepdim=True)
        g = g - a.exp() * g.sum(-1, keepdim=True)
    return g


@_sinkhorn_backward.register_fake
def _(logits, grad, iters):
    return torch.empty_like(logits)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.iters = inputs[1]


def _backward(ctx, grad):
    (logits,) = ctx.saved_tensors
    return _sinkhorn_backward(logits, grad, ctx.iters), None


_sinkhorn_op.register_autograd(_backward, setup_context=_setup)


def sinkhorn(logits: torch.Tensor, iters: int) -> torch.Tensor:
    """exp(logits) projected towards the doubly stochastic matrices over the last two dims, in float32."""
    z = logits.float()
    if z.device.type == "cpu" and torch.compiler.is_compiling():
        return _sinkhorn_op(z, iters)
    return sinkhorn_reference(z, iters)   # eager: the same loop (the op would import torch._dynamo: seconds)
