"""Weight initialisation schemes (`model.init`), picked by name from `INITS` (model/config.py,
where each scheme below is named).

A scheme sets every Linear and Embedding weight of a freshly built GPT (biases to zero); the
variant's own `init_weights` hook (DeepNorm's beta gains, nGPT's unit rows) runs after it.
`model.embed_std` overrides the scheme's std of the token (and position) embeddings alone.

Why a choice: the scale of the embeddings is the scale of a Pre-LN residual stream at init, and so
how large a step each sublayer takes relative to the stream from the first update
(docs/variants.md, "Initialisation"; docs/step_scale_study.md).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import torch.nn as nn

from .config import INITS  # name -> the functions below

if TYPE_CHECKING:
    from .config import GPTConfig


def _is_residual_proj(name: str) -> bool:
    """The projections that write into the residual stream (attention and MLP outputs)."""
    return name.endswith("c_proj.weight")


def _apply(model: nn.Module, std: Callable[[int], float], embed_std: float, resid_scale: float) -> None:
    """Linear weights N(0, std(fan_in)^2) and embeddings N(0, embed_std^2), visited by `model.apply` as
    nanoGPT does (so the default consumes the RNG exactly as before); then the residual projections
    re-drawn at `resid_scale` times their std. A head tied to the token table is drawn last (it is the
    last module) and takes the embedding std, so `model.embed_std` holds for the shared table."""
    tied_head = model.lm_head if model.config.tie_embeddings else None

    def init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            s = embed_std if module is tied_head else std(module.in_features)
            nn.init.normal_(module.weight, mean=0.0, std=s)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=embed_std)

    model.apply(init)
    for name, p in model.named_parameters():
        if _is_residual_proj(name):
            nn.init.normal_(p, mean=0.0, std=std(p.shape[1]) * resid_scale)  # weight is [out, in]


def nanogpt(model: nn.Module, cfg: "GPTConfig") -> None:
    """nanoGPT / GPT-2: every matrix and embedding N(0, 0.02), biases 0, residual projections
    N(0, 0.02/sqrt(2N)); width-independent, so a wider model's stream and logits start relatively smaller."""
    embed = 0.02 if cfg.embed_std is None else cfg.embed_std
    _apply(model, lambda fan_in: 0.02, embed, 1.0 / math.sqrt(2 * cfg.n_layer))


def fan_in(model: nn.Module, cfg: "GPTConfig") -> None:
    """Width-scaled (LeCun / torchtitan-style): every matrix N(0, 1/fan_in), residual projections also
    times 1/sqrt(2N); embeddings N(0, 1/d) [our choice: the tied table is also the LM head, whose
    fan-in is d, so its logits start at RMS ~1 whatever the width]."""
    embed = 1.0 / math.sqrt(cfg.n_embd) if cfg.embed_std is None else cfg.embed_std
    _apply(model, lambda fan_in: 1.0 / math.sqrt(fan_in), embed, 1.0 / math.sqrt(2 * cfg.n_layer))


def initialise(model: nn.Module, cfg: "GPTConfig") -> None:
    INITS[cfg.init](model, cfg)
