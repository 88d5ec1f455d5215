"""Run names carry the overrides that change what is trained, so the README's one-axis commands after the
quick start get their own run dirs, and resuming with a longer horizon keeps the same one."""
import subprocess
import sys

import pytest

from helpers import REPO
from trainer.run_name import run_tag

BASE = "pre_ln-tiny-gpt2-adamw-pydocs-s1337"


def test_tag_names_what_is_trained_and_leaves_out_how_long_where_and_logging():
    assert run_tag([]) == ""
    assert run_tag(["model.attn_gate=headwise"]) == "-attn_gate=headwise"
    assert run_tag(["norm.sublayer_input=raw", "model.init=fan_in"]) == "-init=fan_in,sublayer_input=raw"
    for same in (["train.max_steps=2000", "train.resume=auto"], ["logging.log_interval=5", "out_dir=x"],
                 ["norm=geonorm", "model=gpt_125m", "train.seed=3"], ["data.num_proc=4"]):
        assert run_tag(same) == "", same  # in the name already, or not what is trained
    assert run_tag(["optim.lr=1e-3"]) != run_tag(["optim.lr=3e-3"])
    assert run_tag(["model.init=fan_in", "optim.lr=1e-3", "data.files=/a/b.txt"]).startswith("-h")  # a path: hashed
    assert run_tag(["a=1", "+model.init=fan_in"]) == "-init=fan_in"
    assert run_tag(["model.init=a", "model.init=b"]) == "-init=b"  # the last spelling wins, as in Hydra


def composed_run_name(*overrides):
    p = subprocess.run([sys.executable, "train.py", *overrides, "--cfg", "job", "--resolve"], cwd=REPO,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return next(line.split(": ", 1)[1] for line in p.stdout.splitlines() if line.startswith("run_name:"))


@pytest.mark.slow
def test_readme_commands_after_the_quick_start_get_their_own_run_dirs():
    names = [composed_run_name(*o) for o in ([], ["model.attn_gate=headwise"], ["norm.embed_norm=scalenorm"],
                                            ["model.init=fan_in"])]
    assert names[0] == BASE
    assert len(set(names)) == len(names) and all(n.startswith(BASE) for n in names), names
    geonorm = "geonorm" + BASE.removeprefix("pre_ln")
    assert composed_run_name("norm=geonorm") == geonorm
    assert composed_run_name("norm=geonorm", "norm.sublayer_input=raw") == geonorm + "-sublayer_input=raw"
    assert composed_run_name("train.max_steps=2000", "train.resume=auto") == BASE  # a longer run continues


def test_a_corpus_without_a_name_is_named_after_its_source_in_the_run_name_and_its_data_dir():
    """data.name has a default (null: the source's name), so a source needs no YAML; the run name reads the
    same name the prepared dir does, not 'None'."""
    from helpers import compose_config

    from data.config import DataConfig

    cfg = compose_config(["data.name=null", "data.source=pysrc"])
    assert cfg.run_name == "pre_ln-tiny-gpt2-adamw-pysrc-s1337"
    assert DataConfig.from_any(cfg.data).out_dir.name == "pysrc-bytes"
    assert compose_config(["data.source=pysrc"]).run_name.endswith("-pydocs-s1337")   # a name given is kept
