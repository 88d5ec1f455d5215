"""Normalization layers: LayerNorm, RMSNorm (the spec's `Norm`), DyT, ScaleNorm, and input steps."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import GPTConfig


class LayerNorm(nn.Module):
    """LayerNorm with learnable gain and optional bias (nanoGPT's `bias` switch)."""

    optim_groups = {"weight": "vectors", "bias": "vectors"}  # see GPT.parameter_groups

    def __init__(self, dim: int, eps: float, bias: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """RMSNorm with learnable gain, no bias."""

    optim_groups = {"weight": "vectors"}

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class DyT(nn.Module):
    """Dynamic Tanh (Zhu et al., arXiv 2503.10622): gamma * tanh(alpha * x) + beta; alpha a learnable scalar."""

    optim_groups = {"alpha": "scalars", "weight": "vectors", "bias": "vectors"}

    def __init__(self, dim: int, alpha_init: float):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(alpha_init)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return self.weight * torch.tanh(self.alpha * x) + self.bias


class ScaleNorm(nn.Module):
    """Modified ScaleNorm (SpheretNorm's input step): g * sqrt(d) * e / ||e||, scalar g (init 1).

    Puts every token on the sphere of radius sqrt(d), where the sphere-family updates keep it.
    `learnable=False` (`norm.learn_radius=false`) fixes g = 1: every token then has norm sqrt(d) exactly.
    """

    optim_groups = {"g": "scalars"}

    def __init__(self, dim: int, learnable: bool = True):
        super().__init__()
        self.radius = math.sqrt(dim)
        if learnable:
            self.g = nn.Parameter(torch.tensor(1.0))
        else:
            self.register_buffer("g", torch.tensor(1.0))

    def forward(self, x):
        x32 = x.float()
        n = x32.pow(2).sum(-1, keepdim=True).sqrt().clamp_min(1e-12)
        return (self.g * self.radius * x32 / n).to(x.dtype)


def make_norm(cfg: GPTConfig) -> nn.Module:
    """The spec's `Norm`: `norm.kind` decides, every instance has its own parameters."""
    if cfg.norm_kind == "rmsnorm":
        return RMSNorm(cfg.n_embd, cfg.norm_eps)
    return LayerNorm(cfg.n_embd, cfg.norm_eps, bias=cfg.bias)


def make_input_step(cfg: GPTConfig) -> nn.Module:
    """`norm.embed_norm`: none (h = e), layer (h = Norm(e), Peri-LN), scalenorm (SpheretNorm)."""
    if cfg.embed_norm == "layer":
        return make_norm(cfg)
    if cfg.embed_norm == "scalenorm":
        return ScaleNorm(cfg.n_embd, learnable=cfg.learn_radius)
    return nn.Identity()
