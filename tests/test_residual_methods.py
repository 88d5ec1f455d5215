"""The residual-stream methods of 2025-26 against independent reference formulas on a 1-block model:
the orthogonal residual update (ortho_pre_ln), Derf (pre_derf, norm.kind=derf), HybridNorm and
hyper-connections (hc, mhc: a widened stream); each also resumes exactly and generates with a cache."""
import pytest
import torch
import torch.nn.functional as F

from model import GPT
from model.generate import generate

from helpers import assert_resume_is_exact, gpt_config

V, T, D = 256, 16, 32


def one_block(norm, **kw):
    torch.manual_seed(0)
    model = GPT(gpt_config(norm, vocab_size=V, block_size=T, n_layer=1, n_head=2, n_embd=D, **kw)).eval()
    groups = model.parameter_groups()
    with torch.no_grad():   # weights larger than the init, so every sublayer's output matters (not the mixing)
        for _, p in groups["matrices"] + groups["embeddings"]:
            p.normal_(0.0, 0.2)
    return model


def tokens(b=3, seed=1):
    return torch.randint(0, V, (b, T), generator=torch.Generator().manual_seed(seed))


def test_the_orthogonal_update_adds_a_vector_orthogonal_to_the_stream():
    model = one_block("ortho_pre_ln", ortho_eps=0.0)
    _, _, hidden = model(tokens(), return_hidden=True)
    for h, h_next in zip(hidden[:-1], hidden[1:]):   # attention, then the MLP
        delta = (h_next - h).double()
        cos = (delta * h.double()).sum(-1) / (delta.norm(dim=-1) * h.double().norm(dim=-1))
        assert cos.abs().max() < 1e-5      # float32 precision: the update has no part along h
        assert (delta.norm(dim=-1) > 1e-3 * h.norm(dim=-1)).all()   # and it is not nothing
        assert (h_next.norm(dim=-1) >= h.norm(dim=-1) * (1 - 1e-6)).all()   # so it can only lengthen h


def test_ortho_pre_ln_matches_the_reference_formula():
    """h1 = h0 + s - <s,h0>/(||h0||^2 + eps) h0, s = attn(LN(h0)), computed here in float64."""
    model = one_block("ortho_pre_ln", ortho_eps=1e-2)   # a large eps, so that the formula's eps is checked too
    x = tokens()
    _, _, hidden = model(x, return_hidden=True)
    h0 = hidden[0]
    block = model.blocks[0]
    s = block.attn(F.layer_norm(h0, (D,), block.attn_rule.norm.weight, block.attn_rule.norm.bias, 1e-5)).double()
    h0d = h0.double()
    ref = h0d + s - (s * h0d).sum(-1, keepdim=True) / ((h0d * h0d).sum(-1, keepdim=True) + 1e-2) * h0d
    assert torch.allclose(hidden[1].double(), ref, atol=1e-5, rtol=1e-5)


def test_pre_derf_matches_the_reference_formula():
    """h0 = s (wte + wpe), s = sqrt(d); h1 = h0 + attn(gamma erf(alpha h0 + shift) + beta), in float64, with
    every Derf parameter moved off its init so that each one is checked."""
    model = one_block("pre_derf")
    norm = model.blocks[0].attn_rule.norm
    with torch.no_grad():
        norm.alpha.fill_(0.7)
        norm.shift.fill_(0.1)
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.1, 0.1)
    x = tokens()
    _, _, hidden = model(x, return_hidden=True)
    e = (model.wte(x) + model.wpe(torch.arange(T))).double()
    assert torch.allclose(hidden[0].double(), D ** 0.5 * e, atol=1e-6)
    u = norm.weight.double() * torch.erf(0.7 * hidden[0].double() + 0.1) + norm.bias.double()
    ref = hidden[0].double() + model.blocks[0].attn(u.float()).double()
    assert torch.allclose(hidden[1].double(), ref, atol=1e-5, rtol=1e-5)
    groups = {n: g for g, ps in model.parameter_groups().items() for n, _ in ps}
    assert groups["input_step.s"] == groups["blocks.0.attn_rule.norm.alpha"] == "scalars"
    assert groups["blocks.0.attn_rule.norm.weight"] == "vectors"


def test_derf_alpha_is_an_option_of_the_derf_kind_only():
    from model import ConfigError
    model = one_block("pre_derf", derf_alpha=8.0)
    assert {m.alpha.item() for m in model.modules() if type(m).__name__ == "Derf"} == {8.0}
    with pytest.raises(ConfigError, match=r"bad config norm.derf_alpha=2.0: read only with norm.kind=derf"):
        gpt_config("pre_ln", derf_alpha=2.0)
    with pytest.raises(ConfigError, match=r"norm.derf_alpha=0.0: must be a finite number > 0"):
        gpt_config("pre_derf", derf_alpha=0.0)


@pytest.mark.parametrize("arch", ["gpt2", "llama", "speedrun", "neox"])
def test_pre_derf_keeps_derf_under_every_arch_preset(arch):
    """llama and speedrun set norm.kind=rmsnorm for the block's Norms; Pre-Derf's Norms stay Derf (a composed
    `arch=llama norm=pre_derf` once trained Pre-RMSNorm with the scaled input instead), as Pre-DyT's stay DyT."""
    from model.config import GPTConfig
    from trainer.config_store import compose_config

    cfg = compose_config([f"arch={arch}", "norm=pre_derf"])
    model = GPT(GPTConfig.from_hydra(cfg.model, cfg.norm, vocab_size=V))
    norms = [type(m).__name__ for n, m in model.named_modules() if n.endswith("rule.norm") or n == "output_step"]
    assert norms and set(norms) == {"Derf"}, norms
    assert "scalar/blocks.0.attn_rule.norm.alpha" in model.scalar_values()  # logged, so its movement is seen
    dyt = GPT(GPTConfig.from_hydra(cfg.model, compose_config([f"arch={arch}", "norm=pre_dyt"]).norm, vocab_size=V))
    assert {type(m).__name__ for n, m in dyt.named_modules() if n.endswith("rule.norm")} == {"DyT"}


def test_derf_is_a_norm_kind_of_every_variant():
    for norm in ("post_ln", "peri_ln", "geonorm"):
        model = one_block(norm, kind="derf")
        assert any(type(m).__name__ == "Derf" for m in model.modules()), norm
        logits = model(tokens())[0]
        assert torch.isfinite(logits).all()


def _attention_reference(attn, x, qkv_norms=None):
    """Causal self-attention written out: q, k, v = x W (each through its norm), heads, softmax, W_o."""
    B, Tt, C = x.shape
    q, k, v = attn.c_attn(x).split(C, dim=2)
    if qkv_norms is not None:
        q, k, v = (F.layer_norm(t, (C,), n.weight, n.bias, 1e-5) for t, n in zip((q, k, v), qkv_norms))
    q, k, v = (t.view(B, Tt, 2, C // 2).transpose(1, 2).double() for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / (C // 2) ** 0.5
    scores = scores.masked_fill(torch.triu(torch.ones(Tt, Tt, dtype=torch.bool), 1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, Tt, C)
    return F.linear(y, attn.c_proj.weight.double(), attn.c_proj.bias.double())


@pytest.mark.parametrize("star", [False, True])
def test_hybridnorm_matches_the_reference_formula(star):
    """Attention reads h, q/k/v each LayerNormed after the projection: h1 = h0 + Attn_QKV(h0); MLP
    post-norm: n = LN(h1), h2 = n + MLP(n). HybridNorm* (star): block 1 is Pre-Norm instead."""
    model = one_block("hybridnorm", star=star)
    block = model.blocks[0]
    _, _, hidden = model(tokens(), return_hidden=True)
    h0, h1, h2 = (t.double() for t in hidden)
    qkv = block.attn.qkv_step
    a_in = hidden[0] if not star else F.layer_norm(hidden[0], (D,), block.attn_rule.norm.weight,
                                                    block.attn_rule.norm.bias, 1e-5)
    assert torch.allclose(h1, h0 + _attention_reference(block.attn, a_in, (qkv.q, qkv.k, qkv.v)), atol=1e-5)
    mnorm = block.mlp_rule.norm
    n = F.layer_norm(hidden[1], (D,), mnorm.weight, mnorm.bias, 1e-5)
    ref = (hidden[1].double() if star else n.double()) + block.mlp(n).double()
    assert torch.allclose(h2, ref, atol=1e-5)
    assert (block.attn_rule.norm is None) != star      # no pre-norm before attention, but in HybridNorm*'s first block


def _same_weights_as(model, reference):
    """`model` with the weights of `reference` (a Pre-LN model): its output Norm sits after the sum of copies."""
    state = {k.replace("output_step.", "output_step.norm."): v for k, v in reference.state_dict().items()}
    missing = model.load_state_dict(state, strict=False).missing_keys
    assert all(k.split(".")[-1] in ("a_m", "a_r", "b", "b_pre", "b_res", "b_post") for k in missing), missing
    return model


@pytest.mark.parametrize("norm", ["hc", "mhc"])
def test_one_stream_with_identity_mixing_is_pre_ln(norm):
    pre_ln = one_block("pre_ln")
    model = _same_weights_as(one_block(norm, streams=1), pre_ln)
    if norm == "mhc":   # H_pre = sigmoid(30) = 1.0 in float32; H_post = 2 sigmoid(0) = 1; H_res = the 1x1 Sinkhorn = 1
        with torch.no_grad():
            for r in model.rules():
                r.b_pre.fill_(30.0)
    x = tokens()
    torch.testing.assert_close(model(x)[0], pre_ln(x)[0], rtol=0, atol=1e-6)


def test_static_hyper_connections_start_as_pre_ln_with_the_stream_copied():
    """At init (A_m one-hot, A_r = I, B = 1) every copy is Pre-LN's stream plus the copy's share: the
    sum over the n copies is n x Pre-LN's stream, which the output Norm maps to the same logits."""
    pre_ln = one_block("pre_ln")
    model = _same_weights_as(one_block("hc", streams=4), pre_ln)
    x = tokens()
    _, _, ours = model(x, return_hidden=True)
    _, _, theirs = pre_ln(x, return_hidden=True)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, 4 * b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model(x)[0], pre_ln(x)[0], rtol=1e-4, atol=1e-4)


def test_mhc_mixing_is_doubly_stochastic_after_the_projection():
    from model.variants import sinkhorn

    logits = torch.randn(3, 4, 4, generator=torch.Generator().manual_seed(0)) * 2
    S = sinkhorn(logits, 20)
    torch.testing.assert_close(S.sum(-1), torch.ones(3, 4), rtol=0, atol=1e-4)    # rows
    torch.testing.assert_close(S.sum(-2), torch.ones(3, 4), rtol=0, atol=1e-6)    # columns (the last step)
    assert (S > 0).all()
    model = one_block("mhc", streams=4, dynamic=True)
    with torch.no_grad():   # dynamic weights off their zero init: H_res depends on the token
        for r in model.rules():
            for p in (r.w_pre, r.w_res, r.w_post):
                p.normal_(0.0, 0.05)
            r.a_res.fill_(1.0)
            r.b_res.zero_()      # away from the near-identity init
    H = torch.randn(2, T, 4, D, generator=torch.Generator().manual_seed(2))
    pre, res, post = model.rules()[0].weights(H)
    assert res.shape == (2, T, 4, 4) and res.std(dim=(0, 1)).max() > 1e-3     # per token
    torch.testing.assert_close(res.sum(-1), torch.ones(2, T, 4), rtol=0, atol=1e-4)
    torch.testing.assert_close(res.sum(-2), torch.ones(2, T, 4), rtol=0, atol=1e-5)
    assert ((0 < pre) & (pre < 1)).all() and ((0 < post) & (post < 2)).all()


def test_widened_stream_options_are_one_line():
    from model import ConfigError

    with pytest.raises(ConfigError, match=r"^bad config norm.streams=0: must be a positive integer$"):
        one_block("hc", streams=0)
    with pytest.raises(ConfigError, match=r"^bad config norm.sinkhorn_iters=0: must be a positive integer$"):
        one_block("mhc", sinkhorn_iters=0)
    with pytest.raises(ConfigError, match=r"norm.sinkhorn_iters=5: not an option of norm.name=hc"):
        one_block("hc", sinkhorn_iters=5)


@pytest.mark.parametrize("norm, kw", [("ortho_pre_ln", {}), ("pre_derf", {}), ("hybridnorm", {}),
                                      ("hc", {"dynamic": True}), ("mhc", {"dynamic": True})])
def test_cached_generation_equals_uncached(norm, kw):
    model = one_block(norm, **kw)
    prompt = tokens(2)[:, :5]
    for new in (T - 5, T + 4):
        assert torch.equal(generate(model, prompt, new, temperature=0, use_cache=True),
                           generate(model, prompt, new, temperature=0, use_cache=False))


@pytest.mark.slow
@pytest.mark.parametrize("norm", ["ortho_pre_ln", "pre_derf", "hybridnorm", "hc", "mhc"])
def test_resume_is_exact(tmp_path, norm):
    assert_resume_is_exact(tmp_path, f"norm={norm}", "train.max_steps=6")


@pytest.mark.parametrize("norm, extra", [
    ("ortho_pre_ln", 5 * 2 * D),                         # Pre-LN's norms: 2 per block and the output Norm
    ("pre_derf", 5 * (2 * D + 2) + 1),                   # Derf: gamma, beta, alpha, shift; the input scale s
    ("hybridnorm", (3 * 2 + 2 + 1) * 2 * D),             # QKV-Norm (3 per block), the MLP's Norm, the output Norm
    ("hc", 5 * 2 * D + 4 * (2 * 4 + 4 * 4)),             # n = 4 copies: per sublayer 2n static + n x n mixing
    ("mhc", 5 * 2 * D + 4 * (2 * 4 + 4 * 4)),
])
def test_parameter_count_follows_the_rule(norm, extra):
    """2 blocks of width D: the body (embeddings, attention and MLP layers) plus the method's own."""
    torch.manual_seed(0)
    model = GPT(gpt_config(norm, vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=D))
    body = V * D + T * D + 2 * (D * 3 * D + 3 * D + D * D + D + D * 4 * D + 4 * D + 4 * D * D + D)
    assert model.num_params(non_embedding=False) == body + extra


@pytest.mark.parametrize("rope", [False, True])
def test_mhc_static_mixing_from_one_batched_sinkhorn_equals_one_per_sublayer(rope, monkeypatch):
    """Every static H_res of the model from one [2N, n, n] Sinkhorn per forward: the same losses and gradients
    as computing each sublayer's own (the compiled graph unrolled 2N loops of sinkhorn_iters before)."""
    from model.variants.streams import ManifoldHyperConnections

    torch.manual_seed(0)
    m = GPT(gpt_config("mhc", n_layer=3, n_head=2, n_embd=32, block_size=16, vocab_size=257,
                       **({"pos_emb": "rope"} if rope else {})))
    with torch.no_grad():
        for r in m.rules():   # mixing that has moved away from the identity, different per sublayer
            r.b_res.add_(torch.randn_like(r.b_res) * 3)
    x, y = torch.randint(0, 257, (2, 16)), torch.randint(0, 257, (2, 16))
    out = []
    for batched in (True, False):
        if not batched:
            monkeypatch.setattr(ManifoldHyperConnections, "shared", classmethod(lambda cls, rules: None))
        m.zero_grad()
        loss = m(x, y)[1]
        loss.backward()
        out.append((loss.detach(), {k: p.grad.clone() for k, p in m.named_parameters() if p.grad is not None}))
    (la, ga), (lb, gb) = out
    assert torch.allclose(la, lb, rtol=1e-6, atol=1e-7)
    for k in ga:
        assert torch.allclose(ga[k], gb[k], rtol=1e-5, atol=1e-7), k
    assert ga["blocks.0.attn_rule.b_res"].abs().sum() > 0          # the mixing is trained through the batch


def test_mhc_dynamic_form_is_computed_per_sublayer():
    torch.manual_seed(0)
    m = GPT(gpt_config("mhc", n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=257, dynamic=True))
    assert m.variant.shared(m.rules()) is None
    x = torch.randint(0, 257, (2, 16))
    loss = m(x, x)[1]
    loss.backward()
    assert torch.isfinite(loss) and m.blocks[0].attn_rule.w_res.grad is not None


@pytest.mark.parametrize("dynamic", [False, True])
def test_mhc_compiles_as_one_graph_with_the_eager_loss(dynamic):
    """fullgraph=True fails on any graph break; the compiled model gives the eager loss and gradients."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = GPT(gpt_config("mhc", n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=257, dynamic=dynamic))
    with torch.no_grad():
        for r in m.rules():
            r.b_res.add_(torch.randn_like(r.b_res))
    x = torch.randint(0, 257, (2, 16))
    out = []
    for run in (m, torch.compile(m, backend="eager", fullgraph=True)):
        m.zero_grad()
        loss = run(x, x)[1]
        loss.backward()
        out.append((loss.detach(), m.blocks[0].attn_rule.b_res.grad.clone()))
    torch._dynamo.reset()
    torch.testing.assert_close(out[1][0], out[0][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out[1][1], out[0][1], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("norm, kw", [("hc", {}), ("hc", {"dynamic": True}), ("mhc", {}), ("mhc", {"dynamic": True})])
def test_the_widened_streams_matmul_mixing_equals_the_broadcast_form(norm, kw, monkeypatch):
    """Without autocast the streams are read and mixed by matmuls (half the eager time); under autocast by
    broadcast products, which keep the stream in float32. The same function: equal losses and gradients in
    float64 (float32 rounds the two summation orders ~100 ulps apart in the embedding's gradient)."""
    torch.manual_seed(0)
    m = GPT(gpt_config(norm, n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=257, **kw)).double()
    with torch.no_grad():
        for name, p in m.named_parameters():   # mixing and read-out weights away from their init
            if "rule" in name:
                p.add_(torch.randn_like(p) * 0.5)
    x, y = torch.randint(0, 257, (2, 16)), torch.randint(0, 257, (2, 16))
    out = []
    for broadcast in (False, True):
        monkeypatch.setattr(torch, "is_autocast_enabled", lambda *a: broadcast)
        m.zero_grad()
        loss = m(x, y)[1]
        loss.backward()
        out.append((loss.detach(), {k: p.grad.clone() for k, p in m.named_parameters() if p.grad is not None}))
    (la, ga), (lb, gb) = out
    assert torch.allclose(la, lb, rtol=1e-13, atol=0)
    for k in ga:
        assert (ga[k] - gb[k]).abs().max() <= 1e-12 * ga[k].abs().max() + 1e-300, k


# ---- SeeDNorm (norm.kind=seednorm) and the value residual (model.value_residual) ----
PRESETS = ("gpt2", "llama", "speedrun", "neox")


def _on_preset(arch, norm=None, **model_kw):
    """A GPT on an arch preset (tiny shape), seeded: `norm` the variant's keys (the preset's Norm kind kept),
    `model_kw` GPTConfig fields."""
    from test_arch import preset

    base = preset(arch).to_dict()
    if norm is not None:
        base["norm"] = {"kind": base["norm"]["kind"], **norm}
    torch.manual_seed(0)
    return GPT(type(preset(arch)).from_dict({**base, **model_kw}))


def _trains_generates_and_compiles(model, arch, label, compile_whole=True):
    """Every parameter gets a finite gradient, cached generation equals uncached (weights larger than the init,
    so the context matters), and on gpt2 the model compiles as one graph (fullgraph fails on any break)."""
    from test_arch import sharp

    x = tokens(2)
    _, loss = model(x, x)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), (arch, label, name)
    model = sharp(model)
    for new in (T - 5, T + 4):
        assert torch.equal(generate(model, x[:, :5], new, temperature=0, use_cache=True),
                           generate(model, x[:, :5], new, temperature=0, use_cache=False)), (arch, label)
    if compile_whole and arch == "gpt2":
        torch._dynamo.reset()
        _, loss = torch.compile(model.train(), backend="eager", fullgraph=True)(x, x)
        assert torch.isfinite(loss)
        torch._dynamo.reset()


def _seednorm_reference(norm, x):
    """[tanh(x beta^T) alpha + gamma] * x / sqrt(mean(x^2) + eps), in float64."""
    x, beta, alpha, gamma = (t.double() for t in (x, norm.beta, norm.alpha, norm.weight))
    t = torch.tanh(x @ beta)[..., None]
    return (t * alpha + gamma) * x / (x.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()


def test_seednorm_is_rmsnorm_at_init_and_follows_its_formula_once_trained():
    from model.norms import RMSNorm, SeeDNorm

    torch.manual_seed(0)
    x = torch.randn(3, T, D) * 3.0
    seed, rms = SeeDNorm(D, 1e-5), RMSNorm(D, 1e-5)
    assert torch.equal(seed(x), rms(x))                   # beta = 0: tanh(0) = 0, the gain is gamma alone
    with torch.no_grad():                                  # every parameter off its init, so each one is checked
        seed.beta.normal_(0.0, 0.3)
        seed.alpha.uniform_(0.5, 1.5)
        seed.weight.uniform_(0.5, 1.5)
    got = seed(x)
    assert torch.allclose(got.double(), _seednorm_reference(seed, x), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, rms(x), atol=1e-2)
    # the gain depends on the token: two tokens with the same direction but different x.beta differ by more
    # than their norms' ratio (RMSNorm would map both to the same vector)
    assert not torch.allclose(seed(x[:, :1] * 2.0), seed(x[:, :1]), atol=1e-3)
    with torch.autocast("cpu", dtype=torch.bfloat16):     # float32 math under bf16 autocast
        auto = seed(x)
    assert auto.dtype == torch.float32 and torch.allclose(auto.double(), _seednorm_reference(seed, x), atol=1e-5)


def test_seednorm_is_a_norm_kind_of_every_variant_with_its_groups_and_stats():
    for norm in ("pre_ln", "post_ln", "peri_ln", "geonorm", "hc"):
        model = one_block(norm, kind="seednorm")
        kinds = {type(m).__name__ for n, m in model.named_modules() if n.endswith("norm") or n == "output_step"}
        assert "SeeDNorm" in kinds and "LayerNorm" not in kinds, (norm, kinds)
        assert torch.isfinite(model(tokens())[0]).all()
    model = one_block("pre_ln", kind="seednorm")
    groups = {n: g for g, ps in model.parameter_groups().items() for n, _ in ps}
    assert {groups[f"blocks.0.attn_rule.norm.{p}"] for p in ("weight", "alpha", "beta")} == {"vectors"}
    stats = model.scalar_values()
    assert stats["scalar/blocks.0.attn_rule.norm.beta_norm"].item() == 0.0       # beta at its init
    assert stats["scalar/blocks.0.attn_rule.norm.alpha_rms"].item() == 1.0


def test_value_residual_leaves_layer_one_and_mixes_its_values_into_every_later_layer():
    """V_n <- (V_1 + V_n)/2 for n >= 2 (ResFormer): layer 1's stream is the plain model's; layer 2's attention,
    written out with the mixed values, is what the model computes."""
    torch.manual_seed(0)
    plain = GPT(gpt_config("pre_ln", vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=D)).eval()
    mixed = GPT(gpt_config("pre_ln", vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=D,
                           value_residual=True)).eval()
    mixed.load_state_dict(plain.state_dict())              # no new parameter: the same weights load strictly
    x = tokens()
    _, _, hp = plain(x, return_hidden=True)
    _, _, hm = mixed(x, return_hidden=True)
    assert torch.equal(hp[1], hm[1]) and torch.equal(hp[2], hm[2])   # block 1 unchanged
    a0, a1 = mixed.blocks[0].attn, mixed.blocks[1].attn
    v1 = a0.c_attn(mixed.blocks[0].attn_rule.norm(hm[0])).split(D, dim=2)[2]
    u = mixed.blocks[1].attn_rule.norm(hm[2])
    q, k, v = a1.c_attn(u).split(D, dim=2)
    v = 0.5 * v1 + 0.5 * v
    q, k, v = (t.view(3, T, 2, D // 2).transpose(1, 2).double() for t in (q, k, v))
    scores = (q @ k.transpose(-1, -2) / (D // 2) ** 0.5).masked_fill(
        torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(3, T, D)
    ref = hm[2].double() + F.linear(y, a1.c_proj.weight.double(), a1.c_proj.bias.double())
    assert torch.allclose(hm[3].double(), ref, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(hm[3], hp[3], atol=1e-4)


@pytest.mark.parametrize("arch", PRESETS)
def test_seednorm_and_value_residual_train_every_parameter_on_every_preset_and_generate_with_a_cache(arch):
    _trains_generates_and_compiles(_on_preset(arch, {"name": "pre_ln", "kind": "seednorm"}), arch, "seednorm",
                                   compile_whole=False)   # compiled below
    _trains_generates_and_compiles(_on_preset(arch, value_residual=True), arch, "value_residual", compile_whole=False)


def test_seednorm_and_value_residual_compile_with_no_graph_break():
    """fullgraph=True fails on any graph break: the forward and backward are one graph each."""
    torch._dynamo.reset()
    for kw in ({"kind": "seednorm"}, {"value_residual": True}):
        model = GPT(gpt_config("pre_ln", vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=D, **kw))
        compiled = torch.compile(model, backend="eager", fullgraph=True)
        x = tokens(2)
        _, loss = compiled(x, x)
        loss.backward()
        assert torch.isfinite(loss)
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("over", [["norm.kind=seednorm"], ["model.value_residual=true", "arch=llama"]])
def test_seednorm_and_value_residual_resume_exactly(tmp_path, over):
    assert_resume_is_exact(tmp_path, *over, "train.max_steps=6")


# ---- SiameseNorm (siamese) ----
SIAMESE_PIECES = [{}, {"depth_scale": False}, {"output_from": "pre"}, {"output_from": "post"},
                  {"post_stream": False}]


@pytest.mark.parametrize("pieces", SIAMESE_PIECES, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "paper")
def test_siamese_streams_start_equal_and_follow_the_authors_rule(pieces):
    """x = y = e; per sublayer x <- Norm_p(x), z = F(Norm_i(x + Norm_q(y))), x <- x + z/sqrt(2k), y <- y + z;
    output Norm(Norm_x(x) + Norm_y(y)): written out over two blocks, every norm's gain moved off its init; and
    each piece left out as its switch says (c = 1; one stream at the output; y alone, read through two Norms)."""
    torch.manual_seed(0)
    model = GPT(gpt_config("siamese", vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=D, **pieces)).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    two = pieces.get("post_stream", True)
    x = tokens()
    e = model.wte(x) + model.wpe(torch.arange(T))
    H0 = model.input_step(e)
    assert H0.shape[-2] == (2 if two else 1) and all(torch.equal(H0[..., i, :], e) for i in range(H0.shape[-2]))
    xs, ys = e, e
    for k, block in enumerate(model.blocks, start=1):
        c = (2 * k) ** 0.5 if pieces.get("depth_scale", True) else 1.0
        for rule, f in ((block.attn_rule, lambda u: block.attn(u)), (block.mlp_rule, block.mlp)):
            if two:
                xs = rule.post_norm(xs)
                z = f(rule.in_norm(xs + rule.pre_norm(ys)))
                xs, ys = xs + z / c, ys + z
            else:
                assert rule.post_norm is None
                ys = ys + f(rule.in_norm(rule.pre_norm(ys)))
    out_step, reads = model.output_step, pieces.get("output_from", "sum") if two else "pre"
    read = {"sum": lambda: out_step.x_norm(xs) + out_step.y_norm(ys), "pre": lambda: out_step.y_norm(ys),
            "post": lambda: out_step.x_norm(xs)}[reads]
    assert (out_step.x_norm is None) == (reads == "pre") and (out_step.y_norm is None) == (reads == "post")
    assert torch.allclose(model(x)[0], model.lm_head(out_step.norm(read())), atol=1e-5)
    _, _, hidden = model(x, return_hidden=True)
    assert torch.allclose(hidden[-1], ys, atol=1e-5)                            # the monitor sees y


def test_siamese_logs_its_streams_and_counts_its_norms():
    model = one_block("siamese")
    model.set_stats_tracking(True)
    model(tokens())
    stats = model.norm_stats()
    assert {"step/0/post_rms", "step/0/pre_rms", "step/1/post_rms", "step/1/pre_rms"} <= set(stats)
    assert abs(stats["step/1/post_rms"].item() - 1.0) < 0.05   # just normalized (gain 1, no bias at init)
    plain = one_block("pre_ln")
    # three norms per sublayer and three at the output, against Pre-LN's one and one (LayerNorm: 2d each);
    # without x, two and two; with one stream at the output, one fewer there
    assert model.num_params() - plain.num_params() == (3 * 2 + 3 - (2 + 1)) * 2 * D
    assert one_block("siamese", post_stream=False).num_params() - plain.num_params() == (2 * 2 + 2 - 3) * 2 * D
    assert one_block("siamese", output_from="pre").num_params() - plain.num_params() == (3 * 2 + 2 - 3) * 2 * D


@pytest.mark.parametrize("keys, bad_key, valid", [
    ({"post_stream": False, "output_from": "post"}, "norm.output_from", "use sum or pre"),
    ({"post_stream": False, "depth_scale": False}, "norm.depth_scale", "read only with norm.post_stream=true"),
    ({"output_from": "both"}, "norm.output_from", "post")])
def test_siamese_rejects_a_piece_that_the_others_leave_out(keys, bad_key, valid):
    """One line naming the key and what would be valid: x's output or scale without x, an unknown output."""
    from common import ConfigError

    with pytest.raises(ConfigError) as err:
        gpt_config("siamese", **keys)
    assert bad_key in str(err.value) and valid in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("arch", PRESETS)
def test_siamese_trains_every_parameter_on_every_preset_generates_with_a_cache_and_compiles_whole(arch):
    _trains_generates_and_compiles(_on_preset(arch, {"name": "siamese"}), arch, "siamese")


@pytest.mark.parametrize("pieces", SIAMESE_PIECES[1:], ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_siamese_without_a_piece_trains_every_parameter_it_builds(pieces):
    """A piece left out builds no Norm for it, so no parameter is left without a gradient (DDP would wait on it)."""
    _trains_generates_and_compiles(_on_preset("gpt2", {"name": "siamese", **pieces}), "gpt2", str(pieces))


@pytest.mark.slow
def test_siamese_resumes_exactly(tmp_path):
    assert_resume_is_exact(tmp_path, "norm=siamese", "train.max_steps=6")


# ---- Attention Residuals (attnres; norm.blocks) ----
def _attnres(blocks=None, n_layer=2, seed=0, queries=True):
    torch.manual_seed(seed)
    model = GPT(gpt_config("attnres", vocab_size=V, block_size=T, n_layer=n_layer, n_head=2, n_embd=D,
                           blocks=blocks)).eval()
    if queries:  # pseudo-queries off their zero init, so the weights are not the uniform mean
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith("query"):
                    p.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(len(n)))
    return model


def _depth_mix(w, sources):
    keys = torch.stack([F.rms_norm(v.double(), (D,), eps=1e-5) for v in sources], dim=-2)
    a = torch.softmax((keys * w.double()).sum(-1), dim=-1)
    return (a.unsqueeze(-1) * torch.stack([v.double() for v in sources], dim=-2)).sum(-2)


@pytest.mark.parametrize("blocks", [None, 2])
def test_attnres_follows_its_rule_full_and_block(blocks):
    """Full: sublayer l reads softmax_i(w_l . RMSNorm(v_i)) over the embedding and every earlier output; Block
    (2 blocks of 2 sublayers): over the embedding, the finished blocks' sums and the current partial sum."""
    model = _attnres(blocks)
    x = tokens()
    e = model.wte(x) + model.wpe(torch.arange(T))
    done, partial = [e], None
    rules = model.rules()
    for j, rule in enumerate(rules):
        block = model.blocks[j // 2]
        f = (lambda u, b=block: b.attn(u)) if j % 2 == 0 else block.mlp
        h = _depth_mix(rule.query, done + ([partial] if partial is not None else []))
        v = f(rule.norm(h.float()))
        partial = v if partial is None else partial + v
        if blocks is None or j % 2 == 1:   # the end of a block: one sublayer (Full) or two (2 blocks of 2)
            done, partial = done + [partial], None
    out = model.output_step.norm(_depth_mix(model.output_step.query, done).float())
    assert torch.allclose(model(x)[0], model.lm_head(out), atol=1e-4)


def test_block_attnres_with_one_sublayer_per_block_is_full_attnres_and_starts_as_the_mean():
    x = tokens()
    full, one_each = _attnres(None, seed=3), _attnres(4, seed=3)   # 2 blocks x 2 sublayers: 4 AttnRes blocks
    assert torch.equal(full(x)[0], one_each(x)[0])
    assert not torch.allclose(full(x)[0], _attnres(2, seed=3)(x)[0], atol=1e-4)
    model = _attnres(None, queries=False)    # zero queries: every sublayer reads the mean of its sources
    model.set_stats_tracking(True)
    model(x)
    stats = model.norm_stats()
    assert stats["step/3/depth_entropy"].item() == pytest.approx(1.0)
    assert stats["step/3/depth_w_embed"].item() == pytest.approx(1 / 4)   # sources: e, v1, v2, v3


def test_attnres_blocks_must_divide_the_sublayers():
    from model import ConfigError
    with pytest.raises(ConfigError, match=r"^bad config norm.blocks=3: must divide the 4 sublayers "
                                          r"\(2 x model.n_layer=2\), or be null \(Full AttnRes\)$"):
        gpt_config("attnres", n_layer=2, blocks=3)
    with pytest.raises(ConfigError, match=r"norm.blocks=2: not an option of norm.name=pre_ln"):
        gpt_config("pre_ln", blocks=2)


@pytest.mark.parametrize("arch", PRESETS)
@pytest.mark.parametrize("blocks", [None, 2])
def test_attnres_trains_every_parameter_on_every_preset_generates_with_a_cache_and_compiles_whole(arch, blocks):
    _trains_generates_and_compiles(_on_preset(arch, {"name": "attnres", "blocks": blocks}), arch, blocks)


@pytest.mark.slow
@pytest.mark.parametrize("over", [[], ["norm.blocks=2"]])
def test_attnres_resumes_exactly(tmp_path, over):
    assert_resume_is_exact(tmp_path, "norm=attnres", *over, "train.max_steps=6")


# ---- ProRes (model.prores_steps) ----
def test_prores_warms_each_block_up_linearly_deeper_blocks_later_and_skipped_steps_do_not_count():
    """The authors' linear schedule: block l's branches scaled by min(1, u/T_l), T_l = linspace(T//N, T, N)."""
    model = GPT(gpt_config("pre_ln", vocab_size=V, block_size=T, n_layer=4, n_head=2, n_embd=D, prores_steps=40))
    assert model.prores_scales().tolist() == [0.0] * 4                  # u = 0: every branch off
    for applied in [True] * 10 + [False] * 3:                           # 3 skipped steps: the count stays at 10
        model.after_optimizer_step(torch.tensor(applied))
    assert model.prores_scales().tolist() == pytest.approx([1.0, 10 / 20, 10 / 30, 10 / 40])
    assert model.norm_stats()["prores/1"].item() == pytest.approx(0.5)  # logged with the other scalars
    from model import ConfigError
    with pytest.raises(ConfigError, match=r"^bad config model.prores_steps=3: must be 0 \(off\) or at least "
                                          r"model.n_layer=4"):
        gpt_config("pre_ln", n_layer=4, prores_steps=3)


@pytest.mark.parametrize("norm", ["pre_ln", "post_ln", "geonorm", "hc"])
def test_prores_at_scale_one_is_its_base_variant_and_at_zero_skips_every_branch(norm):
    torch.manual_seed(0)
    base = GPT(gpt_config(norm, vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=D)).eval()
    warm = GPT(gpt_config(norm, vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=D, prores_steps=8)).eval()
    warm.load_state_dict(base.state_dict(), strict=False)
    x = tokens()
    for _ in range(8):
        warm.after_optimizer_step(torch.tensor(True))
    assert torch.equal(warm(x)[0], base(x)[0])                         # every scale exactly 1.0
    if norm in ("pre_ln", "hc"):   # additive rules: F scaled by 0 leaves the stream where the input step put it
        warm.prores_step.zero_()
        _, _, hidden = warm(x, return_hidden=True)
        assert all(torch.equal(h, hidden[0]) for h in hidden[1:])


@pytest.mark.parametrize("arch", PRESETS)
def test_prores_trains_on_every_preset_and_compiles_whole(arch):
    x = tokens(2)
    model = _on_preset(arch, prores_steps=4)
    for _ in range(2):
        model.after_optimizer_step(torch.tensor(True))
    _, loss = model(x, x)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    if arch == "gpt2":
        torch._dynamo.reset()
        _, loss = torch.compile(model, backend="eager", fullgraph=True)(x, x)
        assert torch.isfinite(loss)
        torch._dynamo.reset()


@pytest.mark.slow
def test_prores_resumes_exactly(tmp_path):
    a, _ = assert_resume_is_exact(tmp_path, "model.prores_steps=8", "train.max_steps=6")
    assert a["model"]["prores_step"].item() == 6                        # the count travels with the weights


# ---- Frac-connections (frac; norm.fractions) ----
@pytest.mark.parametrize("m", [1, 2, 4])
def test_frac_connections_start_as_pre_ln_exactly_and_follow_their_rule(m):
    """Gamma = A = I, beta = 1 at init: Pre-LN bitwise, for every m. Moved off: x_j = sum_i Gamma_ij H_i,
    H_j <- sum_k A_kj H_k + beta_j o_j, o = F(Norm(x)), written out in float64."""
    torch.manual_seed(0)
    pre = GPT(gpt_config("pre_ln", vocab_size=V, block_size=T, n_layer=1, n_head=2, n_embd=D)).eval()
    frac = GPT(gpt_config("frac", vocab_size=V, block_size=T, n_layer=1, n_head=2, n_embd=D, fractions=m)).eval()
    frac.load_state_dict(pre.state_dict(), strict=False)
    x = tokens()
    assert torch.equal(frac(x)[0], pre(x)[0])
    rule = frac.blocks[0].attn_rule
    with torch.no_grad():
        g = torch.Generator().manual_seed(2)
        for p in (rule.gamma, rule.alpha, rule.beta):
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    _, _, hidden = frac(x, return_hidden=True)
    H = hidden[0].double().unflatten(-1, (m, -1))
    xin = torch.einsum("ij,btid->btjd", rule.gamma.double(), H).flatten(-2)
    o = frac.blocks[0].attn(rule.norm(xin.float())).double().unflatten(-1, (m, -1))
    ref = (torch.einsum("kj,btkd->btjd", rule.alpha.double(), H) + rule.beta.double()[:, None] * o).flatten(-2)
    assert torch.allclose(hidden[1].double(), ref, atol=1e-5, rtol=1e-5)


def test_frac_fractions_must_divide_the_width_and_are_frac_s_key_only():
    from model import ConfigError
    with pytest.raises(ConfigError, match=r"^bad config norm.fractions=3: must divide model.n_embd=32$"):
        gpt_config("frac", n_embd=32, n_head=2, fractions=3)
    with pytest.raises(ConfigError, match=r"norm.fractions=2: not an option of norm.name=hc"):
        gpt_config("hc", fractions=2)


@pytest.mark.parametrize("arch", PRESETS)
def test_frac_trains_every_parameter_on_every_preset_generates_with_a_cache_and_compiles_whole(arch):
    _trains_generates_and_compiles(_on_preset(arch, {"name": "frac"}), arch, "frac")


@pytest.mark.slow
def test_frac_resumes_exactly(tmp_path):
    assert_resume_is_exact(tmp_path, "norm=frac", "norm.fractions=4", "train.max_steps=6")
