"""GPTConfig: the one typed description of a model, validated once at construction.

Field names follow docs/variants.md ("Configuration keys"): every Hydra `norm.*` key maps
onto one flat field here, and `model.*` keys onto the shape fields. Per-variant defaults (decay,
input step, output step) are left as None here and filled in from the variant's class, so that a
config only states what it changes.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping, Optional

from common import ConfigError

from .decay import DECAYS
from .norms import INPUT_STEPS, NORM_KINDS
from .variants import get_variant

KEEL_FIRST = ("v1", "v2")
POS_EMBS = ("learned", "rope")
MLPS = ("gelu", "swiglu", "relu2")
# Model keys that are not GPTConfig fields: labels, and the vocabulary padding used by from_hydra.
MODEL_EXTRA_KEYS = ("name", "arch", "pad_vocab_to")
DEEPNORM_INITS = ("scaled", "xavier")
DECAY_INDICES = ("block", "sublayer")


# Hydra `norm.*` key -> GPTConfig field.
NORM_KEYS = {"name": "norm", "kind": "norm_kind", "eps": "norm_eps", "decay": "decay", "p": "p",
             "clamp": "geonorm_clamp", "embed_norm": "embed_norm", "final_norm": "final_norm",
             "first_layer": "keel_first_layer", "alpha_attn": "dyt_alpha_attn",
             "alpha_other": "dyt_alpha_other", "deepnorm_init": "deepnorm_init",
             "learn_radius": "learn_radius", "decay_index": "decay_index", "alpha_init": "alpha_init",
             "a_init": "a_init"}


def norm_group_defaults(name: str) -> dict:
    """A complete `norm` config group for variant `name` (every key at its default; the variant's own
    defaults stay null and are filled from its class): what `norm=<name>` composes when the variant
    has no configs/norm/<name>.yaml."""
    get_variant(name)
    d = {f.name: f.default for f in fields(GPTConfig)}
    return {key: (name if key == "name" else d[field_name]) for key, field_name in NORM_KEYS.items()}


@dataclass
class GPTConfig:
    vocab_size: int = 50304
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True
    tie_embeddings: bool = True          # GPT-2: the LM head shares the token embedding matrix
    # --- architecture axes (Hydra group `arch` sets them together; docs/variants.md, "Architecture presets") ---
    pos_emb: str = "learned"             # learned absolute positions (GPT-2) | rope
    rope_base: float = 10000.0
    rope_fraction: float = 1.0           # fraction of each head's dimensions that RoPE rotates
    mlp: str = "gelu"                    # gelu (GPT-2) | swiglu (LLaMA) | relu2 (modded-nanogpt)
    mlp_hidden: Optional[int] = None     # None: 4d (gelu, relu2); 8d/3 rounded up to a multiple of 64 (swiglu)
    qk_norm: bool = False                # RMSNorm (no gain) of q and k per head before attention
    # --- normalization (Hydra group `norm`) ---
    norm: str = "pre_ln"
    norm_kind: str = "layernorm"
    norm_eps: float = 1e-5
    decay: Optional[str] = None          # None: the variant's default
    p: Optional[float] = None            # None: the variant's default (1; fixed for proj/cay)
    geonorm_clamp: float = math.pi / 4
    embed_norm: Optional[str] = None     # None: the variant's default
    final_norm: Optional[bool] = None    # None: the variant's default
    keel_first_layer: str = "v2"
    dyt_alpha_attn: float = 0.5
    dyt_alpha_other: float = 0.5
    deepnorm_init: str = "scaled"
    # --- open choices of the sphere family (docs/variants.md, "Switches for open choices") ---
    learn_radius: bool = True            # ScaleNorm's g learnable (else fixed at 1)
    decay_index: str = "block"           # lambda indexed by block k of N, or by sublayer j+1 of 2N
    alpha_init: float = 1.0              # SpheretNorm: softplus(rho) at init
    a_init: float = 1.0                  # GeoNorm: a at init

    def __post_init__(self) -> None:
        variant = get_variant(self.norm)  # raises ConfigError listing the valid names
        if self.p is not None:
            if isinstance(self.p, str) and self.p.strip().lower() in (".inf", "+.inf"):
                self.p = math.inf  # YAML's spelling, also accepted on the command line
            try:
                self.p = float(self.p)
            except (TypeError, ValueError):
                raise ConfigError(f"bad config norm.p={self.p!r}: must be a number > 0 (.inf in YAML)") from None
        if variant.fixed_p is not None and self.p is not None and self.p != variant.fixed_p:
            raise ConfigError(f"bad config norm.p={self.p}: norm.name={self.norm} means p={variant.fixed_p:g}; "
                              "use norm=spheret to choose p")
        self.p = float(variant.fixed_p or (1.0 if self.p is None else self.p))
        if self.decay is None:
            self.decay = variant.default_decay
        if self.embed_norm is None:
            self.embed_norm = variant.default_embed_norm
        if self.final_norm is None:
            self.final_norm = variant.default_final_norm
        self.validate()

    def validate(self) -> None:
        def bad(key: str, value: Any, valid: str) -> None:
            raise ConfigError(f"bad config {key}={value!r}: {valid}")

        for key in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                bad(key, v, "must be a positive integer")
        if self.n_embd % self.n_head:
            bad("n_embd", self.n_embd, f"must be divisible by n_head={self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            bad("dropout", self.dropout, "must be in [0, 1)")
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
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown GPTConfig field(s) {unknown}: valid fields are {sorted(known)}")
        return cls(**dict(d))

    @classmethod
    def from_hydra(cls, model_cfg: Mapping[str, Any], norm_cfg: Mapping[str, Any],
                   vocab_size: Optional[int] = None) -> "GPTConfig":
        """Build from the `model` and `norm` Hydra groups (OmegaConf nodes or plain dicts).

        `vocab_size` is the tokenizer's; used when `model.vocab_size` is null, padded up to a
        multiple of `model.pad_vocab_to` (GPT-2's 50257 -> 50304, as nanoGPT does, for fast matmuls).
        """
        m, n = dict(model_cfg), dict(norm_cfg)
        arch_keys = ("pos_emb", "rope_base", "rope_fraction", "mlp", "mlp_hidden", "qk_norm")
        model_keys = {"vocab_size", "block_size", "n_layer", "n_head", "n_embd", "dropout", "bias", "tie_embeddings",
                      *arch_keys, *MODEL_EXTRA_KEYS}
        unknown = sorted(set(m) - model_keys)
        if unknown:  # e.g. `+model.foo=1` on the command line
            raise ConfigError(f"unknown model key(s) {unknown}: valid keys are {sorted(model_keys)}")
        vs = m.get("vocab_size")
        if vs is None:
            if vocab_size is None:
                raise ConfigError("model.vocab_size is null and no tokenizer vocabulary size was given")
            pad = int(m.get("pad_vocab_to") or 1)
            vs = -(-int(vocab_size) // pad) * pad
        elif vocab_size is not None and vs < vocab_size:
            raise ConfigError(f"bad config model.vocab_size={vs}: smaller than the tokenizer's {vocab_size}")
        norm_keys = NORM_KEYS
        unknown = sorted(set(n) - set(norm_keys))
        if unknown:
            raise ConfigError(f"unknown norm key(s) {unknown}: valid keys are {sorted(norm_keys)}")
        kw = {norm_keys[k]: v for k, v in n.items()}
        return cls(vocab_size=int(vs), block_size=m["block_size"], n_layer=m["n_layer"], n_head=m["n_head"],
                   n_embd=m["n_embd"], dropout=float(m.get("dropout", 0.0)), bias=bool(m.get("bias", True)),
                   tie_embeddings=m.get("tie_embeddings", True), **{k: m[k] for k in arch_keys if k in m}, **kw)
