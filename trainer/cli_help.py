"""`python train.py --help`: the config groups and every option with its default and one-line doc.

The defaults are those of the composed default config (the dataclasses, then each group's default
file); the docs are the trailing comments of the dataclass fields and the choices their `Literal`s (the
single place each is written), so the help cannot drift from what a run uses. In the `norm` and `optim`
groups, whose components read their own keys, a key the default component does not read shows the
default of the first that does, and names the components that read it. Hydra's own help: --hydra-help.
"""
from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path


def _docs(prefix: str, owners: dict) -> dict:
    """{dotted key: '{choices} doc'} for {key: the dataclass reading it}, nested dataclasses included."""
    from common.config import field_docs, literal_choices, show_value

    out = {}
    for key, cls in owners.items():
        t = typing.get_type_hints(cls).get(key)
        choices = literal_choices(t)
        out[f"{prefix}.{key}"] = (f"{{{' | '.join(map(show_value, choices))}}} " if choices else "") + \
            field_docs(cls).get(key, "")
        if dataclasses.is_dataclass(t):
            out.update(_docs(f"{prefix}.{key}", {f.name: t for f in dataclasses.fields(t)}))
    return out


def _filled(value, default):
    """A composed value with its nulls (the component's default, in `norm` and `optim`) filled in."""
    if isinstance(value, dict):
        return {k: _filled(v, (default or {}).get(k)) for k, v in value.items()}
    return default if value is None else value


def _component_values(group: str, node: dict, readers: dict) -> dict:
    """The `norm` or `optim` group with each key at the chosen component's default, or for a key the
    chosen components do not read, the first reader's; such a key's readers go into `readers`."""
    from common.config import defaults

    if group == "norm":
        from model.variants import VARIANTS
        components, chosen = {n: v.Options for n, v in VARIANTS.items()}, {node["name"]}
    else:
        from .optim import OPTIMIZERS
        from .schedules import SCHEDULES
        components = {**{n: o.Options for n, o in OPTIMIZERS.items()}, **{n: s.Options for n, s in SCHEDULES.items()}}
        chosen = {node["name"], node["schedule"]}
    own = {n: defaults(cls) for n, cls in components.items()}  # each component's keys and defaults
    shown = {}
    for k, v in node.items():
        names = [n for n, d in own.items() if k in d]
        first = next((n for n in names if n in chosen), None)
        if first is None:
            first, readers[f"{group}.{k}"] = names[0], f"[{', '.join(names)}] "
        shown[k] = _filled(v, own[first][k])
    return shown


def _flat(node, prefix: str) -> list[tuple[str, object]]:
    out = []
    for k, v in node.items():
        out += _flat(v, f"{prefix}.{k}") if isinstance(v, dict) else [(f"{prefix}.{k}", v)]
    return out


def config_help(config_dir: Path) -> str:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from common.config import show_value
    from data.config import DataConfig
    from model.config import MODEL_GROUP_KEYS, GPTConfig, ModelGroup, model_group_defaults, norm_group_keys

    from .config import LoggingConfig, TrainConfig
    from .config_store import register_code_configs
    from .optim import optim_group_keys

    config_dir = Path(config_dir)
    top = (config_dir / "config.yaml").read_text()
    defaults = dict(re.findall(r"^\s*-\s*(\w+):\s*(\w+)", top, flags=re.M))
    register_code_configs(config_dir, from_cache=True)  # also caches the schema for train.py's next start
    with initialize_config_dir(config_dir=str(config_dir.resolve()), version_base=None):
        cfg = OmegaConf.to_container(compose("config"), resolve=False)
    fields = lambda cls: {f.name: cls for f in dataclasses.fields(cls)}  # noqa: E731
    docs = {**_docs("model", {k: ModelGroup if k in MODEL_GROUP_KEYS else GPTConfig for k in model_group_defaults()}),
            **_docs("norm", norm_group_keys()), **_docs("data", fields(DataConfig)),
            **_docs("train", fields(TrainConfig)), **_docs("optim", optim_group_keys()),
            **_docs("logging", fields(LoggingConfig))}
    readers: dict = {}
    for group in ("norm", "optim"):
        cfg[group] = _component_values(group, cfg[group], readers)
    lines = ["usage: python train.py [group=option ...] [key=value ...]",
             "       torchrun --nproc_per_node=N train.py ...    (DDP; see README)",
             "",
             "Hydra overrides: `group=option` picks a file of a config group, `key=value` sets one option.",
             "Every option is typed and checked at start-up. Hydra's own help: --hydra-help.",
             "",
             "Config groups (default in brackets):"]
    for group in sorted(defaults):
        choices = sorted(p.stem for p in (config_dir / group).glob("*.yaml"))
        if choices:
            shown = ", ".join(f"[{c}]" if c == defaults[group] else c for c in choices)
            lines.append(f"  {group + '=':<12} {shown}")
    lines += ["", "Options (key=default  doc), as the default groups compose them:"]
    for group in ("train", "optim", "logging", "model", "norm", "data"):
        lines += ["", f"{group}.*  (defaults: {group}={defaults.get(group, '')})"]
        for key, value in _flat(cfg[group], group):
            left = f"  {key}={show_value(list(value) if isinstance(value, tuple) else value)}"
            reader = next((r for k, r in readers.items() if key == k or key.startswith(k + ".")), "")
            lines.append(f"{left:<40} {reader}{docs.get(key, '')}".rstrip())
    lines += ["", "Top level (where the run goes):"]
    for key in ("run_name", "out_dir"):
        m = re.search(rf"^{key}:\s*(.*)$", top, flags=re.M)
        lines.append(f"  {key}={m[1] if m else ''}")
    return "\n".join(lines)
