"""Name -> component registries: one mechanism for every kind that a config picks by name (variant, Norm,
input step, init, decay schedule, optimizer, LR schedule, data source, tokenizer, study part).

    DECAYS = Registry("norm.decay")

    @DECAYS.register("harmonic")
    def harmonic(k, n): ...

    DECAYS["harmonic"]      # the function; an unknown name raises one line listing the valid ones

A component that carries config keys records them beside its name (`options=`, or a class's own `Options`):
`VARIANTS.options("geonorm")` is the `norm.*` dataclass of GeoNorm. A component defined in a torch module is
named by its path instead ("model.norms:rmsnorm"), next to its torch-free Options: its name and keys are then
known to the config and `--help` without importing torch, and the module is imported the first time the
component itself is read. The path is written once, where the name is; nothing in that module registers back.
"""
from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Optional, Type

from .errors import ConfigError, UserError


class Registry(Mapping):
    def __init__(self, key: str, error: Type[UserError] = ConfigError):
        self.key, self.error = key, error   # the config key that picks a name, for error messages
        self._items: dict[str, Any] = {}    # name -> the component, or "module:attr" until first read
        self._options: dict[str, Any] = {}  # name -> its Options class, for components with config keys

    def register(self, name: str, options: Any = None) -> Callable[[Any], Any]:
        """Decorator: the object under `name`; a class's own `Options` (or `options`) become its keys."""
        def deco(obj):
            self.add(name, obj, options if options is not None else self._carried_options(obj))
            if isinstance(obj, type):
                obj.name = name
            return obj
        return deco

    def add(self, name: str, obj: Any, options: Any = None) -> None:
        """`obj` under `name` (a "module:attr" string is imported when first read); `options`: its keys."""
        if name in self._items:
            raise ValueError(f"{self.key}: {name!r} is registered twice")  # a bug, not a user error
        self._items[name] = obj
        if options is not None:
            self._options[name] = options

    def options(self, name: str) -> Any:
        """The Options class of `name` (None if it has none), without importing its component."""
        self._check(name)
        return self._options.get(name)

    def all_options(self) -> dict:
        """{name: its Options class} over the names with config keys, in order, importing nothing."""
        return {name: self._options[name] for name in self._items if name in self._options}

    def _carried_options(self, obj: Any) -> Optional[Any]:
        """A class's own Options, else the Options of the nearest registered class it extends (a user's
        subclass of GeoNorm reads GeoNorm's keys), else any Options it inherits from the interface."""
        if not isinstance(obj, type):
            return None
        if "Options" in obj.__dict__ or not self._options:
            return getattr(obj, "Options", None)
        for base in obj.__mro__[1:]:
            for name in self._options:
                if self[name] is base:
                    return self._options[name]
        return getattr(obj, "Options", None)

    def _check(self, name: str) -> None:
        if name not in self._items:
            raise self.error(f"unknown {self.key}={name!r}: valid are {', '.join(self._items)}")

    def __getitem__(self, name: str) -> Any:
        self._check(name)
        obj = self._items[name]
        if isinstance(obj, str):  # "package.module:attr", imported on first use
            module, _, attr = obj.partition(":")
            obj = self._items[name] = getattr(importlib.import_module(module), attr)
            if isinstance(obj, type):  # the class carries its name and keys, as a user's does
                obj.name = name
                if name in self._options:
                    obj.Options = self._options[name]
        return obj

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.key}: {', '.join(self._items)})"
