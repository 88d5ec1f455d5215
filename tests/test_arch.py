"""Architecture axes and the `arch` presets: RoPE against an independent reference, the relative-position
property, cached == uncached generation for every variant on the modern presets, parameter counts and
FLOPs against formulas, and one-line config errors."""
import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from model import GPT, GPTConfig, VARIANTS, ConfigError
from model.generate import generate
from model.rope import apply_rope, rope_tables
from trainer.config_store import register_code_configs

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ("gpt2", "llama", "speedrun", "neox")
V, T, D, H, N = 256, 16, 32, 2, 2


def preset(arch, norm="pre_ln", **kw):
    """GPTConfig of a preset, composed through Hydra as train.py does (tiny shape)."""
    register_code_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose("config", overrides=[f"arch={arch}", f"norm={norm}", f"model.n_layer={N}", f"model.n_head={H}",
                                           f"model.n_embd={D}", f"model.block_size={T}"])
    c = GPTConfig.from_hydra(cfg.model, cfg.norm, vocab_size=V)
    return GPTConfig.from_dict({**c.to_dict(), **kw})


def sharp(model):
    """Larger weights than the init (std 0.3): attention that depends on positions and context."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
    return model.eval()


def rope_reference(x, base, rot):
    """RoPE as a complex rotation: (x_i + i x_{i+rot/2}) * exp(i pos base^(-2i/rot)), written independently."""
    B, Hh, Tt, hd = x.shape
    xd = x.double()
    z = torch.complex(xd[..., :rot // 2], xd[..., rot // 2:rot])
    theta = torch.tensor([base ** (-2 * i / rot) for i in range(rot // 2)], dtype=torch.float64)
    pos = torch.arange(Tt, dtype=torch.float64)
    z = z * torch.polar(torch.ones(Tt, rot // 2, dtype=torch.float64), pos[:, None] * theta[None, :])
    return torch.cat((z.real, z.imag, xd[..., rot:]), dim=-1)


@pytest.mark.parametrize("rot", [8, 4])
def test_rope_equals_complex_rotation_reference(rot):
    x = torch.randn(2, 3, 11, 8, generator=torch.Generator().manual_seed(0))
    cos, sin = rope_tables(11, rot, 10000.0)
    out = apply_rope(x, cos, sin)
    assert torch.allclose(out.double(), rope_reference(x, 10000.0, rot), atol=1e-5)
    assert torch.equal(out[..., rot:], x[..., rot:])            # a fraction < 1 leaves the rest alone
    assert not torch.allclose(out[:, :, 1:, :rot], x[:, :, 1:, :rot])  # and does rotate the rest


@pytest.mark.parametrize("arch", ["llama", "speedrun", "neox"])
def test_rope_logits_depend_on_relative_positions_only(arch):
    torch.manual_seed(0)
    model = sharp(GPT(preset(arch)))
    x = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(1))
    ref = model(x)[0]
    cos, sin = rope_tables(T + 7, model.config.rope_dims, model.config.rope_base)
    model.rope_cos, model.rope_sin = cos[7:], sin[7:]              # every position shifted by 7
    assert torch.allclose(model(x)[0], ref, atol=1e-4)
    model.rope_cos, model.rope_sin = cos[:T] * 0 + 1, sin[:T] * 0  # no rotation: positions lost
    assert not torch.allclose(model(x)[0], ref, atol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "speedrun"])
@pytest.mark.parametrize("norm", list(VARIANTS))
def test_cached_generation_equals_uncached_on_modern_presets(arch, norm):
    torch.manual_seed(0)
    model = sharp(GPT(preset(arch, norm)))
    prompt = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(1))
    for new in (T - 5, T + 4):  # within block_size, and across crops (the cache is recomputed)
        a = generate(model, prompt, new, temperature=0, use_cache=True)
        b = generate(model, prompt, new, temperature=0, use_cache=False)
        assert torch.equal(a, b), (arch, norm, new)
        assert len(set(a[:, 5:].flatten().tolist())) > 2


def test_kv_cache_offsets_rope_positions():
    torch.manual_seed(0)
    model = sharp(GPT(preset("llama")))
    x = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(1))
    cache = model.new_kv_cache(2)
    parts = [
        model(x[:, :5], kv_cache=cache)[0],
        model(x[:, 5:6], kv_cache=cache)[0],
        model(x[:, 6:], kv_cache=cache)[0],
    ]
    assert torch.allclose(torch.cat(parts, 1), model(x)[0], atol=1e-4)


def expected_params(arch, d=D, n=N, v=V, t=T):
    """Pre-LN parameter count of each preset from its definition (docs/variants.md, "Architecture presets")."""
    bias = arch in ("gpt2", "neox")
    h = -(-8 * d // 192) * 64 if arch == "llama" else 4 * d
    attn = 3 * d * d + d * d + (4 * d if bias else 0)
    mlp = (3 * d * h + (2 * h + d if bias else 0)) if arch == "llama" else 2 * d * h + (h + d if bias else 0)
    norm = 2 * d if arch in ("gpt2", "neox") else d        # LayerNorm with bias | RMSNorm
    emb = v * d + (t * d if arch == "gpt2" else 0) + (0 if arch == "gpt2" else v * d)  # wpe | untied head
    return emb + n * (attn + mlp + 2 * norm) + norm


@pytest.mark.parametrize("arch", PRESETS)
def test_preset_parameter_counts_match_formula(arch):
    model = GPT(preset(arch))
    assert model.num_params(non_embedding=False) == expected_params(arch)
    non_emb = expected_params(arch) - (T * D if arch == "gpt2" else V * D)  # wpe | the untied token table
    assert model.num_params() == non_emb
    if arch == "llama":
        assert model.config.hidden_size == 128  # 8*32/3 = 85.3 -> 128


def test_gpt2_preset_is_the_previous_model():
    c = preset("gpt2")
    assert c == GPTConfig(vocab_size=V, block_size=T, n_layer=N, n_head=H, n_embd=D)
    torch.manual_seed(0)
    sd = GPT(c).state_dict()
    assert "wpe.weight" in sd and not any("c_gate" in k or "rope" in k for k in sd)
    # the default tiny model as the README states it: 4 x 128, byte vocabulary (320 padded)
    assert GPT(GPTConfig(vocab_size=320, block_size=256, n_layer=4, n_head=4, n_embd=128)).num_params() == 834304


@pytest.mark.parametrize("arch", PRESETS)
def test_flops_per_token_counts_swiglu_matrices_and_no_position_table(arch):
    model = GPT(preset(arch))
    c = model.config
    h = c.hidden_size
    matmul = N * (4 * D * D + (3 if c.mlp == "swiglu" else 2) * D * h) + V * D  # head: tied or not, one V x d
    vectors = model.num_params() - matmul                  # norm gains, biases: counted by 6N like nanoGPT
    assert model.flops_per_token() == 6 * (matmul + vectors) + 12 * N * D * T
    assert vectors < 0.1 * matmul


@pytest.mark.slow
def test_presets_set_the_documented_axes():
    want = {"gpt2": ("learned", "gelu", True, True, False, "layernorm"),
            "llama": ("rope", "swiglu", False, False, False, "rmsnorm"),
            "speedrun": ("rope", "relu2", False, False, True, "rmsnorm"),
            "neox": ("rope", "gelu", True, False, False, "layernorm")}
    for arch, axes in want.items():
        c = preset(arch, "geonorm")
        assert (c.pos_emb, c.mlp, c.bias, c.tie_embeddings, c.qk_norm, c.norm.kind) == axes, arch
    assert preset("neox").rope_dims == 4  # a quarter of head_dim 16


def test_no_preset_overrides_a_variant_s_own_norm_default():
    """An arch preset's `norm.*` key lands on every variant: where a variant chose its own default for that
    key (pre_derf once had norm.kind=derf), the preset would silently replace the method. So no variant may
    default a key a preset sets; such a variant builds its Norm itself (as pre_derf and pre_dyt do)."""
    import yaml
    from common.config import defaults
    from model.norm_options import VARIANTS, NormOptions

    base = defaults(NormOptions)
    for arch in PRESETS:
        for key in (yaml.safe_load((ROOT / "configs" / "arch" / f"{arch}.yaml").read_text()) or {}).get("norm", {}):
            own = [v for v, cls in VARIANTS.all_options().items()
                   if defaults(cls).get(key, base.get(key)) != base.get(key)]
            assert not own, f"arch={arch} sets norm.{key}, which {own} default away from the base"


@pytest.mark.parametrize("kw,match", [
    (dict(pos_emb="alibi"), "model.pos_emb='alibi': valid: learned, rope"),
    (dict(mlp="geglu"), "model.mlp='geglu': valid: gelu, swiglu, relu2"),
    (dict(pos_emb="rope", rope_fraction=0.05), "model.rope_fraction=0.05"),
    (dict(rope_fraction=1.5), "model.rope_fraction"),
    (dict(rope_base=0.5), "model.rope_base"),
    (dict(mlp_hidden=0), "model.mlp_hidden"),
    (dict(qk_norm="yes"), "model.qk_norm"),
    (dict(attn_gate="yes"), "model.attn_gate='yes': valid: none, elementwise, headwise"),
])
def test_bad_axes_fail_with_one_line(kw, match):
    with pytest.raises(ConfigError, match=match) as err:
        GPTConfig(vocab_size=V, block_size=T, n_layer=N, n_head=H, n_embd=D, **kw)
    assert "\n" not in str(err.value)


def test_unknown_model_key_and_arch_names():
    with pytest.raises(ConfigError, match=r"^unknown key\(s\) model.pos_embedding: valid keys are block_size, "):
        GPTConfig.from_hydra(dict(n_layer=2, n_head=2, n_embd=32, block_size=16, pos_embedding="rope"),
                             dict(name="pre_ln"), vocab_size=V)
    assert {p.stem for p in (ROOT / "configs" / "arch").glob("*.yaml")} == set(PRESETS)


@pytest.mark.slow
@pytest.mark.parametrize("arch", PRESETS)
def test_every_variant_trains_every_parameter_on_every_preset(arch):
    """Each parameter gets a finite gradient (an unused one would also break DDP), for every variant."""
    x = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(1))
    base = preset(arch).to_dict()  # composed once; each variant then takes its own defaults but the preset's kind
    for norm in VARIANTS:
        torch.manual_seed(0)
        model = GPT(GPTConfig.from_dict({**base, "norm": {"name": norm, "kind": base["norm"]["kind"]}}))
        _, loss = model(x, x)
        assert abs(loss.item() - math.log(V)) < 1.0, (arch, norm)
        loss.backward()
        for name, p in model.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), (arch, norm, name)


@pytest.mark.parametrize("gate", ["elementwise", "headwise"])
@pytest.mark.parametrize("norm", ["pre_ln", "proj_spheret"])
def test_a_gate_of_exactly_one_is_the_ungated_model(gate, norm):
    """Gated attention (arXiv 2505.06708): with every gate at exactly 1 (weights 0, bias 30: sigmoid(30)
    is 1.0 in float32) the model is the ungated one with the same other weights; at init it is not."""
    torch.manual_seed(0)
    plain = sharp(GPT(preset("llama", norm, bias=True)))
    gated = GPT(preset("llama", norm, bias=True, attn_gate=gate)).eval()
    missing = gated.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert sorted(missing) == sorted(f"blocks.{i}.attn.gate.{p}" for i in range(N) for p in ("weight", "bias"))
    x = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(1))
    assert not torch.allclose(gated(x)[0], plain(x)[0])           # gates at their init values (about 0.5)
    with torch.no_grad():
        for b in gated.blocks:
            b.attn.gate.weight.zero_()
            b.attn.gate.bias.fill_(30.0)
    assert torch.equal(gated(x)[0], plain(x)[0])


@pytest.mark.parametrize("gate, per_layer", [("elementwise", D * D + D), ("headwise", D * H + H)])
def test_the_gate_adds_its_matrix_to_the_matrices_group_and_generates_with_a_cache(gate, per_layer):
    base, gated = GPT(preset("llama", bias=True)), GPT(preset("llama", bias=True, attn_gate=gate))
    assert gated.num_params() - base.num_params() == N * per_layer
    groups = {g: [n for n, _ in ps if ".gate." in n] for g, ps in gated.parameter_groups().items()}
    assert groups["matrices"] == [f"blocks.{i}.attn.gate.weight" for i in range(N)]
    assert groups["vectors"] == [f"blocks.{i}.attn.gate.bias" for i in range(N)]
    torch.manual_seed(0)
    model = sharp(gated)
    prompt = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(1))
    for new in (T - 5, T + 4):
        assert torch.equal(generate(model, prompt, new, temperature=0, use_cache=True),
                           generate(model, prompt, new, temperature=0, use_cache=False))


@pytest.mark.slow
def test_gated_attention_trains_and_resumes_exactly(tmp_path):
    from helpers import assert_resume_is_exact

    a, _ = assert_resume_is_exact(tmp_path, "model.attn_gate=headwise", "arch=llama", "train.max_steps=6")
    assert "blocks.0.attn.gate.weight" in a["model"]
