"""What Hydra composes from code rather than YAML, and its errors as one line. `base_config` (first in
configs/config.yaml's defaults) holds every key of every group at its dataclass default, so a YAML file
holds only what differs, any key is overridden without `+`, and a misspelt key fails at composition.
The `norm` and `optim` groups have one option per component, made from its Options (model/norm_options.py,
trainer/optim_options.py): the component's own keys at its defaults, closed, so a key another variant or
optimizer reads fails at composition too."""
from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

from common.errors import say_line

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def group_defaults() -> dict:
    """{group: {key: default}} for every config group train.py reads."""
    from common.config import defaults
    from data.config import data_group_defaults
    from model.config import model_group_defaults

    from .config import LoggingConfig, TrainConfig

    return {"model": model_group_defaults(), "data": data_group_defaults(),
            "train": defaults(TrainConfig), "logging": defaults(LoggingConfig)}


def component_nodes() -> dict:
    """{group: {component: {key: default}}}: each `norm=<variant>` and `optim=<optimizer>` option, the
    component's own keys at its defaults."""
    from common.config import defaults
    from model.norm_options import VARIANTS

    from .optim_options import optim_nodes

    return {"norm": {name: {**defaults(cls), "name": name} for name, cls in VARIANTS.all_options().items()},
            "optim": optim_nodes()}


def _schema() -> list:
    """[the groups' defaults, the components' options]: what composition needs, read without torch."""
    return [group_defaults(), component_nodes()]


def register_code_configs(config_dir: Path = CONFIG_DIR) -> list[str]:
    """Store the `base_config` schema and one `norm=<name>` option per variant and `optim=<name>` per
    optimizer (returns the variants' names); call before Hydra composes. Imports no torch: every key and
    default comes from torch-free Options."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from .run_name import register_resolver

    register_resolver()
    groups, components = _schema()
    schema = OmegaConf.create(groups)  # closed keys (a typo fails here), untyped values (`check` types them)
    for group in groups:
        OmegaConf.set_struct(schema[group], True)
    store = ConfigStore.instance()
    store.store(name="base_config", node=schema)
    for group, options in components.items():
        for name, keys in options.items():
            node = OmegaConf.create(keys)
            OmegaConf.set_struct(node, True)  # `norm.clamp` under norm=pre_ln fails at composition
            store.store(group=group, name=name, node=node)
    return list(components["norm"])


def compose_config(overrides, config_dir: Path = CONFIG_DIR):
    """The composed config of `overrides` (as train.py's command line gives them), or the ConfigError of
    one line that train.py prints for them."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    from common import ConfigError

    register_code_configs(config_dir)
    with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base=None):
        try:
            return compose("config", overrides=list(overrides))
        except HydraException as e:
            raise ConfigError(composition_error(e, overrides)) from None


def composition_error(e: BaseException, overrides) -> str:
    """One line for a composition error of `overrides`. A `norm.*` or `optim.*` key the chosen component
    does not have names that component and its keys (it is found by composing without the key); Hydra must
    be initialized."""
    from common.config import composition_error_line

    groups, components = _schema()
    full_key = getattr(e.__cause__, "full_key", None) or ""
    group, _, key = full_key.partition(".")
    if group in components and key:
        from hydra import compose

        top = key.split(".")[0]
        given = [o for o in overrides if (o.split("=", 1)[0].lstrip("+~") + ".").startswith(full_key + ".")]
        try:
            name = compose("config", overrides=[o for o in overrides if o not in given])[group].name
        except Exception:  # noqa: BLE001  (another error too: say what Hydra said)
            name = None
        if name is not None:
            own = ", ".join(components[group][name])
            if all(top not in keys for keys in components[group].values()):
                return f"unknown key(s) {full_key}: valid keys are {own}"
            if top not in components[group][name]:
                shown = given[-1].lstrip("+~") if given else full_key
                return f"bad config {shown}: not an option of {group}.name={name} (its options: {own})"
            return composition_error_line(e, {**groups, group: components[group][name]})  # deeper: its node's
    if full_key and "." not in full_key and full_key not in groups:  # a top-level key: every one it could be
        top = {**groups, **{g: {} for g in components}, **{k: {} for k in _top_level_keys()}}
        return composition_error_line(e, top)
    return composition_error_line(e, groups)


def _top_level_keys() -> list:
    """The composed config's top-level keys (run_name, out_dir, ...) and the groups chosen by name (arch=,
    experiment=), for an unknown top-level key's error line."""
    from hydra import compose

    try:
        keys = [k for k in compose("config") if k != "hydra"]
    except Exception:  # noqa: BLE001  (the list is a courtesy: never a second error)
        keys = []
    return keys + ["arch", "experiment"]


def run_hydra(hydra_main) -> None:
    """Run a @hydra.main entry point with composition errors and an uncreatable run dir reported as one
    line and exit status 2 (HYDRA_FULL_ERROR=1 keeps Hydra's own report); the task reports its own."""
    from hydra.errors import ConfigCompositionException, OverrideParseException

    for a in sys.argv[1:]:  # Hydra's own error for an empty key is a ValueError traceback ("... Got int")
        if not a.startswith("-") and "=" in a and not a.split("=", 1)[0].lstrip("+~"):
            say_line(f"error: bad override {a!r}: the key before '=' is empty "
                     "(write key=value, e.g. train.seed=1)")
            raise SystemExit(2)
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return hydra_main()
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra then raises the error instead of printing its report
    from omegaconf.errors import OmegaConfBaseException

    try:
        hydra_main()
    except OmegaConfBaseException as e:  # an interpolation that cannot resolve (${nope}, ${oc.env:UNSET})
        from common.errors import interpolation_line

        say_line(f"error: {interpolation_line(e)}")
        raise SystemExit(2) from None
    except (ConfigCompositionException, OverrideParseException) as e:
        from hydra import initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra

        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            line = composition_error(e, [a for a in sys.argv[1:] if not a.startswith("-")])
        say_line(f"error: {line}")
        raise SystemExit(2) from None
    except OSError as e:
        frames = [f.filename for f in traceback.extract_tb(e.__traceback__)]
        hydra = [i for i, name in enumerate(frames) if "/hydra/" in name]
        if not hydra or any(name.startswith(str(CONFIG_DIR.parent)) for name in frames[hydra[-1] + 1:]):
            raise  # not Hydra's own mkdir of the run dir, before the task
        say_line(f"error: cannot create the run dir {e.filename} ({e.strerror or e}), chosen by out_dir: pass a "
                 "writable out_dir=... (default runs/<run_name>)")
        raise SystemExit(2) from None
