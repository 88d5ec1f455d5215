"""What train.py's command line needs before torch, cached: the config schema, the variants defined in
code only, and the `--help` text. They are derived from the sources (dataclasses, variant classes,
configs/), and deriving them imports torch (seconds); cached under a hash of every file they come from,
`--help` and a composition error (an unknown key or option) answer without it. A changed source is a
new key, so a stale entry is never read; an unwritable cache dir only means no cache."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
# Everything the schema, the code-only variants and the help text are derived from.
SOURCES = ("common", "model", "data/config.py", "data/errors.py", "trainer/config.py", "trainer/optim.py",
           "trainer/schedules.py", "trainer/cli_help.py", "trainer/config_store.py", "configs")


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nanonorm"


def key() -> str:
    h = hashlib.sha1()
    for src in SOURCES:
        p = REPO / src
        for f in sorted(p.rglob("*")) if p.is_dir() else [p]:
            if f.suffix in (".py", ".yaml") and f.is_file():
                h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def cached(name: str, make: Callable[[], Any]) -> Any:
    """make()'s JSON-able value, from the cache when the sources are unchanged."""
    path = cache_dir() / f"{name}-{key()}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    value = make()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(value))
        os.replace(tmp, path)
    except OSError:
        pass  # no cache, same answer
    return value
