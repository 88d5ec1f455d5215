"""The variant interface: `Variant` (input step, sublayer rule, output step, and the hooks). Each built-in
variant is named, with its `norm.*` keys, in ../norm_options.py (`VARIANTS`, torch-free); the families live
beside this file: classic.py, sphere.py, depth.py, ngpt.py, recent.py, streams.py. A variant in a user's own
module is one class under `@register("name")`, carrying its keys as its `Options`."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Dict, Optional, Type

import torch
import torch.nn as nn

from ..norm_options import VARIANTS, NormOptions
from ..norms import make_input_step, make_norm
from ..sublayers import MLP as MLPSublayer, CausalSelfAttention, LMHead

if TYPE_CHECKING:  # type hints only: the config imports the registry, not the other way round
    from ..config import GPTConfig

register = VARIANTS.register  # a user's variant: the class and its Options (its own, or its base's)


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

    @classmethod
    def shared(cls, rules: list) -> Optional[list]:
        """What the variant computes once per forward for all its 2N rules (one entry per rule, passed to its
        forward as a third argument), or None: nothing (mHC: every static H_res in one batched Sinkhorn)."""
        return None

    def step_sizes(self) -> Dict[str, torch.Tensor]:
        """Learned step-size scalars, for the training monitor."""
        return {}

    # ---- beyond the residual stream (docs/variants.md, "Variant interface") ----
    # A variant whose novelty is inside a sublayer or the head names its subclass of GPT-2's here
    # (HybridNorm's attention, nGPT's attention, MLP and head); the model builds whichever is named.
    Attention: Type[CausalSelfAttention] = CausalSelfAttention
    MLP: Type[MLPSublayer] = MLPSublayer
    Head: Type[LMHead] = LMHead

    @staticmethod
    def stream_view(h: torch.Tensor) -> torch.Tensor:
        """The stream as the monitor and `return_hidden` see it, [B, T, d]: itself, but for a widened
        stream (hyper-connections: the sum of its copies)."""
        return h

    @classmethod
    def after_step(cls, model: nn.Module, applied: torch.Tensor) -> None:
        """Called by the trainer after every optimizer step with `applied`, a 0-d bool tensor on the
        device (False: the step was skipped as non-finite). It must leave the model untouched when
        `applied` is False, and must not read `applied` on the host (the loop is sync-free)."""
