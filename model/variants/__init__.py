"""The normalization variants: one small class each, picked by name from `VARIANTS`, one file per family
(classic, sphere, depth, ngpt, recent, streams; the interface and registry in base.py).

A variant is three parts (docs/variants.md gives every variant's exact rule and source):
  1. input step  `input_step(cfg)`:  what happens to the embeddings e before block 1;
  2. sublayer rule  `forward(h, f)`:  how the stream h is updated by one sublayer f (attention or MLP);
  3. output step `output_step(cfg)`: what happens to h before the LM head.
One instance of the class is made per sublayer (index j = 0..2N-1, block k = j//2 + 1), so each
sublayer owns its norms and scalars.

Each variant's `norm.*` keys are its `Options` dataclass, recorded by name in model/norm_options.py
(torch-free, so the config and `--help` read them without building a model); `GPTConfig.norm` is an
instance of the chosen variant's Options, and a key the variant does not read is an error naming the
keys it does (model/config.py builds it).
"""
from .base import VARIANTS, NormOptions, Variant, get_variant, register  # noqa: F401
# imported in this order: the order of registration is the order of every table and legend
from .classic import *  # noqa: F401,F403
from .sphere import *  # noqa: F401,F403
from .depth import *  # noqa: F401,F403
from .ngpt import *  # noqa: F401,F403
from .recent import *  # noqa: F401,F403
from .streams import *  # noqa: F401,F403
