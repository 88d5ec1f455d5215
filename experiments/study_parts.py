"""The parts of a study file, typed like the rest of the config: one dataclass per part kind, registered by
its kind's name (`kind`), carrying its own keys (type, default and doc line beside each; a key without a
default is required). A study file's part is built once, when the study is read: an unknown key, a missing
one or a value of the wrong type is one line naming the part and the key (experiments/study.py says what
each kind runs).

A part still reads like the mapping it was written as (`part["of"]`, `part.get("pick")`, `"pick" in part`):
a key is present when the file gave it. A new part kind is a class here under `@kind(name)` and its branch
in `Runner.run_part`.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Optional, Union

from common import Registry
from common.config import Name, Positive, build, check
from common.errors import ConfigError

PART_KINDS = Registry("kind")


def kind(name: str):
    """Record the decorated Part class as the part kind `name`."""
    def deco(cls):
        PART_KINDS.add(name, cls)
        return cls
    return deco


@dataclass(kw_only=True)
class Part:
    """The keys every part has. `sweep`: the run-dir group it writes to (default: its `of` part's);
    `seeds`: the seeds of this part, instead of the study's. Read by key as a mapping is (not a Mapping:
    its `values` would be a method, and a vary part has a key of that name)."""
    name: Name
    kind: Name
    sweep: Optional[Name] = None
    seeds: Optional[list] = None

    def __post_init__(self) -> None:
        check(self, f"parts.{self.name}", ConfigError)

    def _given(self) -> list:
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]

    def __getitem__(self, key: str) -> Any:
        if key not in self._given():
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return key in self._given()

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in self._given() else default

    def keys(self) -> list:
        return self._given()

    def setdefault(self, key: str, default: Any) -> Any:
        if getattr(self, key) is None:
            setattr(self, key, default)
        return getattr(self, key)


@kind("grid")
@dataclass(kw_only=True)
class GridPart(Part):
    """Each cell at the ladder points around its start (`tune.width` on each side), every seed."""


@kind("edge")
@dataclass(kw_only=True)
class EdgePart(Part):
    """Where a cell's best is the largest or smallest value tried in `of`, one more ladder point beyond."""
    of: Name


@kind("rerun")
@dataclass(kw_only=True)
class RerunPart(Part):
    """The cells of `pick` at their best value in `of`, with this part's seeds and overrides; `ablations`
    (name: {of: cell, overrides: {...}}) add cells that change one choice of a picked cell."""
    of: Name
    pick: Optional[list] = None
    overrides: Optional[Union[dict, list]] = None
    ablations: Optional[dict] = None


@kind("shapes")
@dataclass(kw_only=True)
class ShapesPart(Part):
    """The cells of `pick` at other model shapes (`shapes`: factors of the base model), each bracketed."""
    of: Name
    pick: Optional[list] = None
    shapes: Optional[list] = None


@kind("vary")
@dataclass(kw_only=True)
class VaryPart(Part):
    """The cells of `pick` at their best in `of`, at each of `values` of a second key `key`."""
    of: Name
    key: Name
    values: list
    pick: Optional[list] = None


@kind("points")
@dataclass(kw_only=True)
class PointsPart(Part):
    """The points of another experiment (its experiment_meta.points), as they are."""
    experiment: Name


@kind("script")
@dataclass(kw_only=True)
class ScriptPart(Part):
    """<script>.py beside the study file, run on the run dirs `runs` selects ({of, cells | best, seeds}),
    skipping a run dir that holds its `output` already."""
    script: Name
    output: Name
    runs: list
    args: Optional[list] = None


@kind("horizon")
@dataclass(kw_only=True)
class HorizonPart(Part):
    """A trunk and WSD cooldown branches per setting and seed (experiments/horizon.py): `horizons` in tokens
    per parameter, the lr chosen on the study's seeds and tested on `test_seeds`; `cells`, or `pick` of
    `of`; `primary_horizon` where the choice is made and tested; `primary` and `ablation`: the declared
    Holm families of its report; `starts` ({cell: value}) moves a cell's grid centre for this part."""
    sweep: Name
    horizons: list
    test_seeds: list
    cells: Optional[list] = None
    of: Optional[Name] = None
    pick: Optional[list] = None
    overrides: Optional[Union[dict, list]] = None
    decay_frac: Optional[Positive] = None
    primary_horizon: Optional[Positive] = None
    primary: Optional[list] = None
    ablation: Optional[list] = None
    starts: Optional[dict] = None


def build_part(i: int, spec: Any) -> Part:
    """The typed part of the file's `parts[i]`; a ConfigError (one line) for a bad one."""
    if not isinstance(spec, Mapping) or "name" not in spec:
        raise ConfigError(f"parts[{i}]: {spec!r}: expected a mapping with name and kind")
    if spec.get("kind") not in PART_KINDS:
        raise ConfigError(f"parts[{i}].kind: {spec.get('kind')!r}: valid are {', '.join(PART_KINDS)}")
    return build(PART_KINDS[spec["kind"]], dict(spec), f"parts.{spec['name']}", ConfigError)
