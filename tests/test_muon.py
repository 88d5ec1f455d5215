"""optim=muon: torch.optim.Muon on the matrices (Q, K, V split), AdamW on the rest, one LR schedule,
exact resume, the non-finite guard for both, and one-line errors."""

import pytest
import torch

from model import GPT, GPTConfig
from common import ConfigError
from trainer.config import optim_config
from trainer.loop import train
from trainer.optim import MuonAdamW, build_optimizer

from helpers import assert_resume_is_exact, make_cfg, records, run_with_a_nan_step  # noqa: E402  (the tiny training config)

pytestmark = pytest.mark.usefixtures("pydocs")
D = 32


def tiny(arch_kw=None):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=D, **(arch_kw or {})))


def test_q_k_v_are_orthogonalized_as_separate_matrices():
    model = tiny()
    ocfg = optim_config(dict(name="muon", lr=0.01, weight_decay=0.0, muon=dict(lr=0.05)))
    opt = build_optimizer(model, ocfg, torch.device("cpu"))
    opt.set_lr(torch.tensor(0.01))
    x = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(1))
    model(x, x)[1].backward()
    w = model.blocks[0].attn.c_attn.weight
    before, grad = w.detach().clone(), w.grad.clone()
    fc = model.blocks[0].mlp.c_fc.weight
    fc_before, fc_grad = fc.detach().clone(), fc.grad.clone()
    opt.step()

    def muon_step(w0, g):  # the reference: one torch.optim.Muon step on a separate matrix
        p = torch.nn.Parameter(w0.clone())
        p.grad = g.clone()
        torch.optim.Muon([p], lr=0.05, weight_decay=0.0, momentum=0.95, nesterov=True, ns_steps=5).step()
        return p.detach()

    for i in range(3):  # q, k, v rows
        rows = slice(i * D, (i + 1) * D)
        assert torch.allclose(w.detach()[rows], muon_step(before[rows], grad[rows]), atol=1e-6), i
    assert not torch.allclose(w.detach(), muon_step(before, grad), atol=1e-4)  # the fused reading differs
    assert torch.allclose(fc.detach(), muon_step(fc_before, fc_grad), atol=1e-6)  # 4d x d, lr x sqrt(4)
    opt.zero_grad()
    assert w.grad is None and all(v.grad is None for _, vs in opt.inner.splits for v in vs)
    groups = {g["group"] for g in opt.param_groups}
    assert groups == {"matrices", "embeddings", "vectors"}
    assert [g["group"] for g in opt.inner.muon.param_groups] == ["matrices"]
    assert id(model.wte.weight) not in {id(p) for g in opt.inner.muon.param_groups for p in g["params"]}


def test_muon_lr_follows_the_schedule_shape():
    model = tiny()
    opt = build_optimizer(model, optim_config(dict(name="muon", lr=0.008, muon=dict(lr=0.05))), torch.device("cpu"))
    opt.set_lr(torch.tensor(0.004))  # half the peak
    lrs = {g["group"]: float(g["lr"]) for g in opt.param_groups}
    assert lrs["matrices"] == pytest.approx(0.025) and lrs["embeddings"] == pytest.approx(0.004)


@pytest.mark.slow
def test_muon_trains_on_llama_and_resumes_exactly(tmp_path):
    common = ["optim=muon", "arch=llama", "train.max_steps=6", "optim.warmup_steps=2", "optim.decay_frac=0.5"]
    sa, sb = assert_resume_is_exact(tmp_path, *common)
    assert set(sa["optimizer"]) == {"adamw", "muon"}
    for pid, st in sa["optimizer"]["muon"]["state"].items():
        assert torch.equal(st["momentum_buffer"], sb["optimizer"]["muon"]["state"][pid]["momentum_buffer"])
    ev = records(tmp_path / "straight", "eval")
    assert ev[-1]["val_loss"] < ev[0]["val_loss"] - 0.5


@pytest.mark.slow
def test_nonfinite_step_skips_muon_and_adamw(tmp_path):
    nan, clean = run_with_a_nan_step(tmp_path, "optim=muon")
    for part in ("adamw", "muon"):
        for pid, st in clean["optimizer"][part]["state"].items():
            for name, t in st.items():
                assert torch.equal(t, nan["optimizer"][part]["state"][pid][name]), (part, pid, name)


def test_muon_errors_are_one_line(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="train.precision='fp16'.*optim=muon") as err:
        train(make_cfg(tmp_path / "a", "optim=muon", "train.precision=fp16"))
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="optim.muon.momentum"):
        train(make_cfg(tmp_path / "b", "optim=muon", "optim.muon.momentum=1.5"))
    monkeypatch.delattr(torch.optim, "Muon")
    with pytest.raises(ConfigError, match=r"optim=muon needs torch >= 2.9 \(torch.optim.Muon\); this is torch "):
        MuonAdamW(tiny(), optim_config(dict(name="muon")), torch.device("cpu"))
