"""Optimizer parameter groups and the sphere family's open-choice switches.

Groups: the model declares membership (GPT.parameter_groups), the optimizer gives each group its
lr multiplier and weight decay. Defaults must reproduce plain AdamW with nanoGPT's p.dim() >= 2
decay rule exactly; a multiplier must take effect; resume with groups must stay exact.
"""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from model import GPT, VARIANTS
from helpers import gpt_config
from model.config import ConfigError
from model.norms import ScaleNorm
from trainer.config import GroupConfig, GroupsConfig
from trainer.optim import build_optimizer
from trainer.optim_options import AdamWOptions

from helpers import assert_resume_is_exact, make_cfg, records
from runtime import checkpoint as ck
from trainer.loop import train

CPU = torch.device("cpu")


def tiny(norm="pre_ln", **kw):
    torch.manual_seed(0)
    return GPT(gpt_config(norm, **{**dict(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32), **kw}))


@pytest.mark.parametrize("norm", sorted(VARIANTS))
@pytest.mark.parametrize("tie", [True, False])
def test_every_parameter_in_exactly_one_group(norm, tie):
    m = tiny(norm, tie_embeddings=tie)
    groups = m.parameter_groups()
    ids = [id(p) for named in groups.values() for _, p in named]
    assert len(ids) == len(set(ids)) == len(list(m.parameters()))
    names = {g: {n for n, _ in named} for g, named in groups.items()}
    assert names["embeddings"] >= {"wte.weight", "wpe.weight"}
    assert ("lm_head.weight" in names["embeddings"]) == (not tie)  # tied: it is wte.weight
    assert all(p.dim() == 2 for _, p in groups["matrices"])
    assert all(p.dim() == 1 for _, p in groups["vectors"])
    # Every module that owns a scalar step size puts it in `scalars`, whatever its shape rule.
    expect_scalars = {f"{mn}.{pn}" if mn else pn for mn, mod in m.named_modules()
                      for pn in getattr(mod, "optim_groups", {})
                      if mod.optim_groups[pn] == "scalars" and isinstance(getattr(mod, pn, None), nn.Parameter)}
    assert names["scalars"] == expect_scalars


def test_scalars_found_for_sphere_family_dyt_and_scalenorm():
    def scalars(norm, **kw):
        return {n.rsplit(".", 1)[-1] for n, _ in tiny(norm, **kw).parameter_groups()["scalars"]}
    assert scalars("geonorm") == {"a", "b"}
    for v in ("spheret", "proj_spheret", "cay_spheret"):
        assert scalars(v) == {"rho", "g"}  # ScaleNorm's g from the input step
    assert scalars("pre_dyt") == {"alpha"}
    assert scalars("geonorm", embed_norm="scalenorm") == {"a", "b", "g"}
    assert scalars("proj_spheret", learn_radius=False) == {"rho"}  # fixed radius: g is a buffer
    assert scalars("pre_ln") == set()


def test_undeclared_parameter_is_reported():
    m = tiny()
    m.blocks[0].attn_rule.gate = nn.Parameter(torch.zeros(()))  # a new rule forgot its declaration
    with pytest.raises(TypeError, match="PreLN.gate has no optimizer group"):
        m.parameter_groups()


def _old_optimizer(model, lr, wd):
    """The optimizer before parameter groups existed: decay on p.dim() >= 2, one shared LR tensor."""
    t = torch.tensor(lr)
    groups = [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": wd, "lr": t},
              {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0, "lr": t}]
    return torch.optim.AdamW(groups, lr=t, betas=(0.9, 0.95), eps=1e-8, fused=True), t


@pytest.mark.parametrize("norm", ["pre_ln", "geonorm", "proj_spheret", "pre_dyt"])
def test_default_groups_reproduce_the_previous_optimizer(norm):
    a, b = tiny(norm), tiny(norm)
    new = build_optimizer(a, AdamWOptions(lr=3e-3, weight_decay=0.1, fused=True), CPU)
    old, old_lr = _old_optimizer(b, 3e-3, 0.1)
    x = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1))
    for step in range(4):
        lr = torch.tensor(3e-3 * (0.5 + 0.1 * step), dtype=torch.float64)  # a changing schedule
        new.set_lr(lr)
        old_lr.copy_(lr)
        for m, opt in ((a, new), (b, old)):
            loss = m(x, x)[1]
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), n


def test_lr_mult_scales_the_first_step():
    """With Adam the first update is lr * sign(g) (up to eps): lr_mult 30 moves a scalar 30x further."""
    moves = {}
    for mult in (1.0, 30.0):
        m = tiny("geonorm")
        groups = GroupsConfig(scalars=GroupConfig(lr_mult=mult, weight_decay=0.0))
        opt = build_optimizer(m, AdamWOptions(lr=1e-4, groups=groups, fused=True), CPU)
        opt.set_lr(torch.tensor(1e-4, dtype=torch.float64))
        before = {n: p.detach().clone() for n, p in m.named_parameters()}
        x = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(2))
        m(x, x)[1].backward()
        opt.step()
        moves[mult] = {n: (p.detach() - before[n]).abs().max().item() for n, p in m.named_parameters()}
    b = "blocks.0.attn_rule.b"  # b starts at 0 and gets a non-zero gradient
    assert moves[1.0][b] > 0
    assert moves[30.0][b] == pytest.approx(30 * moves[1.0][b], rel=1e-3)
    w = "blocks.0.attn.c_attn.weight"  # matrices keep their LR
    assert moves[30.0][w] == pytest.approx(moves[1.0][w], rel=1e-6)


def test_group_weight_decay_and_validation():
    groups = GroupsConfig(vectors=GroupConfig(weight_decay=0.05), embeddings=GroupConfig(weight_decay=0.0))
    opt = build_optimizer(tiny("geonorm"), AdamWOptions(weight_decay=0.1, groups=groups), CPU)
    assert {g["group"]: g["weight_decay"] for g in opt.param_groups} == {
        "matrices": 0.1, "embeddings": 0.0, "vectors": 0.05, "scalars": 0.0}
    with pytest.raises(ConfigError, match=r"optim\.groups\.scalars\.lr_mult=0"):
        AdamWOptions(groups=GroupsConfig(scalars=GroupConfig(lr_mult=0)))
    with pytest.raises(ConfigError, match=r"optim\.groups\.vectors\.weight_decay=-1"):
        AdamWOptions(groups=GroupsConfig(vectors=GroupConfig(weight_decay=-1)))


def test_group_overrides_through_hydra_and_unknown_group(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key\(s\) optim\.groups\.gains"):
        train(make_cfg(tmp_path / "bad", "+optim.groups.gains.lr_mult=2"))


@pytest.mark.slow
def test_resume_with_groups_is_exact(tmp_path):
    common = ["norm=geonorm", "train.max_steps=6", "optim.groups.scalars.lr_mult=30",
              "optim.groups.vectors.weight_decay=0.01"]
    sa, sb = assert_resume_is_exact(tmp_path, *common)
    assert [g["lr_mult"] for g in sb["optimizer"]["param_groups"] if g["group"] == "scalars"] == [30.0]


# ---- the switches for choices the papers leave open ----

def test_untied_head_has_its_own_weight_and_count():
    tied, untied = tiny(tie_embeddings=True), tiny(tie_embeddings=False)
    assert tied.lm_head.weight is tied.wte.weight
    assert untied.lm_head.weight is not untied.wte.weight
    n_wte = untied.wte.weight.numel()
    assert sum(p.numel() for p in untied.parameters()) == sum(p.numel() for p in tied.parameters()) + n_wte
    assert untied.num_params() == tied.num_params()  # non-embedding count: the head counts once either way
    assert math.isfinite(untied(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long))[1].item())


def test_learn_radius_false_fixes_g():
    m = tiny("proj_spheret", learn_radius=False)
    assert isinstance(m.input_step, ScaleNorm) and "g" in dict(m.input_step.named_buffers())
    e = torch.randn(2, 5, 32)
    assert torch.allclose(m.input_step(e).norm(dim=-1), torch.full((2, 5), math.sqrt(32)), atol=1e-5)


def test_decay_index_block_vs_sublayer():
    blk = tiny("geonorm", decay_index="block").rules()
    sub = tiny("geonorm", decay_index="sublayer").rules()
    assert [r.lam for r in blk] == pytest.approx([1, 1, 1 / 2, 1 / 2])  # harmonic over blocks k
    assert [r.lam for r in sub] == pytest.approx([1, 1 / 2, 1 / 3, 1 / 4])  # over sublayers j+1
    lin = tiny("proj_spheret", decay="linear", decay_index="sublayer").rules()
    assert [r.lam for r in lin] == pytest.approx([1, 3 / 4, 2 / 4, 1 / 4])  # (2N - j) / 2N


def test_initial_step_sizes():
    for r in tiny("proj_spheret", alpha_init=0.5).rules():
        assert F.softplus(r.rho).item() == pytest.approx(0.5)
    for r in tiny("geonorm", a_init=0.5).rules():
        assert r.a.item() == 0.5 and r.b.item() == 0.0
    assert F.softplus(tiny("proj_spheret").rules()[0].rho).item() == pytest.approx(1.0)


@pytest.mark.parametrize("kw, match", [
    ({"decay_index": "layer"}, r"norm\.decay_index='layer'.*block, sublayer"),
    ({"norm": "proj_spheret", "alpha_init": 0.0}, r"norm\.alpha_init=0\.0: must be a finite number > 0"),
    ({"a_init": float("nan")}, r"norm\.a_init=nan"),
    ({"alpha_init": 2.0}, r"norm\.alpha_init=2\.0: not an option of norm.name=geonorm"),  # SpheretNorm's, not GeoNorm's
    ({"tie_embeddings": "yes"}, r"model\.tie_embeddings='yes'"),
    ({"learn_radius": 1}, r"norm\.learn_radius=1"),
])
def test_switches_reject_bad_values(kw, match):
    with pytest.raises(ConfigError, match=match):
        gpt_config(
            **{"norm": "geonorm", "vocab_size": 64, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32, **kw}
        )


def test_switches_through_hydra(tmp_path):
    r = train(make_cfg(tmp_path / "r", "norm=proj_spheret", "model.tie_embeddings=false", "norm.learn_radius=false",
                       "norm.decay_index=sublayer", "norm.alpha_init=0.5", "train.max_steps=2"))
    assert r["steps"] == 2
    mc = ck.load_checkpoint(ck.find_latest(tmp_path / "r"))["model_config"]
    n = mc["norm"]
    assert (mc["tie_embeddings"], n["learn_radius"], n["decay_index"], n["alpha_init"]) == (
        False,
        False,
        "sublayer",
        0.5,
    )


def test_layer_ablation_script(tmp_path):
    """studies/fidelity/layer_ablation.py: base loss = the trainer's last sampled validation loss on the same budget;
    a block whose residual projections are zero (a Pre-LN block that adds nothing) costs nothing to skip."""
    import importlib.util
    import json
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "layer_ablation", Path(__file__).parents[1] / "studies" / "fidelity" / "layer_ablation.py"
    )
    la = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(la)
    run = tmp_path / "r"
    train(make_cfg(run, "train.max_steps=3"))
    final = records(run, "eval")[-1]["val_loss"]
    res = la.ablate(run, tokens=512)
    assert res["base_loss"] == pytest.approx(final, abs=1e-5)
    assert len(res["increase"]) == 2 and all(abs(x) > 1e-4 for x in res["increase"])
    path = ck.find_latest(run)
    state = torch.load(path, weights_only=False)
    for k in list(state["model"]):
        if k.startswith("blocks.1.") and ".c_proj." in k:
            state["model"][k].zero_()
    torch.save(state, path)
    res = la.ablate(run, tokens=512)
    assert abs(res["increase"][1]) < 1e-6 and abs(res["increase"][0]) > 1e-4
    assert la.main([str(run), "--tokens", "512"]) == 0
    assert json.loads((run / "layer_ablation.json").read_text())["norm"] == "pre_ln"
    assert (run / "layer_ablation.png").stat().st_size > 0
