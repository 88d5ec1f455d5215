"""What Hydra composes from code rather than YAML, and its errors as one line. `base_config` (first in
configs/config.yaml's defaults) holds every key of every group at its dataclass default, so a YAML file
holds only what differs, any key is overridden without `+`, and a misspelt key fails at composition. A
variant registered in code without a configs/norm/<name>.yaml is still a `norm=<name>` option."""
from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def group_defaults() -> dict:
    """{group: {key: default}} for every config group train.py reads."""
    from common.config import defaults
    from data.config import DataConfig
    from model.config import model_group_defaults, norm_group_defaults

    from .config import LoggingConfig, TrainConfig
    from .optim import optim_group_defaults

    return {"model": model_group_defaults(), "norm": norm_group_defaults(), "data": defaults(DataConfig),
            "train": defaults(TrainConfig), "optim": optim_group_defaults(), "logging": defaults(LoggingConfig)}


def _schema() -> list:
    """[the groups' defaults, the registered variants]: what composition needs (cached by the CLI)."""
    from model.variants import VARIANTS

    return [group_defaults(), list(VARIANTS)]


def register_code_configs(config_dir: Path = CONFIG_DIR, from_cache: bool = False) -> list[str]:
    """Store the `base_config` schema and a `norm=<name>` option for each variant without a YAML (returns
    their names); call before Hydra composes. `from_cache` (train.py): without importing torch."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from .cli_cache import cached
    from .run_name import register_resolver

    register_resolver()
    groups, variants = cached("schema", _schema) if from_cache else _schema()
    schema = OmegaConf.create(groups)  # closed keys (a typo fails here), untyped values (`check` types them)
    for group in groups:
        OmegaConf.set_struct(schema[group], True)
    ConfigStore.instance().store(name="base_config", node=schema)
    stored = [name for name in variants if not (Path(config_dir) / "norm" / f"{name}.yaml").is_file()]
    for name in stored:
        ConfigStore.instance().store(group="norm", name=name, node={"name": name})
    return stored


def run_hydra(hydra_main) -> None:
    """Run a @hydra.main entry point with composition errors and an uncreatable run dir reported as one
    line and exit status 2 (HYDRA_FULL_ERROR=1 keeps Hydra's own report); the task reports its own."""
    from hydra.errors import ConfigCompositionException, OverrideParseException

    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return hydra_main()
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra then raises the error instead of printing its report
    try:
        hydra_main()
    except (ConfigCompositionException, OverrideParseException) as e:
        from common.config import composition_error_line

        from .cli_cache import cached

        print(f"error: {composition_error_line(e, cached('schema', _schema)[0])}", file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as e:
        frames = [f.filename for f in traceback.extract_tb(e.__traceback__)]
        hydra = [i for i, name in enumerate(frames) if "/hydra/" in name]
        if not hydra or any(name.startswith(str(CONFIG_DIR.parent)) for name in frames[hydra[-1] + 1:]):
            raise  # not Hydra's own mkdir of the run dir, before the task
        print(f"error: cannot create the run dir {e.filename} ({e.strerror or e}), chosen by out_dir: pass a "
              "writable out_dir=... (default runs/<run_name>)", file=sys.stderr)
        raise SystemExit(2) from None
