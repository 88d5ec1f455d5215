"""The sphere math of docs/variants.md: retraction identities, limits, guards."""
import math

import pytest
import torch

from model.sphere import retract, rotate, spheret_angle, sphere_update, tangent


def _state(n=6, d=16, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=dtype) * 3.0
    s = torch.randn(n, d, generator=g, dtype=dtype)
    return h, s


def test_tangent_is_orthogonal_and_idempotent():
    h, s = _state()
    v = tangent(h, s)
    assert torch.allclose((v * h).sum(-1), torch.zeros(len(h), dtype=h.dtype), atol=1e-12)
    assert torch.allclose(tangent(h, v), v, atol=1e-12)


@pytest.mark.parametrize("scale", [0.01, 0.5, 3.0, 100.0])
def test_p1_is_metric_projection(scale):
    h, s = _state()
    u = tangent(h, s) * scale
    expected = h.norm(dim=-1, keepdim=True) * (h + u) / (h + u).norm(dim=-1, keepdim=True)
    assert torch.allclose(retract(h, u, 1.0), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("scale", [0.01, 0.7, 5.0])
def test_p2_is_cayley_with_explicit_inverse(scale):
    h, s = _state(n=4, d=8)
    u = tangent(h, s) * scale
    for i in range(len(h)):
        hi, ui = h[i:i + 1].T, u[i:i + 1].T  # column vectors
        W = (ui @ hi.T - hi @ ui.T) / (hi.T @ hi)
        eye = torch.eye(len(hi), dtype=h.dtype)
        cayley = torch.linalg.inv(eye - W / 2) @ (eye + W / 2) @ hi
        assert torch.allclose(retract(h[i:i + 1], u[i:i + 1], 2.0), cayley.T, rtol=1e-10, atol=1e-10)


def test_large_p_is_exponential_map_and_inf_is_exact():
    h, s = _state()
    u = tangent(h, s) * 0.8
    nh, nu = h.norm(dim=-1, keepdim=True), u.norm(dim=-1, keepdim=True)
    expmap = torch.cos(nu / nh) * h + torch.sin(nu / nh) * nh * u / nu
    assert torch.allclose(retract(h, u, 1e6), expmap, rtol=1e-9, atol=1e-9)
    assert torch.allclose(retract(h, u, math.inf), expmap, rtol=1e-12, atol=1e-12)


def test_tiny_p_is_identity():
    h, s = _state(dtype=torch.float32)
    u = tangent(h, s) * 10.0
    out = retract(h, u, 1e-6)
    assert ((out - h).norm(dim=-1) / h.norm(dim=-1)).max() < 1e-5


def test_angle_bounded_by_p_pi_over_2_float64():
    beta = torch.logspace(-6, 12, 200, dtype=torch.float64)
    for p in (1e-3, 0.5, 1.0, 2.0, 7.0):
        theta = spheret_angle(beta, p)
        assert (theta <= p * math.pi / 2).all() and (theta > 0).all()
        assert (theta <= beta * (1 + 1e-12)).all()  # never more than the exponential map's angle
    assert torch.equal(spheret_angle(beta, math.inf), beta)


@pytest.mark.parametrize("p", [1.0, 2.0, math.inf])
def test_retraction_keeps_norm(p):
    h, s = _state(dtype=torch.float32)
    out = retract(h, tangent(h, s) * 2.0, p)
    assert torch.allclose(out.norm(dim=-1), h.norm(dim=-1), rtol=1e-6)


def test_finite_gradients_at_zero_update():
    h, _ = _state()
    h.requires_grad_(True)
    u = torch.zeros_like(h, requires_grad=True)
    out = retract(h, u, 1.0)
    assert torch.equal(out.detach(), h.detach())
    out.sum().backward()
    assert torch.isfinite(h.grad).all() and torch.isfinite(u.grad).all()


def _angle_fn(a=1.0, b=0.0):
    return lambda r: a * r + b


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sphere_update_equals_reference(dtype):
    h, s = _state(dtype=dtype)
    for a, b in [(1.0, 0.0), (3.0, 0.4), (0.2, -0.3)]:
        out, theta = sphere_update(h, s, _angle_fn(a, b))
        ref = rotate(h, tangent(h, s), theta)
        tol = 1e-5 if dtype == torch.float32 else 1e-12
        assert torch.allclose(out, ref, rtol=tol, atol=tol)
        r = tangent(h, s).norm(dim=-1, keepdim=True) / h.norm(dim=-1, keepdim=True)
        assert torch.allclose(theta, a * r + b, rtol=tol)


def test_sphere_update_gradients_match_reference():
    h, s = _state(n=3, d=7)
    a = torch.tensor(1.7, dtype=torch.float64, requires_grad=True)

    def fused(h, s, a):
        return sphere_update(h, s, lambda r, a: torch.atan(a * r), (a,))[0]

    def reference(h, s, a):
        v = tangent(h, s)
        r = v.norm(dim=-1, keepdim=True) / h.norm(dim=-1, keepdim=True)
        return rotate(h, v, torch.atan(a * r))

    inputs = (h.clone().requires_grad_(True), s.clone().requires_grad_(True), a)
    assert torch.autograd.gradcheck(fused, inputs)
    w = torch.randn_like(h)
    g1 = torch.autograd.grad((fused(*inputs) * w).sum(), inputs)
    g2 = torch.autograd.grad((reference(*inputs) * w).sum(), inputs)
    for x, y in zip(g1, g2):
        assert torch.allclose(x, y, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_parallel_update_returns_h_with_finite_gradients(dtype):
    h, _ = _state(dtype=dtype)
    h = h.clone().requires_grad_(True)
    s = (2.5 * h.detach()).requires_grad_(True)
    out, theta = sphere_update(h, s, _angle_fn(1.0, 0.5))  # b != 0: theta would be nonzero
    assert torch.allclose(out, h, rtol=1e-6, atol=0)
    assert (theta == 0).all()
    out.sum().backward()
    assert torch.isfinite(h.grad).all() and torch.isfinite(s.grad).all()
    zero = torch.zeros_like(h, requires_grad=True)
    out0, _ = sphere_update(zero, s, _angle_fn(1.0, 0.5))  # ||h|| = 0: nothing to rotate
    assert torch.equal(out0, zero.detach())
