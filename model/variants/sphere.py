"""The sphere family: GeoNorm (a geodesic rotation) and the SpheretNorms (retractions), with their
shared options and update (the maths is in model/sphere.py)."""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


from ..decay import decay_factor
from ..norms import make_norm
from ..sphere import spheret_angle, sphere_update

from .base import Variant


class _SphereVariant(Variant):
    """Shared plumbing of the sphere family: F sees h directly, the update is a rotation of h."""


    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        # lambda indexed by block k of N (default, attention and MLP of a block share it) or by
        # sublayer j+1 of 2N (`norm.decay_index=sublayer`): the papers do not say which [choice].
        idx, n = (self.k, cfg.n_layer) if cfg.norm.decay_index == "block" else (j + 1, 2 * cfg.n_layer)
        self.lam = decay_factor(cfg.norm.decay, idx, n)
        self.track = False                       # the monitor turns this on at stats steps
        self.last_theta: Optional[torch.Tensor] = None
        # `norm.sublayer_input=norm`: F reads Norm(h) instead of the raw stream (the papers write F(h);
        # raw for the SpheretNorms, norm for GeoNorm: our choices). The rotation still acts on the raw h.
        self.in_norm = make_norm(cfg) if cfg.norm.sublayer_input == "norm" else None
        self._record_r: Optional[list] = None    # calibrate() collects the raw steps r here
        self.bound = cfg.norm.angle_bound()      # the largest angle the rule can produce (its Options say)

    def angle(self, r: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        """Rotation angle from r = ||v||/||h|| and the learnable scalars `params`."""
        raise NotImplementedError

    def angle_params(self):
        return ()

    def angle_bound(self) -> float:
        """The largest angle the rule can produce (the monitor reports the share of tokens near it)."""
        return self.bound

    def scale_for(self, r: torch.Tensor, target: float) -> float:
        """The initial step-size value that turns tokens with raw step r = ||v||/||h|| (the mean over a
        batch) by `target` on average; the variant's inverse of its angle rule."""
        raise NotImplementedError

    def set_initial_scale(self, value: float) -> None:
        raise NotImplementedError

    @classmethod
    def init_weights(cls, model):
        if model.config.norm.target_angle is not None:  # `norm.target_angle`: the step-0 calibration
            cls.calibrate(model, model.config.norm.target_angle)

    @classmethod
    @torch.no_grad()
    def calibrate(cls, model, target):
        """`norm.target_angle`: sublayer by sublayer (each sees the ones before it calibrated), measure
        the raw step r on a fixed batch of random tokens (its own generator: the model's RNG stream is
        untouched) and set the initial scalar so that the mean angle is `target`. A rule, not a
        constant: it holds at any width and depth (docs/variants.md, "Switches for open choices")."""
        cfg = model.config
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, cfg.vocab_size, (4, min(cfg.block_size, 64)), generator=g,
                          device=model.wte.weight.device)
        was_training = model.training
        model.eval()
        for rule in model.rules():
            rule.set_initial_scale(1.0)
        for rule in model.rules():
            seen = []
            rule._record_r = seen
            model(x)
            rule._record_r = None
            rule.set_initial_scale(rule.scale_for(seen[0], target))  # from the mean raw step over the batch
        model.train(was_training)

    def forward(self, h, f):
        s = f(h if self.in_norm is None else self.in_norm(h))
        angle = self.angle
        if self._record_r is not None:
            def angle(r, *params):
                self._record_r.append(r.detach().float().mean().item())
                return self.angle(r, *params)
        h_new, theta = sphere_update(h, s, angle, self.angle_params())
        if self.track:
            self.last_theta = theta.detach()
        return h_new


class GeoNorm(_SphereVariant):
    """GeoNorm (Zheng et al., arXiv 2601.22095, Eq. 3-5 and Appendix D): h = e [choice];
    v = s - (<s,h>/||h||^2) h;  theta0 = min(c, ||v||/||h||);  theta = min(c, (a*theta0 + b)*lambda_k);
    h <- cos(theta) h + sin(theta) ||h|| v/||v||;  output Norm(h) [choice].
    a (init `norm.a_init`, 1) and b (init 0) are learnable float scalars per sublayer; lambda_k from `norm.decay`."""

    optim_groups = {"a": "scalars", "b": "scalars"}

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.clamp = cfg.norm.clamp
        self.a = nn.Parameter(torch.tensor(float(cfg.norm.a_init)))
        self.b = nn.Parameter(torch.tensor(0.0))

    def angle_params(self):
        return (self.a, self.b)

    def scale_for(self, r, target):
        # theta = min(c, a * min(c, r) * lambda) at b = 0: a = target / (lambda r), the target below c
        return target / (self.lam * min(self.clamp, r))

    def set_initial_scale(self, value):
        self.a.fill_(value)

    def angle(self, r, a, b):
        theta0 = r.clamp(max=self.clamp)                           # clamp before decay
        return ((a * theta0 + b) * self.lam).clamp(max=self.clamp)  # and after

    def step_sizes(self):
        return {"a": self.a.detach(), "b": self.b.detach()}


def _inverse_softplus(a: float) -> float:
    """rho with softplus(rho) = a; the second form does not overflow for large a (expm1 does past ~709)."""
    return math.log(math.expm1(a)) if a < 700 else a + math.log1p(-math.exp(-a))


class SpheretNorm(_SphereVariant):
    """p-SpheretNorm (Sphere Retraction Normalizations, arXiv 2608.02668):
    input step ScaleNorm h = g sqrt(d) e/||e||;  z = s - (<s,h>/||h||^2) h;
    beta = alpha_k lambda_k ||z||/||h||;  theta = p atan(beta/p) (theta = beta for p = inf);
    h <- cos(theta) h + sin(theta) ||h|| z/||z||;  output Norm(h) [choice].
    alpha_k = softplus(rho) per sublayer, initialised to `norm.alpha_init` (1); lambda_k = 1/sqrt(k) by default."""

    optim_groups = {"rho": "scalars"}

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.p = cfg.norm.p
        self.rho = nn.Parameter(torch.tensor(_inverse_softplus(cfg.norm.alpha_init)))

    def angle_params(self):
        return (self.rho,)

    def scale_for(self, r, target):
        # theta = p atan(alpha lambda r / p): alpha = p tan(target / p) / (lambda r); target / (lambda r) at p = inf
        beta = target if math.isinf(self.p) else self.p * math.tan(target / self.p)
        return beta / (self.lam * r)

    def set_initial_scale(self, value):
        self.rho.fill_(_inverse_softplus(value))

    def angle(self, r, rho):
        return spheret_angle(F.softplus(rho) * self.lam * r, self.p)

    def step_sizes(self):
        return {"alpha": F.softplus(self.rho.detach())}


class ProjSpheretNorm(SpheretNorm):
    """1-SpheretNorm: the metric-projection retraction ||h|| (h+u)/||h+u|| (p = 1)."""


class CaySpheretNorm(SpheretNorm):
    """2-SpheretNorm: the Cayley retraction (p = 2)."""

