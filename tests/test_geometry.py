"""The step-scale instruments (model/geometry.py, scripts/step_scale.py) and knobs (model.init,
model.embed_std, norm.sublayer_input), and the study statistics (common/stats.py)."""
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.stats import summarize, verdict, welch_p, power_law_fit
from model import GPT, ConfigError
from helpers import gpt_config
from model.geometry import angle_between, stream_geometry, update_ratios

ROOT = Path(__file__).resolve().parents[1]
V, T, D = 64, 8, 32


def build(norm="pre_ln", seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(gpt_config(norm, **{**dict(vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=D), **kw}))


def batch(b=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (b, T), generator=g), torch.randint(0, V, (b, T), generator=g)


# ---- instruments ----------------------------------------------------------------------------------

@pytest.mark.parametrize("theta", [1e-6, 1e-3, 0.3, math.pi / 2, 2.5])
def test_angle_of_a_known_rotation(theta):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(5, 16, generator=g, dtype=torch.float64)
    u = torch.randn(5, 16, generator=g, dtype=torch.float64)
    u = u - (u * a).sum(-1, keepdim=True) / (a * a).sum(-1, keepdim=True) * a   # orthogonal to a
    b = 3.0 * (math.cos(theta) * a / a.norm(dim=-1, keepdim=True) + math.sin(theta) * u / u.norm(dim=-1, keepdim=True))
    got = angle_between(a.float(), b.float())
    assert torch.allclose(got.double(), torch.full((5,), theta, dtype=torch.float64), rtol=1e-4, atol=1e-6)


def test_pre_ln_effective_angle_at_init_matches_a_hand_computation():
    """One block, by hand: h0 = wte + wpe, h1 = h0 + attn(LN(h0)), h2 = h1 + mlp(LN(h1))."""
    m = build("pre_ln", n_layer=1).eval()
    x, y = batch()
    geo = stream_geometry(m, x, y)
    with torch.no_grad():
        b = m.blocks[0]
        h0 = m.wte(x) + m.wpe(torch.arange(T))
        f0 = b.attn(b.attn_rule.norm(h0))
        h1 = h0 + f0
        f1 = b.mlp(b.mlp_rule.norm(h1))
        h2 = h1 + f1
        cos0 = (h0 * h1).sum(-1) / (h0.norm(dim=-1) * h1.norm(dim=-1))
        cos1 = (h1 * h2).sum(-1) / (h1.norm(dim=-1) * h2.norm(dim=-1))
    assert geo["geo/angle/0"].item() == pytest.approx(torch.acos(cos0).mean().item(), rel=1e-4)
    assert geo["geo/angle/1"].item() == pytest.approx(torch.acos(cos1).mean().item(), rel=1e-4)
    assert geo["geo/rel_update/0"].item() == pytest.approx((f0.norm(dim=-1) / h0.norm(dim=-1)).mean().item(), rel=1e-5)
    assert geo["geo/f_ratio/1"].item() == pytest.approx((f1.norm(dim=-1) / h1.norm(dim=-1)).mean().item(), rel=1e-5)
    assert geo["geo/transmission"].item() == pytest.approx((cos0 * cos1).mean().item(), rel=1e-5)
    assert geo["rms/0"].item() == pytest.approx(h0.pow(2).mean().sqrt().item(), rel=1e-6)
    # Pre-LN at nanoGPT's init: its stream is the embedding (RMS ~0.03), so sublayers turn it a lot
    sphere = stream_geometry(build("proj_spheret", n_layer=1).eval(), x, y)
    assert geo["geo/angle/0"].item() > 10 * sphere["geo/angle/0"].item()


def test_sphere_effective_angle_is_the_rules_theta():
    m = build("proj_spheret", kind="layernorm").eval()
    x, y = batch()
    m.set_stats_tracking(True)
    geo = stream_geometry(m, x, y)
    for j, rule in enumerate(m.rules()):
        assert geo[f"geo/angle/{j}"].item() == pytest.approx(rule.last_theta.mean().item(), rel=1e-3, abs=1e-6)
    m.set_stats_tracking(False)


def test_stream_gradient_is_autograd_and_leaves_parameter_grads_alone():
    m = build("geonorm").eval()
    x, y = batch()
    geo = stream_geometry(m, x, y)
    assert all(p.grad is None for p in m.parameters())
    _, loss, hidden = m(x, y, return_hidden=True)
    grads = torch.autograd.grad(loss, hidden)
    for j, g in enumerate(grads):
        assert geo[f"geo/grad/{j}"].item() == pytest.approx(g.norm().item(), rel=1e-5)


def test_update_ratios_of_a_known_step():
    a, b = torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.full((3,), 2.0))
    groups = {"g": [a, b]}
    before = {"g": [a.detach().clone(), b.detach().clone()]}
    with torch.no_grad():
        a.add_(0.5)   # ||dW|| = sqrt(4 * 0.25) = 1; ||W|| = sqrt(4 + 12) = 4
    assert update_ratios(before, groups)["update_ratio/g"].item() == pytest.approx(0.25)


def test_saturation_shares_in_norm_stats():
    m = build("proj_spheret", alpha_init=1e4).eval()   # beta huge: every angle near p*pi/2
    m.set_stats_tracking(True)
    m(batch()[0])
    st = m.norm_stats()
    assert st["angle_above_1rad/0"].item() == 1.0 and st["angle_near_bound/0"].item() == 1.0
    m = build("proj_spheret").eval()
    m.set_stats_tracking(True)
    m(batch()[0])
    assert m.norm_stats()["angle_above_1rad/0"].item() == 0.0
    m = build("spheret", p=math.inf).eval()
    m.set_stats_tracking(True)
    m(batch()[0])
    assert "angle_near_bound/0" not in m.norm_stats()   # the exponential map has no bound


@pytest.mark.slow
def test_step_scale_script_table(pydocs, load_script, capsys):
    argv = ["--lr", "1e-3", "--cell", "a1=norm=proj_spheret", "--cell", "a32=norm=proj_spheret,norm.alpha_init=32",
            "--cell", "pre=norm=pre_ln", "--", "experiment=fidelity", "model.n_layer=2", "model.n_embd=32",
            "model.n_head=2", "model.block_size=32", "train.micro_batch_size=2", "train.batch_tokens=64"]
    assert load_script("step_scale").main(argv) == 0
    got = capsys.readouterr()
    # a progress line per cell as it starts and as it ends, with its time (a 125M cell takes minutes)
    assert re.findall(r"^# \[(\d)/3\] (\w+): done in [\d.]+ s", got.err, re.M) == [("1", "a1"), ("2", "a32"),
                                                                                   ("3", "pre")]
    rows = {
        line.split("|")[1].strip(): line.split("|")
        for line in got.out.splitlines()
        if line.startswith("| a") or line.startswith("| pre")
    }
    assert set(rows) == {"a1", "a32", "pre"}
    angle = {k: float(r[4].split()[0]) for k, r in rows.items()}
    dlogits = {k: float(r[8]) for k, r in rows.items()}
    assert angle["a32"] > 10 * angle["a1"]             # alpha scales the first rotations
    assert dlogits["a32"] > dlogits["a1"] > 0          # and the logit change of one step with them


def test_step_scale_measures_a_batch_that_fits_for_gpt_125m():
    """gpt_125m at its micro-batch of 16 x 1024 x 50,304 holds 3.3 GB of logits (OOM-killed at 24 GB with the
    step); the measured batch is capped to 1 GiB of logits, --batch chooses it, tiny models keep theirs."""
    from experiments.step_scale import measured_batch as m
    assert m(16, 1024, 50304) == 5 and 4 * 5 * 1024 * 50304 <= 1 << 30
    assert m(16, 256, 320) == 16 and m(16, 1024, 50304, asked=2) == 2
    assert m(16, 1 << 20, 50304) == 1  # never empty


def test_step_scale_refuses_what_the_machine_cannot_hold_naming_the_batch_that_fits(load_script, monkeypatch):
    """gpt_125m with --batch 8 on a 5 GB machine: one line with the batch that fits, before anything is built
    (it used to be killed by the kernel minutes in)."""
    from common import UserError
    from experiments import step_scale as ss

    # above the measured peak RSS of gpt_125m at one sequence (3.63 GB), not far above
    assert 1.0 < ss.peak_bytes(124_475_904, 12, 768, 1, 1024, 50304) / 3.63e9 < 1.2
    assert ss.peak_bytes(10**6, 2, 64, 4, 256, 320) < ss.peak_bytes(10**6, 2, 64, 5, 256, 320)
    monkeypatch.setattr(ss, "available_bytes", lambda: 5 * 10**9)
    monkeypatch.setattr(ss, "batch_for", lambda *a: pytest.fail("data read for a batch that cannot fit"))
    with pytest.raises(UserError, match=r"^--batch 8 x 1024 tokens needs ~16\.0 GB \(124M parameters, vocab "
                                        r"50304\) but 5\.0 GB is available: pass --batch 1$"):
        ss.measure(["model=gpt_125m", "data.tokenizer=gpt2"], None, True, batch=8)
    monkeypatch.setattr(ss, "available_bytes", lambda: 3 * 10**9)
    with pytest.raises(UserError, match=r"no batch fits: use a smaller model\.\* or block_size$"):
        ss.measure(["model=gpt_125m", "data.tokenizer=gpt2"], None, True, batch=8)


def test_step_scale_script_bad_cell_or_lr_is_one_line(load_script):
    out = subprocess.run([sys.executable, "scripts/step_scale.py", "--cell", "x"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "bad --cell 'x'" in out.stderr and "Traceback" not in out.stderr
    with pytest.raises(SystemExit, match=r"^bad --lr -0.001: must be a finite number > 0$"):  # a step uphill
        load_script("step_scale").main(["--lr=-1e-3"])


# ---- knobs ----------------------------------------------------------------------------------------

def test_default_init_is_nanogpt_and_explicit_nanogpt_is_bitwise_the_same():
    a, b = build("pre_ln"), build("pre_ln", init="nanogpt")
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


def _std(t):
    return t.detach().float().std().item()


def test_nanogpt_init_stds():
    m = build("pre_ln", n_layer=4, n_embd=64, n_head=2, vocab_size=512, block_size=64)
    blk = m.blocks[0]
    assert _std(m.wte.weight) == pytest.approx(0.02, rel=0.05)
    assert _std(blk.attn.c_attn.weight) == pytest.approx(0.02, rel=0.05)
    assert _std(blk.mlp.c_proj.weight) == pytest.approx(0.02 / math.sqrt(8), rel=0.05)


def test_fan_in_init_stds_scale_with_width_and_depth():
    for d, n in ((64, 4), (128, 8)):
        m = build("pre_ln", init="fan_in", n_layer=n, n_embd=d, n_head=2, vocab_size=512, block_size=64,
                  tie_embeddings=False)
        blk = m.blocks[0]
        assert _std(blk.attn.c_attn.weight) == pytest.approx(d ** -0.5, rel=0.05)
        assert _std(blk.mlp.c_fc.weight) == pytest.approx(d ** -0.5, rel=0.05)
        assert _std(blk.mlp.c_proj.weight) == pytest.approx((4 * d) ** -0.5 / math.sqrt(2 * n), rel=0.05)
        assert _std(blk.attn.c_proj.weight) == pytest.approx(d ** -0.5 / math.sqrt(2 * n), rel=0.05)
        assert _std(m.wte.weight) == pytest.approx(d ** -0.5, rel=0.05)
        assert _std(m.lm_head.weight) == pytest.approx(d ** -0.5, rel=0.05)
        assert all(torch.count_nonzero(b) == 0 for name, b in m.named_parameters() if name.endswith(".bias"))


@pytest.mark.parametrize("init", ["nanogpt", "fan_in"])
def test_embed_std_sets_the_tied_table_alone(init):
    m = build("pre_ln", init=init, embed_std=0.5, vocab_size=512, block_size=64)
    assert _std(m.wte.weight) == pytest.approx(0.5, rel=0.05) and m.lm_head.weight is m.wte.weight
    assert _std(m.wpe.weight) == pytest.approx(0.5, rel=0.1)
    assert _std(m.blocks[0].attn.c_attn.weight) == pytest.approx(0.02 if init == "nanogpt" else D ** -0.5, rel=0.05)


@pytest.mark.parametrize("kw,key", [({"init": "xavier"}, "model.init"), ({"embed_std": -1.0}, "model.embed_std"),
                                    ({"embed_std": float("inf")}, "model.embed_std"),
                                    ({"sublayer_input": "ln"}, "norm.sublayer_input")])
def test_bad_knob_values_are_one_line(kw, key):
    with pytest.raises(ConfigError) as e:
        build("geonorm", **kw)
    assert key in str(e.value) and "\n" not in str(e.value)


def test_sublayer_input_only_for_the_sphere_family():
    with pytest.raises(ConfigError, match="norm.sublayer_input='norm': not an option of norm.name=pre_ln"):
        build("pre_ln", sublayer_input="norm")


def test_geonorm_normalized_sublayer_input():
    """F reads LayerNorm(h) (RMS ~1 at init) instead of the raw stream (the embedding, RMS ~0.03);
    the rotation still acts on h, so ||h|| is kept."""
    seen = {}
    for mode in ("raw", "norm"):
        m = build("geonorm", sublayer_input=mode).eval()
        inputs = []
        m.blocks[0].attn.register_forward_hook(lambda mod, args, out: inputs.append(args[0]))
        x, _ = batch()
        _, _, hidden = m(x, return_hidden=True)
        seen[mode] = inputs[0].pow(2).mean().sqrt().item()
        assert torch.allclose(hidden[1].norm(dim=-1), hidden[0].norm(dim=-1), rtol=1e-5)
    assert seen["raw"] < 0.1 and seen["norm"] == pytest.approx(1.0, rel=0.05)
    names = dict(build("geonorm", sublayer_input="norm").parameter_groups())
    assert any("in_norm" in n for n, _ in names["vectors"])


# ---- statistics -----------------------------------------------------------------------------------

def test_t_interval_on_known_numbers():
    s = summarize([1.0, 2.0, 3.0])
    half = 4.302652729911275 / math.sqrt(3)   # t(0.975, 2) * std / sqrt(n), std = 1
    assert (s.n, s.mean, s.std) == (3, 2.0, 1.0)
    assert s.lo == pytest.approx(2.0 - half) and s.hi == pytest.approx(2.0 + half)
    assert summarize([5.0]).lo is None and summarize([]).mean is None


def test_welch_test_separates_only_what_it_should():
    a, b = [1.00, 1.01, 0.99], [2.00, 2.02, 1.98]
    assert welch_p(a, b) < 1e-4 and verdict(a, b, "A", "B").startswith("A ahead (p=")
    c = [1.0, 1.5, 0.6]
    assert welch_p(a, c) > 0.05 and verdict(a, c, "A", "C").startswith("not separated (p=")
    assert welch_p([1.0], a) is None and verdict([1.0], a, "x", "y").startswith("not tested")
    # Welch's t for two samples with unequal variances, against the textbook formula
    x, y = [2.1, 2.4, 2.2, 2.6], [3.0, 2.2, 3.9]
    from scipy import stats
    assert welch_p(x, y) == pytest.approx(stats.ttest_ind(x, y, equal_var=False).pvalue)


def test_power_law_fit_recovers_its_exponent():
    n = [1e5, 4e5, 1.6e6]
    loss = [3.0 * v ** -0.1 for v in n]
    a, b = power_law_fit(n, loss)
    assert a == pytest.approx(3.0, rel=1e-4) and b == pytest.approx(0.1, rel=1e-4)


def test_difference_interval_matches_welch():
    from common.stats import diff_ci
    a, b = [1.0, 2.0, 3.0], [2.0, 3.0, 4.5]
    d, lo, hi = diff_ci(a, b)
    assert d == pytest.approx(-7 / 6) and lo < 0 < hi        # p = 0.28: the interval holds 0
    d, lo, hi = diff_ci([1.0, 1.01, 0.99], [2.0, 2.02, 1.98])
    assert hi < 0                                             # separated: the interval excludes 0


@pytest.mark.parametrize("norm", ["proj_spheret", "cay_spheret", "geonorm"])
@pytest.mark.parametrize("d,n_layer", [(32, 2), (128, 4)])
def test_target_angle_calibrates_the_first_rotations_at_any_width(norm, d, n_layer):
    torch.manual_seed(0)
    m = GPT(gpt_config(norm, vocab_size=V, block_size=32, n_layer=n_layer, n_head=2, n_embd=d,
                       target_angle=0.2)).eval()
    x = torch.randint(0, V, (4, 32), generator=torch.Generator().manual_seed(5))  # not the calibration batch
    geo = stream_geometry(m, x)
    angles = [geo[f"geo/angle/{j}"].item() for j in range(2 * n_layer)]
    assert sum(angles) / len(angles) == pytest.approx(0.2, rel=0.1)
    assert all(0.1 < a < 0.3 for a in angles)
    plain = stream_geometry(build(norm, n_layer=n_layer, n_embd=d, block_size=32, sublayer_input="raw").eval(), x)
    assert plain["geo/angle/0"].item() < 0.05                 # without it the first rotations are tiny


def test_target_angle_leaves_the_init_rng_and_other_weights_alone():
    a, b = build("proj_spheret"), build("proj_spheret", target_angle=0.2)
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q) == (not name.endswith("rho")), name
    with pytest.raises(ConfigError, match="norm.target_angle=0.2: not an option of norm.name=pre_ln"):
        build("pre_ln", target_angle=0.2)
    with pytest.raises(ConfigError, match=r"norm.target_angle=2.0: must be a number in \(0, 0.7854\)"):
        build("geonorm", target_angle=2.0)
