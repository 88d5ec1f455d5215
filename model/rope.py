"""Rotary position embedding (RoPE; Su et al., arXiv 2104.09864) in the rotate-half form of GPT-NeoX
and LLaMA: of each head's first `rot` dimensions, dimension i is paired with i + rot/2, and the pair
is rotated by the angle pos * base^(-2i/rot). With `model.rope_fraction` < 1 only the first `rot`
dimensions rotate and the rest pass through (GPT-NeoX's rotary_pct).
"""
from __future__ import annotations

import torch


def rope_tables(max_len: int, rot: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position's angles, [max_len, rot/2] float32 (computed in float64)."""
    inv_freq = base ** (-torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, H, T, hd] by the tables for its T positions, cos/sin [T, rot/2]."""
    rot = 2 * cos.size(-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2, rest = x[..., :rot // 2], x[..., rot // 2:rot], x[..., rot:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest), dim=-1)
