"""The typed config layer. A config is a dataclass beside its component; each field's default, one-line
doc (its trailing comment) and valid values (its annotation: `max_steps: PosInt = 600`) are written once.
`check`, first in every config's `__post_init__`, enforces the annotations in one line naming the key;
`build` makes a config from a composed group, `defaults` gives the Hydra schema, `field_docs` the help."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import re
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Optional, Type, Union

from .errors import ConfigError, UserError

MISSING = "???"  # OmegaConf's marker of a required value (a field without a default)


def bad(key: str, value: Any, valid: str, error: Type[UserError] = ConfigError) -> typing.NoReturn:
    """The one error line of every config key: `bad config <key>=<value>: <what is valid>`."""
    raise error(f"bad config {key}={value!r}: {valid}")


@dataclasses.dataclass(frozen=True)
class Range:
    """A number's valid interval, in its annotation: `Annotated[float, Range(0, 1, "[)")]`. `ends` says which
    ends are in (an excluded infinite end: the number must be finite); `note` ends the error line."""
    lo: float = -math.inf
    hi: float = math.inf
    ends: str = "[]"
    note: str = ""

    def holds(self, v: float) -> bool:
        return (v > self.lo if self.ends[0] == "(" else v >= self.lo) and \
            (v < self.hi if self.ends[1] == ")" else v <= self.hi)

    def text(self, integer: bool) -> str:
        if math.isinf(self.lo) and math.isinf(self.hi):
            return "must be a finite number"
        if math.isfinite(self.lo) and math.isfinite(self.hi):
            if integer:  # exact bounds: 2**64 - 1 is not 1.84467e+19
                return f"must be an integer in {self.ends[0]}{int(self.lo)}, {int(self.hi)}{self.ends[1]}"
            return f"must be in {self.ends[0]}{self.lo:g}, {self.hi:g}{self.ends[1]}"
        if integer:
            return "must be a positive integer" if self.lo == 1 else f"must be an integer >= {self.lo:g}"
        finite = "a finite number " if self.ends[1] == ")" else ""
        return f"must be {finite}{'>' if self.ends[0] == '(' else '>='} {self.lo:g}"


PosInt = Annotated[int, Range(1)]                          # an integer >= 1
NonNegInt = Annotated[int, Range(0)]                       # an integer >= 0
Seed = Annotated[int, Range(0, 2 ** 64 - 1, note="(the range torch.manual_seed takes)")]  # a random seed
Positive = Annotated[float, Range(0, math.inf, "()")]      # a finite number > 0
NonNeg = Annotated[float, Range(0)]                        # a number >= 0 (.inf allowed)
Finite = Annotated[float, Range(-math.inf, math.inf, "()")]  # a finite number
Name = Annotated[str, "non-empty"]                         # a non-empty string
_TYPE_ERRORS = {bool: "must be true or false", int: "must be an integer", str: "must be a string"}


@functools.cache
def type_hints(cls) -> dict:
    """A config class's field annotations, read once per class."""
    return typing.get_type_hints(cls, include_extras=True)


def _unwrap(t: Any) -> tuple:
    return (t.__origin__, t.__metadata__) if typing.get_origin(t) is Annotated else (t, ())


def check(obj: Any, prefix: str, error: Type[UserError] = ConfigError) -> None:
    """Every field of a config object against its annotation (type, `Literal` choices, `Range`, non-empty
    `Name`), else one line naming `prefix.field`. Values are normalised in place: an int where a float is
    declared, a list where a tuple is, YAML's `.inf` spelling."""
    for f in dataclasses.fields(obj):
        v = _conform(f"{prefix}.{f.name}", getattr(obj, f.name), type_hints(type(obj))[f.name], error)
        object.__setattr__(obj, f.name, v)  # frozen configs too: this is their construction


def _conform(key: str, v: Any, t: Any, error: Type[UserError]) -> Any:
    (t, meta), given, nullable = _unwrap(t), v, False
    if typing.get_origin(t) in (Union, types.UnionType):
        options = [a for a in typing.get_args(t) if a is not type(None)]
        nullable = len(options) < len(typing.get_args(t))
        if len(options) > 1 and v is not None:
            return v  # several types (auto|true|false, a glob or a list of globs): the class checks the value
        t, meta = _unwrap(options[0])
    if v is None:
        return None if nullable or t is Any else bad(key, v, "must not be null", error)
    if typing.get_origin(t) is Literal:
        # `True == 1` in Python, so compare types too (compile=1 is not compile=true).
        if not any(v == a and type(v) is type(a) for a in typing.get_args(t)):
            bad(key, v, "valid: " + ", ".join(map(show_value, typing.get_args(t))), error)
    elif t is float:
        if isinstance(v, str) and v.strip().lower() in (".inf", "+.inf"):
            v = math.inf  # YAML's spelling of infinity, also accepted on the command line
        if not isinstance(v, (int, float)) or isinstance(v, bool) or math.isnan(v):
            bad(key, v, "must be a number", error)
        v = float(v)
    elif t in _TYPE_ERRORS and (not isinstance(v, t) or (t is int and isinstance(v, bool))):
        bad(key, v, _TYPE_ERRORS[t], error)
    elif tuple in (t, typing.get_origin(t)) or list in (t, typing.get_origin(t)):
        if not isinstance(v, (list, tuple)):
            bad(key, v, "must be a list", error)
        v = (tuple if tuple in (t, typing.get_origin(t)) else list)(v)
    elif dict in (t, typing.get_origin(t)) and not isinstance(v, Mapping):
        bad(key, v, "must be a mapping of keys to values", error)
    elif dataclasses.is_dataclass(t) and not isinstance(v, t):
        bad(key, v, "must be a group of keys", error)  # a nested group checked itself when it was made
    for m in meta:
        if isinstance(m, Range) and not m.holds(v):
            bad(key, given, m.text(t is int) + (" or null" if nullable else "") + (f" {m.note}" if m.note else ""),
                error)
        if m == "non-empty" and not v:
            bad(key, v, "must be a non-empty string", error)
    return v


def literal_choices(t: Any) -> Optional[tuple]:
    """The values a `Literal[...]` (or `Optional[Literal[...]]`) field allows; None for other types."""
    if typing.get_origin(t) in (Union, types.UnionType):
        t = next((a for a in typing.get_args(t) if a is not type(None)), t)
    return typing.get_args(t) if typing.get_origin(t) is Literal else None


def show_value(v: Any) -> str:
    """A value as YAML writes it (true, null)."""
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def to_plain(node: Any) -> dict:
    """A config group as a plain dict (OmegaConf nodes resolved; required values left unset dropped)."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=True)
    if not isinstance(node, Mapping):
        raise ConfigError(f"a config group must be a mapping of keys to values, got {type(node).__name__}")
    return {k: v for k, v in node.items() if v != MISSING}


def defaults(cls) -> dict:
    """{field: default} of a dataclass: nested dataclasses as dicts, tuples as lists, MISSING if none."""
    return {f.name: _default(f) for f in dataclasses.fields(cls)}


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return _plain(f.default_factory())
    return MISSING if f.default is dataclasses.MISSING else _plain(f.default)


def _plain(v: Any) -> Any:
    if dataclasses.is_dataclass(v):
        return {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    return [_plain(x) for x in v] if isinstance(v, (list, tuple)) else v


def build(cls, node: Any, prefix: str, error: Type[UserError] = ConfigError, keys=None, **fixed):
    """The dataclass `cls` from a config group `prefix`: absent keys take its defaults, a partial nested
    group keeps the default's other keys. `keys`: the group's valid keys when they are not cls's fields,
    `fixed`: fields that are no keys of the group. The class's `__post_init__` checks the values."""
    data, fs = to_plain(node), {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in data if k not in (keys or fs)]
    if unknown:
        raise error(f"unknown key(s) {', '.join(f'{prefix}.{k}' for k in unknown)}: valid keys are "
                    + ", ".join(keys or fs))
    for key, v in data.items():
        t = type_hints(cls)[key]
        if dataclasses.is_dataclass(t) and isinstance(v, Mapping):  # a nested group: over its default's keys
            data[key] = build(t, {**_default(fs[key]), **v}, f"{prefix}.{key}", error)
    missing = [k for k, f in fs.items() if k not in data and k not in fixed and _default(f) == MISSING]
    if missing:
        raise error(f"missing key {prefix}.{missing[0]}: it has no default, set it")
    return cls(**{**data, **fixed})


def union_keys(classes) -> dict:
    """{key: the first class declaring it} over the Options classes of a group whose components each read
    their own keys (`norm`, `optim`): the keys of its schema."""
    out: dict = {}
    for cls in classes:
        for f in dataclasses.fields(cls):
            out.setdefault(f.name, cls)
    return out


def own_options(cls, given: Mapping[str, Any], prefix: str, owner: str, known, hide: tuple = (),
                hint: str = "", error: Type[UserError] = ConfigError) -> Any:
    """`cls` (one component's Options) built from the keys `given` of its group. A key only another
    component reads is one line naming `owner` (`norm.name=pre_ln`) and cls's keys (but `hide`), then
    `hint` (`{key}` = the full key); a key no component has is an unknown key."""
    own = [f.name for f in dataclasses.fields(cls)]
    listed = ", ".join(k for k in own if k not in hide) or "none"
    foreign = [k for k in given if k not in own]
    typos = [k for k in foreign if k not in known]
    if typos:
        raise error(f"unknown key(s) {', '.join(f'{prefix}.{k}' for k in typos)}: valid keys are {listed}")
    if foreign:
        key = f"{prefix}.{foreign[0]}"
        bad(key, given[foreign[0]], f"not an option of {owner} (its options: {listed})" + hint.format(key=key), error)
    return build(cls, given, prefix, error)


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


def composition_error_line(e: BaseException, groups: Mapping) -> str:
    """One line for a Hydra composition error: an unknown group option, an unknown key of `groups` (the
    schema, {group: {key: default}}), bad syntax (the parser's reason)."""
    options, missing = getattr(e, "options", None), getattr(e, "missing_cfg_file", None)
    if options and missing and "/" in missing:  # `norm=nope`
        group, name = missing.rsplit("/", 1)
        return f"unknown {group}={name}: valid are {', '.join(options)}"
    full_key = getattr(e.__cause__, "full_key", None)
    if full_key and "." in full_key:  # `model.foo=1`: a key the group does not have
        node = groups
        for part in full_key.split(".")[:-1]:
            node = node.get(part) if isinstance(node, Mapping) else None
        if isinstance(node, Mapping):
            return f"unknown key(s) {full_key}: valid keys are {', '.join(node)}"
    if full_key and groups and full_key not in groups:  # `foo=1`, `modle=tiny`: a top-level key that is not one
        import difflib

        close = difflib.get_close_matches(full_key, list(groups), n=1)
        return (f"unknown key {full_key}: the top-level keys are {', '.join(groups)}"
                + (f"; did you mean {close[0]}?" if close else ""))
    lines = str(e).strip().splitlines() or [type(e).__name__]
    if getattr(e, "override", None):  # bad syntax: line 1 repeats the override, line 2 says what is wrong
        return f"bad override {e.override!r}: {' '.join(lines[min(1, len(lines) - 1)].split())}"
    first = " ".join(lines[0].split())
    cause = str(e.__cause__).strip().splitlines()[0] if e.__cause__ is not None and str(e.__cause__).strip() else ""
    return f"{first}: {cause}" if cause and cause not in first else first


_FIELD_LINE = re.compile(r"^\s+(\w+)\s*:[^#]*#\s*(.+?)\s*$")
_FIELD_BARE = re.compile(r"^\s+(\w+)\s*:[^#]*$")  # a field with its doc in the `#:` lines above
_DOC_ABOVE = re.compile(r"^\s+#:\s?(.*?)\s*$")


@functools.cache
def field_docs(cls) -> dict:
    """{field: its one-line doc}: the trailing `# ...` comment of the field's line in the class source, or
    the `#: ...` lines just above it (where the line would be too long), looked up in the class's bases too
    (an Options class inherits its base's docs). Read once per class."""
    docs: dict = {}
    for c in reversed([c for c in cls.__mro__ if dataclasses.is_dataclass(c)]):
        try:
            lines = inspect.getsource(c).splitlines()
        except (OSError, TypeError):
            continue
        names, own, above = {f.name for f in dataclasses.fields(c)}, {}, []
        for line in lines:
            doc_line = _DOC_ABOVE.match(line)
            if doc_line:  # `#: ...` lines above a field whose line is too long for its doc
                above.append(doc_line[1])
                continue
            m = _FIELD_LINE.match(line) or _FIELD_BARE.match(line)
            if m and m[1] in names:
                doc = m[2] if m.lastindex and m.lastindex >= 2 and m[2] else " ".join(above)
                if doc:
                    own.setdefault(m[1], doc)
            above = []
        docs.update(own)
    return docs


def seed_arg(text: str) -> int:
    """argparse type of a --seed: an integer in the range torch.manual_seed takes."""
    import argparse

    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= v <= 2 ** 64 - 1:
        raise argparse.ArgumentTypeError(f"{v} is not in [0, {2 ** 64 - 1}] (the range torch.manual_seed takes)")
    return v
