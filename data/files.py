"""Atomic file writes: a reader, or a process killed half-way, never sees half a file."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator, Union

from common.errors import UserError


@contextmanager
def atomic_open(path: Union[str, os.PathLike], mode: str = "w") -> Iterator[IO]:
    """Write to a temporary file beside `path`; when the block ends without error, flush and fsync
    it and rename it over `path` (atomic on POSIX). On error the temporary file is removed and `path`
    is untouched. The temporary name is `.<name>.<pid>.tmp`: hidden, unique per process, and ending
    in `.tmp` so that cleanup code recognises what a killed process left behind."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(path: Union[str, os.PathLike], data: Union[str, bytes]) -> Path:
    """Write `data` (text as UTF-8, or bytes) to `path` atomically; returns `path`."""
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    return Path(path)


class NotWritable(UserError, OSError):
    """A destination that cannot be written: one line, naming the key that chose it."""


def writable_dir(path: Union[str, os.PathLike], key: str) -> Path:
    """Create the directory `path` if needed and check that a file can be written in it, before any work
    whose result would go there; a NotWritable naming `key` otherwise."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".write_check.{os.getpid()}.tmp"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise NotWritable(f"cannot write to {path} ({e.strerror or e}), chosen by {key}: choose a writable "
                          "location") from None
    return p

