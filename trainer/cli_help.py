"""`python train.py --help`: the config groups and every option with its default and one-line doc.

The defaults are those of the composed default config (the dataclasses, then each group's default
file); the docs are the trailing comments of the dataclass fields (the single place both are written),
so the help cannot drift from what a run uses. Hydra's own help is `--hydra-help`.
"""
from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path


def _docs(cls, prefix: str, keys: dict | None = None) -> dict:
    """{dotted key: doc} of a dataclass, nested dataclasses included; `keys` maps keys to the class that
    reads them where a group's components each read their own (`norm`, `optim`)."""
    from common.config import field_docs, literal_choices, show_value

    out = {}
    for key, owner in (keys or {f.name: cls for f in dataclasses.fields(cls)}).items():
        c = next((c for c in owner.__mro__ if dataclasses.is_dataclass(c) and key in field_docs(c)), owner)
        t = typing.get_type_hints(owner).get(key)
        choices = literal_choices(t)  # generated from the annotation, the one place they are written
        out[f"{prefix}.{key}"] = (f"{{{' | '.join(map(show_value, choices))}}} " if choices else "") + \
            field_docs(c).get(key, "")
        if dataclasses.is_dataclass(t):
            out.update(_docs(t, f"{prefix}.{key}"))
    return out


def _all_docs() -> dict:
    from data.config import DataConfig
    from model.config import MODEL_KEYS, GPTConfig, ModelGroup, norm_group_keys

    from .config import LoggingConfig, TrainConfig
    from .optim import optim_group_keys

    return {**_docs(GPTConfig, "model", {k: GPTConfig for k in MODEL_KEYS}), **_docs(ModelGroup, "model"),
            **_docs(None, "norm", norm_group_keys()), **_docs(DataConfig, "data"), **_docs(TrainConfig, "train"),
            **_docs(None, "optim", optim_group_keys()), **_docs(LoggingConfig, "logging")}


def _optim_flat(o) -> dict:
    d = dataclasses.asdict(o)
    sched = d.pop("schedule")
    return {**d, **sched, "schedule": sched["name"], "name": d["name"]}


def _shown(group: str, node: dict) -> tuple[dict, dict]:
    """A group whose components read their own keys (`norm`, `optim`) as its default components resolve
    it; a key they do not read shows the default of the first component that does, and its doc names
    the components that read it."""
    if group == "norm":
        from model.config import norm_options
        from model.variants import VARIANTS, get_variant

        resolve = lambda n: dataclasses.asdict(norm_options(n))  # noqa: E731
        choices = {n: ("name", get_variant(n).Options) for n in VARIANTS}
    else:
        from .optim import OPTIMIZERS, optim_config
        from .schedules import SCHEDULES

        resolve = lambda n: _optim_flat(optim_config(n))  # noqa: E731
        choices = {**{n: ("name", o.Options) for n, o in OPTIMIZERS.items()},
                   **{n: ("schedule", s.Options) for n, s in SCHEDULES.items()}}
    opts = resolve(node)
    shown, readers = {}, {}
    for k in node:
        if k in opts:
            shown[k] = opts[k]
            continue
        names = [n for n, (_, cls) in choices.items() if k in {f.name for f in dataclasses.fields(cls)}]
        shown[k] = resolve({choices[names[0]][0]: names[0]})[k]
        readers[f"{group}.{k}"] = f"[{', '.join(names)}] "
    return shown, readers


def _flat(node, prefix: str) -> list[tuple[str, object]]:
    out = []
    for k, v in node.items():
        out += _flat(v, f"{prefix}.{k}") if isinstance(v, dict) else [(f"{prefix}.{k}", v)]
    return out


def _show(v) -> str:
    from common.config import show_value

    return show_value(list(v) if isinstance(v, tuple) else v)


def config_help(config_dir: Path) -> str:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from .config_store import register_code_configs

    config_dir = Path(config_dir)
    top = (config_dir / "config.yaml").read_text()
    defaults = dict(re.findall(r"^\s*-\s*(\w+):\s*(\w+)", top, flags=re.M))
    register_code_configs(config_dir)
    with initialize_config_dir(config_dir=str(config_dir.resolve()), version_base=None):
        cfg = OmegaConf.to_container(compose("config"), resolve=False)
    lines = ["usage: python train.py [group=option ...] [key=value ...]",
             "       torchrun --nproc_per_node=N train.py ...    (DDP; see README)",
             "",
             "Hydra overrides: `group=option` picks a file of a config group, `key=value` sets one option.",
             "Every option is typed and checked at start-up. Hydra's own help: --hydra-help.",
             "",
             "Config groups (default in brackets):"]
    for group in sorted(defaults):
        choices = sorted(p.stem for p in (config_dir / group).glob("*.yaml"))
        if not choices:
            continue
        default = defaults[group]
        shown = ", ".join(f"[{c}]" if c == default else c for c in choices)
        lines.append(f"  {group + '=':<12} {shown}")
    docs = _all_docs()
    lines += ["", "Options (key=default  doc), as the default groups compose them:"]
    (cfg["norm"], readers), (cfg["optim"], optim_readers) = _shown("norm", cfg["norm"]), _shown("optim", cfg["optim"])
    readers.update(optim_readers)
    for group in ("train", "optim", "logging", "model", "norm", "data"):
        lines += ["", f"{group}.*  (defaults: {group}={defaults.get(group, '')})"]
        for key, value in _flat(cfg[group], group):
            left = f"  {key}={_show(value)}"
            reader = next((r for k, r in readers.items() if key == k or key.startswith(k + ".")), "")
            lines.append(f"{left:<40} {reader}{docs.get(key, '')}".rstrip())
    lines += ["", "Top level (where the run goes):"]
    for key in ("run_name", "out_dir"):
        m = re.search(rf"^{key}:\s*(.*)$", top, flags=re.M)
        lines.append(f"  {key}={m[1] if m else ''}")
    return "\n".join(lines)
