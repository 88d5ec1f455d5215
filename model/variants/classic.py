"""The classic placements of the norm: Pre-LN, Post-LN, DeepNorm, Sandwich, Peri-LN, Keel, Pre-DyT."""
from __future__ import annotations

import math

import torch
import torch.nn as nn


from ..norms import DyT, make_norm

from .base import Variant


class PreLN(Variant):
    """Pre-LN (GPT-2; nanoGPT): h = e;  h <- h + F(Norm(h));  output Norm(h)."""

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.norm = make_norm(cfg)

    def forward(self, h, f):
        return h + f(self.norm(h))


class PostLN(Variant):
    """Post-LN (Vaswani et al. 2017, sec. 3.1): h = e;  h <- Norm(h + F(h));  no output step."""

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.norm = make_norm(cfg)

    def forward(self, h, f):
        return self.norm(h + f(h))


class DeepNorm(Variant):
    """DeepNorm (Wang et al., DeepNet, arXiv 2203.00555, decoder-only constants):
    h = e;  h <- Norm(alpha*h + F(h)), alpha = (2N)^(1/4);  no output step.
    Init: beta = (8N)^(-1/4) < 1 on V, attention output and both MLP matrices (see init_weights)."""

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.alpha = (2 * cfg.n_layer) ** 0.25
        self.norm = make_norm(cfg)

    def forward(self, h, f):
        return self.norm(self.alpha * h + f(h))

    @staticmethod
    def beta(n_layer: int) -> float:
        return (8 * n_layer) ** -0.25

    @classmethod
    def init_weights(cls, model):
        cfg = model.config
        beta, d = cls.beta(cfg.n_layer), cfg.n_embd
        for block in model.blocks:
            targets = [block.attn.c_attn.weight[2 * d:], block.attn.c_proj.weight,
                       block.mlp.c_fc.weight, block.mlp.c_proj.weight]
            if hasattr(block.mlp, "c_gate"):  # SwiGLU: both input matrices of the MLP
                targets.append(block.mlp.c_gate.weight)
            with torch.no_grad():
                for w in targets:  # w is [fan_out, fan_in]; the V slice has its own fan (d, d)
                    if cfg.norm.deepnorm_init == "xavier":
                        std = beta * math.sqrt(2.0 / (w.shape[0] + w.shape[1]))
                    else:  # "scaled": nanoGPT's N(0, 0.02) times beta
                        std = 0.02 * beta
                    w.normal_(0.0, std)


class Sandwich(Variant):
    """Sandwich-LN (Ding et al., CogView, arXiv 2105.13290):
    h = e;  h <- h + Norm_out(F(Norm_in(h)));  output Norm(h)."""

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.norm_in = make_norm(cfg)
        self.norm_out = make_norm(cfg)

    def forward(self, h, f):
        return h + self.norm_out(f(self.norm_in(h)))


class PeriLN(Sandwich):
    """Peri-LN (Kim et al., arXiv 2502.02732): Sandwich's rule, plus the input step h = Norm_emb(e)."""


class Keel(Variant):
    """Keel (arXiv 2601.19895): h = e;  h <- Norm_1(alpha*h + F(Norm_2(h))), alpha = 2N (sublayers);
    no output step [choice]. First sublayers (`norm.first_layer`): v2 (default) makes sublayer 1
    plain Pre-LN and sublayer 2 use alpha = 1; v1 makes sublayers 1 and 2 plain Pre-LN."""

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.pre_ln = j == 0 or (j == 1 and cfg.norm.first_layer == "v1")
        self.norm_in = make_norm(cfg)                       # Norm_2
        if not self.pre_ln:
            self.norm_out = make_norm(cfg)                  # Norm_1
            self.alpha = 1.0 if j == 1 else float(2 * cfg.n_layer)

    def forward(self, h, f):
        if self.pre_ln:
            return h + f(self.norm_in(h))
        return self.norm_out(self.alpha * h + f(self.norm_in(h)))


class PreDyT(Variant):
    """Pre-DyT (Zhu et al., arXiv 2503.10622): h = e;  h <- h + F(DyT(h));  output DyT(h).
    alpha init: `norm.alpha_attn` before attention, `norm.alpha_other` before the MLP and at the output."""

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.norm = DyT(cfg.n_embd, cfg.norm.alpha_attn if self.is_attn else cfg.norm.alpha_other)

    def forward(self, h, f):
        return h + f(self.norm(h))

    @classmethod
    def output_step(cls, cfg):
        return DyT(cfg.n_embd, cfg.norm.alpha_other) if cfg.norm.final_norm else nn.Identity()
