"""The normalization variants: one small class each, picked by name from `VARIANTS`, one file per family
(classic, sphere, depth, ngpt, recent, streams; the interface and registry in base.py).

A variant is three parts (docs/variants.md gives every variant's exact rule and source):
  1. input step  `input_step(cfg)`:  what happens to the embeddings e before block 1;
  2. sublayer rule  `forward(h, f)`:  how the stream h is updated by one sublayer f (attention or MLP);
  3. output step `output_step(cfg)`: what happens to h before the LM head.
One instance of the class is made per sublayer (index j = 0..2N-1, block k = j//2 + 1), so each
sublayer owns its norms and scalars.

Each variant owns its `norm.*` keys: `Options`, a dataclass on the class that extends its parent's (and
may change a parent's default: Post-LN has no output Norm). `GPTConfig.norm` is an instance of the
chosen variant's `Options`, so `cfg.norm.clamp` exists exactly for the variants that read it, and a key
the variant does not read is an error naming the keys it does (model/config.py builds it). A new option
is one field with its doc line, its valid values in its annotation (`streams: PosInt = 4`, `Literal`,
`Range`: common/config.py); a check relating two fields goes in that class's `__post_init__`.
"""
from .base import VARIANTS, NormOptions, Variant, get_variant, register  # noqa: F401
# imported in this order: the order of registration is the order of every table and legend
from .classic import *  # noqa: F401,F403
from .sphere import *  # noqa: F401,F403
from .depth import *  # noqa: F401,F403
from .ngpt import *  # noqa: F401,F403
from .recent import *  # noqa: F401,F403
from .streams import *  # noqa: F401,F403
