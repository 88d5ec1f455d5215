"""GPT-2 (as in nanoGPT) with the residual-stream normalization taken from a variant class.

Architecture axes (GPTConfig: pos_emb, mlp, bias, tie_embeddings, qk_norm, attn_gate; the `arch` presets
set the first five together) turn it into a LLaMA-, modded-nanogpt- or GPT-NeoX-style block; the default is GPT-2.
Read top to bottom: KV cache, attention, MLP, a block (two sublayers, each wrapped by the variant's
rule), and the GPT (embeddings -> input step -> blocks -> output step -> LM head).
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import GPTConfig
from .init import initialise
from .rope import apply_rope, rope_tables
from .variants import Variant, get_variant

# Optimizer parameter groups (trainer/optim.py gives each its own lr multiplier and weight decay).
PARAM_GROUPS = ("matrices", "embeddings", "vectors", "scalars")


class KVCache:
    """Per-layer keys and values for incremental decoding. `pos` = tokens already cached."""

    def __init__(self, n_layer: int, batch_size: int, max_len: int):
        self.n_layer, self.batch_size, self.max_len = n_layer, batch_size, max_len
        self.k: List[Optional[torch.Tensor]] = [None] * n_layer
        self.v: List[Optional[torch.Tensor]] = [None] * n_layer
        self.pos = 0

    def reset(self) -> None:
        self.pos = 0

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Write this step's k, v ([B, H, T, hd]) at pos..pos+T; return all cached k, v so far."""
        B, H, T, hd = k.shape
        if B != self.batch_size:
            raise ValueError(f"KV cache was made for batch size {self.batch_size}, got {B}")
        if self.pos + T > self.max_len:
            raise ValueError(f"KV cache full: {self.pos} + {T} tokens exceed max_len={self.max_len}")
        cached = self.k[layer]
        if cached is None or (self.pos == 0 and (cached.dtype, cached.device) != (k.dtype, k.device)):
            # allocated on first use, so the dtype follows autocast and the device follows the model
            self.k[layer] = k.new_zeros(B, H, self.max_len, hd)
            self.v[layer] = v.new_zeros(B, H, self.max_len, hd)
        elif (cached.dtype, cached.device) != (k.dtype, k.device):
            raise ValueError(f"KV cache holds {cached.dtype} on {cached.device} but got {k.dtype} on {k.device} "
                             "mid-sequence: keep autocast and device fixed, or reset() the cache")
        self.k[layer][:, :, self.pos:self.pos + T] = k
        self.v[layer][:, :, self.pos:self.pos + T] = v
        return self.k[layer][:, :, :self.pos + T], self.v[layer][:, :, :self.pos + T]


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig, layer: int, variant: type[Variant]):
        super().__init__()
        self.layer, self.n_head, self.n_embd = layer, cfg.n_head, cfg.n_embd
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # q, k, v stacked (rows)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.qk_norm, self.eps = cfg.qk_norm, cfg.norm.eps
        # Gated attention (Qiu et al., arXiv 2505.06708, Eq. 5 at position G1): Y' = Y * sigmoid(x W_g), x the
        # sublayer's input, one gate per element of each head (W_g: d x d) or per head (W_g: d x n_head).
        self.gate = None if cfg.attn_gate == "none" else nn.Linear(
            cfg.n_embd, cfg.n_embd if cfg.attn_gate == "elementwise" else cfg.n_head, bias=cfg.bias)
        self.qkv_step = variant.qkv_step(cfg)       # the variant's own treatment of q, k, v (HybridNorm)
        self.qk_step = variant.attention_step(cfg)  # the variant's own treatment of q, k (nGPT)
        self.scale = getattr(self.qk_step, "softmax_scale", None)  # None: SDPA's 1/sqrt(hd)
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.track, self.last_gate_mean = False, None   # the gate's mean, at the monitor's stats steps

    def forward(self, x: torch.Tensor, cache: Optional[KVCache] = None, rope=None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        if self.qkv_step is not None:
            q, k, v = self.qkv_step(q, k, v)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.qk_norm:  # modded-nanogpt: RMSNorm without gain, per head, before the rotation
            q, k = F.rms_norm(q, (q.size(-1),), eps=self.eps), F.rms_norm(k, (k.size(-1),), eps=self.eps)
        if rope is not None:  # cos/sin of this call's positions (offset by the cache length)
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if self.qk_step is not None:
            q, k = self.qk_step(q, k)
        drop = self.dropout if self.training else 0.0
        if cache is None or cache.pos == 0:
            if cache is not None:
                cache.update(self.layer, k, v)
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=True, scale=self.scale)
        else:
            pos = cache.pos
            k, v = cache.update(self.layer, k, v)  # cached keys are stored already rotated
            mask = None
            if T > 1:  # new queries see the whole cache and the causal part of themselves
                mask = (
                    torch.arange(pos + T, device=x.device)[None, :] <= (pos + torch.arange(T, device=x.device))[:, None]
                )
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop, scale=self.scale)
        if self.gate is not None:  # (B, T, n_head, hd or 1) -> each head's output times its gates
            g = torch.sigmoid(self.gate(x))
            if self.track:  # the monitor's forward at stats steps only: no extra op in training
                self.last_gate_mean = g.detach().float().mean()
            y = y * g.view(B, T, self.n_head, -1).transpose(1, 2)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """`model.mlp`: gelu (GPT-2), relu2 (ReLU squared, modded-nanogpt) or swiglu (LLaMA:
    c_proj(c_fc(x) * silu(c_gate(x)))). Hidden width: GPTConfig.hidden_size."""

    def __init__(self, cfg: GPTConfig, variant: type[Variant]):
        super().__init__()
        hidden = cfg.hidden_size
        self.kind = cfg.mlp
        self.c_fc = nn.Linear(cfg.n_embd, hidden, bias=cfg.bias)
        if self.kind == "swiglu":
            self.c_gate = nn.Linear(cfg.n_embd, hidden, bias=cfg.bias)
        self.c_proj = nn.Linear(hidden, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)
        self.act_step = variant.mlp_step(cfg, hidden)  # the variant's scalers of the pre-activations (nGPT)

    def forward(self, x):
        s = self.act_step
        g = self.c_gate(x) if self.kind == "swiglu" else self.c_fc(x)  # the activation's input
        if s is not None:
            g = s.gate(g)
        if self.kind == "swiglu":
            u = self.c_fc(x)
            a = (u if s is None else s.up(u)) * F.silu(g)
        elif self.kind == "relu2":
            a = F.relu(g).square()
        else:
            a = F.gelu(g)
        return self.dropout(self.c_proj(a))


class Block(nn.Module):
    """Two sublayers; the variant's rule decides how each one updates the residual stream."""

    def __init__(self, cfg: GPTConfig, layer: int, variant: type[Variant]):
        super().__init__()
        self.attn = CausalSelfAttention(cfg, layer, variant)
        self.mlp = MLP(cfg, variant)
        self.attn_rule = variant(cfg, 2 * layer)
        self.mlp_rule = variant(cfg, 2 * layer + 1)

    def forward(self, h, cache: Optional[KVCache] = None, hidden: Optional[list] = None, rope=None,
                outputs: Optional[list] = None):
        """`hidden` collects the stream after each sublayer, `outputs` each sublayer's own output F(.)."""
        attn, mlp = (lambda x: self.attn(x, cache, rope)), self.mlp
        if outputs is not None:
            attn, mlp = _recording(attn, outputs), _recording(mlp, outputs)
        h = self.attn_rule(h, attn)
        if hidden is not None:
            hidden.append(self.attn_rule.stream_view(h))
        h = self.mlp_rule(h, mlp)
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
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.logit_step = variant.logit_step(config)        # the variant's logit scaling (nGPT), or None
        if config.tie_embeddings:
            self.wte.weight = self.lm_head.weight           # weight tying, as GPT-2

        initialise(self, config)                            # `model.init` (model/init.py)
        variant.init_weights(self)                          # the variant's own (DeepNorm's gains, a calibration)

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None, *,
                return_hidden: bool = False, kv_cache: Optional[KVCache] = None, last_only: bool = False,
                sublayer_outputs: Optional[list] = None):
        """Logits and loss. `return_hidden` adds the 2N+1 stream states (after the input step and after
        every sublayer); a list given as `sublayer_outputs` receives the 2N sublayer outputs F(.)
        (model/geometry.py measures both)."""
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
        for block in self.blocks:
            h = block(h, kv_cache, hidden, rope, sublayer_outputs)
        h = self.output_step(h)
        if last_only:
            h = h[:, -1:, :]
        logits = self.lm_head(h)
        if self.logit_step is not None:
            logits = self.logit_step(logits)
        loss = None
        if targets is not None:
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
        (False after a skipped step). The variant decides what, if anything, to do (nGPT renormalizes)."""
        self.variant.after_step(self, applied)

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
        return out

    def flops_per_token(self, seq_len: Optional[int] = None) -> float:
        """Training FLOPs per token (forward + backward), nanoGPT's estimate: 6N + 12 L d T.

        N counts every matmul weight (three MLP matrices for SwiGLU, the head when untied) but no
        position embedding; 12 L d T is the attention scores and values. RoPE, activations and norms
        are elementwise and left out, as in the PaLM/nanoGPT estimate."""
        cfg = self.config
        return 6 * self.num_params() + 12 * cfg.n_layer * cfg.n_embd * (seq_len or cfg.block_size)
