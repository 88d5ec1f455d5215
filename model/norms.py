"""Normalization layers: LayerNorm, RMSNorm (`Norm` in docs/variants.md), DyT, ScaleNorm, and input steps.

`norm.kind` picks the Norm from NORM_KINDS and `norm.embed_norm` the input step from INPUT_STEPS: each name
is recorded in model/norm_options.py (torch-free, so the config checks it) with the factory below that it
builds, `cfg -> module`. A new kind is its module, its factory here and its name there.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

from .norm_options import INPUT_STEPS, NORM_KINDS  # name -> the factories below

if TYPE_CHECKING:  # type hints only
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


class Derf(nn.Module):
    """Dynamic erf (Chen et al., arXiv 2512.10938, Eq. 1): gamma * erf(alpha * x + s) + beta; alpha and the
    shift s learnable scalars (init 1 and 0: the paper's language-model setting), gamma, beta per channel
    (beta always: it is part of the function, whatever model.bias says)."""

    optim_groups = {"alpha": "scalars", "shift": "scalars", "weight": "vectors", "bias": "vectors"}

    def __init__(self, dim: int, alpha_init: float = 1.0, shift_init: float = 0.0):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(alpha_init)))
        self.shift = nn.Parameter(torch.tensor(float(shift_init)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return self.weight * torch.erf(self.alpha * x + self.shift) + self.bias


class SeeDNorm(nn.Module):
    """SeeDNorm (Cai et al., arXiv 2510.22777, ICLR 2026): [tanh(x beta^T) alpha + gamma] * x / RMS(x), with
    RMS(x) = sqrt(mean(x^2) + eps). beta, alpha, gamma are per channel; x beta^T is one number per token, so
    the gain gamma moves with the input along alpha. Init gamma = alpha = 1, beta = 0 (our choice: RMSNorm
    exactly at init, and beta, then alpha, learn from the first step; docs/variants.md)."""

    optim_groups = {"weight": "vectors", "alpha": "vectors", "beta": "vectors"}

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))   # gamma
        self.alpha = nn.Parameter(torch.ones(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        # The dot product as a multiply and a sum, not a matmul: autocast would run a matmul in bf16 and
        # tanh's input is a sum over d channels, whose rounding would be the gain's.
        t = torch.tanh((x * self.beta).sum(-1, keepdim=True))
        return (t * self.alpha + self.weight) * F.rms_norm(x, self.weight.shape, None, self.eps)

    def scalar_stats(self) -> dict:
        """What the monitor logs: how far beta (the input dependence) and alpha have moved from 0 and 1."""
        return {"beta_norm": self.beta.detach().norm(), "alpha_rms": self.alpha.detach().pow(2).mean().sqrt()}


class ScaledInput(nn.Module):
    """h = s * e with a learnable scalar s, init sqrt(d): the input step of Derf's (and DyT's) nanoGPT
    recipe (arXiv 2512.10938, its language-model code), which puts the stream at RMS ~ 0.02 sqrt(d)."""

    optim_groups = {"s": "scalars"}

    def __init__(self, dim: int):
        super().__init__()
        self.s = nn.Parameter(torch.tensor(math.sqrt(dim)))

    def forward(self, x):
        return self.s * x


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


class UnitNorm(nn.Module):
    """x / ||x|| per token, in float32 (nGPT's input step: the stream starts on the unit sphere)."""

    def forward(self, x):
        x32 = x.float()
        return (x32 / x32.norm(dim=-1, keepdim=True).clamp_min(1e-12)).to(x.dtype)


def layernorm(cfg: "GPTConfig") -> nn.Module:
    return LayerNorm(cfg.n_embd, cfg.norm.eps, bias=cfg.bias)


def rmsnorm(cfg: "GPTConfig") -> nn.Module:
    return RMSNorm(cfg.n_embd, cfg.norm.eps)


def seednorm(cfg: "GPTConfig") -> nn.Module:
    return SeeDNorm(cfg.n_embd, cfg.norm.eps)


def derf(cfg: "GPTConfig") -> nn.Module:
    return Derf(cfg.n_embd, alpha_init=cfg.norm.derf_alpha)         # point-wise: norm.eps is not read


def make_norm(cfg: "GPTConfig") -> nn.Module:
    """`Norm` of docs/variants.md (`norm.kind`); every instance has its own parameters."""
    return NORM_KINDS[cfg.norm.kind](cfg)


def none_input(cfg: "GPTConfig") -> nn.Module:
    return nn.Identity()                                            # h = e


def layer_input(cfg: "GPTConfig") -> nn.Module:
    return make_norm(cfg)                                           # h = Norm(e): Peri-LN


def scalenorm_input(cfg: "GPTConfig") -> nn.Module:
    return ScaleNorm(cfg.n_embd, learnable=cfg.norm.learn_radius)       # h = g sqrt(d) e/||e||: SpheretNorm


def scaled_input(cfg: "GPTConfig") -> nn.Module:
    return ScaledInput(cfg.n_embd)                                  # h = s e, s init sqrt(d): pre_derf


def unit_input(cfg: "GPTConfig") -> nn.Module:
    return UnitNorm()                                               # h = e/||e||: nGPT


def make_input_step(cfg: "GPTConfig") -> nn.Module:
    return INPUT_STEPS[cfg.norm.embed_norm](cfg)
