"""Metrics every part reports alike."""
from __future__ import annotations

import math

# exp() overflows a float past ~709.78: a diverged run's loss gives an infinite perplexity, not an error.
_MAX_LOG = 700.0


def perplexity(loss: float | None) -> float | None:
    """exp(loss) of a mean next-token loss in nats: inf where that would overflow, NaN for a NaN loss,
    None for None (no loss measured)."""
    if loss is None:
        return None
    if math.isnan(loss):
        return math.nan
    return math.exp(loss) if loss < _MAX_LOG else math.inf
