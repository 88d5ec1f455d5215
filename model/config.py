"""GPTConfig: the one typed description of a model, validated once at construction. The `model` group's
defaults and docs are written here once; the `norm` group is the chosen variant's own `Options`
(model/variants/), so a key the variant does not read is one line naming the keys it does."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Annotated, Any, Literal, Mapping, Optional

from common import ConfigError, Registry
from common.config import Name, NonNegInt, PosInt, Range, bad, build, check, defaults, own_options, to_plain, union_keys

from .norm_options import VARIANTS, NormOptions

# Weight init schemes (`model.init`), name -> fn(model, cfg) in model/init.py, imported when a model is built
INITS = Registry("model.init")
for _name in ("nanogpt", "fan_in"):
    INITS.add(_name, f"{__package__}.init:{_name}")


def norm_options(node: Any) -> NormOptions:
    """The `norm` group as the chosen variant's `Options`; a null value is the variant's default."""
    given = {k: v for k, v in to_plain(asdict(node) if isinstance(node, NormOptions) else node).items()
             if v is not None}
    name = given.setdefault("name", NormOptions.name)
    cls = VARIANTS.options(name)  # an unknown name raises ConfigError listing the valid ones
    opts = own_options(cls, given, "norm", f"norm.name={name}", norm_group_keys())
    for k, setting in opts.unread(set(given)).items():
        bad(f"norm.{k}", given[k], f"read only with {setting} (its options: {', '.join(f.name for f in fields(cls))})")
    return opts


def norm_group_keys() -> dict:
    """{key: the Options class that declares it first} over every registered variant: the `norm` schema."""
    return union_keys(VARIANTS.options(name) for name in VARIANTS)


@dataclass
class GPTConfig:
    vocab_size: PosInt = 50304           # token ids (Hydra: model.vocab_size, see ModelGroup)
    block_size: PosInt = 1024            # context length in tokens
    n_layer: PosInt = 12                 # transformer blocks
    n_head: PosInt = 12                  # attention heads (n_embd must divide by it)
    n_embd: PosInt = 768                 # residual stream width d
    dropout: Annotated[float, Range(0, 1, "[)")] = 0.0  # dropout probability (attention, residual, embeddings)
    bias: bool = True                    # biases in linear layers and norms
    tie_embeddings: bool = True          # LM head shares the token embedding (GPT-2); false = separate head
    # --- architecture axes (Hydra group `arch` sets them together; docs/variants.md, "Architecture presets") ---
    pos_emb: Literal["learned", "rope"] = "learned"  # learned absolute positions (GPT-2), or rotary
    rope_base: Annotated[float, Range(1, math.inf, "()")] = 10000.0  # RoPE frequency base
    rope_fraction: Annotated[float, Range(0, 1, "(]")] = 1.0  # fraction of each head's dimensions that RoPE rotates
    mlp: Literal["gelu", "swiglu", "relu2"] = "gelu"  # gelu (GPT-2), swiglu (LLaMA), relu2 (modded-nanogpt)
    #: null: 4d (gelu, relu2); 8d/3 rounded up to a multiple of 64 (swiglu)
    mlp_hidden: Optional[Annotated[int, Range(1, note="(the MLP kind's default)")]] = None
    qk_norm: bool = False                # RMSNorm (no gain) of q and k per head before attention
    #: sigmoid gate on attention's output before c_proj, from the sublayer input (Gated Attention, arXiv 2505.06708,
    #: G1): per element or per head
    attn_gate: Literal["none", "elementwise", "headwise"] = "none"
    #: value residual (ResFormer, arXiv 2410.17897): every later layer's attention reads V_n <- (V_1 + V_n)/2,
    #: V_1 the first layer's values (the authors' code: fixed halves)
    value_residual: bool = False
    #: ProRes (arXiv 2603.05369): every residual branch of block l scaled by min(1, u/T_l), u the optimizer
    #: updates so far, T_l from this/N (block 1) to this (block N), linearly; 0: off
    prores_steps: NonNegInt = 0
    #: weight init scheme: nanogpt (N(0, 0.02)) | fan_in (N(0, 1/fan_in)); model/init.py
    init: Name = "nanogpt"
    #: std of the token/position embeddings at init; null: the init scheme's
    embed_std: Optional[Annotated[float, Range(0, math.inf, "()", "(the init scheme's)")]] = None
    # --- normalization (Hydra group `norm`): the variant's name and its own options ---
    norm: Any = NormOptions.name  # a variant name, a mapping of norm.* keys or its Options (built from either)

    def __post_init__(self) -> None:
        if not (isinstance(self.norm, NormOptions) and type(self.norm) is VARIANTS.options(self.norm.name)):
            self.norm = norm_options({"name": self.norm} if isinstance(self.norm, str) else self.norm)
        check(self, "model")
        if self.n_embd % self.n_head:
            bad("model.n_embd", self.n_embd, f"must be divisible by model.n_head={self.n_head}")
        INITS[self.init]  # an unknown scheme: one line listing the valid ones
        self.norm.check_model(self)
        if 0 < self.prores_steps < self.n_layer:
            bad("model.prores_steps", self.prores_steps, f"must be 0 (off) or at least model.n_layer={self.n_layer} "
                "(block 1 warms up over prores_steps // n_layer updates)")
        if self.pos_emb == "rope" and self.rope_dims < 2:
            bad("model.rope_fraction", self.rope_fraction, f"rotates no pair of the {self.head_dim} head dimensions")

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
        (LLaMA's rule: a 4d two-matrix MLP's parameter count, in three matrices)."""
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        return -(-8 * self.n_embd // (3 * 64)) * 64 if self.mlp == "swiglu" else 4 * self.n_embd

    def to_dict(self) -> dict:
        return asdict(self)  # `norm` as a nested mapping of its keys

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "GPTConfig":
        """From `to_dict()` (a checkpoint's model_config), also in the flat form of older checkpoints."""
        return build(cls, _from_flat(dict(d)) if isinstance(d.get("norm"), str) else d, "model_config")

    @classmethod
    def from_hydra(cls, model_cfg: Any, norm_cfg: Any, vocab_size: Optional[int] = None) -> "GPTConfig":
        """From the composed `model` and `norm` groups (nodes or dicts); absent keys take the defaults above.
        `vocab_size`: the tokenizer's (used when model.vocab_size is null)."""
        m = to_plain(model_cfg)
        group = build(ModelGroup, {f.name: m.pop(f.name) for f in fields(ModelGroup) if f.name in m}, "model")
        return build(cls, m, "model", keys=model_group_defaults(), vocab_size=group.vocab(vocab_size),
                     norm=norm_options(norm_cfg))


# Checkpoints written before the variants owned their options stored every norm key as a flat field.
_FLAT = {"norm": "name", "norm_kind": "kind", "norm_eps": "eps", "geonorm_clamp": "clamp",
         "keel_first_layer": "first_layer", "dyt_alpha_attn": "alpha_attn", "dyt_alpha_other": "alpha_other",
         **{k: k for k in ("decay", "p", "embed_norm", "final_norm", "deepnorm_init", "learn_radius",
                           "decay_index", "alpha_init", "a_init", "sublayer_input", "target_angle")}}


def _from_flat(d: dict) -> dict:
    """An old flat model_config in today's form: the norm keys the variant reads, under `norm`."""
    flat = {key: d.pop(old) for old, key in _FLAT.items() if old in d}
    own = {f.name for f in fields(VARIANTS.options(flat["name"]))}
    norm = {k: v for k, v in flat.items() if k in own}
    if norm.get("embed_norm") != "scalenorm":    # a radius flag without a ScaleNorm was never read
        norm.pop("learn_radius", None)
    if "sublayer_input" in own:                  # written before GeoNorm's default became `norm`
        norm.setdefault("sublayer_input", "raw")
    return {**d, "norm": norm}


@dataclass
class ModelGroup:
    """The `model.*` keys that are not GPTConfig fields as they are: labels and the vocabulary rule."""
    name: Name = "custom"                # label of the model shape, used in run names (configs/model/<name>.yaml)
    arch: Name = "gpt2"                  # label of the architecture preset (configs/arch/<name>.yaml sets it)
    vocab_size: Optional[PosInt] = None  # null: the tokenizer's vocabulary, padded up to a multiple of pad_vocab_to
    pad_vocab_to: PosInt = 64            # GPT-2's 50257 -> 50304, as nanoGPT does, for fast matmuls

    def __post_init__(self) -> None:
        check(self, "model")

    def vocab(self, tokenizer_vocab: Optional[int]) -> int:
        if self.vocab_size is None:
            if tokenizer_vocab is None:
                raise ConfigError("model.vocab_size is null and no tokenizer vocabulary size was given")
            return -(-int(tokenizer_vocab) // self.pad_vocab_to) * self.pad_vocab_to
        if tokenizer_vocab is not None and self.vocab_size < tokenizer_vocab:
            bad("model.vocab_size", self.vocab_size, f"smaller than the tokenizer's {tokenizer_vocab}")
        return self.vocab_size


def model_group_defaults() -> dict:
    """The `model` group's Hydra schema: GPTConfig's keys but `norm` (its own group), then ModelGroup's."""
    group = defaults(ModelGroup)
    return {**{k: v for k, v in defaults(GPTConfig).items() if k != "norm" and k not in group}, **group}


def from_spec(spec: str, norm: Optional[dict] = None, **fields_) -> "GPTConfig":
    """A model from a row of a benchmark or check, `name[:key=value,...]`: the variant, then keys that are
    GPTConfig fields (`value_residual=true`) or the variant's `norm.*` keys (`kind=seednorm`), values as YAML;
    `norm` and `fields_` are the keys every row shares (a preset's), which the row's own override."""
    import yaml

    name, _, rest = spec.partition(":")
    extra = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in rest.split(",") if kv)}
    model_keys = {f.name for f in fields(GPTConfig)}
    own = {k: v for k, v in extra.items() if k in model_keys}
    return GPTConfig(**{**fields_, **own}, norm={"name": name, **(norm or {}),
                                                 **{k: v for k, v in extra.items() if k not in model_keys}})

