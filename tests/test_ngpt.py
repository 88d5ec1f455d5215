"""nGPT (norm=ngpt): the rule, unit-norm states and weights after steps, the post-step hook (after applied
steps only), the variant's optimizer overrides, exact resume."""
import math

import pytest
import torch

from model import GPT, GPTConfig, VARIANTS
from model.variants import NGPT, PreLN, register
from runtime import checkpoint as ck
from trainer.config import optim_config
from trainer.loop import train
from trainer.optim import LRSchedule, build_optimizer, for_variant

from helpers import make_cfg, records, unregister  # noqa: E402  (the tiny training config)

D, V, T = 32, 64, 16


def tiny(**kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=D, norm="ngpt", **kw))


def assert_unit(model, tol=1e-5):
    for w, dim in NGPT.unit_matrices(model):
        assert torch.allclose(w.norm(dim=dim), torch.ones(()), atol=tol)


def test_rule_and_initial_scalers():
    model = tiny()
    rule = model.blocks[0].attn_rule
    h = torch.nn.functional.normalize(torch.randn(2, 5, D), dim=-1)
    s = torch.randn(2, 5, D) * 3
    want = h + 0.05 * (s / s.norm(dim=-1, keepdim=True) - h)          # alpha_A = 0.05 at init
    assert torch.allclose(rule(h, lambda x: s), want / want.norm(dim=-1, keepdim=True), atol=1e-6)
    attn = model.blocks[0].attn
    assert attn.scale == math.sqrt(D // 2)                             # softmax scale sqrt(d_k)
    assert torch.allclose(attn.qk_step.s_qk.value(), torch.ones(D))    # s_qk = 1, stored at 1/sqrt(d)
    assert torch.allclose(attn.qk_step.s_qk.s, torch.full((D,), D ** -0.5))
    assert torch.allclose(model.lm_head.s_z.value(), torch.ones(V))
    assert isinstance(model.output_step, torch.nn.Identity)            # no final norm
    assert_unit(model)                                                 # weights start on the sphere


@pytest.mark.parametrize("arch", [{}, dict(pos_emb="rope", mlp="swiglu", bias=False, tie_embeddings=False)])
def test_states_stay_unit_norm_and_the_hook_renormalizes(arch):
    model = tiny(**arch)
    x = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(1))
    _, _, hidden = model(x, x, return_hidden=True)
    for h in hidden:
        assert torch.allclose(h.norm(dim=-1), torch.ones(()), atol=1e-5)
    with torch.no_grad():
        for w, _ in NGPT.unit_matrices(model):
            w.mul_(1.5)
    before = [w.clone() for w, _ in NGPT.unit_matrices(model)]
    model.after_optimizer_step(torch.tensor(False))                    # skipped step: nothing moves
    assert all(torch.equal(w, b) for (w, _), b in zip(NGPT.unit_matrices(model), before))
    model.after_optimizer_step(torch.tensor(True))
    assert_unit(model)


def test_variant_fixes_no_weight_decay_and_no_warmup():
    o = for_variant(optim_config(dict(weight_decay=0.1, warmup_steps=50)), NGPT)
    assert o.weight_decay == 0.0 and o.warmup_steps == 0
    opt = build_optimizer(tiny(), o, torch.device("cpu"))
    assert all(g["weight_decay"] == 0.0 for g in opt.param_groups)
    assert LRSchedule(o, 100)(0.0) == o.lr
    assert for_variant(optim_config(), PreLN) == optim_config()          # other variants: untouched


@pytest.mark.slow
@pytest.mark.usefixtures("pydocs")
def test_trained_ngpt_stays_on_the_sphere_and_resumes_exactly(tmp_path):
    common = ["norm=ngpt", "arch=llama", "train.max_steps=6", "optim.lr=3e-3"]
    a, b = tmp_path / "straight", tmp_path / "resumed"
    train(make_cfg(a, *common))
    train(make_cfg(b, *common, "train.stop_at=3"))
    train(make_cfg(b, *common, "train.resume=auto"))
    la = [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in records(a, "train")]
    assert la == [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in records(b, "train")]
    assert la[0][3] == pytest.approx(3e-3, rel=1e-6)                   # no warmup (the config asks for 2)
    sa, sb = ck.load_checkpoint(ck.find_latest(a)), ck.load_checkpoint(ck.find_latest(b))
    for k, v in sa["model"].items():
        assert torch.equal(v, sb["model"][k]), k
    model, _ = ck.load_model(a)
    assert_unit(model)
    assert records(a, "eval")[-1]["val_loss"] < records(a, "eval")[0]["val_loss"]
    assert all(g["weight_decay"] == 0.0 for g in sa["optimizer"]["param_groups"])


class _Recorder(PreLN):
    """Pre-LN that records every post-step call (test only)."""
    calls: list = []

    @classmethod
    def after_step(cls, model, applied):
        cls.calls.append(bool(applied))


@pytest.mark.usefixtures("pydocs")
def test_loop_calls_the_hook_after_applied_steps_only(tmp_path):
    register("recorder")(_Recorder)
    try:
        _Recorder.calls = []
        train(make_cfg(tmp_path, "norm.name=recorder", "train.max_steps=5", "train.inject_nan_at=3"))
        assert _Recorder.calls == [True, True, False, True, True]
    finally:
        unregister(VARIANTS, "recorder")


def test_a_checkpoint_from_before_the_head_held_the_logit_scale_still_loads(tmp_path):
    """nGPT's logit scale was the GPT's `logit_step` module (key logit_step.s_z.s); it is now its head's
    (lm_head.s_z.s). A checkpoint with the old key loads, with the value it saved."""
    model = tiny()
    with torch.no_grad():
        model.lm_head.s_z.s.mul_(3.0)
    old = {("logit_step." + k[len("lm_head."):] if k.startswith("lm_head.s_z") else k): v
           for k, v in model.state_dict().items()}
    assert "logit_step.s_z.s" in old and "lm_head.s_z.s" not in old
    fresh = tiny()
    ck.load_weights(fresh, old, tmp_path / "old.pt", "this model")
    assert torch.equal(fresh.lm_head.s_z.s, model.lm_head.s_z.s)
    x = torch.randint(0, V, (2, 8))
    assert torch.equal(fresh(x)[0], model(x)[0])
