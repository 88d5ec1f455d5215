"""The typed config layer: defaults written once (in the dataclasses), YAML files holding only what
differs, overrides without `+`, and one-line errors for unknown keys, wrong types and unknown options."""
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from common import ConfigError
from common.config import build, composition_error_line, field_docs
from data.config import DataConfig
from evaluation.config import EvalConfig
from model.config import GPTConfig, ModelGroup
from model.norm_options import NormOptions
from model.variants import VARIANTS
from trainer.config import (GroupConfig, LoggingConfig, OptimConfig, TrainConfig, WandbConfig, optim_config,
                            parse_run_config)
from trainer.optim import MuonSettings
from trainer.config_store import compose_config, group_defaults, register_code_configs

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


def composed(*overrides):
    register_code_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose("config", overrides=list(overrides))


def test_keys_missing_from_the_yaml_are_overridden_without_plus():
    cfg = composed("norm=geonorm", "norm.clamp=0.5", "train.max_steps=3", "optim.groups.scalars.lr_mult=30",
                   "data.max_docs=10")
    rc = parse_run_config(cfg)
    assert rc.train.max_steps == 3 and rc.optim.groups.scalars == GroupConfig(lr_mult=30.0, weight_decay=0.0)
    m = GPTConfig.from_hydra(cfg.model, cfg.norm, vocab_size=257)
    assert m.norm.name == "geonorm" and m.norm.clamp == 0.5
    assert DataConfig.from_any(cfg.data).max_docs == 10


def test_default_composition_is_the_dataclass_defaults():
    cfg = composed("logging.wandb.mode=offline")
    rc = parse_run_config(cfg)
    assert rc.train == TrainConfig() and rc.optim == optim_config() and rc.logging == LoggingConfig()
    muon = parse_run_config(composed("optim=muon")).optim  # a partial `groups` keeps the other defaults
    assert muon.groups.vectors == GroupConfig(lr_mult=5.0, weight_decay=0.0) and muon.groups.matrices == GroupConfig()
    assert muon.muon == MuonSettings()


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_defaults_come_from_its_class_through_hydra(name):
    cfg = composed(f"norm={name}")  # the variant's own keys at its own defaults, and no other key
    assert OmegaConf.to_container(cfg.norm) == asdict(VARIANTS[name].Options(name=name))
    m = GPTConfig.from_hydra(cfg.model, cfg.norm, vocab_size=257)
    assert m.norm == VARIANTS[name].Options(name=name)
    assert GPTConfig(norm=m.norm).norm is m.norm  # built and checked once, then kept


def test_an_explicit_setting_beats_the_variant_default():
    cfg = composed("norm=geonorm", "norm.decay=none", "norm.final_norm=false")
    m = GPTConfig.from_hydra(cfg.model, cfg.norm, vocab_size=257)
    assert (m.norm.decay, m.norm.final_norm) == ("none", False)


@pytest.mark.slow
def test_wrong_types_are_one_line_naming_the_key():
    for override, msg in (
        ("train.max_steps=abc", "bad config train.max_steps='abc': must be an integer"),
        ("norm=geonorm norm.clamp=abc", "bad config norm.clamp='abc': must be a number"),
        (
            "norm.clamp=0.5",
            "bad config norm.clamp=0.5: not an option of norm.name=pre_ln (its "
            "options: name, kind, eps, embed_norm, final_norm, learn_radius, derf_alpha)",
        ),
        ("model.bias=1", "bad config model.bias=1: must be true or false"),
        ("optim.groups.vectors.lr_mult=[1]", "bad config optim.groups.vectors.lr_mult=[1]: must be a number"),
        ("optim.groups=5", "bad config optim.groups=5: must be a group of keys"),
        ("logging.wandb=3", "bad config logging.wandb=3: must be a group of keys"),
        ("norm=geonorm norm.streams=2", "bad config norm.streams=2: not an option of norm.name=geonorm (its "
         "options: name, kind, eps, embed_norm, final_norm, learn_radius, derf_alpha, decay, decay_index, "
         "sublayer_input, target_angle, clamp, a_init)"),
        ("norm.clampp=0.5", "unknown key(s) norm.clampp: valid keys are name, kind, eps, embed_norm, final_norm, "
         "learn_radius, derf_alpha"),
    ):
        with pytest.raises(ConfigError) as e:  # at composition (a key the variant lacks) or when built (a value)
            parse_run_config(compose_config(override.split()))
        assert str(e.value) == msg


def test_composition_errors_become_one_line():
    for override, msg in (
        ("norm=nope", "unknown norm=nope: valid are " + ", ".join(sorted(VARIANTS))),  # Hydra sorts them
        ("model.foo=1", "unknown key(s) model.foo: valid keys are " + ", ".join(group_defaults()["model"])),
    ):
        with pytest.raises(ConfigCompositionException) as e:
            composed(override)
        assert composition_error_line(e.value, group_defaults()) == msg
    adamw = "name, lr, min_lr, weight_decay, grad_clip, schedule, warmup_steps, groups, betas, eps, fused, decay_frac"
    for overrides, msg in (  # the optim group: one option per optimizer, its own keys only
        (["optim.groups.gains.lr_mult=2"],
         "unknown key(s) optim.groups.gains: valid keys are matrices, embeddings, vectors, scalars"),
        (["optim.muon.lr=0.1"], f"bad config optim.muon.lr=0.1: not an option of optim.name=adamw (its options: "
                                f"{adamw})"),
        (["optim=muon", "optim.muon.foo=1"], "unknown key(s) optim.muon.foo: valid keys are lr, momentum, nesterov, "
                                             "ns_steps"),
        (["optim.momentum=1"], f"unknown key(s) optim.momentum: valid keys are {adamw}"),
        (["optim=sgd"], "unknown optim=sgd: valid are adamw, muon"),
    ):
        with pytest.raises(ConfigError) as e:
            compose_config(overrides)
        assert str(e.value) == msg


@pytest.mark.slow
def test_train_py_reports_an_unknown_key_in_one_line(tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled"}
    p = subprocess.run([sys.executable, "train.py", "+model.foo=1", f"out_dir={tmp_path}"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and p.stderr.startswith(
        "error: unknown key(s) model.foo: "
    )
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.slow
def test_train_py_reports_an_unwritable_run_dir_in_one_line(tmp_path):
    (tmp_path / "afile").write_text("")  # a file where the run dir should go: unwritable even as root
    env = {**os.environ, "WANDB_MODE": "disabled"}
    p = subprocess.run([sys.executable, "train.py", f"out_dir={tmp_path / 'afile' / 'run'}"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip() == (f"error: cannot create the run dir {tmp_path / 'afile' / 'run'} (Not a directory), "
                                "chosen by out_dir: pass a writable out_dir=... (default runs/<run_name>)")


def _leaves(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def test_yaml_files_hold_only_what_differs_from_the_defaults():
    """A key whose YAML value equals its dataclass default would be a second place that default lives."""
    schema = group_defaults()
    flat = {g: dict(_leaves(d)) for g, d in schema.items()} | {"norm": asdict(NormOptions())}
    assert not (CONFIGS / "norm").exists()  # the variants' options are made from their Options, no file
    for group in ("model", "data", "train", "optim", "logging"):
        for path in sorted((CONFIGS / group).glob("*.yaml")):
            content = yaml.safe_load(path.read_text()) or {}
            own = flat[group]
            for key, value in _leaves({k: v for k, v in content.items() if k != "defaults"}):
                if group == "optim" and key.startswith("schedule."):  # a nested schedule: its name and keys
                    key = "schedule" if key == "schedule.name" else key.removeprefix("schedule.")
                assert key in flat[group], f"{path.name}: {group}.{key} is not a key"
                assert key == "name" or value != own[key], f"{path.name}: {group}.{key} restates its default"
    for path in sorted((CONFIGS / "arch").glob("*.yaml")):  # presets: model.* axes and norm.kind
        for key, value in _leaves(yaml.safe_load(path.read_text())):
            group, _, sub = key.partition(".")
            assert sub == "arch" or value != flat[group][sub], f"arch/{path.name}: {key} restates its default"


def test_experiment_files_hold_only_what_differs_from_what_they_compose():
    """An experiment picks group files in its `defaults` list and then sets keys: a key set to the value
    those groups already give it is a second place that value lives (it would not follow a change)."""
    for path in sorted((CONFIGS / "experiment").glob("*.yaml")):
        content = yaml.safe_load(path.read_text()) or {}
        picks = [f"{k.split('/')[-1]}={v}" for d in content.get("defaults", []) if isinstance(d, dict)
                 for k, v in d.items() if k.startswith("override /")]
        base = dict(_leaves(OmegaConf.to_container(composed(*picks), resolve=False)))
        for key, value in _leaves({k: v for k, v in content.items() if k not in ("defaults", "experiment_meta")}):
            if isinstance(value, (list, tuple)) and isinstance(base.get(key), (list, tuple)):
                value, other = list(value), list(base[key])
            else:
                other = base.get(key, object())
            assert value != other, f"experiment/{path.name}: {key}={value!r} restates what its groups give"


def test_every_config_field_has_a_one_line_doc():
    from trainer.optim import OPTIMIZERS
    from trainer.schedules import SCHEDULES

    for cls in (GPTConfig, ModelGroup, DataConfig, TrainConfig, OptimConfig, GroupConfig, MuonSettings, LoggingConfig,
                WandbConfig, EvalConfig, *OPTIMIZERS.all_options().values(), *SCHEDULES.all_options().values()):
        own = set(vars(cls).get("__annotations__", {}))  # the fields this class declares (not inherited)
        assert own <= set(field_docs(cls)), (cls.__qualname__, own - set(field_docs(cls)))


def test_builder_refuses_null_and_unknown_keys_in_nested_groups():
    with pytest.raises(ConfigError, match=r"^bad config optim.lr=None: must not be null$"):
        build(OptimConfig, {"lr": None}, "optim")
    with pytest.raises(ConfigError, match=r"^unknown key\(s\) logging.wandb.mood: valid keys are mode, "):
        build(LoggingConfig, {"wandb": {"mood": "online"}}, "logging")
    assert EvalConfig().tasks[:2] == ["lambada_openai", "wikitext"] and len(EvalConfig().tasks) == 11


@pytest.mark.slow
def test_help_and_a_bad_key_answer_without_torch(tmp_path):
    """The schema is torch-free (every key and default from torch-free Options): `--help` and a
    composition error need no torch and no cache."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "WANDB_MODE": "disabled"}

    def run(*argv, script="train.py"):
        p = subprocess.run([sys.executable, "-X", "importtime", script, *argv], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=600)
        imported = {
            line.rsplit("|", 1)[-1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")
        }
        return p, imported

    first, imported = run("--help")
    assert first.returncode == 0 and "norm.clamp=" in first.stdout and "optim.decay_frac=" in first.stdout
    assert "torch" not in imported
    for argv, line in ((["model.foo=1"], "error: unknown key(s) model.foo: valid keys are "),
                       (["norm.clamp=0.5"], "error: bad config norm.clamp=0.5: not an option of norm.name=pre_ln")):
        bad, imported = run(*argv)
        assert bad.returncode == 2 and line in bad.stderr and "torch" not in imported, bad.stderr
    assert not (tmp_path / "cache").exists()  # nothing cached
    for script in ("eval.py", "sample.py"):
        p, imported = run("--help", script=script)
        assert p.returncode == 0 and "--dtype" in p.stdout and "torch" not in imported, script


def test_optimizer_and_schedule_keys_belong_to_their_component():
    from trainer.schedules import SCHEDULES

    with pytest.raises(
        ConfigError,
        match=r"^bad config optim.decay_frac=0.4: not an option of optim.schedule=cosine "
        r"\(its options: none\); if a config file set it, optim.decay_frac=null drops it$",
    ):
        optim_config({"name": "muon", "schedule": "cosine", "decay_frac": 0.4})
    # optim=muon's file nests its schedule's keys, so naming another schedule drops them with it
    assert parse_run_config(composed("optim=muon")).optim.schedule == SCHEDULES["wsd"].Options(
        name="wsd", decay_frac=0.4
    )
    assert parse_run_config(composed("optim=muon", "optim.schedule=cosine")).optim.schedule.name == "cosine"
    for override in ("optim.decay_frac=0.3", "optim.schedule.decay_frac=0.3"):  # the command line wins
        assert parse_run_config(composed("optim=muon", override)).optim.schedule.decay_frac == 0.3
    with pytest.raises(
        ConfigError, match=r"^bad config optim.decay_frac=0.4: not an option of optim.schedule=constant"
    ):
        optim_config({"schedule": {"name": "constant", "decay_frac": 0.4}})
    assert (
        optim_config({"name": "muon", "schedule": "cosine", "decay_frac": None}).schedule
        == SCHEDULES["cosine"].Options()
    )
    assert optim_config({"schedule": "wsd", "decay_frac": 0.4}).schedule.decay_frac == 0.4
    with pytest.raises(ConfigError, match=r"^bad config optim.muon=\{'lr': 0.1\}: not an option of optim.name=adamw"):
        optim_config({"muon": {"lr": 0.1}})
    assert optim_config({"name": "muon", "muon": {"lr": 0.1, "momentum": None}}).muon.momentum == 0.95  # null: default
    with pytest.raises(ConfigError, match=r"^bad config optim.decay_frac=0.0: must be in \(0, 1\]$"):
        optim_config({"schedule": "wsd", "decay_frac": 0.0})


def test_every_group_is_validated_when_built():
    with pytest.raises(ConfigError, match=r"^bad config train.max_steps=0: must be a positive integer$"):
        TrainConfig(max_steps=0)
    with pytest.raises(ConfigError, match=r"^bad config logging.spike_k=0: must be > 0$"):
        LoggingConfig(spike_k=0)


def test_a_fields_annotation_is_its_check():
    """Type, Range, Literal and non-empty come from the annotation alone, also when a dataclass is built
    directly; numbers are normalised (int -> float, YAML's .inf), the error shows the value as given."""
    import math
    from dataclasses import dataclass
    from typing import Annotated, Literal, Optional

    from common.config import Name, PosInt, Range, check

    @dataclass(frozen=True)
    class Toy:
        n: PosInt = 1
        frac: Annotated[float, Range(0, 1, "[)")] = 0.5
        cap: Optional[Annotated[float, Range(0, math.inf, "(]")]] = None
        mode: Literal["a", "b"] = "a"
        label: Name = "x"
        dims: tuple = ()
        clip: Annotated[float, Range(0, note="(0 = off)")] = 1.0

        def __post_init__(self):
            check(self, "toy")

    t = Toy(frac=0, cap=".inf", dims=[1, 2])
    assert (t.frac, type(t.frac), t.cap, t.dims) == (0.0, float, math.inf, (1, 2))
    for kw, msg in (({"n": 0}, "toy.n=0: must be a positive integer"), ({"n": 2.0}, "toy.n=2.0: must be an integer"),
                    ({"frac": 1}, r"toy.frac=1: must be in \[0, 1\)"), ({"cap": 0}, "toy.cap=0: must be > 0 or null"),
                    ({"mode": "c"}, "toy.mode='c': valid: a, b"), ({"label": ""}, "toy.label='': must be a non-empty"),
                    ({"n": None}, "toy.n=None: must not be null"), ({"dims": 3}, "toy.dims=3: must be a list"),
                    ({"clip": -1}, r"toy.clip=-1: must be >= 0 \(0 = off\)$")):
        with pytest.raises(ConfigError, match=rf"^bad config {msg}"):
            Toy(**kw)


@pytest.mark.slow
def test_every_train_command_in_the_readme_and_docs_composes_and_validates():
    """Each `python train.py key=value ...` (or torchrun) line of README.md and docs/*.md is a valid run
    config, so a renamed key or option cannot leave a documented command behind."""
    import re
    import shlex

    found = {}
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for m in re.finditer(r"(?:torchrun[^`\n]*?|python )train\.py((?: +[^\s`|;#)]+)*)", path.read_text()):
            overrides = [t for t in shlex.split(m[1]) if "=" in t and not t.startswith("-")]
            if overrides and not any("..." in t or "…" in t for t in overrides):  # placeholders
                found.setdefault(" ".join(overrides), path.name)
    assert len(found) >= 10  # the pattern still finds the commands
    for command, source in found.items():
        try:
            parse_run_config(composed(*command.split()))
        except Exception as e:  # noqa: BLE001  (any failure names its command)
            pytest.fail(f"{source}: train.py {command}: {type(e).__name__}: {e}")


def test_a_registry_entry_named_by_path_is_imported_when_first_read_never_before(tmp_path, monkeypatch):
    """The config checks names and reads the keys of components defined in torch modules (variants, norm
    kinds, inits, optimizers) through entries named by path: the module is imported when the component
    itself is first read, never for a name check or its Options, so the schema stays torch-free."""
    import sys
    from dataclasses import dataclass

    from common import ConfigError, Registry

    (tmp_path / "holds_kinds.py").write_text("class Plain:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    @dataclass
    class PlainOptions:
        width: int = 3

    kinds = Registry("thing.kind")
    kinds.add("plain", "holds_kinds:Plain", options=PlainOptions)

    @kinds.register("mine")
    class Mine:  # a user's own, carrying its keys
        @dataclass
        class Options:
            depth: int = 1

    assert "plain" in kinds and list(kinds) == ["plain", "mine"]
    assert kinds.options("plain") is PlainOptions and kinds.all_options() == {"plain": PlainOptions,
                                                                               "mine": Mine.Options}
    assert "holds_kinds" not in sys.modules
    assert kinds["plain"].__name__ == "Plain" and kinds["plain"].name == "plain" and "holds_kinds" in sys.modules

    class Sub(sys.modules["holds_kinds"].Plain):  # a user's subclass of a built-in reads the built-in's keys
        pass
    assert kinds._carried_options(Sub) is PlainOptions
    for read in (lambda: kinds["nope"], lambda: kinds.options("nope")):
        with pytest.raises(ConfigError, match=r"^unknown thing.kind='nope': valid are plain, mine$"):
            read()
    monkeypatch.delitem(sys.modules, "holds_kinds")


def test_every_component_named_by_path_resolves_to_its_class():
    """Each built-in's path, written once beside its name, names what the code defines (a renamed class fails
    here, not in a user's run)."""
    from model.config import INITS
    from model.norm_options import INPUT_STEPS, NORM_KINDS, VARIANTS
    from model.variants import Variant
    from trainer.optim_options import OPTIMIZERS, SCHEDULES
    from trainer.schedules import Schedule

    for registry in (INITS, INPUT_STEPS, NORM_KINDS, OPTIMIZERS, SCHEDULES, VARIANTS):
        for name in registry:
            assert callable(registry[name]), (registry.key, name)
    assert all(issubclass(VARIANTS[n], Variant) and VARIANTS[n].name == n for n in VARIANTS)
    assert all(issubclass(SCHEDULES[n], Schedule) for n in SCHEDULES)
    assert all(hasattr(OPTIMIZERS[n], "build") for n in OPTIMIZERS)


def test_the_model_config_checks_init_and_norm_names_and_imports_torch_only_then():
    import subprocess
    import sys

    code = ("import sys\nfrom model.config import GPTConfig\nimport model.norm_options\n"
            "assert 'torch' not in sys.modules\n"
            "for kw in ({'init': 'bogus'}, {'norm': {'name': 'pre_ln', 'kind': 'bogus'}},\n"
            "           {'norm': {'name': 'pre_ln', 'embed_norm': 'bogus'}}):\n"
            "    try:\n        GPTConfig(**kw)\n    except Exception as e:\n        print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["unknown model.init='bogus': valid are nanogpt, fan_in",
                                "unknown norm.kind='bogus': valid are layernorm, rmsnorm, derf, seednorm",
                                "unknown norm.embed_norm='bogus': valid are none, layer, scalenorm, scaled, unit"]


def test_a_seed_is_bounded_at_torchs_range_on_every_entry_point():
    import argparse

    import torch

    from common.config import seed_arg

    assert seed_arg(str(2 ** 64 - 1)) == 2 ** 64 - 1
    torch.Generator().manual_seed(2 ** 64 - 1)                      # the bound is torch's own
    for bad_seed in (str(2 ** 64), "-1", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            seed_arg(bad_seed)


def test_an_unknown_top_level_key_names_the_valid_ones_and_the_closest(tmp_path):
    """`foo=1` and `modle=tiny` used to print Hydra's "Key ... is not in struct" and nothing else."""
    from common import ConfigError
    from helpers import make_cfg

    with pytest.raises(ConfigError, match=r"unknown key modle: the top-level keys are .*\bnorm\b.*\bout_dir\b.*; "
                                          r"did you mean model\?"):
        make_cfg(tmp_path, "modle=tiny")
    with pytest.raises(ConfigError, match=r"unknown key foo: the top-level keys are (?!.*did you mean)"):
        make_cfg(tmp_path, "foo=1")


def test_the_choices_a_help_line_lists_are_its_registrys_names():
    """A key picked by name documents its choices once (an Options subclass changing the default inherits
    the doc), and that list is the registry's: a new input step, norm kind, decay, optimizer, schedule,
    source or tokenizer that is not in the help fails here (three embed_norm lines had dropped `scaled`)."""
    import re

    from common.config import field_docs
    from data.config import DataConfig
    from data.sources import SOURCES
    from data.tokenizer import TOKENIZERS
    from model.decay import DECAYS
    from model.norm_options import INPUT_STEPS, NORM_KINDS, VARIANTS
    from trainer.optim_options import OPTIMIZERS, SCHEDULES, OptimConfig

    def listed(doc):   # "input step: none | layer (why) | scaled" -> {none, layer, scaled}
        return {re.sub(r"\s*\(.*$", "", w.split(":")[-1]).strip() for w in doc.split("|")}

    keys = [(DataConfig, "source", SOURCES), (DataConfig, "tokenizer", TOKENIZERS),
            (OptimConfig, "name", OPTIMIZERS), (OptimConfig, "schedule", SCHEDULES)]
    keys += [(cls, k, reg) for cls in VARIANTS.all_options().values()
             for k, reg in (("kind", NORM_KINDS), ("embed_norm", INPUT_STEPS), ("decay", DECAYS))
             if k in field_docs(cls)]
    for cls, key, registry in keys:
        assert listed(field_docs(cls)[key]) == set(registry), (cls.__name__, key, field_docs(cls)[key])
