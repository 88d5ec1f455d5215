"""Sphere math shared by GeoNorm and the p-SpheretNorm family.

Every function acts per token over the last dimension. Reductions, norms and trig run in float32
(float64 if given float64); docs/variants.md, "Numerics of the sphere step".

Pure reference functions (the rules of docs/variants.md, readable): `tangent`, `spheret_angle`, `rotate`, `retract`.
`sphere_update` is the same step in the form the model uses: it never materialises the tangent
vector for autograd and saves only `h` and `s` (the tensors the sublayer keeps anyway), so the
sphere variants cost no more activation memory than Pre-LN.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence, Tuple

import torch

_TINY = 1e-30          # guards divisions by ||h||^2 (float32 min normal is ~1e-38)
_PARALLEL_TOL = 1e-10  # ||v||^2 <= tol * ||s||^2: s is parallel to h (angle < 1e-5 rad), no direction


def _acc(x: torch.Tensor) -> torch.Tensor:
    """Accumulation dtype: float32 for half types, else unchanged (lets tests run in float64)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-token <a, b>, in the inputs' precision (float32 from _acc) in forward and backward.

    Elementwise product and sum, deliberately not a matmul: autocast never lowers `mul`/`sum` to
    bf16 (a matmul under torch.compile would be differentiated in bf16, since AOTAutograd traces
    the backward under the forward's autocast, whatever region disabled it), and TF32 (which
    `allow_tf32` turns on for every float32 matmul on CUDA) never applies to them."""
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


def _coefficients(hh, hs, vv, angle, params):
    """Per-token scalars of the step h_new = A*h + w*s, and theta (all [..., 1], float32).

    A = cos(theta) - w<h,s>/||h||^2 and w = sin(theta)||h||/||v||; with no tangent direction
    (||v|| ~ 0, s parallel to h, or h = 0) theta is 0, so A = 1, w = 0 and h_new = h exactly.
    """
    with torch.no_grad():  # the mask needs no gradient; ||s||^2 = ||v||^2 + <h,s>^2/||h||^2
        ss = vv + hs * hs / hh.clamp_min(_TINY)
        valid = (hh > _TINY) & (vv > _PARALLEL_TOL * ss)
    one = torch.ones_like(vv)
    hh_safe = torch.where(valid, hh, one)
    n_h, n_v = hh_safe.sqrt(), torch.where(valid, vv, one).sqrt()  # finite gradients when invalid
    theta = torch.where(valid, angle(n_v / n_h, *params), torch.zeros_like(vv))
    w = torch.sin(theta) * n_h / n_v
    return torch.cos(theta) - w * (hs / hh_safe), w, theta


def _tangent_dots(h32, s32):
    """||h||^2, <h,s> and ||v||^2 with v = tangent(h, s) materialised: ||s||^2 - <h,s>^2/||h||^2
    would cancel catastrophically when s is nearly parallel to h."""
    hh, hs = _dot(h32, h32), _dot(h32, s32)
    v = torch.addcmul(s32, h32, hs / hh.clamp_min(_TINY), value=-1.0)
    return hh, hs, _dot(v, v)


def _combine(a, x, b, y, c=None, z=None):
    """a*x + b*y (+ c*z) with per-token scalars a, b, c: one new [..., d] buffer, updated in place."""
    out = a * x
    out.addcmul_(b, y)
    return out if c is None else out.addcmul_(c, z)


class _SphereStep(torch.autograd.Function):
    """Eager-mode fused sphere step. Saves h, s (which the sublayers keep anyway) and [..., 1]
    scalars; backward needs no tangent vector: with c = <h,s>/||h||^2 and the scalar gradients
    g_hh, g_hs, g_vv of ||h||^2, <h,s>, ||v||^2 (from a tiny autograd graph over per-token scalars
    and the step-size parameters), and g_A = <g,h>, g_w = <g,s>:
        dL/dh = A g + (2 g_hh + 2 c^2 g_vv) h + (g_hs - 2 c g_vv) s
        dL/ds = w g + (g_hs - 2 c g_vv) h + 2 g_vv s
    """

    @staticmethod
    def forward(ctx, h, s, angle, *params):
        h32, s32 = _acc(h), _acc(s)
        hh, hs, vv = _tangent_dots(h32, s32)
        with torch.enable_grad():  # the per-token scalar graph, replayed in backward
            leaves = [t.detach().requires_grad_() for t in (hh, hs, vv)]
            pleaves = [p.detach().requires_grad_() for p in params]
            a, w, theta = _coefficients(*leaves, angle, pleaves)
        ctx.graph = (a, w, leaves, pleaves)
        ctx.save_for_backward(h, s)
        ctx.c = hs / hh.clamp_min(_TINY)
        out = _combine(a.detach(), h32, w.detach(), s32).to(h.dtype)
        theta = theta.detach()
        ctx.mark_non_differentiable(theta)
        return out, theta

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_out, _g_theta):
        h, s = ctx.saved_tensors
        a, w, leaves, pleaves = ctx.graph
        h32, s32, g = _acc(h), _acc(s), _acc(g_out)
        grads = torch.autograd.grad((a, w), leaves + pleaves, (_dot(g, h32), _dot(g, s32)),
                                    allow_unused=True, retain_graph=True)  # tiny; lets backward rerun
        g_hh, g_hs, g_vv = (torch.zeros_like(a) if x is None else x for x in grads[:3])
        c = ctx.c
        cross = g_hs - 2 * c * g_vv
        g_h = _combine(a.detach(), g, 2 * g_hh + 2 * c * c * g_vv, h32, cross, s32)
        g_s = _combine(w.detach(), g, cross, h32, 2 * g_vv, s32)
        p_grads = [None if x is None else x.to(p.dtype) for x, p in zip(grads[3:], pleaves)]
        return (g_h.to(h.dtype), g_s.to(s.dtype), None, *p_grads)


def sphere_update(h: torch.Tensor, s: torch.Tensor, angle: Callable[..., torch.Tensor],
                  params: Sequence[torch.Tensor] = ()) -> Tuple[torch.Tensor, torch.Tensor]:
    """One sphere-family sublayer step: rotate(h, tangent(h, s), angle(||v||/||h||, *params)).

    `angle` maps the raw normalised step r = ||v||/||h|| (float32, [..., 1]) and the learnable
    scalars `params` to the rotation angle; GeoNorm and SpheretNorm differ only there. Returns
    (h_new in h's dtype, theta). Eager mode runs the fused `_SphereStep` (few passes over memory,
    saves only h and s); under torch.compile the plain expression is traced instead, which
    inductor fuses and rematerialises by itself; without gradients (inference) the plain one too.
    """
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (h, s, *params))
    if torch.compiler.is_compiling() or not needs_grad:
        h32, s32 = _acc(h), _acc(s)
        a, w, theta = _coefficients(*_tangent_dots(h32, s32), angle, params)
        return _combine(a, h32, w, s32).to(h.dtype), theta
    return _SphereStep.apply(h, s, angle, *params)
