"""nGPT: the normalized Transformer (everything on the unit sphere, weights included)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..sublayers import MLP, CausalSelfAttention, LMHead
from .base import Variant

if TYPE_CHECKING:  # type hints only: the config imports the registry, not the other way round
    from ..config import GPTConfig


class _ScaledVector(nn.Module):
    """nGPT's scaled parametrisation of a learned vector: stored s (init `scale`), used as
    s * init/scale, so its effective value starts at `init` while Adam's step on s is relative to `scale`."""

    optim_groups = {"s": "scalars"}

    def __init__(self, size: int, init: float, scale: float):
        super().__init__()
        self.ratio = init / scale
        self.s = nn.Parameter(torch.full((size,), float(scale)))

    def value(self) -> torch.Tensor:
        return self.s * self.ratio


def _unit(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    x32 = x.float()
    return (x32 / x32.norm(dim=dim, keepdim=True).clamp_min(1e-12)).to(x.dtype)


class _NGPTQK(nn.Module):
    """q, k normalized per head and scaled by s_qk (init 1, scale 1/sqrt(d)); softmax scale sqrt(d_k)."""

    def __init__(self, cfg: "GPTConfig"):
        super().__init__()
        self.n_head, self.hd = cfg.n_head, cfg.n_embd // cfg.n_head
        self.s_qk = _ScaledVector(cfg.n_embd, 1.0, cfg.n_embd ** -0.5)
        self.softmax_scale = math.sqrt(self.hd)

    def forward(self, q, k):
        s = self.s_qk.value().view(1, self.n_head, 1, self.hd).to(q.dtype)
        return s * _unit(q), s * _unit(k)


class _NGPTMLP(nn.Module):
    """u <- u * s_u;  v <- v * s_v * sqrt(d) (the activation's input, kept in its non-linear range);
    s_u, s_v init 1, scale 1. A one-branch MLP (GELU, ReLU^2) has no u, so no s_u."""

    def __init__(self, cfg: "GPTConfig", hidden: int):
        super().__init__()
        if cfg.mlp == "swiglu":
            self.s_u = _ScaledVector(hidden, 1.0, 1.0)
        self.s_v = _ScaledVector(hidden, 1.0, 1.0)
        self.sqrt_d = math.sqrt(cfg.n_embd)

    def up(self, u):
        return u * self.s_u.value().to(u.dtype)

    def gate(self, v):
        return v * (self.s_v.value() * self.sqrt_d).to(v.dtype)


class NGPTAttention(CausalSelfAttention):
    """GPT-2's attention with nGPT's q, k: unit per head times s_qk, softmax scale sqrt(d_k)."""

    def __init__(self, cfg: "GPTConfig", layer: int):
        super().__init__(cfg, layer)
        self.qk_step = _NGPTQK(cfg)
        self.scale = self.qk_step.softmax_scale

    def heads(self, q, k, v, rope=None):
        q, k, v = super().heads(q, k, v, rope)
        return (*self.qk_step(q, k), v)


class NGPTMLP(MLP):
    """GPT-2's MLP with nGPT's scalers of the pre-activations."""

    def __init__(self, cfg: "GPTConfig"):
        super().__init__(cfg)
        self.act_step = _NGPTMLP(cfg, cfg.hidden_size)

    def pre_activations(self, x):
        u, g = super().pre_activations(x)
        return (None if u is None else self.act_step.up(u)), self.act_step.gate(g)


class NGPTHead(LMHead):
    """The LM head's logits times s_z (init 1, scale 1/sqrt(d)), per vocabulary entry."""

    def __init__(self, cfg: "GPTConfig"):
        super().__init__(cfg)
        self.s_z = _ScaledVector(cfg.vocab_size, 1.0, cfg.n_embd ** -0.5)

    def forward(self, h):
        # the head's rows scaled (V x d products) rather than the logits (B*T x V): the same function
        return F.linear(h, self.loss_weight())

    def loss_weight(self):
        # logits * s_z is h @ (s_z-scaled rows of W)^T: V x d multiplications instead of B*T x V
        return self.weight * self.s_z.value()[:, None]


class NGPT(Variant):
    """nGPT (Loshchilov et al., arXiv 2410.01131; NVIDIA/ngpt where the paper is silent):
    input step h = e/||e||;  h <- Norm(h + alpha (.) (Norm(F(h)) - h)), Norm(x) = x/||x||, alpha per
    dimension (init 0.05, scale 1/sqrt(d), used as |alpha|);  no output step;  q, k unit per head times
    s_qk with softmax scale sqrt(d_k);  MLP scalers s_u, s_v;  logits times s_z;  embeddings, head and
    every matrix renormalized along the embedding dimension after each applied optimizer step;
    no weight decay, no warmup."""

    Attention, MLP, Head = NGPTAttention, NGPTMLP, NGPTHead
    # OptimConfig fields nGPT fixes (trainer/optim.py: for_variant); a weight_decay sets every group's
    optim_overrides = {"weight_decay": 0.0, "warmup_steps": 0}

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.alpha = _ScaledVector(cfg.n_embd, 0.05, cfg.n_embd ** -0.5)

    def forward(self, h, f):
        a = self.alpha.value().abs()
        h32 = h.float()
        return _unit(h32 + a * (_unit(f(h)).float() - h32)).to(h.dtype)

    def step_sizes(self):
        return {"alpha_mean": self.alpha.value().detach().abs().mean()}

    @staticmethod
    def unit_matrices(model):
        """(weight, dim) of every matrix nGPT keeps unit-norm along the embedding dimension: the rows
        of tables and input projections ([out, d]: dim 1), the columns of output projections ([d, in]: dim 0)."""
        out = [(model.wte.weight, 1), (model.lm_head.weight, 1)]
        if hasattr(model, "wpe"):
            out.append((model.wpe.weight, 1))
        for b in model.blocks:
            out += [
                (b.attn.c_attn.weight, 1),
                (b.attn.c_proj.weight, 0),
                (b.mlp.c_fc.weight, 1),
                (b.mlp.c_proj.weight, 0),
            ]
            if hasattr(b.mlp, "c_gate"):
                out.append((b.mlp.c_gate.weight, 1))
        return out

    @classmethod
    def init_weights(cls, model):
        cls.after_step(model, torch.ones((), dtype=torch.bool))

    @classmethod
    @torch.no_grad()
    def after_step(cls, model, applied):
        seen = set()
        for w, dim in cls.unit_matrices(model):  # a tied head is the token table: normalized once
            if id(w) in seen:
                continue
            seen.add(id(w))
            w.copy_(torch.where(applied, _unit(w, dim), w))
