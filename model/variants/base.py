"""The variant interface and its registry: `VARIANTS` (name -> class), `register`, `NormOptions` (the
`norm.*` keys every variant reads) and `Variant` (input step, sublayer rule, output step, and the hooks).
The families live beside it: classic.py, sphere.py, depth.py, ngpt.py, recent.py, streams.py."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Type

import torch
import torch.nn as nn

from common import Registry
from common.config import NonNeg, Positive, check

from ..norms import INPUT_STEPS, NORM_KINDS, make_input_step, make_norm

if TYPE_CHECKING:  # type hints only: the config imports the registry, not the other way round
    from ..config import GPTConfig

VARIANTS = Registry("norm.name")   # name -> Variant class; `@register("name")` adds one
register = VARIANTS.register


def get_variant(name: str) -> Type["Variant"]:
    return VARIANTS[name]  # an unknown name raises ConfigError listing the valid ones


Sublayer = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class NormOptions:
    """The `norm.*` keys every variant reads (its Norms, input and output step)."""
    name: str = "pre_ln"              # the variant: a name registered in model/variants/
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
