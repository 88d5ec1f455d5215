"""The GPT and every normalization variant, against the rules of docs/variants.md."""
import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from model import GPT, GPTConfig, VARIANTS, ConfigError
from helpers import gpt_config
from model.norms import LayerNorm
from model.variants import DeepNorm, decay_factor

ROOT = Path(__file__).resolve().parents[1]
SPHERE = ["geonorm", "spheret", "proj_spheret", "cay_spheret"]
V, T, D, N = 256, 16, 32, 2


def tiny(norm, **kw):
    return gpt_config(norm, **{**dict(vocab_size=V, block_size=T, n_layer=N, n_head=2, n_embd=D), **kw})


def build(norm, seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(tiny(norm, **kw))


def batch(b=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (b, T), generator=g), torch.randint(0, V, (b, T), generator=g)


BODY = ("wte.weight", "wpe.weight", "c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias", "c_fc.weight",
        "c_fc.bias")


def body_params(d=D, n=N, v=V, t=T):
    """Parameters every variant shares: embeddings, attention's and the MLP's linear layers (with biases)."""
    return v * d + t * d + n * (d * 3 * d + 3 * d + d * d + d + d * 4 * d + 4 * d + 4 * d * d + d)


def variant_params(norm, d=D, n=N, v=V, first_layer="v2"):
    """The parameters of the variants of this file beyond the body, from the rules of docs/variants.md
    (LayerNorm with bias: 2d; DyT: 2d + 1). Newer variants pin theirs in their own test files."""
    ln, sub = 2 * d, 2 * n
    return {
        "pre_ln": (sub + 1) * ln, "post_ln": sub * ln, "deepnorm": sub * ln,
        "sandwich": (2 * sub + 1) * ln, "peri_ln": (2 * sub + 2) * ln,
        "keel": (1 + 2 * (sub - 1)) * ln if first_layer == "v2" else (2 + 2 * (sub - 2)) * ln,
        "pre_dyt": (sub + 1) * (2 * d + 1),
        "geonorm": 2 * sub + ln + sub * ln,    # a, b; final norm; Norm(h) of each sublayer's input
        "spheret": sub + 1 + ln, "proj_spheret": sub + 1 + ln, "cay_spheret": sub + 1 + ln,
        "lns": (sub + 1) * ln, "mix_ln": (sub + 1) * ln,
        "ngpt": sub * d + n * d + n * 4 * d + v,  # alpha per sublayer, s_qk, s_v (GELU: no s_u), s_z; no norms
    }[norm]


def expected_params(norm, **kw):
    return body_params(**{k: v for k, v in kw.items() if k != "first_layer"}) + variant_params(norm, **kw)


@pytest.mark.parametrize("norm", list(VARIANTS))
def test_every_variant_forward_backward_loss_params_hidden(norm):
    model = build(norm)
    x, y = batch()
    logits, loss, hidden = model(x, y, return_hidden=True)
    assert logits.shape == (4, T, V)
    assert torch.isfinite(logits).all() and torch.isfinite(loss)
    assert abs(loss.item() - math.log(V)) < 0.3
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    total = model.num_params(non_embedding=False)
    assert sum(p.numel() for k, p in model.named_parameters() if k.endswith(BODY)) == body_params()
    assert model.num_params() == total - T * D and total > body_params()
    assert len(hidden) == 2 * N + 1 and all(h.shape == (4, T, D) for h in hidden)
    logits_last, none = model(x, last_only=True)
    assert none is None and torch.allclose(logits_last, logits[:, -1:], atol=1e-6)


@pytest.mark.parametrize("norm", ["pre_ln", "post_ln", "deepnorm", "sandwich", "peri_ln", "keel", "pre_dyt", "geonorm",
                                  "spheret", "proj_spheret", "cay_spheret", "lns", "mix_ln", "ngpt"])
def test_parameter_count_follows_the_rule(norm):
    assert build(norm).num_params(non_embedding=False) == expected_params(norm)


@pytest.mark.parametrize("norm", list(VARIANTS))
def test_every_variant_under_bf16_autocast(norm):
    model = build(norm)
    x, y = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss, hidden = model(x, y, return_hidden=True)
    assert torch.isfinite(loss) and abs(loss.item() - math.log(V)) < 0.3
    assert all(h.dtype == torch.float32 for h in hidden)  # the stream stays float32
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    if norm in SPHERE:  # rotation math in float32 keeps the norm even with bf16 sublayer outputs
        n = torch.stack([h.norm(dim=-1) for h in hidden])
        assert ((n - n[0]).abs() / n[0]).max() < 1e-5


def _perturb_sphere_scalars(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for r in model.rules():
            if hasattr(r, "a"):
                r.a.fill_(2.0 + torch.rand((), generator=g).item())
                r.b.fill_(0.3 + 0.2 * torch.rand((), generator=g).item())
            if hasattr(r, "rho"):
                r.rho.fill_(2.0 + torch.rand((), generator=g).item())
        for b in model.blocks:  # sublayer outputs comparable to the stream: O(1) rotation angles
            b.attn.c_proj.weight.mul_(30.0)
            b.mlp.c_proj.weight.mul_(30.0)


@pytest.mark.parametrize("norm", SPHERE)
@pytest.mark.parametrize("trained_scalars", [False, True])
def test_sphere_family_preserves_norm_every_sublayer(norm, trained_scalars):
    model = build(norm, n_layer=4)
    if trained_scalars:  # O(1) angles, b != 0: not only the init
        _perturb_sphere_scalars(model)
        model.set_stats_tracking(True)
    x, _ = batch()
    _, _, hidden = model(x, return_hidden=True)
    n0 = hidden[0].norm(dim=-1)
    for j, h in enumerate(hidden[1:]):
        assert ((h.norm(dim=-1) - n0).abs() / n0).max() < 1e-5, f"sublayer {j}"
    if norm != "geonorm":  # ScaleNorm input step: radius sqrt(d)
        assert torch.allclose(n0, torch.full_like(n0, math.sqrt(D)), rtol=1e-5)
    if trained_scalars:
        stats = model.norm_stats()
        assert max(stats[f"angle_max/{j}"].item() for j in range(8)) > 0.3
        assert all(f"angle_mean/{j}" in stats for j in range(8))


def test_sphere_stats_keys_and_tracking_off_by_default():
    model = build("geonorm")
    model(batch()[0])
    stats = model.norm_stats()
    assert not any(k.startswith("angle") for k in stats)
    assert stats["step/0/a"].item() == 1.0 and stats["step/3/b"].item() == 0.0
    sph = build("spheret")
    assert sph.norm_stats()["step/0/alpha"].item() == pytest.approx(1.0)
    assert sph.norm_stats()["step/embed_g"].item() == 1.0


def test_geonorm_clamp_before_and_after_decay():
    model = build("geonorm", n_layer=4)
    c = math.pi / 4
    rules = model.rules()
    big, mid = torch.tensor([[10.0]]), torch.tensor([[0.5]])
    # before: r = 10 is clamped to c, then decayed: block 2 gives c/2 (unclamped it would be 5 -> c)
    assert rules[2].angle(big, *rules[2].angle_params()).item() == pytest.approx(c / 2)
    # after: a = 10 makes (a*0.5)*(1/2) = 2.5, clamped to c
    with torch.no_grad():
        rules[2].a.fill_(10.0)
    assert rules[2].angle(mid, *rules[2].angle_params()).item() == pytest.approx(c)
    # block 1, sublayer MLP shares lambda_1 = 1
    assert rules[1].angle(mid, *rules[1].angle_params()).item() == pytest.approx(0.5)


@pytest.mark.parametrize("schedule,expected", [
    ("harmonic", [1, 1 / 2, 1 / 3, 1 / 4]), ("sqrt", [1, 2 ** -0.5, 3 ** -0.5, 0.5]),
    ("linear", [1, 3 / 4, 2 / 4, 1 / 4]), ("none", [1, 1, 1, 1])])
@pytest.mark.parametrize("norm", ["geonorm", "spheret"])
def test_decay_factors_per_block(norm, schedule, expected):
    model = build(norm, n_layer=4, decay=schedule)
    lams = [r.lam for r in model.rules()]
    assert lams == pytest.approx([e for e in expected for _ in range(2)])
    assert [decay_factor(schedule, k, 4) for k in (1, 2, 3, 4)] == pytest.approx(expected)


def test_variant_default_decays_and_steps():
    assert tiny("geonorm").norm.decay == "harmonic" and tiny("spheret").norm.decay == "sqrt"
    assert not hasattr(tiny("pre_ln").norm, "decay")  # only the sphere family has a step to decay
    assert tiny("spheret").norm.embed_norm == "scalenorm" and tiny("peri_ln").norm.embed_norm == "layer"
    assert not tiny("post_ln").norm.final_norm and not tiny("keel").norm.final_norm and tiny("geonorm").norm.final_norm
    assert tiny("cay_spheret").norm.p == 2.0 and tiny("proj_spheret").norm.p == 1.0
    assert tiny("spheret", p=math.inf).norm.p == math.inf


def test_geonorm_scalars_are_float_parameters_with_gradients():
    # raw input: the sublayer outputs are small next to h, so the perturbed a stays below the clamp
    # (with Norm(h) in, theta0 is large and a perturbed a clamps every token: no gradient reaches a, b)
    model = build("geonorm", sublayer_input="raw")
    _perturb_sphere_scalars(model)
    x, y = batch()
    model(x, y)[1].backward()
    for r in model.rules():
        for p in (r.a, r.b):
            assert isinstance(p, nn.Parameter) and p.dtype == torch.float32 and p.dim() == 0
            assert p.grad is not None and p.grad.abs().item() > 0


def test_spheret_alpha_is_softplus_initialised_to_one():
    model = build("spheret")
    for r in model.rules():
        assert F.softplus(r.rho).item() == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("n_layer", [2, 4, 6])
def test_deepnorm_constants(n_layer):
    model = build("deepnorm", n_layer=n_layer)
    assert all(r.alpha == pytest.approx((2 * n_layer) ** 0.25) for r in model.rules())
    beta = DeepNorm.beta(n_layer)
    assert beta == pytest.approx((8 * n_layer) ** -0.25) and beta < 1


@pytest.mark.parametrize("init", ["scaled", "xavier"])
def test_deepnorm_beta_applies_to_exactly_v_o_mlp(init):
    n, d = 4, 128
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(
            vocab_size=V, block_size=T, n_layer=n, n_head=4, n_embd=d, norm={"name": "deepnorm", "deepnorm_init": init}
        )
    )
    beta = DeepNorm.beta(n)

    def want(fan_out, fan_in):
        return 0.02 * beta if init == "scaled" else beta * math.sqrt(2 / (fan_in + fan_out))

    for b in model.blocks:
        w = b.attn.c_attn.weight
        stds = {"q": w[:d].std(), "k": w[d:2 * d].std(), "v": w[2 * d:].std(), "o": b.attn.c_proj.weight.std(),
                "fc": b.mlp.c_fc.weight.std(), "proj": b.mlp.c_proj.weight.std()}
        assert stds["q"].item() == pytest.approx(0.02, rel=0.05)  # query and key keep gain 1
        assert stds["k"].item() == pytest.approx(0.02, rel=0.05)
        assert stds["v"].item() == pytest.approx(want(d, d), rel=0.05)
        assert stds["o"].item() == pytest.approx(want(d, d), rel=0.05)
        assert stds["fc"].item() == pytest.approx(want(4 * d, d), rel=0.05)
        assert stds["proj"].item() == pytest.approx(want(d, 4 * d), rel=0.05)


@pytest.mark.parametrize("first", ["v1", "v2"])
def test_keel_alpha_and_first_sublayers(first):
    model = build("keel", n_layer=3, first_layer=first)
    rules = model.rules()
    h = torch.randn(2, T, D)
    f = lambda x: 0.5 * x + 1.0  # noqa: E731  a stand-in sublayer
    # sublayer 1: plain Pre-LN in both versions
    assert torch.allclose(rules[0](h, f), h + f(rules[0].norm_in(h)))
    if first == "v2":  # sublayer 2: alpha = 1 with the outer norm
        assert torch.allclose(rules[1](h, f), rules[1].norm_out(h + f(rules[1].norm_in(h))))
    else:
        assert torch.allclose(rules[1](h, f), h + f(rules[1].norm_in(h)))
    for r in rules[2:]:
        assert r.alpha == 2 * 3
        assert torch.allclose(r(h, f), r.norm_out(6 * h + f(r.norm_in(h))))
    assert model.num_params(non_embedding=False) == expected_params("keel", n=3, first_layer=first)


def test_peri_ln_is_sandwich_plus_embedding_norm():
    """horizon16's ablation reads Peri-LN as Pre-LN + an input norm + Sandwich's output norms."""
    peri, sand = build("peri_ln"), build("sandwich")
    assert isinstance(peri.input_step, LayerNorm) and isinstance(sand.input_step, nn.Identity)
    sd = {k: v for k, v in peri.state_dict().items() if not k.startswith("input_step.")}
    sand.load_state_dict(sd)  # same parameters apart from the embedding norm
    x, _ = batch()
    e = peri.wte(x) + peri.wpe(torch.arange(T))
    got = peri(x)[0]
    # feeding Norm_emb(e) as the "embedding" of the sandwich model must reproduce peri_ln
    h = peri.input_step(e)
    for b in sand.blocks:
        h = b(h)
    assert torch.allclose(got, sand.lm_head(sand.output_step(h)), atol=1e-5)
    assert not torch.allclose(got, sand(x)[0], atol=1e-3)
    # so Sandwich with norm.embed_norm=layer is Peri-LN itself: the same parameters from one seed, the same
    # logits and loss, bitwise
    sand = build("sandwich", embed_norm="layer")
    a, b = peri.state_dict(), sand.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    x, y = batch()
    (la, loss_a), (lb, loss_b) = peri(x, y)[:2], sand(x, y)[:2]
    assert torch.equal(la, lb) and torch.equal(loss_a, loss_b)


def test_post_ln_outputs_are_normalized_rows():
    model = build("post_ln", eps=0.0)  # eps is comparable to the tiny embeddings' variance
    _, _, hidden = model(batch()[0], return_hidden=True)
    for h in hidden[1:]:
        assert torch.allclose(h.mean(-1), torch.zeros(h.shape[:2]), atol=1e-5)
        assert torch.allclose(h.var(-1, unbiased=False), torch.ones(h.shape[:2]), atol=1e-3)


def test_rmsnorm_kind_everywhere():
    model = build("sandwich", kind="rmsnorm")
    norms = [m for m in model.modules() if m.__class__.__name__ in ("LayerNorm", "RMSNorm")]
    assert norms and all(m.__class__.__name__ == "RMSNorm" for m in norms)


class NanoGPTBlock(nn.Module):
    """nanoGPT's Block written independently (explicit softmax attention)."""

    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.h)
        att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


def test_pre_ln_matches_independent_nanogpt():
    model = build("pre_ln")
    ref = [NanoGPTBlock(D, 2) for _ in range(N)]
    for b, r in zip(model.blocks, ref):
        r.ln_1.load_state_dict(b.attn_rule.norm.state_dict())
        r.ln_2.load_state_dict(b.mlp_rule.norm.state_dict())
        r.c_attn.load_state_dict(b.attn.c_attn.state_dict())
        r.c_proj.load_state_dict(b.attn.c_proj.state_dict())
        r.c_fc.load_state_dict(b.mlp.c_fc.state_dict())
        r.mlp_proj.load_state_dict(b.mlp.c_proj.state_dict())
    x, _ = batch()
    h = model.wte(x) + model.wpe(torch.arange(T))
    for r in ref:
        h = r(h)
    expected = F.linear(F.layer_norm(h, (D,), model.output_step.weight, model.output_step.bias), model.wte.weight)
    assert torch.allclose(model(x)[0], expected, atol=1e-5)


@pytest.mark.parametrize("index", ["sublayer", "block"])
def test_pre_ln_rescaled_recursion(index):
    """GeoNorm paper sec. 3.3 / App. B: x_j = sqrt(j/(j+1)) x_{j-1} + phi_j(Norm(x_{j-1}))/sqrt(j+1)."""
    torch.manual_seed(0)
    model = GPT(tiny("pre_ln", eps=0.0, n_layer=3)).double()
    x, _ = batch()
    with torch.no_grad():
        h = model.wte(x) + model.wpe(torch.arange(T))
        for j, (rule, f) in enumerate(
            [(r, s) for b in model.blocks for r, s in ((b.attn_rule, b.attn), (b.mlp_rule, b.mlp))], 1
        ):
            i = j if index == "sublayer" else (j + 1) // 2
            h = math.sqrt(i / (i + 1)) * h + f(rule.norm(h)) / math.sqrt(i + 1)
        rescaled = model.lm_head(model.output_step(h))
        direct = model(x)[0]
    rel = ((rescaled - direct).norm() / direct.norm()).item()
    if index == "sublayer":
        assert rel < 1e-5
    else:  # the block index is the wrong reading: visibly different
        assert rel > 1e-2


def test_kv_cache_incremental_equals_full_forward():
    for norm in ("pre_ln", "geonorm", "spheret"):
        model = build(norm).eval()
        x, _ = batch(b=2)
        full = model(x)[0]
        cache = model.new_kv_cache(2)
        parts = [
            model(x[:, :5], kv_cache=cache)[0],
            model(x[:, 5:6], kv_cache=cache)[0],
            model(x[:, 6:], kv_cache=cache)[0],
        ]
        assert cache.pos == T
        assert torch.allclose(torch.cat(parts, 1), full, atol=1e-5)
        with pytest.raises(ValueError, match="block_size"):
            model(x[:, :1], kv_cache=cache)
    cache = model.new_kv_cache(2, device="cpu", dtype=torch.float32)  # preallocated
    assert cache.k[0].shape == (2, 2, T, D // 2)
    model(x[:, :4], kv_cache=cache)
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(ValueError, match="mid-sequence"):
        model(x[:, 4:5], kv_cache=cache)  # switching dtype mid-sequence would silently drop the cache


@pytest.mark.parametrize("kw,match", [
    (dict(norm="layer_norm"), "unknown norm.name='layer_norm': valid are pre_ln, post_ln"),
    (dict(norm="spheret", p=0.0), "norm.p"),
    (dict(norm="spheret", p=-1.0), "norm.p"),
    (dict(norm="spheret", p="abc"), "norm.p"),
    (dict(norm="cay_spheret", p=3.0), "norm.p"),
    (dict(n_embd=30, n_head=4), "model.n_embd=30.*divisible by model.n_head=4"),
    (dict(norm="geonorm", decay="cubic"), "norm.decay='cubic'.*harmonic"),
    (dict(norm="pre_ln", p=2.0), r"norm.p=2.0: not an option of norm.name=pre_ln \(its options: name, kind, eps"),
    (dict(norm="pre_ln", learn_radius=False), "norm.learn_radius=False: read only with norm.embed_norm=scalenorm"),
    (dict(kind="batchnorm"), "norm.kind='batchnorm'.*layernorm, rmsnorm"),
    (dict(first_layer="v3"), "norm.first_layer"),
    (dict(embed_norm="xyz"), "norm.embed_norm"),
])
def test_bad_config_fails_at_construction_with_one_line(kw, match):
    base = dict(vocab_size=V, block_size=T, n_layer=N, n_head=2, n_embd=D)
    base.update(kw)
    with pytest.raises(ConfigError, match=match) as err:
        gpt_config(**base)
    assert "\n" not in str(err.value)


def test_config_round_trip_and_from_hydra_pads_vocab():
    cfg = tiny("spheret", p=math.inf)
    assert GPTConfig.from_dict(cfg.to_dict()) == cfg
    model_cfg = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=None, pad_vocab_to=64)
    c = GPTConfig.from_hydra(model_cfg, dict(name="geonorm", clamp=0.5, decay="sqrt"), vocab_size=50257)
    assert c.vocab_size == 50304 and c.norm.clamp == 0.5 and c.norm.decay == "sqrt"
    with pytest.raises(ConfigError, match=r"^unknown key\(s\) norm.clmap: valid keys are name, kind, .*clamp, a_init$"):
        GPTConfig.from_hydra(model_cfg, dict(name="geonorm", clmap=0.5), vocab_size=257)


@pytest.mark.slow
def test_hydra_compose_every_norm_with_every_model():
    from hydra import compose, initialize_config_dir

    from trainer.config_store import register_code_configs
    norms = register_code_configs()  # one `norm` option per variant, made from its Options
    models = sorted(p.stem for p in (ROOT / "configs" / "model").glob("*.yaml"))
    assert norms == list(VARIANTS)
    assert {"tiny", "gpt_125m", "gpt_350m", "gpt_760m", "gpt_1_3b"} <= set(models)
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        # the model and norm groups set disjoint keys: every file of each composes with one of the other
        for m, n in [(m, "pre_ln") for m in models] + [("tiny", n) for n in norms]:
            cfg = compose("config", overrides=[f"model={m}", f"norm={n}"])
            c = GPTConfig.from_hydra(cfg.model, cfg.norm, vocab_size=50257)
            assert c.norm.name == n and c.n_layer == cfg.model.n_layer
        for spelling in ("inf", ".inf"):  # Hydra's override grammar reads inf; YAML spells it .inf
            inf = compose("config", overrides=["norm=spheret", f"norm.p={spelling}"])
            assert GPTConfig.from_hydra(inf.model, inf.norm, vocab_size=257).norm.p == math.inf
    sizes = {"gpt_125m": 124e6, "gpt_350m": 355e6, "gpt_760m": 774e6, "gpt_1_3b": 1.31e9}
    with torch.device("meta"):  # parameter counts of the presets without allocating them
        with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
            for m, n in sizes.items():
                cfg = compose("config", overrides=[f"model={m}"])
                count = GPT(GPTConfig.from_hydra(cfg.model, cfg.norm, vocab_size=50257)).num_params()
                assert count == pytest.approx(n, rel=0.03), m


def test_layernorm_scaling_divides_the_normed_input_by_sqrt_block_index():
    model = build("lns", n_layer=4)
    h, f = torch.randn(2, T, D), (lambda x: 2.0 * x)
    for j, r in enumerate(model.rules()):
        k = j // 2 + 1
        assert torch.allclose(r(h, f), h + 2.0 * r.norm(h) / math.sqrt(k), atol=1e-6)


def test_mix_ln_is_post_ln_in_the_first_quarter_then_pre_ln():
    model = build("mix_ln", n_layer=8)
    h, f = torch.randn(2, T, D), (lambda x: 2.0 * x)
    for j, r in enumerate(model.rules()):
        want = r.norm(h + f(h)) if j // 2 < 2 else h + f(r.norm(h))
        assert r.post == (j // 2 < 2) and torch.allclose(r(h, f), want, atol=1e-6)


def test_a_checkpoint_config_of_the_flat_form_still_loads():
    """Checkpoints written before the variants owned their options stored every norm key as a flat
    field of model_config, whether the variant read it or not; they load as the same model."""
    flat = dict(vocab_size=V, block_size=T, n_layer=N, n_head=2, n_embd=D, dropout=0.0, bias=True,
                tie_embeddings=True, pos_emb="learned", rope_base=10000.0, rope_fraction=1.0, mlp="gelu",
                mlp_hidden=None, qk_norm=False, init="nanogpt", embed_std=None, norm="geonorm",
                norm_kind="rmsnorm", norm_eps=1e-5, decay="sqrt", p=1.0, geonorm_clamp=0.5, embed_norm="none",
                final_norm=True, keel_first_layer="v2", dyt_alpha_attn=0.5, dyt_alpha_other=0.5,
                deepnorm_init="scaled", learn_radius=True, decay_index="block", alpha_init=1.0, a_init=2.0,
                sublayer_input="raw", target_angle=None)
    c = GPTConfig.from_dict(flat)
    assert c == tiny("geonorm", kind="rmsnorm", decay="sqrt", clamp=0.5, a_init=2.0,
                     sublayer_input="raw")  # written before GeoNorm's default became norm
    assert GPTConfig.from_dict(c.to_dict()) == c
    assert not hasattr(c.norm, "alpha_init")  # SpheretNorm's key, stored flat but never read by GeoNorm
    older = {k: v for k, v in flat.items() if k not in ("sublayer_input", "target_angle")}  # before those keys
    assert GPTConfig.from_dict(older) == c    # the raw input GeoNorm had then, not today's default


@pytest.mark.parametrize("norm,tie", [("pre_ln", True), ("pre_ln", False), ("ngpt", True)])
def test_the_chunked_loss_equals_the_plain_loss_and_its_gradients(norm, tie, monkeypatch):
    """model/loss.py in fp32: the same loss and gradients as cross-entropy over the full logits, with ignored
    targets, several chunks, a tied or untied head and nGPT's scaled logits."""
    import model.loss as ml
    from helpers import gpt_config

    monkeypatch.setattr(ml, "MAX_CHUNK_ELEMENTS", 257 * 7)        # 7 tokens a chunk: several chunks and a tail
    torch.manual_seed(0)
    m = GPT(gpt_config(norm, n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=257, tie_embeddings=tie))
    x = torch.randint(0, 257, (3, 16))
    y = torch.randint(0, 257, (3, 16))
    y[0, :5] = -1
    grads = []
    for fused in (False, True):
        m.zero_grad()
        logits, loss = m(x, y, return_logits=not fused)
        loss.backward()
        assert (logits is None) == fused
        grads.append((loss.detach(), {k: p.grad.clone() for k, p in m.named_parameters() if p.grad is not None}))
    (l0, g0), (l1, g1) = grads
    assert torch.allclose(l0, l1, rtol=1e-6, atol=1e-6) and g0.keys() == g1.keys()
    for k in g0:
        assert torch.allclose(g0[k], g1[k], rtol=1e-5, atol=1e-7), k
    with torch.no_grad():   # evaluation: the loss alone
        assert torch.allclose(m(x, y, return_logits=False)[1], l0, rtol=1e-6)


def test_the_chunked_loss_under_bf16_autocast_is_within_bf16_rounding():
    from helpers import gpt_config

    torch.manual_seed(0)
    m = GPT(gpt_config("pre_ln", n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=257))
    x, y = torch.randint(0, 257, (2, 16)), torch.randint(0, 257, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = m(x, y)[1]
        fused = m(x, y, return_logits=False)[1]
    assert abs(plain.item() - fused.item()) < 2e-2 * plain.item()
