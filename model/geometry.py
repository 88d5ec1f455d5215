"""The geometry of the residual stream: how far each sublayer turns and moves it, and the gradient
that reaches each depth. The same measurements for every variant, so Pre-LN's implied rotation and
GeoNorm's explicit one are on one axis (docs/step_scale_study.md; docs/training.md, "Monitoring").

    stats = stream_geometry(model, x, y)   # {name: 0-d tensor}, one forward and one backward

Keys (j = 0..2N-1 the sublayer, h_j the stream before it, F_j its output, t a token):
  geo/angle/{j}       mean_t angle(h_j, h_{j+1})                       (radians)
  geo/rel_update/{j}  mean_t ||h_{j+1} - h_j|| / ||h_j||
  geo/f_ratio/{j}     mean_t ||F_j|| / ||h_j||
  geo/grad/{j}        ||dL/dh_j|| over the batch, j = 0..2N            (the stream after the input step is j=0)
  geo/transmission    mean_t prod_j cos(angle_j): how much of h_0's direction survives to the top
  rms/{j}             RMS of the stream h_j, j = 0..2N
"""
from __future__ import annotations

from typing import Dict, Optional

import torch


def angle_between(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-token angle between a and b (last dim) in [0, pi], float32. atan2 of the orthogonal and
    parallel parts of b along a: accurate for tiny angles, where acos of a cosine near 1 is not."""
    a, b = a.float(), b.float()
    a_hat = a / a.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    par = (b * a_hat).sum(-1)
    perp = (b - par.unsqueeze(-1) * a_hat).norm(dim=-1)
    return torch.atan2(perp, par)


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return num.float().norm(dim=-1) / den.float().norm(dim=-1).clamp_min(1e-30)


def stream_geometry(
    model: torch.nn.Module, x: torch.Tensor, y: Optional[torch.Tensor] = None
) -> Dict[str, torch.Tensor]:
    """The measurements of one batch (keys in the module doc), as 0-d device tensors (no host sync).

    Runs its own forward (in the model's current mode: the trainer puts it in eval mode) and, when
    targets `y` are given, a backward to the stream states alone: parameter gradients are untouched."""
    outputs: list = []
    with torch.enable_grad():
        _, loss, hidden = model(x, y, return_hidden=True, sublayer_outputs=outputs)
        grads = torch.autograd.grad(loss, hidden, allow_unused=True) if y is not None and loss.requires_grad else None
    out: Dict[str, torch.Tensor] = {}
    transmission = None
    with torch.no_grad():
        out.update({f"rms/{j}": h.float().pow(2).mean().sqrt() for j, h in enumerate(hidden)})
        for j, (h0, h1, f) in enumerate(zip(hidden[:-1], hidden[1:], outputs)):
            ang = angle_between(h0, h1)
            out[f"geo/angle/{j}"] = ang.mean()
            out[f"geo/rel_update/{j}"] = _ratio(h1.float() - h0.float(), h0).mean()
            out[f"geo/f_ratio/{j}"] = _ratio(f, h0).mean()
            c = torch.cos(ang)
            transmission = c if transmission is None else transmission * c
        if transmission is not None:
            out["geo/transmission"] = transmission.mean()
        if grads is not None:
            for j, g in enumerate(grads):
                if g is not None:
                    out[f"geo/grad/{j}"] = torch.linalg.vector_norm(g.float())
    return out


@torch.no_grad()
def update_ratios(before: Dict[str, list], groups: Dict[str, list]) -> Dict[str, torch.Tensor]:
    """'update_ratio/{group}': ||W_after - W_before|| / ||W_before|| over each optimizer group's
    parameters (one number a group: the relative size of one optimizer step)."""
    out = {}
    for name, params in groups.items():
        old = before.get(name)
        if not params or not old:
            continue
        diff = torch._foreach_sub([p.detach() for p in params], old)
        num = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(diff)))
        den = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(old)))
        out[f"update_ratio/{name}"] = num / den.clamp_min(1e-30)
    return out
