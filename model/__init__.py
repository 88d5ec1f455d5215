"""nanonorm's model: a GPT-2 with pluggable residual-stream normalization variants.

    from model import GPT, GPTConfig
    model = GPT(GPTConfig(norm="geonorm", n_layer=12, n_head=12, n_embd=768))
"""
from .config import ConfigError, GPTConfig
from .gpt import GPT, KVCache
from .variants import VARIANTS, get_variant

__all__ = ["GPT", "GPTConfig", "ConfigError", "KVCache", "VARIANTS", "get_variant"]
