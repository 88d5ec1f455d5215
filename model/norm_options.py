"""The variants by name, with their `norm.*` keys, without torch: the config, `--help` and Hydra's composition
read them before a model is built. `VARIANTS` maps a variant's name to its class in model/variants/ (imported
when first read) and records its `Options` dataclass (`VARIANTS.options(name)`); the order here is the order
of every table and legend.

Each Options extends its parent's (and may change a parent's default: Post-LN has no output Norm), so
`GPTConfig.norm.clamp` exists exactly for the variants that read it. A new option is one field with its
doc line and its valid values in its annotation (`streams: PosInt = 4`, `Literal`, `Range`:
common/config.py); a check relating two fields goes in that class's `__post_init__`. A variant defined
in a user's own module may instead carry an `Options` class of its own (`register` records it here).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal, Optional

from common import Registry
from common.config import Finite, NonNeg, PosInt, Positive, Range, bad, check

VARIANTS = Registry("norm.name")   # variant name -> its class (model/variants/), with its Options
# The Norm of every sublayer (`norm.kind`) and the input step (`norm.embed_norm`): name -> its factory in
# model/norms.py (cfg -> module), imported when a model is built
NORM_KINDS = Registry("norm.kind")
INPUT_STEPS = Registry("norm.embed_norm")
for _name in ("layernorm", "rmsnorm", "derf", "seednorm"):
    NORM_KINDS.add(_name, f"{__package__}.norms:{_name}")
for _name in ("none", "layer", "scalenorm", "scaled", "unit"):
    INPUT_STEPS.add(_name, f"{__package__}.norms:{_name}_input")


def variant(name: str, cls: str):
    """Record the decorated Options class as the `norm.*` keys of variant `name`, whose class is `cls`
    ("family:Class" in model/variants/)."""
    def deco(options):
        VARIANTS.add(name, f"{__package__}.variants.{cls}", options=options)
        return options
    return deco


@dataclass
class NormOptions:
    """The `norm.*` keys every variant reads (its Norms, input and output step)."""
    name: str = "pre_ln"              # the variant: a name registered in model/variants/
    kind: str = "layernorm"           # layernorm | rmsnorm | derf | seednorm (every Norm of the variant)
    eps: NonNeg = 1e-5                # epsilon of every Norm
    embed_norm: str = "none"          # input step: none | layer | scalenorm | unit | scaled
    final_norm: bool = True           # output Norm before the LM head
    learn_radius: bool = True         # input step scalenorm: its radius g learnable (false: fixed at 1)
    derf_alpha: Positive = 1.0        # norm.kind=derf: Derf's initial alpha (1: its paper's language-model setting)

    def __post_init__(self) -> None:
        check(self, "norm")  # every field of the variant's Options, its own included
        NORM_KINDS[self.kind], INPUT_STEPS[self.embed_norm]  # unknown names: one line listing the valid ones

    def check_model(self, model) -> None:
        """Checks that relate a `norm.*` key to the model's shape (`model` is the GPTConfig); none here."""

    def unread(self, given) -> dict:
        """Of the keys set (`given`) away from their defaults, those this configuration does not read, each
        with the setting that reads it (a fixed radius without a ScaleNorm to fix; Derf's alpha without Derf)."""
        out = {}
        if not self.learn_radius and self.embed_norm != "scalenorm":
            out["learn_radius"] = "norm.embed_norm=scalenorm"
        if self.derf_alpha != 1.0 and self.kind != "derf":
            out["derf_alpha"] = "norm.kind=derf"
        return out


# ---- the classic placements (model/variants/classic.py) ----
variant("pre_ln", "classic:PreLN")(NormOptions)


@variant("post_ln", "classic:PostLN")
@dataclass
class PostLNOptions(NormOptions):
    final_norm: bool = False          # output Norm before the LM head


@variant("deepnorm", "classic:DeepNorm")
@dataclass
class DeepNormOptions(NormOptions):
    final_norm: bool = False          # output Norm before the LM head
    #: scaled: nanoGPT's N(0, 0.02) times beta; xavier: beta times Xavier's std
    deepnorm_init: Literal["scaled", "xavier"] = "scaled"


variant("sandwich", "classic:Sandwich")(NormOptions)


@variant("peri_ln", "classic:PeriLN")
@dataclass
class PeriLNOptions(NormOptions):
    embed_norm: str = "layer"


@variant("keel", "classic:Keel")
@dataclass
class KeelOptions(NormOptions):
    final_norm: bool = False          # output Norm before the LM head
    first_layer: Literal["v2", "v1"] = "v2"  # Keel's first sublayers


@variant("pre_dyt", "classic:PreDyT")
@dataclass
class PreDyTOptions(NormOptions):
    alpha_attn: Finite = 0.5          # DyT alpha at init, attention sublayers
    alpha_other: Finite = 0.5         # DyT alpha at init, other Norms


# ---- the sphere family (model/variants/sphere.py) ----
# p of a SpheretNorm retraction: > 0, .inf the exponential map
RetractionP = Annotated[float, Range(0, math.inf, "(]", "(.inf in YAML for the exponential map)")]


@dataclass
class SphereOptions(NormOptions):
    """The `norm.*` keys of the sphere family (GeoNorm, the SpheretNorms)."""
    decay: str = "none"               # step decay lambda: none | harmonic (GeoNorm's) | sqrt (SpheretNorm's) | linear
    decay_index: Literal["block", "sublayer"] = "block"  # lambda indexed by block k of N, or by sublayer j+1 of 2N
    #: F reads the raw stream h (raw) or Norm(h) (norm; GeoNorm's default)
    sublayer_input: Literal["raw", "norm"] = "raw"
    #: initial step sizes set so the mean angle at init is this (rad); null: the _init value
    target_angle: Optional[float] = None

    def __post_init__(self):
        from .decay import DECAYS

        super().__post_init__()
        DECAYS[self.decay]
        if self.target_angle is not None and not 0 < self.target_angle < self.angle_bound():
            bad("norm.target_angle", self.target_angle, f"must be a number in (0, {self.angle_bound():.4g}) rad "
                "(the rule's bound), or null")

    def angle_bound(self) -> float:
        """The largest angle the rule can produce: bounds norm.target_angle, and the monitor reports the
        share of tokens near it."""
        return math.inf


@variant("geonorm", "sphere:GeoNorm")
@dataclass
class GeoNormOptions(SphereOptions):
    decay: str = "harmonic"
    clamp: Annotated[float, Range(0, math.pi, "(]", "(3.14159 = pi)")] = math.pi / 4  # angle clamp c (pi/4)
    a_init: Finite = 1.0              # a at init
    # Attention and the MLP read Norm(h): GeoNorm's stream keeps the embedding's radius, so the raw h
    # (the other choice, `raw`) makes its first attention logits ~1e-3 of Pre-LN's (our choice; the
    # paper does not say what its sublayers read; docs/step_scale_study.md).
    sublayer_input: Literal["raw", "norm"] = "norm"

    def angle_bound(self):
        return self.clamp


@variant("spheret", "sphere:SpheretNorm")
@dataclass
class SpheretOptions(SphereOptions):
    fixed_p: ClassVar[Optional[float]] = None  # set by the variants that are one member of the p-family
    decay: str = "sqrt"
    embed_norm: str = "scalenorm"
    p: RetractionP = 1.0              # p of the retraction (> 0; .inf = the exponential map)
    alpha_init: Annotated[float, Range(0, math.inf, "()", "(softplus(rho) at init)")] = 1.0  # softplus(rho) at init

    def __post_init__(self):
        super().__post_init__()
        if self.fixed_p is not None and self.p != self.fixed_p:
            bad("norm.p", self.p, f"norm.name={self.name} means p={self.fixed_p:g}; use norm=spheret to choose p")

    def angle_bound(self):
        return self.p * math.pi / 2  # p atan(beta/p) < p pi/2; inf for the exponential map


@variant("proj_spheret", "sphere:ProjSpheretNorm")
@dataclass
class ProjSpheretOptions(SpheretOptions):
    fixed_p: ClassVar[Optional[float]] = 1.0
    p: RetractionP = 1.0              # fixed: 1 (use norm=spheret to choose p)


@variant("cay_spheret", "sphere:CaySpheretNorm")
@dataclass
class CaySpheretOptions(SpheretOptions):
    fixed_p: ClassVar[Optional[float]] = 2.0
    p: RetractionP = 2.0              # fixed: 2 (use norm=spheret to choose p)


# ---- depth-dependent placements (model/variants/depth.py) and nGPT (model/variants/ngpt.py) ----
variant("lns", "depth:LayerNormScaling")(NormOptions)
variant("mix_ln", "depth:MixLN")(NormOptions)


@variant("ngpt", "ngpt:NGPT")
@dataclass
class NGPTOptions(NormOptions):
    embed_norm: str = "unit"
    final_norm: bool = False          # output Norm before the LM head


# ---- the 2025-26 methods on one stream (model/variants/recent.py) ----
@variant("pre_derf", "recent:PreDerf")
@dataclass
class PreDerfOptions(NormOptions):
    embed_norm: str = "scaled"

    def unread(self, given) -> dict:
        # its Norms are Derf whatever norm.kind says (model/variants/recent.py), so derf_alpha is always read
        return {k: v for k, v in super().unread(given).items() if k != "derf_alpha"}


@variant("ortho_pre_ln", "recent:OrthoPreLN")
@dataclass
class OrthoOptions(NormOptions):
    ortho_eps: NonNeg = 1e-6          # eps in <s,h>/(||h||^2 + eps) (the paper's code: 1e-6)


@variant("hybridnorm", "recent:HybridNorm")
@dataclass
class HybridNormOptions(NormOptions):
    star: bool = False                # HybridNorm*: the first block Pre-Norm (the paper's variant)


# ---- widened streams (model/variants/streams.py) ----
@variant("hc", "streams:HyperConnections")
@dataclass
class StreamOptions(NormOptions):
    streams: PosInt = 4               # n: copies of the residual stream (the expansion rate; the papers' 4)
    dynamic: bool = False             # coefficients also computed from the stream (the papers' dynamic form)


@variant("mhc", "streams:ManifoldHyperConnections")
@dataclass
class ManifoldStreamOptions(StreamOptions):
    sinkhorn_iters: PosInt = 20       # Sinkhorn-Knopp iterations of H_res (the paper's t_max)


@variant("frac", "streams:FracConnections")
@dataclass
class FracOptions(NormOptions):
    fractions: PosInt = 2             # m: the stream split into m fractions of width d/m (expansion rate 1/m)

    def check_model(self, model) -> None:
        if model.n_embd % self.fractions:
            bad("norm.fractions", self.fractions, f"must divide model.n_embd={model.n_embd}")


@variant("siamese", "streams:SiameseNorm")
@dataclass
class SiameseOptions(NormOptions):
    """SiameseNorm's pieces, each one switch so an ablation can leave it out (the defaults: the paper's)."""
    #: the Post-Norm-like stream x (false: y alone, each sublayer F(Norm_i(Norm_q(y))), the output Norm(Norm_y(y)))
    post_stream: bool = True
    depth_scale: bool = True          # x's writes divided by sqrt(2k), k the block (false: by 1)
    #: the output step reads Norm_x(x) + Norm_y(y) (sum), or one stream: Norm_y(y) (pre) or Norm_x(x) (post)
    output_from: Literal["sum", "pre", "post"] = "sum"

    def __post_init__(self):
        super().__post_init__()
        if not self.post_stream and self.output_from == "post":
            bad("norm.output_from", self.output_from, "reads x, which norm.post_stream=false leaves out; "
                "use sum or pre (the same model without x)")

    def unread(self, given) -> dict:
        out = super().unread(given)
        if not self.depth_scale and not self.post_stream:
            out["depth_scale"] = "norm.post_stream=true"
        return out


@variant("attnres", "streams:AttentionResiduals")
@dataclass
class AttnResOptions(NormOptions):
    #: Block AttnRes: the 2N sublayers in this many blocks (2N must divide by it); null: Full AttnRes
    blocks: Optional[PosInt] = None

    def check_model(self, model) -> None:
        if self.blocks is not None and (2 * model.n_layer) % self.blocks:
            bad("norm.blocks", self.blocks, f"must divide the {2 * model.n_layer} sublayers "
                f"(2 x model.n_layer={model.n_layer}), or be null (Full AttnRes)")
