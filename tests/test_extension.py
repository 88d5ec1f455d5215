"""Extending nanonorm: a new variant, LR schedule or data source is its code plus its test.

Each test defines the component here, as a user would in their own module, and uses it by name
through the same config path as the built-in ones (no YAML, no edits elsewhere).
"""
import pytest

from common import ConfigError
from model.variants import VARIANTS, Variant, register
from model.norms import make_norm
from trainer.config_store import register_code_configs
from trainer.loop import train
from trainer.schedules import SCHEDULES, Schedule

from test_train import make_cfg, records


@pytest.fixture
def scaled_pre_ln():
    @register("scaled_pre_ln")
    class ScaledPreLN(Variant):
        """h <- h + 0.5 F(Norm(h)): a new rule, declared in one class."""

        def __init__(self, cfg, j):
            super().__init__(cfg, j)
            self.norm = make_norm(cfg)

        def forward(self, h, f):
            return h + 0.5 * f(self.norm(h))
    yield ScaledPreLN
    VARIANTS.unregister("scaled_pre_ln")


def test_new_variant_is_a_norm_option_without_yaml(tmp_path, scaled_pre_ln):
    assert "scaled_pre_ln" in register_code_configs()
    r = train(make_cfg(tmp_path / "r", "norm=scaled_pre_ln", "train.max_steps=3"))
    assert r["steps"] == 3
    assert records(tmp_path / "r", "summary")[0]["norm"] == "scaled_pre_ln"
    assert "pre_ln" not in register_code_configs()  # variants with a YAML keep it


def test_new_lr_schedule_is_one_class(tmp_path):
    @SCHEDULES.register("step_half")
    class StepHalf(Schedule):
        """lr until half of the steps, then lr / 2."""

        def main(self, u, ops):
            return ops.where(u < self.max_steps / 2, u * 0 + self.lr, u * 0 + self.lr / 2)
    try:
        r = train(make_cfg(tmp_path / "r", "optim.schedule=step_half", "optim.warmup_steps=0", "optim.lr=0.01",
                           "train.max_steps=4"))
        assert r["steps"] == 4
        lrs = [rec["lr"] for rec in records(tmp_path / "r", "train")]
        assert lrs == pytest.approx([0.01, 0.01, 0.005, 0.005])
    finally:
        SCHEDULES.unregister("step_half")
    with pytest.raises(ConfigError, match=r"unknown optim.schedule='step_half': valid are cosine, wsd, constant"):
        train(make_cfg(tmp_path / "bad", "optim.schedule=step_half"))


def test_new_data_source_is_one_function(tmp_path):
    from data.config import DataConfig
    from data.sources import SOURCES, Stream, open_streams

    @SOURCES.register("numbers")
    def numbers(cfg):
        docs = [f"document {i}: " + "ab " * i for i in range(1, 50)]
        return [Stream(label="numbers", split=None, total=len(docs), batches=lambda skip: iter([docs[skip:]]))]
    try:
        cfg = DataConfig.from_any({"name": "n", "source": "numbers", "tokenizer": "bytes", "root": str(tmp_path)})
        (stream,) = open_streams(cfg)
        assert next(stream.batches(0))[0] == "document 1: ab "
    finally:
        SOURCES.unregister("numbers")
    with pytest.raises(Exception, match=r"unknown data.source='numbers'"):
        DataConfig.from_any({"name": "n", "source": "numbers", "tokenizer": "bytes", "root": str(tmp_path)})
