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


# --- precision of the sphere step under bf16 autocast, torch.compile and TF32 ---------------------

SPHERE = ["geonorm", "spheret", "proj_spheret", "cay_spheret"]


def _sublayer_step(norm):
    """One sphere sublayer (block 1) with a float32 elementwise sublayer F(x) = s + sin(x)/2, and
    perturbed step sizes: gradients reach h, s and the learnable scalars."""
    from model import GPTConfig, get_variant

    cfg = GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=32, norm=norm)
    rule = get_variant(norm)(cfg, 1)
    with torch.no_grad():
        for p in rule.parameters():
            p.add_(0.3)

    def step(h, s):
        return rule(h, lambda x: s + 0.5 * torch.sin(x))

    return rule, step


@pytest.mark.slow
@pytest.mark.parametrize("norm", SPHERE)
def test_compiled_sphere_gradients_are_float32_under_bf16_autocast(norm):
    """Eager and torch.compile (aot_eager: AOTAutograd, no codegen) both differentiate the sphere
    step in float32 under bf16 autocast: every gradient within float32 precision of a float64
    reference. (A matmul for the dot products would be differentiated in bf16 when compiled,
    ~5e-4 relative error here, because AOTAutograd traces the backward under the forward's autocast.)"""
    rule, step = _sublayer_step(norm)
    g = torch.Generator().manual_seed(0)
    h, s, w = (torch.randn(4, 6, 32, generator=g) * c for c in (3.0, 1.0, 1.0))

    def grads(fn, dtype, autocast):
        rule.to(dtype)
        for p in rule.parameters():
            p.grad = None
        hl, sl = h.to(dtype).clone().requires_grad_(), s.to(dtype).clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = fn(hl, sl)
        (out * w.to(dtype)).sum().backward()  # backward outside autocast, as in the training loop
        return [x.double() for x in (hl.grad, sl.grad, *(p.grad for p in rule.parameters()))]

    ref = grads(step, torch.float64, False)
    eager = grads(step, torch.float32, True)
    torch._dynamo.reset()
    compiled = grads(torch.compile(step, backend="aot_eager"), torch.float32, True)
    for name, got in (("eager", eager), ("compiled", compiled)):
        errs = [((x - y).norm() / y.norm()).item() for x, y in zip(got, ref)]
        assert max(errs) < 1e-5, (name, errs)


def test_sphere_step_runs_no_matmul():
    """The per-token dot products are not matmuls, in forward or backward, eager or traced path:
    on CUDA `allow_tf32` would otherwise run them in TF32 (~1e-3 relative angle error for small
    tangent updates) and autocast could lower them to bf16."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    matmuls = {"mm", "bmm", "matmul", "addmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot", "linear"}
    for norm in SPHERE:
        rule, step = _sublayer_step(norm)
        h, s = _state(n=6, d=32, dtype=torch.float32)
        for grad in (True, False):  # fused autograd Function; plain expression (inference, compile)
            with Ops() as ops, torch.autocast("cpu", dtype=torch.bfloat16), torch.set_grad_enabled(grad):
                hl = h.clone().requires_grad_(grad)
                out = step(hl, s)
                if grad:
                    out.sum().backward()
            assert "mul" in ops.seen and not (ops.seen & matmuls), (norm, grad, ops.seen & matmuls)
