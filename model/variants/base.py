"""The variant interface and its registry: `VARIANTS` (name -> class), `register` and `Variant` (input
step, sublayer rule, output step, and the hooks). Each variant's `norm.*` keys are in ../norm_options.py
(torch-free); the families live beside this file: classic.py, sphere.py, depth.py, ngpt.py, recent.py,
streams.py."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Type

import torch
import torch.nn as nn

from common import Registry

from ..norm_options import NORM_OPTIONS, NormOptions
from ..norms import make_input_step, make_norm

if TYPE_CHECKING:  # type hints only: the config imports the registry, not the other way round
    from ..config import GPTConfig

VARIANTS = Registry("norm.name", options=NORM_OPTIONS)   # name -> Variant class; `@register("name")` adds one
register = VARIANTS.register  # the class takes the Options recorded under its name in ../norm_options.py


def get_variant(name: str) -> Type["Variant"]:
    return VARIANTS[name]  # an unknown name raises ConfigError listing the valid ones


Sublayer = Callable[[torch.Tensor], torch.Tensor]


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
