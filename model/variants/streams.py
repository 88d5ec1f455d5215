"""Widened residual streams: hyper-connections and mHC (n copies, mixed by learned (doubly stochastic)
matrices), SiameseNorm (a Post-Norm-like and a Pre-Norm-like stream updated by the same sublayers) and
Attention Residuals (the earlier sublayers' outputs kept apart and attended over by depth); and
Frac-connections, hyper-connections over fractions of the stream instead of copies."""
from __future__ import annotations

import math
from typing import Dict

import torch
import torch.nn as nn
import torch.nn.functional as F


from ..norms import make_input_step, make_norm

from .base import Variant


class _WideStream(Variant):
    """Shared plumbing of the variants whose stream is n copies of width d, H: [B, T, n, d]: the input
    step copies the token n times, the output step reads the sum over the copies, and the monitor
    (stream_view) sees that sum. Each sublayer reads a weighted sum of the copies through a Pre-Norm,
    F(Norm(x)), and writes to every copy: H <- mix(H) + post (x) F(Norm(x)) (subclasses: the weights)."""


    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.n, self.norm = cfg.norm.streams, make_norm(cfg)

    def weights(self, H):
        """(pre [.., n], mix [.., n, n], post [.., n]) for the stream H [B, T, n, d]: x = sum_i pre_i H_i,
        H'_i = sum_j mix_ij H_j + post_i F(Norm(x))."""
        raise NotImplementedError

    def forward(self, H, f, shared=None):
        pre, mix, post = self.weights(H) if shared is None else self.weights(H, shared)
        if torch.is_autocast_enabled(H.device.type):
            # Broadcast products and sums: autocast would run a matmul in bf16 (its backward too, under
            # torch.compile, which fuses these n products of [B, T, n, d] into one kernel) and the stream
            # would leave float32.
            x = (pre.unsqueeze(-1) * H).sum(-2)
            mixed = sum(mix[..., :, k, None] * H[..., k, None, :] for k in range(self.n))   # H'_m = sum_k mix_mk H_k
        else:
            # No autocast: one contraction each (einsum: a third of the eager time of n broadcast passes
            # over the stream, and less than matmul's, which broadcasts the mixing matrix over the tokens)
            x = torch.einsum("...k,...kd->...d", pre, H)
            mixed = torch.einsum("...mk,...kd->...md", mix, H)
        return mixed + post.unsqueeze(-1) * f(self.norm(x)).unsqueeze(-2)

    @staticmethod
    def stream_view(H):
        return H.sum(-2)

    @classmethod
    def input_step(cls, cfg):
        return _Expand(make_input_step(cfg), cfg.norm.streams)

    @classmethod
    def output_step(cls, cfg):
        return _Reduce(make_norm(cfg) if cfg.norm.final_norm else nn.Identity())


class _Expand(nn.Module):
    def __init__(self, step, n):
        super().__init__()
        self.step, self.n = step, n

    def forward(self, e):
        h = self.step(e)
        return h.unsqueeze(-2).expand(*h.shape[:-1], self.n, h.shape[-1]).contiguous()


class _Reduce(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, H):
        return self.norm(H.sum(-2))


class HyperConnections(_WideStream):
    """Hyper-connections (Zhu et al., arXiv 2409.19606, Eq. 1-5 and Appendix J): the stream widened to n
    copies H; sublayer j reads x = A_m^T H and writes H <- A_r^T H + B^T F(Norm(x)). Static init: A_m the
    one-hot of copy j mod n, A_r = I, B = 1 (so at init the sum of the copies is n times Pre-LN's stream).
    Dynamic (`norm.dynamic`): A(H) = s_a tanh(Norm(H) W) + A, B(H) = s_b tanh(Norm(H) W_b) + B, W zero and
    s_a = s_b = 0.01 at init (the paper's)."""

    optim_groups = {"a_m": "scalars", "a_r": "scalars", "b": "scalars", "w_m": "scalars", "w_r": "scalars",
                    "w_b": "scalars", "s_a": "scalars", "s_b": "scalars"}

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        n, d = self.n, cfg.n_embd
        self.a_m = nn.Parameter(F.one_hot(torch.tensor(j % n), n).float())
        self.a_r = nn.Parameter(torch.eye(n))
        self.b = nn.Parameter(torch.ones(n))
        self.dyn = make_norm(cfg) if cfg.norm.dynamic else None
        if self.dyn is not None:
            self.w_m, self.w_r, self.w_b = (nn.Parameter(torch.zeros(d, k)) for k in (1, n, 1))
            self.s_a, self.s_b = nn.Parameter(torch.tensor(0.01)), nn.Parameter(torch.tensor(0.01))

    def weights(self, H):
        a_m, a_r, b = self.a_m, self.a_r, self.b
        if self.dyn is not None:
            hn = self.dyn(H)
            a_m = a_m + self.s_a * torch.tanh(hn @ self.w_m).squeeze(-1)
            a_r = a_r + self.s_a * torch.tanh(hn @ self.w_r)
            b = b + self.s_b * torch.tanh(hn @ self.w_b).squeeze(-1)
        return a_m, a_r.transpose(-1, -2), b          # H'_i = sum_j (A_r)_ji H_j

    def step_sizes(self):
        return mixing_stats(self.a_r.detach())


def mixing_stats(res: torch.Tensor) -> Dict[str, torch.Tensor]:
    """How far a stream-mixing matrix (static part) is from the identity, the matrix of n independent
    copies: the mean over rows of the off-diagonal mass sum_j!=i |M_ij|, and ||M - I||_F."""
    n = res.shape[-1]
    eye = torch.eye(n, dtype=res.dtype, device=res.device)
    return {"offdiag_mass": (res.abs() * (1 - eye)).sum() / n, "res_dist_identity": (res - eye).square().sum().sqrt()}


def sinkhorn(logits: torch.Tensor, iters: int) -> torch.Tensor:
    """exp(logits) projected towards the doubly stochastic matrices (Sinkhorn-Knopp), in the log domain:
    rows, then columns normalised `iters` times; the last step makes the columns sum to 1 exactly."""
    z = logits.float()
    for _ in range(iters):
        z = z - torch.logsumexp(z, dim=-1, keepdim=True)
        z = z - torch.logsumexp(z, dim=-2, keepdim=True)
    return z.exp()


class ManifoldHyperConnections(_WideStream):
    """Manifold-constrained hyper-connections (Xie et al., arXiv 2512.24880, Eq. 3-8): x = H_pre H,
    H <- H_res H + H_post^T F(Norm(x)), with H_pre = sigmoid(.), H_post = 2 sigmoid(.) and H_res the
    Sinkhorn-Knopp projection of exp(.) onto the doubly stochastic matrices (rows and columns sum to 1:
    the mixing neither amplifies nor loses the stream). Each (.) is a static logit b, plus, dynamic,
    a (RMSNorm(vec H) W) with W zero and a = 0.01 at init. Init [choice, as the reference code]: H_res
    near I (logits 0 on the diagonal, -8 off it), H_pre near the one-hot of copy j mod n, H_post = 1."""

    optim_groups = {"b_pre": "scalars", "b_res": "scalars", "b_post": "scalars", "w_pre": "scalars",
                    "w_res": "scalars", "w_post": "scalars", "a_pre": "scalars", "a_res": "scalars",
                    "a_post": "scalars"}

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        n, d = self.n, cfg.n_embd
        self.iters = cfg.norm.sinkhorn_iters
        self.b_pre = nn.Parameter(torch.full((n,), -8.0).index_fill_(0, torch.tensor(j % n), 8.0))
        self.b_res = nn.Parameter(torch.full((n, n), -8.0).fill_diagonal_(0.0))
        self.b_post = nn.Parameter(torch.zeros(n))
        self.dynamic = cfg.norm.dynamic
        if self.dynamic:
            self.w_pre, self.w_res, self.w_post = (nn.Parameter(torch.zeros(n * d, k)) for k in (n, n * n, n))
            self.a_pre, self.a_res, self.a_post = (nn.Parameter(torch.tensor(0.01)) for _ in range(3))

    @classmethod
    def shared(cls, rules):
        """Static H_res depend on parameters only: all 2N of them from one batched [2N, n, n] Sinkhorn per
        forward, instead of 2N unrolled loops of `sinkhorn_iters` (the compiled graph's size and most of its
        time). The dynamic form depends on the stream and is computed per sublayer."""
        if rules[0].dynamic:
            return None
        return list(sinkhorn(torch.stack([r.b_res for r in rules]), rules[0].iters).unbind(0))

    def weights(self, H, h_res=None):
        """`h_res`: this sublayer's H_res from `shared` (static form), else computed here."""
        pre, res, post = self.b_pre, self.b_res, self.b_post
        if h_res is not None:
            return torch.sigmoid(pre), h_res.to(H.dtype), 2 * torch.sigmoid(post)
        if self.dynamic:
            v = F.rms_norm(H.flatten(-2).float(), (H.shape[-2] * H.shape[-1],)).to(H.dtype)   # vec(H), normalised
            pre = pre + self.a_pre * (v @ self.w_pre)
            res = res + self.a_res * (v @ self.w_res).unflatten(-1, (self.n, self.n))
            post = post + self.a_post * (v @ self.w_post)
        return torch.sigmoid(pre), sinkhorn(res, self.iters).to(H.dtype), 2 * torch.sigmoid(post)

    def step_sizes(self):
        return mixing_stats(sinkhorn(self.b_res.detach(), self.iters))


class SiameseNorm(Variant):
    """SiameseNorm (Li et al., arXiv 2602.08064, ICML 2026; the authors' released code, post-pre form): two
    streams of width d, H = (x, y) as [B, T, 2, d], both the embedding at the input, updated by the same
    sublayer output z. x is Post-Norm-like (normalized before each sublayer, so the main path is), y is
    Pre-Norm-like (never normalized: the identity path); with c = sqrt(2k) for block k (1-based),

        x <- Norm_post(x);   z = F(Norm_in(x + Norm_pre(y)));   x <- x + z / c;   y <- y + z,

    and the output step is Norm_out(Norm_x(x) + Norm_y(y)). Every Norm is `norm.kind`, each its own.

    Each piece can be left out for ablation: `norm.post_stream=false` keeps y alone (H is [B, T, 1, d],
    z = F(Norm_in(Norm_pre(y))), output Norm_out(Norm_y(y)): Pre-LN with two Norms in series at each
    place), `norm.depth_scale=false` sets c = 1, `norm.output_from` reads one stream at the output."""

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.has_x = cfg.norm.post_stream
        self.post_norm = make_norm(cfg) if self.has_x else None
        self.pre_norm, self.in_norm = make_norm(cfg), make_norm(cfg)
        # the authors' code: sqrt((block index + 1) * 2), shared by both sublayers
        self.c = math.sqrt(2 * self.k) if cfg.norm.depth_scale else 1.0
        self.track, self.last_rms = False, None   # the monitor turns tracking on at stats steps

    def forward(self, H, f):
        y = H[..., -1, :]
        if not self.has_x:
            return (y + f(self.in_norm(self.pre_norm(y)))).unsqueeze(-2)
        x = self.post_norm(H[..., 0, :])
        z = f(self.in_norm(x + self.pre_norm(y)))
        if self.track:   # each stream's RMS as this sublayer reads it: how far the two have parted
            self.last_rms = torch.stack([t.detach().float().pow(2).mean().sqrt() for t in (x, y)])
        return torch.stack((x + z / self.c, y + z), dim=-2)

    def step_sizes(self) -> Dict[str, torch.Tensor]:
        return {} if self.last_rms is None else {"post_rms": self.last_rms[0], "pre_rms": self.last_rms[1]}

    @staticmethod
    def stream_view(H):
        return H[..., -1, :]   # the Pre-Norm-like stream y (last, with or without x): comparable with Pre-LN's h

    @classmethod
    def input_step(cls, cfg):
        return _Expand(make_input_step(cfg), 2 if cfg.norm.post_stream else 1)

    @classmethod
    def output_step(cls, cfg):
        return _SiameseOutput(cfg)


class _SiameseOutput(nn.Module):
    """Norm_out(Norm_x(x) + Norm_y(y)), or of one stream (`norm.output_from`, and y alone without x);
    `norm.final_norm=false` leaves out Norm_out. Only the Norms of the streams read are built."""

    def __init__(self, cfg):
        super().__init__()
        reads = cfg.norm.output_from if cfg.norm.post_stream else "pre"
        self.x_norm = make_norm(cfg) if reads in ("sum", "post") else None
        self.y_norm = make_norm(cfg) if reads in ("sum", "pre") else None
        self.norm = make_norm(cfg) if cfg.norm.final_norm else nn.Identity()

    def forward(self, H):
        x = 0 if self.x_norm is None else self.x_norm(H[..., 0, :])
        y = 0 if self.y_norm is None else self.y_norm(H[..., -1, :])
        return self.norm(x + y)


class AttentionResiduals(Variant):
    """Attention Residuals (Kimi Team, arXiv 2603.15031): the residual sum replaced by softmax attention over
    depth. Sublayer l reads h_l = sum_i a_il v_i over its sources v_i, a_il = softmax_i(w_l . RMSNorm(v_i)),
    w_l a learned pseudo-query per sublayer (init 0: the uniform mean), and adds its output F(Norm(h_l)) as a
    new source. Full AttnRes (`norm.blocks` null): the sources are the embedding and every earlier sublayer's
    output. Block AttnRes (`norm.blocks=B`): the 2N sublayers form B blocks of 2N/B; the sources are the
    embedding, each finished block's sum of outputs and the current block's partial sum.

    The state H [B, T, m, d] stacks the sources: the finished ones, then the partial sum when there is one."""

    optim_groups = {"query": "vectors"}

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        self.norm = make_norm(cfg)                        # the sublayer's own Pre-Norm: F(Norm(h_l))
        self.query = nn.Parameter(torch.zeros(cfg.n_embd))
        self.eps = cfg.norm.eps
        self.size = sublayers_per_block(cfg)
        self.first, self.last = j % self.size == 0, j % self.size == self.size - 1  # of its block
        self.track, self.last_weights = False, None

    def forward(self, H, f):
        a = depth_weights(self.query, H, self.eps)        # [B, T, m]
        h = (a.unsqueeze(-1) * H).sum(-2)
        if self.track:
            self.last_weights = a.detach().float().mean(dim=(0, 1))
        v = f(self.norm(h)).unsqueeze(-2)
        if self.first:                                    # v starts this block's partial sum
            H = torch.cat((H, v), dim=-2)
        else:                                             # the partial sum is the last source
            H = torch.cat((H[..., :-1, :], H[..., -1:, :] + v), dim=-2)
        return H

    def step_sizes(self) -> Dict[str, torch.Tensor]:
        """At stats steps: the mean weight on the embedding and on the newest source, and the weights'
        entropy over log(sources) (1: the uniform mean)."""
        a = self.last_weights
        if a is None:
            return {}
        m = a.numel()
        entropy = -(a * a.clamp_min(1e-12).log()).sum() / math.log(m) if m > 1 else a.new_tensor(0.0)
        return {"depth_w_embed": a[0], "depth_w_newest": a[-1], "depth_entropy": entropy}

    @staticmethod
    def stream_view(H):
        return H.sum(-2)   # the embedding plus every output so far: Pre-LN's h

    @classmethod
    def input_step(cls, cfg):
        return _Expand(make_input_step(cfg), 1)

    @classmethod
    def output_step(cls, cfg):
        return _DepthReadout(cfg)


def sublayers_per_block(cfg) -> int:
    """2N/B sublayers per Block AttnRes block; 1 for Full AttnRes (`norm.blocks` null)."""
    return 1 if cfg.norm.blocks is None else 2 * cfg.n_layer // cfg.norm.blocks


def depth_weights(query: torch.Tensor, H: torch.Tensor, eps: float) -> torch.Tensor:
    """softmax over the m sources of w . RMSNorm(v_i), in float32 ([B, T, m]). The key norm has no gain: a gain
    shared by the sources would only rescale w. A multiply and a sum, not a matmul, so autocast leaves it in
    float32."""
    keys = F.rms_norm(H.float(), (H.size(-1),), None, eps)
    return torch.softmax((keys * query.float()).sum(-1), dim=-1).to(H.dtype)


class _DepthReadout(nn.Module):
    """The output step: the same attention over the final sources with its own pseudo-query, then Norm."""

    optim_groups = {"query": "vectors"}

    def __init__(self, cfg):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(cfg.n_embd))
        self.eps = cfg.norm.eps
        self.norm = make_norm(cfg) if cfg.norm.final_norm else nn.Identity()

    def forward(self, H):
        return self.norm((depth_weights(self.query, H, self.eps).unsqueeze(-1) * H).sum(-2))


class FracConnections(Variant):
    """Frac-connections (Zhu et al., arXiv 2503.14125): hyper-connections with an expansion rate 1/m, the
    stream h split into m fractions H_1..H_m of width d/m instead of copied. Sublayer j reads x with fractions
    x_j = sum_i Gamma_ij H_i, and writes H_j <- sum_k A_kj H_k + beta_j o_j, o = F(Norm(x)) split the same way
    (the connection matrix [[0, beta], [Gamma, A]] of the paper). Static init Gamma = A = I, beta = 1: Pre-LN
    exactly, for every m (tested). The dynamic form (coefficients from the stream) is left out."""

    optim_groups = {"gamma": "scalars", "alpha": "scalars", "beta": "scalars"}

    def __init__(self, cfg, j):
        super().__init__(cfg, j)
        m = self.m = cfg.norm.fractions
        self.norm = make_norm(cfg)
        self.gamma = nn.Parameter(torch.eye(m))   # width connection: the sublayer's input
        self.alpha = nn.Parameter(torch.eye(m))   # depth connection: the fractions' own mixing
        self.beta = nn.Parameter(torch.ones(m))   # the sublayer output's weight on each fraction

    def forward(self, h, f):
        H = h.unflatten(-1, (self.m, -1))                          # [B, T, m, d/m]
        x = mix(self.gamma, H)
        o = f(self.norm(x.flatten(-2))).unflatten(-1, (self.m, -1))
        return (mix(self.alpha, H) + self.beta.unsqueeze(-1) * o).flatten(-2)

    def step_sizes(self) -> Dict[str, torch.Tensor]:
        """How far the connections moved from Pre-LN's: |Gamma - I| and |A - I| (Frobenius), mean beta."""
        eye = torch.eye(self.m, device=self.gamma.device)
        return {"frac_gamma_dev": (self.gamma.detach() - eye).norm(),
                "frac_alpha_dev": (self.alpha.detach() - eye).norm(), "frac_beta_mean": self.beta.detach().mean()}


def mix(c: torch.Tensor, H: torch.Tensor) -> torch.Tensor:
    """Y_j = sum_i c_ij H_i over the fractions ([m, m] x [.., m, d/m]), as products and a sum: autocast would
    run a matmul in bf16, and the stream stays float32."""
    return (c.transpose(0, 1).unsqueeze(-1) * H.unsqueeze(-3)).sum(-2)
