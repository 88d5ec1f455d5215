"""Extending nanonorm: a new variant, a variant's option, an optimizer, an LR schedule or a data source
is its code plus its test.

Each test defines the component here, as a user would in their own module, and uses it by name
through the same config path as the built-in ones (no YAML, no edits elsewhere).
"""
from dataclasses import dataclass

import pytest
from hydra.core.config_store import ConfigStore

from common import ConfigError
from model.variants import VARIANTS, NormOptions, Variant, register
from model.norms import make_norm
from trainer.config_store import register_code_configs
from trainer.loop import train
from trainer.schedules import SCHEDULES, Schedule

from helpers import make_cfg, records, unregister


@pytest.fixture
def scaled_pre_ln():
    @register("scaled_pre_ln")
    class ScaledPreLN(Variant):
        """h <- h + s F(Norm(h)): a new rule and its option `norm.scale`, declared in one class."""

        @dataclass
        class Options(NormOptions):
            scale: float = 0.5            # the factor s on F

        def __init__(self, cfg, j):
            super().__init__(cfg, j)
            self.norm = make_norm(cfg)
            self.scale = cfg.norm.scale

        def forward(self, h, f):
            return h + self.scale * f(self.norm(h))
    yield ScaledPreLN
    unregister(VARIANTS, "scaled_pre_ln")
    ConfigStore.instance().repo.get("norm", {}).pop("scaled_pre_ln.yaml", None)  # its code-only `norm` option


@pytest.mark.slow
def test_new_variant_is_a_norm_option_without_yaml(tmp_path, scaled_pre_ln):
    assert "scaled_pre_ln" in register_code_configs()
    r = train(make_cfg(tmp_path / "r", "norm=scaled_pre_ln", "train.max_steps=3"))
    assert r["steps"] == 3
    assert records(tmp_path / "r", "summary")[0]["norm"] == "scaled_pre_ln"
    assert {"pre_ln", "scaled_pre_ln"} <= set(register_code_configs())  # every variant's option: its Options


def test_new_variant_option_is_one_field(tmp_path, scaled_pre_ln):
    register_code_configs()
    r = train(make_cfg(tmp_path / "r", "norm=scaled_pre_ln", "norm.scale=0.25", "train.max_steps=2"))
    assert r["steps"] == 2
    from runtime import checkpoint as ck
    assert ck.load_checkpoint(ck.find_latest(tmp_path / "r"))["model_config"]["norm"]["scale"] == 0.25
    with pytest.raises(ConfigError, match=r"^bad config norm.scale=0.25: not an option of norm.name=pre_ln"):
        train(make_cfg(tmp_path / "bad", "norm=pre_ln", "norm.scale=0.25"))
    with pytest.raises(ConfigError, match=r"^bad config norm.scale='x': must be a number$"):
        train(make_cfg(tmp_path / "bad2", "norm=scaled_pre_ln", "norm.scale=x"))


def test_new_norm_kind_is_one_factory_under_its_name(tmp_path):
    """The architecture page's recipe for a Norm kind, in a user's module: a factory `cfg -> module` registered
    under its name; every variant's Norms take it by `norm.kind`, no YAML, and a wrong name lists it."""
    import torch

    from model.norm_options import NORM_KINDS
    from model.norms import RMSNorm

    class HalfRMSNorm(RMSNorm):
        def forward(self, x):
            return 0.5 * super().forward(x)

    NORM_KINDS.register("half_rms")(lambda cfg: HalfRMSNorm(cfg.n_embd, cfg.norm.eps))
    try:
        from model import GPT, GPTConfig
        model = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2, n_embd=16,
                              norm={"name": "peri_ln", "kind": "half_rms"}))
        assert isinstance(model.blocks[0].attn_rule.norm_in, HalfRMSNorm)
        assert isinstance(model.input_step, HalfRMSNorm)
        assert torch.isfinite(model(torch.arange(8)[None])[0]).all()
        r = train(make_cfg(tmp_path / "r", "norm.kind=half_rms", "train.max_steps=2"))
        assert r["steps"] == 2
    finally:
        unregister(NORM_KINDS, "half_rms")
    with pytest.raises(ConfigError, match=r"^unknown norm.kind='half_rms': valid are layernorm, rmsnorm, derf, "
                                          r"seednorm$"):
        train(make_cfg(tmp_path / "bad", "norm.kind=half_rms"))


def test_a_variant_that_changes_a_sublayer_is_one_subclass_of_it(tmp_path):
    """A variant whose novelty is inside attention (here: a fixed softmax temperature) subclasses GPT-2's
    attention and names it; model/gpt.py and the trainer need no edit."""
    import torch

    from model import GPT, GPTConfig
    from model.sublayers import CausalSelfAttention
    from model.variants import PreLN

    class HotAttention(CausalSelfAttention):
        scale = 0.05  # instead of SDPA's 1/sqrt(head dim)

    @register("hot_pre_ln")
    class HotPreLN(PreLN):
        """Pre-LN with HotAttention."""
        Attention = HotAttention

    try:
        def logits(norm):
            torch.manual_seed(0)
            model = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2, n_embd=16, norm=norm))
            return model, model(torch.arange(8)[None])[0]

        hot, hot_logits = logits("hot_pre_ln")
        assert isinstance(hot.blocks[0].attn, HotAttention)
        assert hot_logits.shape == logits("pre_ln")[1].shape and not torch.equal(hot_logits, logits("pre_ln")[1])
        register_code_configs()
        assert train(make_cfg(tmp_path / "r", "norm=hot_pre_ln", "train.max_steps=2"))["steps"] == 2
    finally:
        unregister(VARIANTS, "hot_pre_ln")
        ConfigStore.instance().repo.get("norm", {}).pop("hot_pre_ln.yaml", None)


def test_new_lr_schedule_is_one_class(tmp_path):
    from trainer.schedules import ScheduleOptions

    @SCHEDULES.register("step_down")
    class StepDown(Schedule):
        """lr until half of the steps, then lr x `optim.drop_to`: its own key, one field."""

        @dataclass(frozen=True)
        class Options(ScheduleOptions):
            drop_to: float = 0.5          # the lr factor after half of the steps

        def main(self, u, ops):
            return ops.where(u < self.max_steps / 2, u * 0 + self.lr, u * 0 + self.lr * self.options.drop_to)
    try:
        r = train(make_cfg(tmp_path / "r", "optim.schedule=step_down", "optim.drop_to=0.25", "optim.warmup_steps=0",
                           "optim.lr=0.01", "train.max_steps=4"))
        assert r["steps"] == 4
        lrs = [rec["lr"] for rec in records(tmp_path / "r", "train")]
        assert lrs == pytest.approx([0.01, 0.01, 0.0025, 0.0025])
        with pytest.raises(ConfigError, match=r"^bad config optim.drop_to=0.25: not an option of "
                                              r"optim.schedule=cosine \(its options: none"):
            train(make_cfg(tmp_path / "bad", "optim.drop_to=0.25"))
    finally:
        unregister(SCHEDULES, "step_down")
    with pytest.raises(ConfigError, match=r"unknown optim.schedule='step_down': valid are cosine, wsd, constant"):
        train(make_cfg(tmp_path / "bad", "optim.schedule=step_down"))


def test_new_optimizer_is_one_class(tmp_path):
    import torch

    from trainer.config import OptimConfig
    from trainer.optim import OPTIMIZERS, Optimizer, group_settings

    @OPTIMIZERS.register("sgd")
    class SGD:
        """SGD with momentum over the model's parameter groups, each with its lr multiplier."""

        @dataclass(frozen=True)
        class Options(OptimConfig):
            momentum: float = 0.0         # SGD momentum

        @staticmethod
        def build(model, ocfg, device):
            settings = group_settings(ocfg)
            groups = [{"params": [p for _, p in named], "group": g, "lr_mult": settings[g][0], "lr": ocfg.lr}
                      for g, named in model.parameter_groups().items() if named]
            inner = torch.optim.SGD(groups, lr=ocfg.lr, momentum=ocfg.momentum)
            return Optimizer(inner, torch.tensor(ocfg.lr), [torch.tensor(ocfg.lr) for _ in groups], settings,
                             fused=False)
    try:
        r = train(make_cfg(tmp_path / "r", "optim=sgd", "optim.momentum=0.9", "optim.lr=0.1",
                           "train.max_steps=3"))
        assert r["steps"] == 3
        lrs = [rec["lr"] for rec in records(tmp_path / "r", "train")]
        assert lrs[0] < lrs[1] and all(x > 0 for x in lrs)  # the schedule's warmup drives it like the others
        with pytest.raises(ConfigError, match=r"^bad config optim.momentum=0.9: not an option of optim.name=adamw"):
            train(make_cfg(tmp_path / "bad", "optim.momentum=0.9"))  # at composition: adamw's node lacks it
        with pytest.raises(ConfigError, match=r"^bad config optim.betas=\[0.9,0.99\]: not an option of "
                                              r"optim.name=sgd"):
            train(make_cfg(tmp_path / "bad", "optim=sgd", "optim.betas=[0.9,0.99]"))
    finally:
        unregister(OPTIMIZERS, "sgd")
        ConfigStore.instance().repo.get("optim", {}).pop("sgd.yaml", None)  # its code-only `optim` option
    with pytest.raises(ConfigError, match=r"unknown optim=sgd: valid are adamw, muon"):
        train(make_cfg(tmp_path / "bad", "optim=sgd"))


def test_new_data_source_is_one_function_with_its_own_typed_keys(tmp_path):
    """A source and its keys, no YAML: the keys exist only under that source, typed, each error one line."""
    from common.config import PosInt
    from data.config import DataConfig, DataError
    from data.sources import SOURCES, Stream, open_streams

    @dataclass
    class NumbersOptions(DataConfig):
        count: PosInt = 49                # how many documents

    @SOURCES.register("numbers", options=NumbersOptions)
    def numbers(cfg):
        docs = [f"document {i}: " + "ab " * i for i in range(1, cfg.count + 1)]
        return [Stream(label="numbers", split=None, total=len(docs), batches=lambda skip: iter([docs[skip:]]))]
    try:
        cfg = DataConfig.from_any({"source": "numbers", "root": str(tmp_path), "count": 3})  # no YAML, no name
        assert isinstance(cfg, NumbersOptions) and cfg.count == 3
        assert cfg.out_dir == tmp_path / "numbers-bytes"                         # named after its source
        (stream,) = open_streams(cfg)
        assert next(stream.batches(0)) == ["document 1: ab ", "document 2: ab ab ", "document 3: ab ab ab "]
        assert "count" in cfg.content()                                          # it changes the tokens
        with pytest.raises(DataError, match=r"^bad config data.count=0: must be a positive integer$"):
            DataConfig.from_any({"source": "numbers", "count": 0})
        with pytest.raises(DataError, match=r"^bad config data.count=3: not an option of data.source=pydocs "
                                            r"\(its options: name, tokenizer, .*, batch_docs\)$"):
            DataConfig.from_any({"source": "pydocs", "count": 3})
    finally:
        unregister(SOURCES, "numbers")
    with pytest.raises(Exception, match=r"unknown data.source='numbers'"):
        DataConfig.from_any({"name": "n", "source": "numbers", "tokenizer": "bytes", "root": str(tmp_path)})


def test_a_sources_keys_exist_only_under_that_source():
    """`data.files` is local's, `data.path` hf's and shards': set under another source, one line naming the
    chosen source's keys; null (the schema's value when no file sets it) is that key's default."""
    from data.config import DataConfig, DataError, HubOptions, LocalOptions, PysrcOptions

    assert not hasattr(DataConfig.from_any({"source": "pydocs"}), "files")
    assert isinstance(DataConfig.from_any({"source": "pysrc", "files": None, "packages": ["torch"]}), PysrcOptions)
    hub = DataConfig.from_any({"source": "hf", "path": "HuggingFaceFW/fineweb-edu", "split": None})
    assert isinstance(hub, HubOptions) and hub.split == "train" and hub.content()["path"] == hub.path
    assert isinstance(DataConfig.from_any({"source": "local", "files": "a/*.txt"}), LocalOptions)
    with pytest.raises(DataError, match=r"^bad config data.files='c/\*.txt': not an option of data.source=hf "
                                        r"\(its options: .*, path, subset, revision, split, val_split\)$"):
        DataConfig.from_any({"source": "hf", "path": "x/y", "files": "c/*.txt"})
    with pytest.raises(DataError, match=r"^unknown key\(s\) data.filez: valid keys are name, "):
        DataConfig.from_any({"source": "local", "files": "a", "filez": "b"})
    # a run dir written when every source's keys sat in one flat group: each at its default, so it still loads
    old = {"name": "pysrc", "source": "pysrc", "tokenizer": "bytes", "path": None, "subset": None, "revision": None,
           "split": "train", "val_split": None, "text_column": "text", "streaming": False, "cache_dir": None,
           "files": None, "val_files": None, "pile_set_name": None, "packages": ["torch"], "sha256": None,
           "near_duplicates": 0.5, "txt_sample_by": "document", "val_fraction": 0.005}
    assert DataConfig.from_any(old).packages == ["torch"]
    with pytest.raises(DataError, match=r"^bad config data.split='validation': not an option of data.source=pysrc"):
        DataConfig.from_any({**old, "split": "validation"})


@pytest.mark.slow
def test_new_study_is_one_yaml_file(tmp_path, pydocs, load_script, capfd, monkeypatch):
    """A study is data: its cells and parts in a YAML file; scripts/study.py runs it (resumable) and
    writes its tables, wall time and commits."""
    import yaml

    from helpers import TINY

    study = {"experiment": "fidelity", "seeds": [0], "reference": "pre_ln",
             "tune": {"key": "optim.lr", "ladder": [1.0e-3, 3.0e-3], "width": 1},
             "cells": {"pre_ln": {"overrides": {"norm": "pre_ln"}, "start": 3.0e-3}},
             "parts": [{"name": "grid", "kind": "grid", "sweep": "mini_a"},
                       {"name": "seeds", "kind": "rerun", "of": "grid", "sweep": "mini_b", "pick": ["pre_ln"],
                        "seeds": [1]}]}
    path = tmp_path / "mini.yaml"
    path.write_text(yaml.safe_dump(study))
    argv = [str(path), "--runs-root", str(tmp_path / "runs"), "--docs", str(tmp_path / "docs"), "--", *TINY,
            "train.max_steps=2"]
    for _ in range(2):   # the second time every run is finished: nothing runs again
        capfd.readouterr()
        assert load_script("study").main(argv) == 0   # its sweeps and runs are subprocesses, as on the command line
    assert "2 finished, 0 to resume, 0 to restart, 0 new" in capfd.readouterr().out
    assert sorted(p.name for p in (tmp_path / "runs" / "mini_a").glob("*-s0")) == [
        "pre_ln-lr-0.001-s0", "pre_ln-lr-0.003-s0"]
    assert [p.name for p in (tmp_path / "runs" / "mini_b").glob("*-s*")] and \
        all(p.name.endswith("-s1") for p in (tmp_path / "runs" / "mini_b").glob("*-s*"))
    manifest = yaml.safe_load((tmp_path / "runs" / "mini_a" / "sweep.json").read_text())
    assert {p["cell"] for p in manifest["points"]} == {"pre_ln"}   # the cell is recorded, not parsed back
    tables = (tmp_path / "docs" / "mini" / "tables.md").read_text()
    assert "## mini_a" in tables and "| pre_ln | 0.001: " in tables and "(edge)" in tables
    assert "| loss spikes at each lr (all seeds) |" in tables and "| 0.001: 0, 0.003: 0 |" in tables
    times = yaml.safe_load((tmp_path / "runs" / "mini_times.json").read_text())
    assert set(times) == {"grid", "seeds"}
    assert set(yaml.safe_load((tmp_path / "runs" / "mini_commits.json").read_text())) == {"grid", "seeds"}
    best = yaml.safe_load((tmp_path / "docs" / "mini" / "a_best.json").read_text())  # sweep mini_a, less "mini_"
    assert set(best) == {"pre_ln"} and best["pre_ln"]["edge"]   # two lrs tried: the best is at an edge
