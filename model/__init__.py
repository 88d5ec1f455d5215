"""nanonorm's model: a GPT-2 with pluggable residual-stream normalization variants."""
from .config import ConfigError, GPTConfig

__all__ = ["GPT", "GPTConfig", "ConfigError", "VARIANTS"]


def __getattr__(name):  # placeholder until gpt.py lands
    raise AttributeError(name)
