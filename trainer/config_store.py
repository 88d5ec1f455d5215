"""Config-group options that come from the code's registries rather than from YAML files.

A variant registered with `@register("name")` and no configs/norm/<name>.yaml is still a `norm=<name>`
option: its group is every `norm.*` key at its default (model.config.norm_group_defaults). So a new
variant is its class and its test; the YAML is optional (add one for comments or other defaults).
"""
from __future__ import annotations

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def register_code_configs(config_dir: Path = CONFIG_DIR) -> list[str]:
    """Store a `norm` group option for every registered variant without a YAML; returns their names.
    Call before Hydra composes (train.py does; tests that compose do too)."""
    from hydra.core.config_store import ConfigStore

    from model.config import norm_group_defaults
    from model.variants import VARIANTS

    stored = []
    for name in VARIANTS:
        if not (config_dir / "norm" / f"{name}.yaml").is_file():
            ConfigStore.instance().store(group="norm", name=name, node=norm_group_defaults(name))
            stored.append(name)
    return stored
