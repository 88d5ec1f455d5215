"""Sphere math shared by GeoNorm and the p-SpheretNorm family.

Every function acts per token over the last dimension. Reductions, norms and trig run in float32
(float64 if given float64), as ../shared/spec/variants.md "Numerical rules" requires.

Pure reference functions (the spec, readable): `tangent`, `spheret_angle`, `rotate`, `retract`.
`sphere_update` is the same step in the form the model uses: it never materialises the tangent
vector for autograd and saves only `h` and `s` (the tensors the sublayer keeps anyway), so the
sphere variants cost no more activation memory than Pre-LN.
"""
from __future__ import annotations

import math
from typing import Callable, Tuple

import torch

_TINY = 1e-30          # guards divisions by ||h||^2 (float32 min normal is ~1e-38)
_PARALLEL_TOL = 1e-10  # ||v||^2 <= tol * ||s||^2: s is parallel to h (angle < 1e-5 rad), no direction


def _acc(x: torch.Tensor) -> torch.Tensor:
    """Accumulation dtype: float32 for half types, else unchanged (lets tests run in float64)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum(-1, keepdim=True)


def tangent(h: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Gram-Schmidt of `s` against `h`: v = s - (<s,h>/||h||^2) h (GeoNorm Eq. 3; SpheretNorm's z)."""
    h, s = _acc(h), _acc(s)
    return s - _dot(s, h) / _dot(h, h).clamp_min(_TINY) * h


def spheret_angle(beta: torch.Tensor, p: float) -> torch.Tensor:
    """Rotation angle of the p-retraction for normalised step beta: p*atan(beta/p); beta for p=inf.

    p=1 is the metric projection, p=2 the Cayley transform, p->inf the exponential map; for finite
    p the angle is below p*pi/2, which is what keeps a huge update from wrapping around the sphere.
    """
    if math.isinf(p):
        return beta
    return p * torch.atan(beta / p)


def rotate(h: torch.Tensor, v: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Rotate `h` by angle `theta` towards the tangent direction `v` (v is orthogonal to h), keeping ||h||.

    h_new = cos(theta) h + sin(theta) ||h|| v/||v||. With no tangent direction (v = 0) there is
    nothing to rotate towards and the result is exactly h (not cos(theta) h, which would shrink it).
    """
    h32, v32 = _acc(h), _acc(v)
    hh, vv = _dot(h32, h32), _dot(v32, v32)
    valid = (vv > 0) & (hh > 0)
    n_v = torch.where(valid, vv, torch.ones_like(vv)).sqrt()  # finite value and gradient at v = 0
    theta = torch.where(valid, theta, torch.zeros_like(theta))
    out = torch.cos(theta) * h32 + (torch.sin(theta) * hh.sqrt() / n_v) * v32
    return out.to(h.dtype)


def retract(h: torch.Tensor, u: torch.Tensor, p: float) -> torch.Tensor:
    """p-family retraction of `h` along the (already scaled, tangent) update `u`: rotation by
    spheret_angle(||u||/||h||, p) in the plane of h and u, keeping ||h|| (SpheretNorm paper)."""
    h32, u32 = _acc(h), _acc(u)
    uu = _dot(u32, u32)
    n_u = torch.where(uu > 0, uu, torch.ones_like(uu)).sqrt()  # sqrt'(0) is infinite: mask u = 0
    beta = torch.where(uu > 0, n_u, torch.zeros_like(uu)) / _dot(h32, h32).sqrt().clamp_min(_TINY)
    return rotate(h, u, spheret_angle(beta, p))


class _TangentDots(torch.autograd.Function):
    """(h, s) -> (||h||^2, <h,s>, ||v||^2) per token, in float32, with v = tangent(h, s).

    ||v||^2 is measured on the materialised v (not as ||s||^2 - <h,s>^2/||h||^2, which cancels
    catastrophically when s is nearly parallel to h). Only h and s are saved; v is recomputed in
    backward. Gradients: d||h||^2/dh = 2h; d<h,s> = (s, h); d||v||^2/ds = 2v, d||v||^2/dh = -2cv.
    """

    @staticmethod
    def forward(ctx, h, s):
        h32, s32 = _acc(h), _acc(s)
        hh, hs = _dot(h32, h32), _dot(h32, s32)
        v = s32 - hs / hh.clamp_min(_TINY) * h32
        ctx.save_for_backward(h, s)
        return hh, hs, _dot(v, v)

    @staticmethod
    def backward(ctx, g_hh, g_hs, g_vv):
        h, s = ctx.saved_tensors
        h32, s32 = _acc(h), _acc(s)
        c = _dot(h32, s32) / _dot(h32, h32).clamp_min(_TINY)
        v = s32 - c * h32
        g_h = 2 * g_hh * h32 + g_hs * s32 - (2 * c * g_vv) * v
        g_s = g_hs * h32 + (2 * g_vv) * v
        return g_h.to(h.dtype), g_s.to(s.dtype)


def sphere_update(h: torch.Tensor, s: torch.Tensor,
                  angle: Callable[[torch.Tensor], torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """One sphere-family sublayer step: rotate(h, tangent(h, s), angle(||v||/||h||)).

    `angle` maps the raw normalised step r = ||v||/||h|| (float32, shape [..., 1]) to the rotation
    angle; GeoNorm and SpheretNorm differ only there. Written as h_new = A*h + w*s with per-token
    scalars A = cos(theta) - w<h,s>/||h||^2 and w = sin(theta)||h||/||v||, so autograd keeps h, s and
    two [..., 1] tensors, nothing of size d more. Returns (h_new in h's dtype, theta).
    """
    hh, hs, vv = _TangentDots.apply(h, s)
    with torch.no_grad():  # the mask needs no gradient; ||s||^2 = ||v||^2 + <h,s>^2/||h||^2
        ss = vv + hs * hs / hh.clamp_min(_TINY)
        valid = (hh > _TINY) & (vv > _PARALLEL_TOL * ss)
    one = torch.ones_like(vv)
    n_h = torch.where(valid, hh, one).sqrt()
    n_v = torch.where(valid, vv, one).sqrt()
    theta = torch.where(valid, angle(n_v / n_h), torch.zeros_like(vv))
    w = torch.sin(theta) * n_h / n_v
    a = torch.cos(theta) - w * (hs / torch.where(valid, hh, one))
    return (a * h + w * s).to(h.dtype), theta
