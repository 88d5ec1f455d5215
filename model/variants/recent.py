"""Residual-stream methods of 2025-26 on a single stream: Pre-Derf, the orthogonal residual update,
HybridNorm."""
from __future__ import annotations


import torch.nn as nn


from ..norm_options import NORM_KINDS
from ..norms import make_norm
from ..sphere import _acc, _dot
from ..sublayers import CausalSelfAttention

from .base import Variant
from .classic import PreLN


class PreDerf(PreLN):
    """Pre-Derf (Chen et al., arXiv 2512.10938, its nanoGPT recipe): h = s e (s learnable, init sqrt(d));
    h <- h + F(Derf(h));  output Derf(h);  Derf(x) = gamma erf(alpha x + shift) + beta (Eq. 1).
    Its Norm is Derf whatever `norm.kind` says, as Pre-DyT's is DyT: an arch preset's `norm.kind=rmsnorm`
    (llama, speedrun) swaps the block's LayerNorms, not the method. Derf in any other variant:
    `norm.kind=derf`."""

    def __init__(self, cfg, j):
        Variant.__init__(self, cfg, j)
        self.norm = NORM_KINDS["derf"](cfg)   # the norm.kind=derf builder, whatever norm.kind says

    @classmethod
    def output_step(cls, cfg):
        return NORM_KINDS["derf"](cfg) if cfg.norm.final_norm else nn.Identity()


class OrthoPreLN(Variant):
    """Orthogonal residual update (Oh et al., arXiv 2505.11881, Eq. 4 with its stabiliser eps): h = e;
    s = F(Norm(h));  h <- h + (s - (<s,h>/(||h||^2 + eps)) h);  output Norm(h). Only the part of the
    sublayer's output orthogonal to its token's stream is added: the stream is turned and lengthened
    (||h||^2 grows by ||s_perp||^2), never scaled along itself. Between Pre-LN and the sphere family:
    the tangent projection without a retraction. Dots in float32 [choice]; per token, over d."""

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.norm, self.eps = make_norm(cfg), cfg.norm.ortho_eps

    def forward(self, h, f):
        s = f(self.norm(h))
        h32, s32 = _acc(h), _acc(s)                  # the sphere family's dot products (model/sphere.py)
        return h + (s32 - _dot(s32, h32) / (_dot(h32, h32) + self.eps) * h32).to(h.dtype)


class _QKVNorm(nn.Module):
    """HybridNorm's QKV-Norm: q, k and v each through its own Norm (norm.kind) over the full width d."""

    def __init__(self, cfg):
        super().__init__()
        self.q, self.k, self.v = make_norm(cfg), make_norm(cfg), make_norm(cfg)

    def forward(self, q, k, v):
        return self.q(q), self.k(k), self.v(v)


class QKVNormAttention(CausalSelfAttention):
    """GPT-2's attention with q, k, v normalised right after their projection, before the heads are split."""

    def __init__(self, cfg, layer: int):
        super().__init__(cfg, layer)
        self.qkv_step = _QKVNorm(cfg)

    def project(self, x):
        return self.qkv_step(*super().project(x))


class HybridNorm(Variant):
    """HybridNorm (Zhuo et al., arXiv 2503.04598, Sec. 3): h = e;  attention: h <- h + Attn_QKV(h), whose
    q, k, v are each normalised right after their projection (QKV-Norm) and which reads the stream
    itself;  MLP: n = Norm(h), h <- n + F(n) (Post-Norm: the residual path starts after the norm);
    output Norm(h) [choice].  norm.star=true is HybridNorm*: the first block is Pre-Norm (attention
    reads Norm(h), QKV-Norm kept; MLP h + F(Norm(h)))."""

    Attention = QKVNormAttention

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.pre = cfg.norm.star and self.k == 1
        self.norm = make_norm(cfg) if self.pre or not self.is_attn else None

    def forward(self, h, f):
        if self.is_attn:
            return h + f(h if self.norm is None else self.norm(h))
        n = self.norm(h)
        return h + f(n) if self.pre else n + f(n)
