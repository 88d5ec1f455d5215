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
    """{dotted key: doc} of a dataclass, nested dataclasses included."""
    from common.config import field_docs

    own, hints = field_docs(cls), typing.get_type_hints(cls)
    out = {}
    for key, name in (keys or {f.name: f.name for f in dataclasses.fields(cls)}).items():
        out[f"{prefix}.{key}"] = own.get(name, "")
        if dataclasses.is_dataclass(hints[name]):
            out.update(_docs(hints[name], f"{prefix}.{key}"))
    return out


def _all_docs() -> dict:
    from data.config import DataConfig
    from model.config import MODEL_KEYS, GPTConfig, ModelGroup, norm_group_docs

    from .config import LoggingConfig, OptimConfig, TrainConfig

    return {**_docs(GPTConfig, "model", MODEL_KEYS), **_docs(ModelGroup, "model"),
            **{f"norm.{k}": doc for k, doc in norm_group_docs().items()},
            **_docs(DataConfig, "data"), **_docs(TrainConfig, "train"), **_docs(OptimConfig, "optim"),
            **_docs(LoggingConfig, "logging")}


def _norm_shown(node: dict) -> tuple[dict, dict]:
    """The `norm` group as the default variant resolves it; a key it does not read shows the default
    of the first variant that does, and its doc names those variants."""
    from model.config import norm_options
    from model.variants import VARIANTS, get_variant

    opts = dataclasses.asdict(norm_options(node))
    shown, readers = {}, {}
    for k in node:
        if k in opts:
            shown[k] = opts[k]
            continue
        names = [n for n in VARIANTS if k in {f.name for f in dataclasses.fields(get_variant(n).Options)}]
        shown[k] = dataclasses.asdict(norm_options({"name": names[0]}))[k]
        readers[f"norm.{k}"] = f"[{', '.join(names)}] "
    return shown, readers


def _flat(node, prefix: str) -> list[tuple[str, object]]:
    out = []
    for k, v in node.items():
        out += _flat(v, f"{prefix}.{k}") if isinstance(v, dict) else [(f"{prefix}.{k}", v)]
    return out


def _show(v) -> str:
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


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
    cfg["norm"], readers = _norm_shown(cfg["norm"])
    for group in ("train", "optim", "logging", "model", "norm", "data"):
        lines += ["", f"{group}.*  (defaults: {group}={defaults.get(group, '')})"]
        for key, value in _flat(cfg[group], group):
            left = f"  {key}={_show(value)}"
            lines.append(f"{left:<40} {readers.get(key, '')}{docs.get(key, '')}".rstrip())
    lines += ["", "Top level (where the run goes):"]
    for key in ("run_name", "out_dir"):
        m = re.search(rf"^{key}:\s*(.*)$", top, flags=re.M)
        lines.append(f"  {key}={m[1] if m else ''}")
    return "\n".join(lines)
