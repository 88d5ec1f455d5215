"""GPTConfig: the one typed description of a model, validated once at construction.

Every default of the `model` and `norm` Hydra groups is written here once, with its one-line doc; the
groups' schemas are derived from these fields (trainer/config_store.py), so configs/model/*.yaml and
configs/norm/*.yaml state only what differs. Every `norm.*` key maps onto one flat field (NORM_KEYS,
docs/variants.md "Configuration keys"), and `model.*` keys onto the shape fields plus ModelGroup.
Per-variant defaults (decay, input step, output step, p) are None here and filled in from the
variant's class in model/variants.py.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping, Optional

from common import ConfigError
from common.config import bad, build, defaults, parse, to_plain

from .decay import DECAYS
from .init import INITS
from .norms import INPUT_STEPS, NORM_KINDS
from .variants import get_variant

KEEL_FIRST = ("v1", "v2")
POS_EMBS = ("learned", "rope")
MLPS = ("gelu", "swiglu", "relu2")
DEEPNORM_INITS = ("scaled", "xavier")
DECAY_INDICES = ("block", "sublayer")
SUBLAYER_INPUTS = ("raw", "norm")


@dataclass
class GPTConfig:
    vocab_size: int = 50304              # token ids (Hydra: model.vocab_size, see ModelGroup)
    block_size: int = 1024               # context length in tokens
    n_layer: int = 12                    # transformer blocks
    n_head: int = 12                     # attention heads (n_embd must divide by it)
    n_embd: int = 768                    # residual stream width d
    dropout: float = 0.0                 # dropout probability (attention, residual, embeddings)
    bias: bool = True                    # biases in linear layers and norms
    tie_embeddings: bool = True          # LM head shares the token embedding (GPT-2); false = separate head
    # --- architecture axes (Hydra group `arch` sets them together; docs/variants.md, "Architecture presets") ---
    pos_emb: str = "learned"             # learned absolute positions (GPT-2) | rope
    rope_base: float = 10000.0           # RoPE frequency base
    rope_fraction: float = 1.0           # fraction of each head's dimensions that RoPE rotates
    mlp: str = "gelu"                    # gelu (GPT-2) | swiglu (LLaMA) | relu2 (modded-nanogpt)
    mlp_hidden: Optional[int] = None     # null: 4d (gelu, relu2); 8d/3 rounded up to a multiple of 64 (swiglu)
    qk_norm: bool = False                # RMSNorm (no gain) of q and k per head before attention
    init: str = "nanogpt"                # weight init scheme: nanogpt (N(0, 0.02)) | fan_in (N(0, 1/fan_in)); model/init.py
    embed_std: Optional[float] = None    # std of the token/position embeddings at init; null: the init scheme's
    # --- normalization (Hydra group `norm`; keys in NORM_KEYS) ---
    norm: str = "pre_ln"                 # the variant: a name registered in model/variants.py
    norm_kind: str = "layernorm"         # layernorm | rmsnorm (every Norm of the variant)
    norm_eps: float = 1e-5               # epsilon of every Norm
    decay: Optional[str] = None          # step decay: none | harmonic | sqrt | linear; null: the variant's default
    p: Optional[float] = None            # SpheretNorm's p (> 0, .inf = exp map); null: the variant's (1; fixed for proj/cay)
    geonorm_clamp: float = math.pi / 4   # GeoNorm angle clamp c (pi/4)
    embed_norm: Optional[str] = None     # input step: none | layer | scalenorm | unit; null: the variant's default
    final_norm: Optional[bool] = None    # output Norm before the LM head; null: the variant's default
    keel_first_layer: str = "v2"         # Keel's first sublayers: v2 | v1
    dyt_alpha_attn: float = 0.5          # DyT alpha at init, attention sublayers
    dyt_alpha_other: float = 0.5         # DyT alpha at init, other Norms
    deepnorm_init: str = "scaled"        # DeepNorm init: scaled (beta gain) | xavier
    # --- open choices of the sphere family (docs/variants.md, "Switches for open choices") ---
    learn_radius: bool = True            # sphere family: ScaleNorm's g learnable (false: fixed at 1)
    decay_index: str = "block"           # lambda indexed by block k of N | sublayer j+1 of 2N
    alpha_init: float = 1.0              # SpheretNorm: softplus(rho) at init
    a_init: float = 1.0                  # GeoNorm: a at init
    sublayer_input: str = "raw"          # sphere family: F reads the raw stream h (raw) or Norm(h) (norm)
    target_angle: Optional[float] = None # sphere family: initial step sizes set so the mean angle at init is this (rad); null: alpha_init / a_init

    def __post_init__(self) -> None:
        variant = get_variant(self.norm)  # raises ConfigError listing the valid names
        if self.p is not None and (not isinstance(self.p, (int, float)) or isinstance(self.p, bool)):
            raise ConfigError(f"bad config norm.p={self.p!r}: must be a number > 0 (.inf in YAML)")
        if variant.fixed_p is not None and self.p is not None and self.p != variant.fixed_p:
            raise ConfigError(f"bad config norm.p={self.p}: norm.name={self.norm} means p={variant.fixed_p:g}; "
                              "use norm=spheret to choose p")
        if self.sublayer_input != "raw" and not variant.reads_sublayer_input:
            raise ConfigError(f"bad config norm.sublayer_input={self.sublayer_input!r}: only the sphere family "
                              f"(geonorm, spheret, proj_spheret, cay_spheret) reads it; norm.name={self.norm} "
                              "already gives its sublayers a normalized input or none")
        if self.target_angle is not None and not variant.supports_target_angle:
            raise ConfigError(f"bad config norm.target_angle={self.target_angle!r}: only the sphere family "
                              f"(geonorm, spheret, proj_spheret, cay_spheret) has initial step sizes to set; "
                              f"norm.name={self.norm}")
        self.p = float(variant.fixed_p or (1.0 if self.p is None else self.p))
        if self.decay is None:
            self.decay = variant.default_decay
        if self.embed_norm is None:
            self.embed_norm = variant.default_embed_norm
        if self.final_norm is None:
            self.final_norm = variant.default_final_norm
        self.validate()

    def validate(self) -> None:
        for key in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                bad(f"model.{key}", v, "must be a positive integer")
        if self.n_embd % self.n_head:
            bad("model.n_embd", self.n_embd, f"must be divisible by model.n_head={self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            bad("model.dropout", self.dropout, "must be in [0, 1)")
        NORM_KINDS[self.norm_kind], DECAYS[self.decay], INPUT_STEPS[self.embed_norm]  # unknown names: one line
        if not isinstance(self.final_norm, bool):
            bad("norm.final_norm", self.final_norm, "must be true or false")
        if self.keel_first_layer not in KEEL_FIRST:
            bad("norm.first_layer", self.keel_first_layer, f"valid: {', '.join(KEEL_FIRST)}")
        if self.deepnorm_init not in DEEPNORM_INITS:
            bad("norm.deepnorm_init", self.deepnorm_init, f"valid: {', '.join(DEEPNORM_INITS)}")
        if not (self.p > 0):  # also rejects NaN
            bad("norm.p", self.p, "must be > 0 (use .inf in YAML for the exponential map)")
        if not (0 < self.geonorm_clamp <= math.pi):
            bad("norm.clamp", self.geonorm_clamp, "must be in (0, pi]")
        if self.decay_index not in DECAY_INDICES:
            bad("norm.decay_index", self.decay_index, f"valid: {', '.join(DECAY_INDICES)}")
        for key, v in (("model.tie_embeddings", self.tie_embeddings), ("norm.learn_radius", self.learn_radius),
                       ("model.bias", self.bias), ("model.qk_norm", self.qk_norm)):
            if not isinstance(v, bool):
                bad(key, v, "must be true or false")
        if not (isinstance(self.alpha_init, (int, float)) and 0 < self.alpha_init < math.inf):
            bad("norm.alpha_init", self.alpha_init, "must be a finite number > 0 (softplus(rho) at init)")
        if not (isinstance(self.a_init, (int, float)) and math.isfinite(self.a_init)):
            bad("norm.a_init", self.a_init, "must be a finite number")
        if not (self.norm_eps >= 0):
            bad("norm.eps", self.norm_eps, "must be >= 0")
        if self.target_angle is not None:
            bound = self.geonorm_clamp if self.norm == "geonorm" else self.p * math.pi / 2
            if not (isinstance(self.target_angle, (int, float)) and not isinstance(self.target_angle, bool)
                    and 0 < self.target_angle < bound):
                bad("norm.target_angle", self.target_angle, f"must be a number in (0, {bound:.4g}) rad (the rule's "
                    "bound), or null")
        if self.sublayer_input not in SUBLAYER_INPUTS:
            bad("norm.sublayer_input", self.sublayer_input, f"valid: {', '.join(SUBLAYER_INPUTS)}")
        INITS[self.init]  # an unknown scheme: one line listing the valid ones
        if self.embed_std is not None and not (isinstance(self.embed_std, (int, float)) and not isinstance(self.embed_std, bool)
                                               and 0 < self.embed_std < math.inf):
            bad("model.embed_std", self.embed_std, "must be a finite number > 0, or null (the init scheme's)")
        if self.pos_emb not in POS_EMBS:
            bad("model.pos_emb", self.pos_emb, f"valid: {', '.join(POS_EMBS)}")
        if self.mlp not in MLPS:
            bad("model.mlp", self.mlp, f"valid: {', '.join(MLPS)}")
        if not (isinstance(self.rope_base, (int, float)) and 1 < self.rope_base < math.inf):
            bad("model.rope_base", self.rope_base, "must be a finite number > 1")
        if not (isinstance(self.rope_fraction, (int, float)) and 0 < self.rope_fraction <= 1):
            bad("model.rope_fraction", self.rope_fraction, "must be in (0, 1]")
        if self.pos_emb == "rope" and self.rope_dims < 2:
            bad("model.rope_fraction", self.rope_fraction, f"rotates no pair of the {self.head_dim} head dimensions")
        if self.mlp_hidden is not None and (not isinstance(self.mlp_hidden, int) or isinstance(self.mlp_hidden, bool)
                                            or self.mlp_hidden <= 0):
            bad("model.mlp_hidden", self.mlp_hidden, "must be a positive integer or null (the MLP kind's default)")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def rope_dims(self) -> int:
        """Dimensions of each head that RoPE rotates: the fraction, rounded down to an even number (GPT-NeoX)."""
        return int(self.head_dim * self.rope_fraction) // 2 * 2

    @property
    def hidden_size(self) -> int:
        """MLP hidden width: `mlp_hidden`, else 4d, or for SwiGLU 8d/3 rounded up to a multiple of 64
        (LLaMA's rule: the same parameter count as a 4d two-matrix MLP, in three matrices)."""
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        if self.mlp == "swiglu":
            return -(-8 * self.n_embd // (3 * 64)) * 64
        return 4 * self.n_embd

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "GPTConfig":
        """From `to_dict()` (a checkpoint's model_config)."""
        return build(cls, d, "model_config")

    @classmethod
    def from_hydra(cls, model_cfg: Any, norm_cfg: Any, vocab_size: Optional[int] = None) -> "GPTConfig":
        """Build from the composed `model` and `norm` groups (OmegaConf nodes or plain dicts); absent keys
        take the defaults above. `vocab_size` is the tokenizer's (used when model.vocab_size is null)."""
        m = to_plain(model_cfg)
        group = build(ModelGroup, {k: m.pop(k) for k in MODEL_GROUP_KEYS if k in m}, "model")
        kw = {**parse(cls, m, "model", keys=MODEL_KEYS, also_valid=MODEL_GROUP_KEYS),
              **parse(cls, norm_cfg, "norm", keys=NORM_KEYS)}
        return cls(vocab_size=group.vocab(vocab_size), **kw)


@dataclass
class ModelGroup:
    """The `model.*` keys that are not GPTConfig fields as they are: labels and the vocabulary rule."""
    name: str = "custom"                 # label of the model shape, used in run names (configs/model/<name>.yaml)
    arch: str = "gpt2"                   # label of the architecture preset (configs/arch/<name>.yaml sets it)
    vocab_size: Optional[int] = None     # null: the tokenizer's vocabulary, padded up to a multiple of pad_vocab_to
    pad_vocab_to: int = 64               # GPT-2's 50257 -> 50304, as nanoGPT does, for fast matmuls

    def vocab(self, tokenizer_vocab: Optional[int]) -> int:
        if self.vocab_size is None:
            if tokenizer_vocab is None:
                raise ConfigError("model.vocab_size is null and no tokenizer vocabulary size was given")
            if self.pad_vocab_to < 1:
                bad("model.pad_vocab_to", self.pad_vocab_to, "must be a positive integer")
            return -(-int(tokenizer_vocab) // self.pad_vocab_to) * self.pad_vocab_to
        if tokenizer_vocab is not None and self.vocab_size < tokenizer_vocab:
            bad("model.vocab_size", self.vocab_size, f"smaller than the tokenizer's {tokenizer_vocab}")
        return self.vocab_size


# Hydra `norm.*` key -> GPTConfig field (docs/variants.md, "Configuration keys").
NORM_KEYS = {"name": "norm", "kind": "norm_kind", "eps": "norm_eps", "decay": "decay", "p": "p",
             "clamp": "geonorm_clamp", "embed_norm": "embed_norm", "final_norm": "final_norm",
             "first_layer": "keel_first_layer", "alpha_attn": "dyt_alpha_attn",
             "alpha_other": "dyt_alpha_other", "deepnorm_init": "deepnorm_init",
             "learn_radius": "learn_radius", "decay_index": "decay_index", "alpha_init": "alpha_init",
             "a_init": "a_init", "sublayer_input": "sublayer_input",
             "target_angle": "target_angle"}
MODEL_GROUP_KEYS = tuple(f.name for f in fields(ModelGroup))
# Hydra `model.*` keys that are GPTConfig fields: the shape and architecture axes.
MODEL_KEYS = {f.name: f.name for f in fields(GPTConfig) if f.name not in {*NORM_KEYS.values(), *MODEL_GROUP_KEYS}}


def model_group_defaults() -> dict:
    """The `model` group's keys and defaults (its Hydra schema)."""
    return {**defaults(GPTConfig, MODEL_KEYS), **defaults(ModelGroup)}


def norm_group_defaults() -> dict:
    """The `norm` group's keys and defaults (its Hydra schema); a variant's own defaults stay null here
    and are filled from its class."""
    return defaults(GPTConfig, NORM_KEYS)
