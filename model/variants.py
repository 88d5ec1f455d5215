"""The normalization variants: one small class each, picked by name from `VARIANTS`.

A variant is three parts (docs/variants.md gives every variant's exact rule and source):
  1. input step  `input_step(cfg)`:  what happens to the embeddings e before block 1;
  2. sublayer rule  `forward(h, f)`:  how the stream h is updated by one sublayer f (attention or MLP);
  3. output step `output_step(cfg)`: what happens to h before the LM head.
One instance of the class is made per sublayer (index j = 0..2N-1, block k = j//2 + 1), so each
sublayer owns its norms and scalars.

Each variant owns its `norm.*` keys: `Options`, a dataclass on the class that extends its parent's (and
may change a parent's default: Post-LN has no output Norm). `GPTConfig.norm` is an instance of the
chosen variant's `Options`, so `cfg.norm.clamp` exists exactly for the variants that read it, and a key
the variant does not read is an error naming the keys it does (model/config.py builds it). A new option
is one field with its doc line, its valid values in its annotation (`streams: PosInt = 4`, `Literal`,
`Range`: common/config.py); a check relating two fields goes in that class's `__post_init__`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Callable, ClassVar, Dict, Literal, Optional, Type

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import Registry
from common.config import Finite, NonNeg, PosInt, Positive, Range, bad, check

from .decay import DECAYS, decay_factor
from .norms import INPUT_STEPS, NORM_KINDS, DyT, make_input_step, make_norm
from .sphere import _acc, _dot, spheret_angle, sphere_update

if TYPE_CHECKING:  # type hints only: the config imports the registry, not the other way round
    from .config import GPTConfig

VARIANTS = Registry("norm.name")   # name -> Variant class; `@register("name")` adds one
register = VARIANTS.register


def get_variant(name: str) -> Type["Variant"]:
    return VARIANTS[name]  # an unknown name raises ConfigError listing the valid ones


Sublayer = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class NormOptions:
    """The `norm.*` keys every variant reads (its Norms, input and output step)."""
    name: str = "pre_ln"              # the variant: a name registered in model/variants.py
    kind: str = "layernorm"           # layernorm | rmsnorm | derf (every Norm of the variant)
    eps: NonNeg = 1e-5                # epsilon of every Norm
    embed_norm: str = "none"          # input step: none | layer | scalenorm | unit | scaled
    final_norm: bool = True           # output Norm before the LM head
    learn_radius: bool = True         # input step scalenorm: its radius g learnable (false: fixed at 1)
    derf_alpha: Positive = 1.0        # norm.kind=derf: Derf's initial alpha (1: its paper's language-model setting)

    def __post_init__(self) -> None:
        check(self, "norm")  # every field of the variant's Options, its own included
        NORM_KINDS[self.kind], INPUT_STEPS[self.embed_norm]  # unknown names: one line listing the valid ones

    def unread(self, given) -> dict:
        """Of the keys set (`given`) away from their defaults, those this configuration does not read, each
        with the setting that reads it (a fixed radius without a ScaleNorm to fix; Derf's alpha without Derf)."""
        out = {}
        if not self.learn_radius and self.embed_norm != "scalenorm":
            out["learn_radius"] = "norm.embed_norm=scalenorm"
        if self.derf_alpha != 1.0 and self.kind != "derf":
            out["derf_alpha"] = "norm.kind=derf"
        return out


class Variant(nn.Module):
    """Base: Pre-LN-style input and output steps; subclasses define `forward`."""

    name = "base"
    Options = NormOptions  # this variant's `norm.*` keys (subclasses extend it)

    def __init__(self, cfg: "GPTConfig", j: int):
        super().__init__()
        self.j, self.k, self.n_layer = j, j // 2 + 1, cfg.n_layer
        self.is_attn = j % 2 == 0

    def forward(self, h: torch.Tensor, f: Sublayer) -> torch.Tensor:
        raise NotImplementedError

    @classmethod
    def input_step(cls, cfg: "GPTConfig") -> nn.Module:
        return make_input_step(cfg)

    @classmethod
    def output_step(cls, cfg: "GPTConfig") -> nn.Module:
        return make_norm(cfg) if cfg.norm.final_norm else nn.Identity()

    @classmethod
    def init_weights(cls, model: nn.Module) -> None:
        """Hook after the `model.init` scheme (DeepNorm replaces some gains; the sphere family calibrates)."""

    def step_sizes(self) -> Dict[str, torch.Tensor]:
        """Learned step-size scalars, for the training monitor."""
        return {}

    # ---- hooks beyond the residual stream (docs/variants.md, "Variant interface"); None / no-op by default ----
    # A variant that changes the inside of a sublayer, the logits or the optimizer step says so here,
    # and the model and trainer call these hooks without knowing which variant they serve.

    optim_overrides: Dict[str, Any] = {}  # OptimConfig fields the variant fixes; weight_decay: every group's

    @staticmethod
    def stream_view(h: torch.Tensor) -> torch.Tensor:
        """The stream as the monitor and `return_hidden` see it, [B, T, d]: itself, but for a widened
        stream (hyper-connections: the sum of its copies)."""
        return h

    @classmethod
    def qkv_step(cls, cfg: "GPTConfig") -> Optional[nn.Module]:
        """A module applied to q, k, v [B, T, d] right after their projection, `(q, k, v) -> (q, k, v)`,
        before the heads are split and RoPE turns them (HybridNorm's QKV-Norm). One per attention sublayer."""
        return None

    @classmethod
    def attention_step(cls, cfg: "GPTConfig") -> Optional[nn.Module]:
        """A module applied to q, k [B, H, T, hd] after RoPE, `(q, k) -> (q, k)`; its `softmax_scale`
        replaces SDPA's 1/sqrt(hd). One per attention sublayer."""
        return None

    @classmethod
    def mlp_step(cls, cfg: "GPTConfig", hidden: int) -> Optional[nn.Module]:
        """A module with `up(u)` (SwiGLU's linear branch) and `gate(v)` (the activation's input),
        applied to the MLP's hidden pre-activations. One per MLP sublayer."""
        return None

    @classmethod
    def logit_step(cls, cfg: "GPTConfig") -> Optional[nn.Module]:
        """A module applied to the LM head's logits."""
        return None

    @classmethod
    def after_step(cls, model: nn.Module, applied: torch.Tensor) -> None:
        """Called by the trainer after every optimizer step with `applied`, a 0-d bool tensor on the
        device (False: the step was skipped as non-finite). It must leave the model untouched when
        `applied` is False, and must not read `applied` on the host (the loop is sync-free)."""


@register("pre_ln")
class PreLN(Variant):
    """Pre-LN (GPT-2; nanoGPT): h = e;  h <- h + F(Norm(h));  output Norm(h)."""

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.norm = make_norm(cfg)

    def forward(self, h, f):
        return h + f(self.norm(h))


@register("post_ln")
class PostLN(Variant):
    """Post-LN (Vaswani et al. 2017, sec. 3.1): h = e;  h <- Norm(h + F(h));  no output step."""

    @dataclass
    class Options(NormOptions):
        final_norm: bool = False      # output Norm before the LM head

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.norm = make_norm(cfg)

    def forward(self, h, f):
        return self.norm(h + f(h))


@register("deepnorm")
class DeepNorm(Variant):
    """DeepNorm (Wang et al., DeepNet, arXiv 2203.00555, decoder-only constants):
    h = e;  h <- Norm(alpha*h + F(h)), alpha = (2N)^(1/4);  no output step.
    Init: beta = (8N)^(-1/4) < 1 on V, attention output and both MLP matrices (see init_weights)."""

    @dataclass
    class Options(NormOptions):
        final_norm: bool = False      # output Norm before the LM head
        #: scaled: nanoGPT's N(0, 0.02) times beta; xavier: beta times Xavier's std
        deepnorm_init: Literal["scaled", "xavier"] = "scaled"

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


@register("sandwich")
class Sandwich(Variant):
    """Sandwich-LN (Ding et al., CogView, arXiv 2105.13290):
    h = e;  h <- h + Norm_out(F(Norm_in(h)));  output Norm(h)."""

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.norm_in = make_norm(cfg)
        self.norm_out = make_norm(cfg)

    def forward(self, h, f):
        return h + self.norm_out(f(self.norm_in(h)))


@register("peri_ln")
class PeriLN(Sandwich):
    """Peri-LN (Kim et al., arXiv 2502.02732): Sandwich's rule, plus the input step h = Norm_emb(e)."""

    @dataclass
    class Options(NormOptions):
        embed_norm: str = "layer"     # input step: none | layer | scalenorm | unit


@register("keel")
class Keel(Variant):
    """Keel (arXiv 2601.19895): h = e;  h <- Norm_1(alpha*h + F(Norm_2(h))), alpha = 2N (sublayers);
    no output step [choice]. First sublayers (`norm.first_layer`): v2 (default) makes sublayer 1
    plain Pre-LN and sublayer 2 use alpha = 1; v1 makes sublayers 1 and 2 plain Pre-LN."""

    @dataclass
    class Options(NormOptions):
        final_norm: bool = False      # output Norm before the LM head
        first_layer: Literal["v2", "v1"] = "v2"  # Keel's first sublayers

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


@register("pre_dyt")
class PreDyT(Variant):
    """Pre-DyT (Zhu et al., arXiv 2503.10622): h = e;  h <- h + F(DyT(h));  output DyT(h).
    alpha init: `norm.alpha_attn` before attention, `norm.alpha_other` before the MLP and at the output."""

    @dataclass
    class Options(NormOptions):
        alpha_attn: Finite = 0.5      # DyT alpha at init, attention sublayers
        alpha_other: Finite = 0.5     # DyT alpha at init, other Norms

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.norm = DyT(cfg.n_embd, cfg.norm.alpha_attn if self.is_attn else cfg.norm.alpha_other)

    def forward(self, h, f):
        return h + f(self.norm(h))

    @classmethod
    def output_step(cls, cfg):
        return DyT(cfg.n_embd, cfg.norm.alpha_other) if cfg.norm.final_norm else nn.Identity()


# p of a SpheretNorm retraction: > 0, .inf the exponential map
RetractionP = Annotated[float, Range(0, math.inf, "(]", "(.inf in YAML for the exponential map)")]


@dataclass
class SphereOptions(NormOptions):
    """The `norm.*` keys of the sphere family (GeoNorm, the SpheretNorms)."""
    decay: str = "none"               # step decay lambda: none | harmonic | sqrt | linear
    decay_index: Literal["block", "sublayer"] = "block"  # lambda indexed by block k of N, or by sublayer j+1 of 2N
    #: F reads the raw stream h (raw) or Norm(h) (norm; GeoNorm's default)
    sublayer_input: Literal["raw", "norm"] = "raw"
    #: initial step sizes set so the mean angle at init is this (rad); null: the _init value
    target_angle: Optional[float] = None

    def __post_init__(self):
        super().__post_init__()
        DECAYS[self.decay]
        if self.target_angle is not None and not 0 < self.target_angle < self.angle_bound():
            bad("norm.target_angle", self.target_angle, f"must be a number in (0, {self.angle_bound():.4g}) rad "
                "(the rule's bound), or null")

    def angle_bound(self) -> float:
        """The largest angle the rule can produce: bounds norm.target_angle, and the monitor reports the
        share of tokens near it."""
        return math.inf


class _SphereVariant(Variant):
    """Shared plumbing of the sphere family: F sees h directly, the update is a rotation of h."""

    Options = SphereOptions

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


@register("geonorm")
class GeoNorm(_SphereVariant):
    """GeoNorm (Zheng et al., arXiv 2601.22095, Eq. 3-5 and Appendix D): h = e [choice];
    v = s - (<s,h>/||h||^2) h;  theta0 = min(c, ||v||/||h||);  theta = min(c, (a*theta0 + b)*lambda_k);
    h <- cos(theta) h + sin(theta) ||h|| v/||v||;  output Norm(h) [choice].
    a (init `norm.a_init`, 1) and b (init 0) are learnable float scalars per sublayer; lambda_k from `norm.decay`."""

    @dataclass
    class Options(SphereOptions):
        decay: str = "harmonic"       # step decay lambda: none | harmonic (GeoNorm's) | sqrt (SpheretNorm's) | linear
        clamp: Annotated[float, Range(0, math.pi, "(]", "(3.14159 = pi)")] = math.pi / 4  # angle clamp c (pi/4)
        a_init: Finite = 1.0          # a at init
        # Attention and the MLP read Norm(h): GeoNorm's stream keeps the embedding's radius, so the raw h
        # (the other choice, `raw`) makes its first attention logits ~1e-3 of Pre-LN's (our choice; the
        # paper does not say what its sublayers read; docs/step_scale_study.md).
        sublayer_input: Literal["raw", "norm"] = "norm"

        def angle_bound(self):
            return self.clamp

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


@register("spheret")
class SpheretNorm(_SphereVariant):
    """p-SpheretNorm (Sphere Retraction Normalizations, arXiv 2608.02668):
    input step ScaleNorm h = g sqrt(d) e/||e||;  z = s - (<s,h>/||h||^2) h;
    beta = alpha_k lambda_k ||z||/||h||;  theta = p atan(beta/p) (theta = beta for p = inf);
    h <- cos(theta) h + sin(theta) ||h|| z/||z||;  output Norm(h) [choice].
    alpha_k = softplus(rho) per sublayer, initialised to `norm.alpha_init` (1); lambda_k = 1/sqrt(k) by default."""

    @dataclass
    class Options(SphereOptions):
        fixed_p: ClassVar[Optional[float]] = None  # set by the variants that are one member of the p-family
        decay: str = "sqrt"           # step decay lambda: none | harmonic (GeoNorm's) | sqrt (SpheretNorm's) | linear
        embed_norm: str = "scalenorm" # input step: none | layer | scalenorm | unit
        p: RetractionP = 1.0          # p of the retraction (> 0; .inf = the exponential map)
        alpha_init: Annotated[float, Range(0, math.inf, "()", "(softplus(rho) at init)")] = 1.0  # softplus(rho) at init

        def __post_init__(self):
            super().__post_init__()
            if self.fixed_p is not None and self.p != self.fixed_p:
                bad("norm.p", self.p, f"norm.name={self.name} means p={self.fixed_p:g}; use norm=spheret to choose p")

        def angle_bound(self):
            return self.p * math.pi / 2  # p atan(beta/p) < p pi/2; inf for the exponential map

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


@register("proj_spheret")
class ProjSpheretNorm(SpheretNorm):
    """1-SpheretNorm: the metric-projection retraction ||h|| (h+u)/||h+u|| (p = 1)."""

    @dataclass
    class Options(SpheretNorm.Options):
        fixed_p: ClassVar[Optional[float]] = 1.0
        p: RetractionP = 1.0          # fixed: 1 (use norm=spheret to choose p)


@register("cay_spheret")
class CaySpheretNorm(SpheretNorm):
    """2-SpheretNorm: the Cayley retraction (p = 2)."""

    @dataclass
    class Options(SpheretNorm.Options):
        fixed_p: ClassVar[Optional[float]] = 2.0
        p: RetractionP = 2.0          # fixed: 2 (use norm=spheret to choose p)


# ---- optional extras beyond the two papers' baseline lists (docs/variants.md, "Summary") ----

@register("lns")
class LayerNormScaling(Variant):
    """LayerNorm Scaling (Sun et al., "The Curse of Depth", arXiv 2502.05795):
    h = e;  h <- h + F(Norm(h)/sqrt(k)), k the block index;  output Norm(h)."""

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.norm = make_norm(cfg)
        self.scale = 1.0 / math.sqrt(self.k)

    def forward(self, h, f):
        return h + f(self.norm(h) * self.scale)


@register("mix_ln")
class MixLN(Variant):
    """Mix-LN (Li et al., arXiv 2412.13795): Post-LN in the first floor(0.25*N) blocks, Pre-LN after;
    h = e; output Norm(h) (the last blocks are Pre-LN)."""

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.post = self.k <= int(0.25 * cfg.n_layer)
        self.norm = make_norm(cfg)

    def forward(self, h, f):
        return self.norm(h + f(h)) if self.post else h + f(self.norm(h))


# ---- nGPT: the normalized Transformer (everything on the unit sphere, weights included) ----

class _ScaledVector(nn.Module):
    """nGPT's scaled parametrisation of a learned vector: stored s (init `scale`), used as
    s * init/scale, so its effective value starts at `init` while Adam's step on s is relative to `scale`."""

    optim_groups = {"s": "scalars"}

    def __init__(self, size: int, init: float, scale: float):
        super().__init__()
        self.ratio = init / scale
        self.s = nn.Parameter(torch.full((size,), float(scale)))

    def value(self) -> torch.Tensor:
        return self.s * self.ratio


def _unit(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    x32 = x.float()
    return (x32 / x32.norm(dim=dim, keepdim=True).clamp_min(1e-12)).to(x.dtype)


class _NGPTQK(nn.Module):
    """q, k normalized per head and scaled by s_qk (init 1, scale 1/sqrt(d)); softmax scale sqrt(d_k)."""

    def __init__(self, cfg: "GPTConfig"):
        super().__init__()
        self.n_head, self.hd = cfg.n_head, cfg.n_embd // cfg.n_head
        self.s_qk = _ScaledVector(cfg.n_embd, 1.0, cfg.n_embd ** -0.5)
        self.softmax_scale = math.sqrt(self.hd)

    def forward(self, q, k):
        s = self.s_qk.value().view(1, self.n_head, 1, self.hd).to(q.dtype)
        return s * _unit(q), s * _unit(k)


class _NGPTMLP(nn.Module):
    """u <- u * s_u;  v <- v * s_v * sqrt(d) (the activation's input, kept in its non-linear range);
    s_u, s_v init 1, scale 1. A one-branch MLP (GELU, ReLU^2) has no u, so no s_u."""

    def __init__(self, cfg: "GPTConfig", hidden: int):
        super().__init__()
        if cfg.mlp == "swiglu":
            self.s_u = _ScaledVector(hidden, 1.0, 1.0)
        self.s_v = _ScaledVector(hidden, 1.0, 1.0)
        self.sqrt_d = math.sqrt(cfg.n_embd)

    def up(self, u):
        return u * self.s_u.value().to(u.dtype)

    def gate(self, v):
        return v * (self.s_v.value() * self.sqrt_d).to(v.dtype)


class _NGPTLogits(nn.Module):
    """logits * s_z (init 1, scale 1/sqrt(d)), per vocabulary entry."""

    def __init__(self, cfg: "GPTConfig"):
        super().__init__()
        self.s_z = _ScaledVector(cfg.vocab_size, 1.0, cfg.n_embd ** -0.5)

    def forward(self, logits):
        return logits * self.s_z.value().to(logits.dtype)


@register("ngpt")
class NGPT(Variant):
    """nGPT (Loshchilov et al., arXiv 2410.01131; NVIDIA/ngpt where the paper is silent):
    input step h = e/||e||;  h <- Norm(h + alpha (.) (Norm(F(h)) - h)), Norm(x) = x/||x||, alpha per
    dimension (init 0.05, scale 1/sqrt(d), used as |alpha|);  no output step;  q, k unit per head times
    s_qk with softmax scale sqrt(d_k);  MLP scalers s_u, s_v;  logits times s_z;  embeddings, head and
    every matrix renormalized along the embedding dimension after each applied optimizer step;
    no weight decay, no warmup."""

    @dataclass
    class Options(NormOptions):
        embed_norm: str = "unit"      # input step: none | layer | scalenorm | unit
        final_norm: bool = False      # output Norm before the LM head
    optim_overrides = {"weight_decay": 0.0, "warmup_steps": 0}

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.alpha = _ScaledVector(cfg.n_embd, 0.05, cfg.n_embd ** -0.5)

    def forward(self, h, f):
        a = self.alpha.value().abs()
        h32 = h.float()
        return _unit(h32 + a * (_unit(f(h)).float() - h32)).to(h.dtype)

    def step_sizes(self):
        return {"alpha_mean": self.alpha.value().detach().abs().mean()}

    @classmethod
    def attention_step(cls, cfg):
        return _NGPTQK(cfg)

    @classmethod
    def mlp_step(cls, cfg, hidden):
        return _NGPTMLP(cfg, hidden)

    @classmethod
    def logit_step(cls, cfg):
        return _NGPTLogits(cfg)

    @staticmethod
    def unit_matrices(model):
        """(weight, dim) of every matrix nGPT keeps unit-norm along the embedding dimension: the rows
        of tables and input projections ([out, d]: dim 1), the columns of output projections ([d, in]: dim 0)."""
        out = [(model.wte.weight, 1), (model.lm_head.weight, 1)]
        if hasattr(model, "wpe"):
            out.append((model.wpe.weight, 1))
        for b in model.blocks:
            out += [
                (b.attn.c_attn.weight, 1),
                (b.attn.c_proj.weight, 0),
                (b.mlp.c_fc.weight, 1),
                (b.mlp.c_proj.weight, 0),
            ]
            if hasattr(b.mlp, "c_gate"):
                out.append((b.mlp.c_gate.weight, 1))
        return out

    @classmethod
    def init_weights(cls, model):
        cls.after_step(model, torch.ones((), dtype=torch.bool))

    @classmethod
    @torch.no_grad()
    def after_step(cls, model, applied):
        for w, dim in cls.unit_matrices(model):  # a tied head is normalized twice: the same rows, idempotent
            w.copy_(torch.where(applied, _unit(w, dim), w))


# --- the residual-stream methods of 2025-26 (registered last: earlier variants keep their order) ---

@register("pre_derf")
class PreDerf(PreLN):
    """Pre-Derf (Chen et al., arXiv 2512.10938, its nanoGPT recipe): h = s e (s learnable, init sqrt(d));
    h <- h + F(Derf(h));  output Derf(h);  Derf(x) = gamma erf(alpha x + shift) + beta (Eq. 1).
    Pre-LN with norm.kind=derf and the scaled input step; any variant takes norm.kind=derf."""

    @dataclass
    class Options(NormOptions):
        kind: str = "derf"            # layernorm | rmsnorm | derf (every Norm of the variant)
        embed_norm: str = "scaled"    # input step: none | layer | scalenorm | unit | scaled


@register("ortho_pre_ln")
class OrthoPreLN(Variant):
    """Orthogonal residual update (Oh et al., arXiv 2505.11881, Eq. 4 with its stabiliser eps): h = e;
    s = F(Norm(h));  h <- h + (s - (<s,h>/(||h||^2 + eps)) h);  output Norm(h). Only the part of the
    sublayer's output orthogonal to its token's stream is added: the stream is turned and lengthened
    (||h||^2 grows by ||s_perp||^2), never scaled along itself. Between Pre-LN and the sphere family:
    the tangent projection without a retraction. Dots in float32 [choice]; per token, over d."""

    @dataclass
    class Options(NormOptions):
        ortho_eps: NonNeg = 1e-6          # eps in <s,h>/(||h||^2 + eps) (the paper's code: 1e-6)

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


@register("hybridnorm")
class HybridNorm(Variant):
    """HybridNorm (Zhuo et al., arXiv 2503.04598, Sec. 3): h = e;  attention: h <- h + Attn_QKV(h), whose
    q, k, v are each normalised right after their projection (QKV-Norm) and which reads the stream
    itself;  MLP: n = Norm(h), h <- n + F(n) (Post-Norm: the residual path starts after the norm);
    output Norm(h) [choice].  norm.star=true is HybridNorm*: the first block is Pre-Norm (attention
    reads Norm(h), QKV-Norm kept; MLP h + F(Norm(h)))."""

    @dataclass
    class Options(NormOptions):
        star: bool = False                # HybridNorm*: the first block Pre-Norm (the paper's variant)

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.pre = cfg.norm.star and self.k == 1
        self.norm = make_norm(cfg) if self.pre or not self.is_attn else None

    def forward(self, h, f):
        if self.is_attn:
            return h + f(h if self.norm is None else self.norm(h))
        n = self.norm(h)
        return h + f(n) if self.pre else n + f(n)

    @classmethod
    def qkv_step(cls, cfg):
        return _QKVNorm(cfg)


@dataclass
class StreamOptions(NormOptions):
    streams: PosInt = 4               # n: copies of the residual stream (the expansion rate; the papers' 4)
    dynamic: bool = False             # coefficients also computed from the stream (the papers' dynamic form)


class _WideStream(Variant):
    """Shared plumbing of the variants whose stream is n copies of width d, H: [B, T, n, d]: the input
    step copies the token n times, the output step reads the sum over the copies, and the monitor
    (stream_view) sees that sum. Each sublayer reads a weighted sum of the copies through a Pre-Norm,
    F(Norm(x)), and writes to every copy: H <- mix(H) + post (x) F(Norm(x)) (subclasses: the weights)."""

    Options = StreamOptions

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.n, self.norm = cfg.norm.streams, make_norm(cfg)

    def weights(self, H):
        """(pre [.., n], mix [.., n, n], post [.., n]) for the stream H [B, T, n, d]: x = sum_i pre_i H_i,
        H'_i = sum_j mix_ij H_j + post_i F(Norm(x))."""
        raise NotImplementedError

    def forward(self, H, f):
        # Broadcast products and sums, not einsum: autocast would run a matmul in bf16 (its backward too,
        # under torch.compile) and the stream would leave float32. n is small: n products of [B, T, n, d].
        pre, mix, post = self.weights(H)
        y = f(self.norm((pre.unsqueeze(-1) * H).sum(-2)))
        out = post.unsqueeze(-1) * y.unsqueeze(-2)
        for k in range(self.n):                      # H'_m += mix_mk H_k, for every m at once
            out = out + mix[..., :, k, None] * H[..., k, None, :]
        return out

    @staticmethod
    def stream_view(H):
        return H.sum(-2)

    @classmethod
    def input_step(cls, cfg):
        return _Expand(make_input_step(cfg), cfg.norm.streams)

    @classmethod
    def output_step(cls, cfg):
        return _Reduce(make_norm(cfg) if cfg.norm.final_norm else nn.Identity())


class _Expand(nn.Module):
    def __init__(self, step, n):
        super().__init__()
        self.step, self.n = step, n

    def forward(self, e):
        h = self.step(e)
        return h.unsqueeze(-2).expand(*h.shape[:-1], self.n, h.shape[-1]).contiguous()


class _Reduce(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, H):
        return self.norm(H.sum(-2))


@register("hc")
class HyperConnections(_WideStream):
    """Hyper-connections (Zhu et al., arXiv 2409.19606, Eq. 1-5 and Appendix J): the stream widened to n
    copies H; sublayer j reads x = A_m^T H and writes H <- A_r^T H + B^T F(Norm(x)). Static init: A_m the
    one-hot of copy j mod n, A_r = I, B = 1 (so at init the sum of the copies is n times Pre-LN's stream).
    Dynamic (`norm.dynamic`): A(H) = s_a tanh(Norm(H) W) + A, B(H) = s_b tanh(Norm(H) W_b) + B, W zero and
    s_a = s_b = 0.01 at init (the paper's)."""

    optim_groups = {"a_m": "scalars", "a_r": "scalars", "b": "scalars", "w_m": "scalars", "w_r": "scalars",
                    "w_b": "scalars", "s_a": "scalars", "s_b": "scalars"}

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        n, d = self.n, cfg.n_embd
        self.a_m = nn.Parameter(F.one_hot(torch.tensor(j % n), n).float())
        self.a_r = nn.Parameter(torch.eye(n))
        self.b = nn.Parameter(torch.ones(n))
        self.dyn = make_norm(cfg) if cfg.norm.dynamic else None
        if self.dyn is not None:
            self.w_m, self.w_r, self.w_b = (nn.Parameter(torch.zeros(d, k)) for k in (1, n, 1))
            self.s_a, self.s_b = nn.Parameter(torch.tensor(0.01)), nn.Parameter(torch.tensor(0.01))

    def weights(self, H):
        a_m, a_r, b = self.a_m, self.a_r, self.b
        if self.dyn is not None:
            hn = self.dyn(H)
            a_m = a_m + self.s_a * torch.tanh(hn @ self.w_m).squeeze(-1)
            a_r = a_r + self.s_a * torch.tanh(hn @ self.w_r)
            b = b + self.s_b * torch.tanh(hn @ self.w_b).squeeze(-1)
        return a_m, a_r.transpose(-1, -2), b          # H'_i = sum_j (A_r)_ji H_j

    def step_sizes(self):
        return mixing_stats(self.a_r.detach())


def mixing_stats(res: torch.Tensor) -> Dict[str, torch.Tensor]:
    """How far a stream-mixing matrix (static part) is from the identity, the matrix of n independent
    copies: the mean over rows of the off-diagonal mass sum_j!=i |M_ij|, and ||M - I||_F."""
    n = res.shape[-1]
    eye = torch.eye(n, dtype=res.dtype, device=res.device)
    return {"offdiag_mass": (res.abs() * (1 - eye)).sum() / n, "res_dist_identity": (res - eye).square().sum().sqrt()}


def sinkhorn(logits: torch.Tensor, iters: int) -> torch.Tensor:
    """exp(logits) projected towards the doubly stochastic matrices (Sinkhorn-Knopp), in the log domain:
    rows, then columns normalised `iters` times; the last step makes the columns sum to 1 exactly."""
    z = logits.float()
    for _ in range(iters):
        z = z - torch.logsumexp(z, dim=-1, keepdim=True)
        z = z - torch.logsumexp(z, dim=-2, keepdim=True)
    return z.exp()


@dataclass
class ManifoldStreamOptions(StreamOptions):
    sinkhorn_iters: PosInt = 20       # Sinkhorn-Knopp iterations of H_res (the paper's t_max)


@register("mhc")
class ManifoldHyperConnections(_WideStream):
    """Manifold-constrained hyper-connections (Xie et al., arXiv 2512.24880, Eq. 3-8): x = H_pre H,
    H <- H_res H + H_post^T F(Norm(x)), with H_pre = sigmoid(.), H_post = 2 sigmoid(.) and H_res the
    Sinkhorn-Knopp projection of exp(.) onto the doubly stochastic matrices (rows and columns sum to 1:
    the mixing neither amplifies nor loses the stream). Each (.) is a static logit b, plus, dynamic,
    a (RMSNorm(vec H) W) with W zero and a = 0.01 at init. Init [choice, as the reference code]: H_res
    near I (logits 0 on the diagonal, -8 off it), H_pre near the one-hot of copy j mod n, H_post = 1."""

    Options = ManifoldStreamOptions
    optim_groups = {"b_pre": "scalars", "b_res": "scalars", "b_post": "scalars", "w_pre": "scalars",
                    "w_res": "scalars", "w_post": "scalars", "a_pre": "scalars", "a_res": "scalars",
                    "a_post": "scalars"}

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        n, d = self.n, cfg.n_embd
        self.iters = cfg.norm.sinkhorn_iters
        self.b_pre = nn.Parameter(torch.full((n,), -8.0).index_fill_(0, torch.tensor(j % n), 8.0))
        self.b_res = nn.Parameter(torch.full((n, n), -8.0).fill_diagonal_(0.0))
        self.b_post = nn.Parameter(torch.zeros(n))
        self.dynamic = cfg.norm.dynamic
        if self.dynamic:
            self.w_pre, self.w_res, self.w_post = (nn.Parameter(torch.zeros(n * d, k)) for k in (n, n * n, n))
            self.a_pre, self.a_res, self.a_post = (nn.Parameter(torch.tensor(0.01)) for _ in range(3))

    def weights(self, H):
        pre, res, post = self.b_pre, self.b_res, self.b_post
        if self.dynamic:
            v = F.rms_norm(H.flatten(-2).float(), (H.shape[-2] * H.shape[-1],)).to(H.dtype)   # vec(H), normalised
            pre = pre + self.a_pre * (v @ self.w_pre)
            res = res + self.a_res * (v @ self.w_res).unflatten(-1, (self.n, self.n))
            post = post + self.a_post * (v @ self.w_post)
        return torch.sigmoid(pre), sinkhorn(res, self.iters).to(H.dtype), 2 * torch.sigmoid(post)

    def step_sizes(self):
        return mixing_stats(sinkhorn(self.b_res.detach(), self.iters))
