"""GPT-2 (as in nanoGPT) with the residual-stream normalization taken from a variant class.

Architecture axes (GPTConfig: pos_emb, mlp, bias, tie_embeddings, qk_norm, attn_gate, value_residual; the `arch` presets
set the first five together) turn it into a LLaMA-, modded-nanogpt- or GPT-NeoX-style block; the default is GPT-2.
Read top to bottom: a block (two sublayers, each wrapped by the variant's rule) and the GPT (embeddings ->
input step -> blocks -> output step -> LM head). The sublayers and the KV cache are in model/sublayers.py.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import GPTConfig
from .init import initialise
from .rope import rope_tables
from .loss import linear_cross_entropy
from .sublayers import KVCache
from .variants import Variant, get_variant

# Optimizer parameter groups (trainer/optim.py gives each its own lr multiplier and weight decay).
PARAM_GROUPS = ("matrices", "embeddings", "vectors", "scalars")


class Block(nn.Module):
    """Two sublayers; the variant's rule decides how each one updates the residual stream."""

    def __init__(self, cfg: GPTConfig, layer: int, variant: type[Variant]):
        super().__init__()
        self.attn = variant.Attention(cfg, layer)  # GPT-2's, or the variant's subclass
        self.mlp = variant.MLP(cfg)
        self.attn_rule = variant(cfg, 2 * layer)
        self.mlp_rule = variant(cfg, 2 * layer + 1)

    def forward(self, h, cache: Optional[KVCache] = None, hidden: Optional[list] = None, rope=None,
                outputs: Optional[list] = None, shared: Optional[list] = None, values: Optional[list] = None,
                scale: Optional[torch.Tensor] = None):
        """`hidden` collects the stream after each sublayer, `outputs` each sublayer's own output F(.);
        `shared`: the variant's once-per-forward values for this block's two rules (Variant.shared); `values`:
        the first layer's attention values (`model.value_residual`); `scale`: the factor on both sublayers'
        outputs (`model.prores_steps`), a 0-d device tensor."""
        attn, mlp = (lambda x: self.attn(x, cache, rope, values)), self.mlp
        if scale is not None:
            attn, mlp = (lambda x, f=attn: scale * f(x)), (lambda x, f=mlp: scale * f(x))
        if outputs is not None:
            attn, mlp = _recording(attn, outputs), _recording(mlp, outputs)
        h = self.attn_rule(h, attn) if shared is None else self.attn_rule(h, attn, shared[0])
        if hidden is not None:
            hidden.append(self.attn_rule.stream_view(h))
        h = self.mlp_rule(h, mlp) if shared is None else self.mlp_rule(h, mlp, shared[1])
        if hidden is not None:
            hidden.append(self.mlp_rule.stream_view(h))
        return h


def _recording(f, out: list):
    def g(x):
        y = f(x)
        out.append(y)
        return y
    return g


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        variant = get_variant(config.norm.name)
        self.variant = variant
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        if config.pos_emb == "learned":
            self.wpe = nn.Embedding(config.block_size, config.n_embd)
        else:  # RoPE: no position parameters; the tables are buffers left out of the state dict
            cos, sin = rope_tables(config.block_size, config.rope_dims, config.rope_base)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.drop = nn.Dropout(config.dropout)
        self.input_step = variant.input_step(config)        # 1. input step
        self.blocks = nn.ModuleList(Block(config, i, variant) for i in range(config.n_layer))  # 2. rules
        self.output_step = variant.output_step(config)      # 3. output step
        self.lm_head = variant.Head(config)
        if config.tie_embeddings:
            self.wte.weight = self.lm_head.weight           # weight tying, as GPT-2

        if config.prores_steps:   # ProRes: the optimizer updates so far, kept with the weights (exact resume)
            self.register_buffer("prores_step", torch.zeros((), dtype=torch.long))
            n = config.n_layer     # block l warms up over T_l, from T//N (block 1) to T (block N): the authors' code
            self.register_buffer("prores_warmup", torch.linspace(config.prores_steps // n, config.prores_steps, n),
                                 persistent=False)
        initialise(self, config)                            # `model.init` (model/init.py)
        variant.init_weights(self)                          # the variant's own (DeepNorm's gains, a calibration)

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None, *,
                return_hidden: bool = False, kv_cache: Optional[KVCache] = None, last_only: bool = False,
                sublayer_outputs: Optional[list] = None, return_logits: bool = True):
        """Logits and loss. `return_hidden` adds the 2N+1 stream states (after the input step and after
        every sublayer); a list given as `sublayer_outputs` receives the 2N sublayer outputs F(.)
        (model/geometry.py measures both). `return_logits=False` with targets: the loss only, computed
        head and cross-entropy together chunk by chunk (model/loss.py), logits None."""
        B, T = idx.shape
        start = kv_cache.pos if kv_cache is not None else 0
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of {start + T} tokens exceeds block_size={self.config.block_size}")
        e, rope = self.wte(idx), None
        if self.config.pos_emb == "learned":
            e = e + self.wpe(torch.arange(start, start + T, dtype=torch.long, device=idx.device))
        else:  # positions start after the cached tokens
            rope = (self.rope_cos[start:start + T], self.rope_sin[start:start + T])
        h = self.input_step(self.drop(e))
        hidden = [self.variant.stream_view(h)] if return_hidden else None
        shared = self.variant.shared(self.rules())
        values = [] if self.config.value_residual else None
        scales = self.prores_scales()
        for i, block in enumerate(self.blocks):
            h = block(h, kv_cache, hidden, rope, sublayer_outputs, None if shared is None else shared[2 * i:2 * i + 2],
                      values, None if scales is None else scales[i])
        h = self.output_step(h)
        if last_only:
            h = h[:, -1:, :]
        loss = None
        if targets is not None and not return_logits:
            logits = None
            loss = linear_cross_entropy(h.flatten(0, 1), self.lm_head.loss_weight(), targets.reshape(-1))
        else:
            logits = self.lm_head(h)
        if targets is not None and logits is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        if kv_cache is not None:
            kv_cache.pos += T
        return (logits, loss, hidden) if return_hidden else (logits, loss)

    # ---- helpers for training, evaluation and research code ----
    def new_kv_cache(self, batch_size: int, max_len: Optional[int] = None, device=None, dtype=None) -> KVCache:
        """An empty KV cache. With `device` and `dtype` (the attention's dtype: the autocast dtype
        under autocast) its storage is allocated now; otherwise on first use, from the keys' own."""
        cfg = self.config
        cache = KVCache(cfg.n_layer, batch_size, max_len or cfg.block_size)
        if device is not None and dtype is not None:
            shape = (batch_size, cfg.n_head, cache.max_len, cfg.n_embd // cfg.n_head)
            cache.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layer)]
            cache.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layer)]
        return cache

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; like nanoGPT, embeddings are excluded by default: the position embedding,
        and the token embedding when untied (tied, it is the LM head's weight and counts as one)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            if self.config.pos_emb == "learned":
                n -= self.wpe.weight.numel()
            if not self.config.tie_embeddings:
                n -= self.wte.weight.numel()
        return n

    def parameter_groups(self) -> Dict[str, List[Tuple[str, nn.Parameter]]]:
        """Every trainable parameter in exactly one optimizer group of PARAM_GROUPS:
        matrices (attention/MLP weights), embeddings (token, position, and the head when untied),
        vectors (norm gains and biases, linear biases), scalars (learned step sizes and gates).

        Linear and Embedding layers are classified here; any other module declares its parameters
        in a class attribute `optim_groups = {param_name: group}` (see model/norms.py, model/variants/),
        so a new variant states its groups next to its parameters. An undeclared parameter is a bug."""
        groups: Dict[str, List[Tuple[str, nn.Parameter]]] = {g: [] for g in PARAM_GROUPS}
        seen = set()
        for mname, module in self.named_modules():
            for pname, p in module.named_parameters(recurse=False):
                if id(p) in seen or not p.requires_grad:
                    continue  # a tied weight belongs to the module that registered it first (wte)
                seen.add(id(p))
                if isinstance(module, nn.Embedding) or module is self.lm_head:
                    group = "embeddings"
                elif isinstance(module, nn.Linear):
                    group = "matrices" if pname == "weight" else "vectors"
                else:
                    group = getattr(module, "optim_groups", {}).get(pname)
                if group not in PARAM_GROUPS:
                    raise TypeError(f"{type(module).__name__}.{pname} has no optimizer group: declare it in "
                                    f"{type(module).__name__}.optim_groups (one of {', '.join(PARAM_GROUPS)})")
                groups[group].append((f"{mname}.{pname}" if mname else pname, p))
        return groups

    def after_optimizer_step(self, applied: torch.Tensor) -> None:
        """The trainer calls this after every optimizer step; `applied` is a 0-d bool device tensor
        (False after a skipped step). The variant decides what, if anything, to do (nGPT renormalizes);
        ProRes counts the applied updates on the device (no host sync)."""
        self.variant.after_step(self, applied)
        if self.config.prores_steps:
            self.prores_step.add_(applied.to(self.prores_step.dtype))

    def prores_scales(self) -> Optional[torch.Tensor]:
        """ProRes's factor of each block's residual branches, min(1, u/T_l) [n_layer]; None when off."""
        if not self.config.prores_steps:
            return None
        return (self.prores_step.float() / self.prores_warmup).clamp(max=1.0)

    def fused_matrices(self) -> Dict[int, int]:
        """Weights that stack several matrices by rows, id(param) -> how many: attention's q, k, v.
        Optimizers that treat a weight as one matrix (Muon) split these (trainer/optim.py)."""
        return {id(b.attn.c_attn.weight): 3 for b in self.blocks}

    def block_modules(self) -> List[nn.Module]:
        return list(self.blocks)

    def rules(self) -> List[Variant]:
        """The 2N sublayer rules in order (j = 0..2N-1)."""
        return [r for b in self.blocks for r in (b.attn_rule, b.mlp_rule)]

    def set_stats_tracking(self, on: bool) -> None:
        for r in self.rules():
            if hasattr(r, "track"):
                r.track = on
                if not on:
                    r.last_theta = None
        for b in self.blocks:
            b.attn.track = on
            if not on:
                b.attn.last_gate_mean = None

    def norm_stats(self) -> Dict[str, torch.Tensor]:
        """Rotation angles of the last forward (tracked sublayers) and learned step sizes, as 0-d tensors."""
        out: Dict[str, torch.Tensor] = {}
        for j, r in enumerate(self.rules()):
            theta = getattr(r, "last_theta", None)
            if theta is not None:
                out[f"angle_mean/{j}"] = theta.mean()
                out[f"angle_max/{j}"] = theta.max()
                # saturation: dtheta/dbeta falls as the angle nears its bound (cos^2 for p = 1)
                out[f"angle_above_1rad/{j}"] = (theta > 1.0).float().mean()
                bound = r.angle_bound()
                if math.isfinite(bound):
                    out[f"angle_near_bound/{j}"] = (theta > 0.9 * bound).float().mean()
            for name, value in r.step_sizes().items():
                out[f"step/{j}/{name}"] = value
        if hasattr(self.input_step, "g"):
            out["step/embed_g"] = self.input_step.g.detach()
        for i, b in enumerate(self.blocks):
            if b.attn.last_gate_mean is not None:
                out[f"gate_mean/{i}"] = b.attn.last_gate_mean
        scales = self.prores_scales()
        if scales is not None:
            out.update({f"prores/{i}": s for i, s in enumerate(scales.detach())})
        out.update(self.scalar_values())
        return out

    def scalar_values(self) -> Dict[str, torch.Tensor]:
        """Every one-element learned scalar not reported as a rule's step size (Derf's and DyT's alpha and
        shift, the scaled input's s), as `scalar/<parameter name>`: how far each moved is the question of
        a long run."""
        rules = {id(r) for r in self.rules()}
        out: Dict[str, torch.Tensor] = {}
        for mname, module in self.named_modules():
            if id(module) in rules:
                continue
            for pname, group in getattr(module, "optim_groups", {}).items():
                p = getattr(module, pname, None)
                if group == "scalars" and isinstance(p, nn.Parameter) and p.numel() == 1:
                    out[f"scalar/{mname}.{pname}" if mname else f"scalar/{pname}"] = p.detach().reshape(())
            for key, v in (module.scalar_stats() if hasattr(module, "scalar_stats") else {}).items():
                out[f"scalar/{mname}.{key}"] = v  # a module's own summary of vector parameters (SeeDNorm's)
        return out

    def flops_per_token(self, seq_len: Optional[int] = None, causal: bool = False) -> float:
        """Training FLOPs per token (forward + backward), nanoGPT's estimate: 6N + 12 L d T; `causal`:
        llm.c's, 6N + 6 L d T (the attention matmuls over the causal half only).

        N counts every matmul weight (three MLP matrices for SwiGLU, the head when untied) but no
        position embedding; 12 L d T is the attention scores and values. RoPE, activations and norms
        are elementwise and left out, as in the PaLM/nanoGPT estimate."""
        cfg = self.config
        return 6 * self.num_params() + (6 if causal else 12) * cfg.n_layer * cfg.n_embd * (seq_len or cfg.block_size)
