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
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # a read-only location: nothing was created, and the first error is the one to tell
            pass


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
    in_the_way = next((q for q in (p, *p.parents) if q.exists() and not q.is_dir()), None)
    if in_the_way is not None:
        where = "" if in_the_way == p else f", in the way of {path}"
        raise NotWritable(f"{in_the_way} is a file, not a directory{where} (chosen by {key}): move it away or choose "
                          "another location")
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".write_check.{os.getpid()}.tmp"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise NotWritable(f"cannot write to {path} ({e.strerror or e}), chosen by {key}: choose a writable "
                          "location") from None
    return p



class CorruptFile(UserError, ValueError):
    """A JSON file that does not parse (cut short by a kill or a full disk, or edited by hand)."""


def read_json(path: Union[str, os.PathLike], advice: str = "restore it, or delete it to start that part again"):
    """json.loads of the file, or one line naming it: a truncated record must not end in a traceback."""
    import json

    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise CorruptFile(f"{path} is corrupt or truncated ({e.msg} at line {e.lineno}): {advice}") from None
    except UnicodeDecodeError:
        raise CorruptFile(f"{path} is not text (not a JSON file): {advice}") from None


def read_yaml(path: Union[str, os.PathLike], what: str, expect: type = dict):
    """yaml.safe_load of the file, checked to be an `expect` (an empty file reads as an empty one); one line
    naming the file and `what` it should hold otherwise (malformed YAML, a list where a mapping belongs)."""
    import yaml

    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise CorruptFile(f"{path}: no such file ({what})") from None
    except UnicodeDecodeError:
        raise CorruptFile(f"{path} is not text: expected YAML, {what}") from None
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise CorruptFile(f"{path} is not valid YAML{at} ({getattr(e, 'problem', None) or e}): expected "
                          f"{what}") from None
    if value is None:
        value = expect()
    if not isinstance(value, expect):
        raise CorruptFile(f"{path} holds a YAML {_kind(value)}, not a {_kind(expect())}: expected {what}")
    return value


def _kind(value) -> str:
    return {dict: "mapping", list: "list", str: "string"}.get(type(value), type(value).__name__)
