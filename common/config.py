"""The typed config layer shared by every component.

A component's config is one dataclass next to the code that reads it; each default and its one-line doc
(the field's trailing comment) are written there once. From such a dataclass this module derives:

- `defaults(cls)`: its keys and defaults as a plain mapping, from which `schema` makes the Hydra schema
  node of a config group (trainer/config_store.py registers them), so every key exists before any YAML
  is read: `train.max_steps=3` needs no `+`, and a YAML file holds only what differs from the defaults;
- `build(cls, node, prefix)`: the typed object, from a composed config group. An unknown key, a wrong type
  or a null where none is allowed fails with one line naming the full key (`train.max_steps`); value
  checks stay in each dataclass (`validate()` or `__post_init__`);
- `field_docs(cls)`: each field's one-line doc, for `python train.py --help`.

Schema leaves are untyped (Any) on purpose: `build` is the one type check, so a wrong type reads the same
one line wherever the config comes from (Hydra, a checkpoint, a test's dict).
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, Optional, Type, Union

from .errors import ConfigError, UserError

MISSING = "???"  # OmegaConf's marker of a required value (a field without a default)


def bad(key: str, value: Any, valid: str, error: Type[UserError] = ConfigError) -> typing.NoReturn:
    """The one error line of every config key: `bad config <key>=<value>: <what is valid>`."""
    raise error(f"bad config {key}={value!r}: {valid}")


def positive_int(key: str, value: Any, error: Type[UserError] = ConfigError) -> None:
    """`value` is an integer > 0 (a bool is not), else the one error line naming `key`."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        bad(key, value, "must be a positive integer", error)


def literal_choices(t: Any) -> Optional[tuple]:
    """The values a `Literal[...]` (or `Optional[Literal[...]]`) field allows; None for other types."""
    if typing.get_origin(t) in (Union, types.UnionType):
        t = next((a for a in typing.get_args(t) if a is not type(None)), t)
    return typing.get_args(t) if typing.get_origin(t) is Literal else None


def show_value(v: Any) -> str:
    """A value as YAML writes it (true, null)."""
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def check_choices(obj: Any, prefix: str, error: Type[UserError] = ConfigError) -> None:
    """Every `Literal` field of a dataclass instance holds one of its values, else one line naming the
    key and the valid values (from __post_init__: the choices are written once, in the annotation)."""
    for name, t in typing.get_type_hints(type(obj)).items():
        allowed, v = literal_choices(t), getattr(obj, name, None)
        # `True == 1` in Python, so compare types too (compile=1 is not compile=true).
        if allowed and not (v is None and type(None) in typing.get_args(t)) and \
                not any(v == a and type(v) is type(a) for a in allowed):
            bad(f"{prefix}.{name}", v, "valid: " + ", ".join(show_value(a) for a in allowed), error)


def to_plain(node: Any) -> dict:
    """A config group as a plain dict (OmegaConf nodes resolved; required values left unset dropped)."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=True)
    if not isinstance(node, Mapping):
        raise ConfigError(f"a config group must be a mapping of keys to values, got {type(node).__name__}")
    return {k: v for k, v in node.items() if v != MISSING}


def defaults(cls, keys: Optional[Mapping[str, str]] = None) -> dict:
    """{key: default} of a dataclass (nested dataclasses as nested dicts, tuples as lists, MISSING where a
    field has no default). `keys` maps config keys to field names when they differ (the `norm` group)."""
    by_field = {f.name: MISSING if _required(f) else _field_default(cls, f.name) for f in dataclasses.fields(cls)}
    keys = keys or {name: name for name in by_field}
    return {key: by_field[name] for key, name in keys.items()}


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _field_default(cls, name: str) -> Any:
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    if f.default is not dataclasses.MISSING:
        return _plain_value(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return _plain_value(f.default_factory())
    return None


def _merge(base: Mapping, over: Mapping) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(out.get(k), Mapping) and isinstance(v, Mapping) else v
    return out


def _plain_value(v: Any) -> Any:
    if dataclasses.is_dataclass(v):
        return {f.name: _plain_value(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, (list, tuple)):
        return [_plain_value(x) for x in v]
    return v


def schema(values: Mapping[str, Any], name: str):
    """A Hydra structured-config node with exactly these keys and defaults (nested mappings become
    nested nodes). Keys are closed (a typo is an error); every leaf is typed Any (see the module doc)."""
    from omegaconf import OmegaConf

    return OmegaConf.structured(_schema_class(values, name))


def _schema_class(values: Mapping[str, Any], name: str):
    specs = []
    for key, v in values.items():
        if isinstance(v, Mapping):
            sub = _schema_class(v, f"{name}_{key}")
            specs.append((key, sub, dataclasses.field(default_factory=sub)))
        elif isinstance(v, list):
            specs.append((key, Any, dataclasses.field(default_factory=lambda v=v: list(v))))
        else:
            specs.append((key, Any, dataclasses.field(default=v)))
    return dataclasses.make_dataclass(name, specs)


def parse(cls, node: Any, prefix: str, keys: Optional[Mapping[str, str]] = None,
          error: Type[UserError] = ConfigError, also_valid: tuple = ()) -> dict:
    """{field name: typed value} for the keys present in `node`; `keys` maps config keys to field names
    (default: the field names themselves). Nested dataclass fields are built recursively."""
    data = to_plain(node)
    hints = typing.get_type_hints(cls)
    keys = keys or {f.name: f.name for f in dataclasses.fields(cls)}
    unknown = [k for k in data if k not in keys]
    if unknown:
        raise error(f"unknown key(s) {', '.join(f'{prefix}.{k}' for k in unknown)}: valid keys are "
                    f"{', '.join([*keys, *also_valid])}")
    kw = {}
    for key, v in data.items():
        name, full, t = keys[key], f"{prefix}.{key}", hints[keys[key]]
        if dataclasses.is_dataclass(t):
            if not isinstance(v, Mapping):
                bad(full, v, "must be a group of keys", error)
            base = _field_default(cls, name)  # a partial group keeps the parent's defaults for the rest
            kw[name] = build(t, _merge(base, v) if isinstance(base, Mapping) else v, full, error=error)
        else:
            kw[name] = _coerce(full, v, t, error)
    return kw


def union_keys(classes) -> dict:
    """{key: the first class declaring it} over the Options classes of a group's components: the keys of
    its schema (a group whose components each read their own keys: `norm`, `optim`)."""
    out: dict = {}
    for cls in classes:
        for f in dataclasses.fields(cls):
            out.setdefault(f.name, cls)
    return out


def union_docs(keys: Mapping[str, type]) -> dict:
    """{key: its one-line doc} for union_keys' result, from the nearest class up the MRO declaring it."""
    return {k: next((d[k] for c in cls.__mro__ if dataclasses.is_dataclass(c)
                     for d in [field_docs(c)] if k in d), "") for k, cls in keys.items()}


def own_options(cls, given: Mapping[str, Any], prefix: str, owner: str, known, hide: tuple = (),
                hint: str = "") -> Any:
    """`cls` (one component's Options) built from the keys `given` of its group. A key only another
    component reads is one line naming `owner` (`norm.name=pre_ln`) and cls's keys (but `hide`), then
    `hint` (`{key}` = the full key); a key no component has is an unknown key."""
    own = [f.name for f in dataclasses.fields(cls)]
    listed = ", ".join(k for k in own if k not in hide) or "none"
    foreign = [k for k in given if k not in own]
    typos = [k for k in foreign if k not in known]
    if typos:
        raise ConfigError(f"unknown key(s) {', '.join(f'{prefix}.{k}' for k in typos)}: valid keys are {listed}")
    if foreign:
        bad(f"{prefix}.{foreign[0]}", given[foreign[0]], f"not an option of {owner} (its options: {listed})"
            + hint.format(key=f"{prefix}.{foreign[0]}"))
    return build(cls, given, prefix)


def set_values(node: Mapping) -> dict:
    """The values of a group that are set: nulls dropped, in nested groups too (a nested group left all
    null is dropped). In a group whose components read their own keys, null means the component's default."""
    out = {}
    for k, v in node.items():
        if isinstance(v, Mapping):
            v = set_values(v) or None
        if v is not None:
            out[k] = v
    return out


def build(cls, node: Any, prefix: str, error: Type[UserError] = ConfigError):
    """The dataclass `cls` from a config group `prefix` (absent keys take the dataclass's defaults)."""
    kw = parse(cls, node, prefix, error=error)
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in kw and _required(f)]
    if missing:
        raise error(f"missing key {prefix}.{missing[0]}: it has no default, set it")
    return cls(**kw)


def _coerce(key: str, v: Any, t: Any, error: Type[UserError]) -> Any:
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is Union or origin is types.UnionType:
        if v is None:
            if type(None) in args:
                return None
            bad(key, v, "must not be null", error)
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _coerce(key, v, options[0], error)
        return v  # several types (e.g. auto|true|false, glob|list of globs): the dataclass names the valid values
    if v is None:
        bad(key, v, "must not be null", error)
    if origin is Literal:
        return v  # the dataclass's __post_init__ checks the value (check_choices)
    if t is bool:
        if isinstance(v, bool):
            return v
        bad(key, v, "must be true or false", error)
    if t is int:
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        bad(key, v, "must be an integer", error)
    if t is float:
        if isinstance(v, str) and v.strip().lower() in (".inf", "+.inf"):
            return math.inf  # YAML's spelling of infinity, also accepted on the command line
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v):
            return float(v)
        bad(key, v, "must be a number", error)
    if t is str:
        if isinstance(v, str):
            return v
        bad(key, v, "must be a string", error)
    if t in (tuple, list) or origin in (tuple, list):
        if isinstance(v, (list, tuple)):
            return (tuple if (t is tuple or origin is tuple) else list)(v)
        bad(key, v, "must be a list", error)
    return v


_FIELD_LINE = re.compile(r"^\s+(\w+)\s*:[^#]*#\s*(.+?)\s*$")


def field_docs(cls) -> dict:
    """{field: its one-line doc}: the trailing `# ...` comment of the field's line in the class source."""
    names = {f.name for f in dataclasses.fields(cls)}
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    docs = {}
    for line in lines:
        m = _FIELD_LINE.match(line)
        if m and m[1] in names and m[1] not in docs:
            docs[m[1]] = m[2]
    return docs
