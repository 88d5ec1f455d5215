"""Layer-wise decay schedules lambda(i, n) of the sphere family's step size (`norm.decay`).

i is 1-based and n the count it runs over: block k of N (the default, GeoNorm paper Eq. 5; attention
and MLP of a block share it) or sublayer j+1 of 2N (`norm.decay_index=sublayer`). A new schedule is
one function under the decorator.
"""
from __future__ import annotations

import math

from common import Registry

DECAYS = Registry("norm.decay")


@DECAYS.register("none")
def no_decay(i: int, n: int) -> float:
    return 1.0


@DECAYS.register("harmonic")
def harmonic(i: int, n: int) -> float:
    """1/i: GeoNorm's default."""
    return 1.0 / i


@DECAYS.register("sqrt")
def inverse_sqrt(i: int, n: int) -> float:
    """1/sqrt(i): SpheretNorm's default."""
    return 1.0 / math.sqrt(i)


@DECAYS.register("linear")
def linear(i: int, n: int) -> float:
    """(n - i + 1)/n: from 1 at the first down to 1/n at the last."""
    return (n - i + 1) / n


def decay_factor(schedule: str, i: int, n: int) -> float:
    return DECAYS[schedule](i, n)
