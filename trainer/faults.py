"""Debugging faults, installed once at set-up around the training forward; the step itself has no
branch for them.

`train.inject_nan_at=N` (with `train.inject_nan_steps=K`, default 1) makes the training loss NaN
for steps N .. N+K-1: the gradients are then NaN and the non-finite-step guard must skip those steps
without touching weights or optimizer state (the tests and `scripts/gpu_check.py` check it).
Validation is not affected. With `train.inject_nan_at=null` (the default) nothing is wrapped.
"""
from __future__ import annotations

from typing import Callable


class NanLoss:
    """Calls `forward(x, y)` and multiplies its loss by NaN while `step_being_made()` is in
    [at, at + steps). Everything else about the forward is unchanged."""

    def __init__(self, forward: Callable, at: int, steps: int, step_being_made: Callable[[], int]):
        self.forward, self.at, self.steps, self.step_being_made = forward, at, steps, step_being_made

    def __call__(self, *args, **kwargs):
        logits, loss = self.forward(*args, **kwargs)
        if 0 <= self.step_being_made() - self.at < self.steps:
            loss = loss * float("nan")
        return logits, loss


def wrap_training_forward(forward: Callable, train_cfg, step_being_made: Callable[[], int]) -> Callable:
    """`forward` itself, or wrapped in the faults that `train_cfg` asks for (see the module doc)."""
    if train_cfg.inject_nan_at is None:
        return forward
    return NanLoss(forward, train_cfg.inject_nan_at, train_cfg.inject_nan_steps, step_being_made)
