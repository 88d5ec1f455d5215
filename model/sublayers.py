"""The sublayers of a block and the KV cache: causal self-attention, the MLP, the LM head. A variant
whose novelty is inside a sublayer (HybridNorm's QKV-Norm, nGPT's scalers) subclasses one and names it
in its `Attention`, `MLP` or `Head` (model/variants/base.py); model/gpt.py builds whichever it names."""
from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .rope import apply_rope

if TYPE_CHECKING:  # type hints only
    from .config import GPTConfig


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
    """Multi-head causal self-attention through SDPA. A variant that changes its inside subclasses it and
    overrides `project` (q, k, v from x) or `heads` (q, k, v split into heads, normalized, rotated)."""

    scale: Optional[float] = None  # the softmax scale; None: SDPA's 1/sqrt(head dim)
    # The KV cache holds each layer's V after the value residual's mix: a cached token's V_1 is its own, so a
    # cached forward mixes exactly what the full one does.

    def __init__(self, cfg: "GPTConfig", layer: int):
        super().__init__()
        self.layer, self.n_head, self.n_embd = layer, cfg.n_head, cfg.n_embd
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # q, k, v stacked (rows)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.qk_norm, self.eps = cfg.qk_norm, cfg.norm.eps
        # Gated attention (Qiu et al., arXiv 2505.06708, Eq. 5 at position G1): Y' = Y * sigmoid(x W_g), x the
        # sublayer's input, one gate per element of each head (W_g: d x d) or per head (W_g: d x n_head).
        self.gate = None if cfg.attn_gate == "none" else nn.Linear(
            cfg.n_embd, cfg.n_embd if cfg.attn_gate == "elementwise" else cfg.n_head, bias=cfg.bias)
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.track, self.last_gate_mean = False, None   # the gate's mean, at the monitor's stats steps

    def project(self, x: torch.Tensor):
        """q, k, v, each [B, T, d]."""
        return self.c_attn(x).split(self.n_embd, dim=2)

    def heads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope=None):
        """q, k, v as [B, H, T, hd]; q and k rotated by `rope` (cos/sin of this call's positions)."""
        B, T, C = q.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.qk_norm:  # modded-nanogpt: RMSNorm without gain, per head, before the rotation
            q, k = F.rms_norm(q, (q.size(-1),), eps=self.eps), F.rms_norm(k, (k.size(-1),), eps=self.eps)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        return q, k, v

    def forward(self, x: torch.Tensor, cache: Optional[KVCache] = None, rope=None,
                values: Optional[list] = None) -> torch.Tensor:
        """`values` (`model.value_residual`): this forward's first-layer V, which layer 0 puts there and every
        later layer mixes into its own, as [B, T, d] before the heads (ResFormer's V_n <- (V_1 + V_n)/2)."""
        B, T, C = x.shape
        q, k, v = self.project(x)
        if values is not None:
            if self.layer == 0:
                values.append(v)
            else:
                v = 0.5 * values[0] + 0.5 * v
        q, k, v = self.heads(q, k, v, rope)
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

    def __init__(self, cfg: "GPTConfig"):
        super().__init__()
        hidden = cfg.hidden_size
        self.kind = cfg.mlp
        self.c_fc = nn.Linear(cfg.n_embd, hidden, bias=cfg.bias)
        if self.kind == "swiglu":
            self.c_gate = nn.Linear(cfg.n_embd, hidden, bias=cfg.bias)
        self.c_proj = nn.Linear(hidden, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def pre_activations(self, x: torch.Tensor):
        """(u, g): SwiGLU's linear branch (None in a one-branch MLP) and the activation's input. A variant
        that scales them (nGPT) overrides this in a subclass."""
        if self.kind == "swiglu":
            g = self.c_gate(x)  # first, as it always was: autograd sums x's gradient in this order
            return self.c_fc(x), g
        return None, self.c_fc(x)

    def forward(self, x):
        u, g = self.pre_activations(x)
        if self.kind == "swiglu":
            a = u * F.silu(g)
        elif self.kind == "relu2":
            a = F.relu(g).square()
        else:
            a = F.gelu(g)
        return self.dropout(self.c_proj(a))


class LMHead(nn.Linear):
    """The language-model head, d -> vocabulary, no bias (tied to the token embedding unless
    `model.tie_embeddings=false`). A variant that scales the logits (nGPT) subclasses it."""

    def __init__(self, cfg: "GPTConfig"):
        super().__init__(cfg.n_embd, cfg.vocab_size, bias=False)

    def loss_weight(self) -> torch.Tensor:
        """The matrix whose product with the hidden states is the logits (model/loss.py takes it)."""
        return self.weight
