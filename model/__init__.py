"""nanonorm's model: a GPT-2 with pluggable residual-stream normalization variants.

    from model import GPT, GPTConfig
    model = GPT(GPTConfig(norm="geonorm", n_layer=12, n_head=12, n_embd=768))

The config (model.config, model.norm_options) imports without torch, so `--help` and Hydra's
composition read the schema without it; the modules are imported on first use.
"""
from .config import ConfigError, GPTConfig

__all__ = ["GPT", "GPTConfig", "ConfigError", "KVCache", "VARIANTS", "get_variant"]


def __getattr__(name: str):
    if name in ("GPT", "KVCache"):
        from . import gpt
        return getattr(gpt, name)
    if name in ("VARIANTS", "get_variant"):
        from . import variants
        return getattr(variants, name)
    raise AttributeError(f"module 'model' has no attribute {name!r}")
