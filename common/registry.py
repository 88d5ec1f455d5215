"""Name -> component registries: one decorator pattern for every kind that a config picks by name
(variant, decay schedule, input step, LR schedule, data source, tokenizer).

    DECAYS = Registry("norm.decay")

    @DECAYS.register("harmonic")
    def harmonic(k, n): ...

    DECAYS["harmonic"]      # the function; an unknown name raises one line listing the valid ones

Adding a component is defining it under the decorator: nothing else lists the names.
A registry made with `filled_by="pkg.module"` imports that module the first time it is read, so a
torch-free config can check a name against components defined in a torch module without importing it
when the schema alone is needed (`--help`, composition).
"""
from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Type

from .errors import ConfigError, UserError


class Registry(Mapping):
    """`options`: for a kind whose components carry their config keys (variants, optimizers, schedules),
    the torch-free registry of those keys' `Options` classes by name. A registered class takes the Options
    recorded there under its name, or, defined elsewhere (a user's module), records the ones it carries."""

    def __init__(self, key: str, error: Type[UserError] = ConfigError, options: "Registry | None" = None,
                 filled_by: str | None = None):
        self.key, self.error = key, error   # the config key that picks a name, for error messages
        self.options = options
        self._items: dict[str, Any] = {}
        self._filled_by = filled_by         # the module that registers the built-in components

    def _fill(self) -> None:
        if self._filled_by is not None:
            module, self._filled_by = self._filled_by, None  # first: that module's decorators read nothing
            importlib.import_module(module)

    def register(self, name: str) -> Callable[[Any], Any]:
        def deco(obj):
            if self.options is not None:
                own = obj.__dict__.get("Options")
                if name in self.options:
                    if own is not None:
                        raise ValueError(f"{self.key}: {name!r} has its Options recorded already, not on the class")
                    obj.Options = self.options[name]
                else:
                    self.options.add(name, obj.Options)
            self.add(name, obj)
            if isinstance(obj, type):
                obj.name = name
            return obj
        return deco

    def add(self, name: str, obj: Any) -> None:
        """`obj` under `name`, leaving obj as it is (one object may serve several names)."""
        if name in self._items:
            raise ValueError(f"{self.key}: {name!r} is registered twice")  # a bug, not a user error
        self._items[name] = obj

    def __getitem__(self, name: str) -> Any:
        self._fill()
        if name not in self._items:
            raise self.error(f"unknown {self.key}={name!r}: valid are {', '.join(self._items)}")
        return self._items[name]

    def __contains__(self, name: object) -> bool:
        self._fill()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        self._fill()
        return iter(self._items)

    def __len__(self) -> int:
        self._fill()
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.key}: {', '.join(self._items)})"
