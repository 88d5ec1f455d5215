"""Learning-rate schedules (`optim.schedule`), picked by name from SCHEDULES.

lr(u) for u = the number of applied updates (a skipped step does not advance it). Every schedule
starts with the same linear warmup (`optim.warmup_steps`) and then follows its own `main(u)`. The
same code runs on Python floats (logging, tests) and on float64 device tensors (the hot path, no
host sync). A new schedule is one class here, named with its own keys (`optim.<key>`, e.g. wsd's
`optim.decay_frac`: the fields of its `Options`) in optim_options.py (torch-free); one defined in a user's
module is a class under `@SCHEDULES.register("name")` carrying its Options. Another schedule's key is a
one-line error.
"""
from __future__ import annotations

import math

import torch

from .optim_options import SCHEDULES, ScheduleOptions  # noqa: F401  (the registry, where users look for it)



class _Ops:
    """clamp/cos/where for floats or tensors, so one formula serves both."""

    def __init__(self, u):
        self.is_tensor = isinstance(u, torch.Tensor)

    def clamp(self, x, lo, hi):
        return x.clamp(lo, hi) if self.is_tensor else min(max(x, lo), hi)

    def cos(self, x):
        return torch.cos(x) if self.is_tensor else math.cos(x)

    def where(self, c, a, b):
        return torch.where(c, a, b) if self.is_tensor else (a if c else b)


class Schedule:
    Options = ScheduleOptions

    def __init__(self, lr: float, min_lr: float, warmup_steps: int, max_steps: int, options: ScheduleOptions):
        self.lr, self.min_lr, self.warmup, self.max_steps = lr, min_lr, warmup_steps, max_steps
        self.options = options

    def main(self, u, ops: _Ops):
        raise NotImplementedError

    def __call__(self, u):
        """`u` a float or a float64 tensor; returns the same kind."""
        ops = _Ops(u)
        warm = self.lr * (u + 1) / (self.warmup + 1)  # nanoGPT: never exactly 0
        return ops.where(u < self.warmup, warm, self.main(u, ops))


class Cosine(Schedule):
    """Cosine from lr down to min_lr at max_steps."""

    def main(self, u, ops):
        r = ops.clamp((u - self.warmup) / max(1, self.max_steps - self.warmup), 0.0, 1.0)
        return self.min_lr + 0.5 * (1.0 + ops.cos(math.pi * r)) * (self.lr - self.min_lr)


class WarmupStableDecay(Schedule):
    """Stable at lr, then linear decay to min_lr over the last `optim.decay_frac` of the steps."""

    def main(self, u, ops):
        start = self.max_steps - max(1, round(self.options.decay_frac * self.max_steps))
        r = ops.clamp((u - start) / max(1, self.max_steps - start), 0.0, 1.0)
        return self.lr + r * (self.min_lr - self.lr)


class Constant(Schedule):
    def main(self, u, ops):
        return u * 0 + self.lr
