"""`python train.py --help`: the config groups, then every option with its value as the default groups
compose it and its doc (the field's trailing comment; choices from its `Literal`), so the help cannot
drift from what a run uses. In `norm` and `optim`, whose components read their own keys, a key the
default components do not read shows its first reader's default, after the names of its readers."""
from __future__ import annotations

import re
from pathlib import Path


def _key_lines(key: str, value, default, cls, name: str, tag: str) -> list[str]:
    """The help line of `key` (field `name` of `cls`), one per leaf of a nested group; null shows `default`."""
    from common.config import field_docs, literal_choices, show_value, type_hints

    t, docs = type_hints(cls)[name], field_docs(cls)
    if isinstance(value, dict):
        return [line for k, v in value.items() for line in _key_lines(f"{key}.{k}", v, default[k], t, k, tag)]
    choices = literal_choices(t)
    doc = (f"{{{' | '.join(map(show_value, choices))}}} " if choices else "") + docs.get(name, "")
    value = default if value is None else value
    return [f"{f'  {key}={show_value(list(value) if isinstance(value, tuple) else value)}':<40} {tag}{doc}".rstrip()]


def config_help(config_dir: Path) -> str:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from common.config import defaults
    from data.config import SOURCES, DataConfig
    from model.config import GPTConfig, ModelGroup
    from model.norm_options import VARIANTS

    from .config import LoggingConfig, TrainConfig
    from .config_store import register_code_configs
    from .optim_options import OPTIMIZERS, SCHEDULES, flat_schedule

    config_dir = Path(config_dir)
    top = (config_dir / "config.yaml").read_text()
    picked = dict(re.findall(r"^\s*-\s*(\w+):\s*(\w+)", top, flags=re.M))
    register_code_configs(config_dir)
    with initialize_config_dir(config_dir=str(config_dir.resolve()), version_base=None):
        cfg = OmegaConf.to_container(compose("config"), resolve=False)
    readers = {"train": [("", TrainConfig)], "logging": [("", LoggingConfig)],
               "data": [("", DataConfig), *SOURCES.all_options().items()],
               "model": [("", ModelGroup), ("", GPTConfig)],  # (component name, its Options)
               "norm": list(VARIANTS.all_options().items()),
               "optim": [*OPTIMIZERS.all_options().items(), *SCHEDULES.all_options().items()]}
    own = {cls: defaults(cls) for rs in readers.values() for _, cls in rs}  # each class's keys and defaults, once
    lines = ["usage: python train.py [group=option ...] [key=value ...]",
             "       torchrun --nproc_per_node=N train.py ...    (DDP; see docs/training.md)",
             "",
             "Hydra overrides: `group=option` picks a file of a config group, `key=value` sets one option.",
             "Every option is typed and checked at start-up. Hydra's own help: --hydra-help.",
             "",
             "Config groups (default in brackets):"]
    for group in sorted(picked):
        choices = ({"norm": list(VARIANTS), "optim": list(OPTIMIZERS)}.get(group)
                   or sorted(p.stem for p in (config_dir / group).glob("*.yaml")))
        if choices:
            lines.append(f"  {group + '=':<12} " + ", ".join(f"[{c}]" if c == picked[group] else c for c in choices))
    lines += ["", "Options (key=default  doc), as the default groups compose them:"]
    for group in ("train", "optim", "logging", "model", "norm", "data"):
        lines += ["", f"{group}.*  (defaults: {group}={picked.get(group, '')})"]
        node = flat_schedule(cfg[group]) if group == "optim" else cfg[group]  # as on the command line
        if group == "norm":  # the default variant's keys, then every other variant's, at its default
            node = {**node, **{k: None for _, c in readers["norm"] for k in own[c] if k not in node}}
        chosen = {"", node.get("name"), node.get("schedule"), node.get("source")}
        for key, value in node.items():
            mine = [(n, c) for n, c in readers[group] if key in own[c]]
            name, cls = next(((n, c) for n, c in mine if n in chosen), mine[0])
            tag = "" if name in chosen else f"[{', '.join(n for n, _ in mine)}] "
            default = own[cls][key] if name else value  # a component's own key: null is its default
            lines += _key_lines(f"{group}.{key}", value, default, cls, key, tag)
    lines += ["", "Top level (where the run goes):"]
    for key in ("run_name", "out_dir"):
        m = re.search(rf"^{key}:\s*(.*)$", top, flags=re.M)
        lines.append(f"  {key}={m[1] if m else ''}")
    return "\n".join(lines)
