"""Depth-dependent placements beyond the two papers' baseline lists: LayerNorm Scaling and Mix-LN."""
from __future__ import annotations

import math



from ..norms import make_norm

from .base import Variant


class LayerNormScaling(Variant):
    """LayerNorm Scaling (Sun et al., "The Curse of Depth", arXiv 2502.05795):
    h = e;  h <- h + F(Norm(h)/sqrt(k)), k the block index;  output Norm(h)."""

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.norm = make_norm(cfg)
        self.scale = 1.0 / math.sqrt(self.k)

    def forward(self, h, f):
        return h + f(self.norm(h) * self.scale)


class MixLN(Variant):
    """Mix-LN (Li et al., arXiv 2412.13795): Post-LN in the first floor(0.25*N) blocks, Pre-LN after;
    h = e; output Norm(h) (the last blocks are Pre-LN)."""

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.post = self.k <= int(0.25 * cfg.n_layer)
        self.norm = make_norm(cfg)

    def forward(self, h, f):
        return self.norm(h + f(h)) if self.post else h + f(self.norm(h))
