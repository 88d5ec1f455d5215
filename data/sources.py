"""Document sources (`data.source`), picked by name from SOURCES. Each yields texts in a fixed order,
so doc index i is stable (val split, resume).

- pydocs: offline default; English prose from the running Python (pydoc_data topics + stdlib docstrings).
- pysrc:  offline long-horizon corpus; the Python source files of the stdlib and of every package that
          nanonorm's own install brings in (~230M bytes), one document per file, deduplicated.
- hf:     any Hugging Face hub dataset through `datasets.load_dataset` (optionally streaming).
- local:  the user's .txt/.jsonl/.json/.parquet globs through the SAME `datasets.load_dataset` path.
- shards: existing llm.c shard files, adopted as they are by prepare.py (no documents to stream).
Each built-in is named, with its own keys (its Options), in data/config.py's SOURCES. A source in a user's
own module is one function `cfg -> list[Stream]` under `@SOURCES.register(name, options=...)`.
"""
from __future__ import annotations

import ast
import glob
import hashlib
import itertools
import logging
import os
import re
import sys
import sysconfig
from dataclasses import dataclass, field
from typing import Callable, Iterator


from .errors import DataError, HubUnreachable

from .config import SOURCES, DataConfig, HubOptions, LocalOptions, PysrcOptions  # noqa: F401  (SOURCES: users' import)


@dataclass
class Stream:
    """One ordered source of documents. split=None: the held-out rule assigns each doc to train/val."""
    label: str
    split: str | None
    total: int | None                          # number of documents when known (progress ETA)
    batches: Callable[[int], Iterator[list]]   # batches(skip) -> iterator of lists of texts
    info: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------- pydocs
# Directories not parsed: tests (code, not prose), third-party packages, build config, pydoc_data (added
# separately). Modules are PARSED with ast, never imported: no side effects (this/antigravity print or
# open a browser, turtle/tkinter open windows) and the result does not depend on what imports cleanly.
_PYDOCS_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "pydoc_data"}


def _docstrings_in_order(tree: ast.AST) -> list[str]:
    out = []

    def visit(node):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc:
                out.append(doc)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def stdlib_modules() -> list[tuple[str, str]]:
    """(dotted name, path) of the standard library's .py files, sorted by name."""
    root = sysconfig.get_paths()["stdlib"]
    mods = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames
                       if d not in _PYDOCS_SKIP_DIRS and not d.startswith((".", "config-"))]
        for fn in filenames:
            if fn.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, fn), root)[:-3].replace(os.sep, ".")
                mods.append((rel.removesuffix(".__init__"), os.path.join(dirpath, fn)))
    return sorted(mods)


def _pydoc_topics() -> list[str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip pydoc_data; the docstrings are still there
        return []
    return [topics[k].strip() for k in sorted(topics)]


def _module_doc(path: str) -> str:
    """A module's docstrings (module, classes, functions) in source order, joined by blank lines."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), filename=path)
    except (SyntaxError, ValueError, OSError):  # e.g. lib2to3 test data in Python 2 syntax
        return ""
    return "\n\n".join(_docstrings_in_order(tree))


def _pydocs_iter(skip: int = 0) -> Iterator[str]:
    """The pydocs corpus in order: one document per pydoc topic (sorted), then one per stdlib module
    (sorted by dotted name; empty when it has no docstrings). Modules are parsed lazily."""
    topics = _pydoc_topics()
    yield from topics[skip:]
    for _, path in stdlib_modules()[max(skip - len(topics), 0):]:
        yield _module_doc(path)


def pydocs_documents() -> list[str]:
    """All non-empty pydocs documents (about 2.3M characters on CPython 3.11)."""
    return [d for d in _pydocs_iter() if d]


def _pydocs_stream() -> Stream:
    total = len(_pydoc_topics()) + len(stdlib_modules())
    if total == 0:
        raise DataError("data.source=pydocs: this Python installation has no pydoc topics or stdlib sources")

    def batches(skip):
        it = _pydocs_iter(skip)
        while batch := list(itertools.islice(it, 64)):
            yield batch

    return Stream("pydocs", None, total, batches,
                  {"python": sys.version.split()[0], "implementation": sys.implementation.name,
                   "stdlib": sysconfig.get_paths()["stdlib"]})


# ------------------------------------------------------------------------------------------------ pysrc
# Long horizons need a corpus many times larger than pydocs that a fresh machine already has offline: the
# .py files of the standard library and of the distributions `pip install -e .` pulls in (torch, numpy,
# scipy, pandas, ...). Code, docstrings and comments, ~230M bytes on CPython 3.11: a 32-tokens-per-parameter
# run of a 0.25M-parameter model reads a few percent of it, once.
PYSRC_MAX_FILE_BYTES = 262_144   # larger .py files are generated tables (chardet, unicode data), not source
PYSRC_ROOT_DIST = "nanonorm"


def _dist_key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def required_distributions(root: str = PYSRC_ROOT_DIST) -> list:
    """The installed distributions `root` requires, transitively (markers evaluated, no extras), sorted
    by name; `root` itself excluded. Raises DataError when `root` is not installed."""
    import importlib.metadata as md

    from packaging.requirements import InvalidRequirement, Requirement

    try:
        md.distribution(root)
    except md.PackageNotFoundError:
        raise DataError(f"data.source=pysrc reads the packages that {root}'s install requires, and {root} is not "
                        "installed: run pip install -e . first") from None
    seen, todo = {}, [root]
    while todo:
        name = todo.pop()
        key = _dist_key(name)
        if key in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:  # an optional dependency not installed here
            seen[key] = None
            continue
        seen[key] = dist
        for spec in dist.requires or []:
            try:
                req = Requirement(spec)
            except InvalidRequirement:
                continue
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    seen.pop(_dist_key(root), None)
    return [seen[k] for k in sorted(seen) if seen[k] is not None]


def _stdlib_files() -> list[tuple[str, str]]:
    """(relative path, path) of the stdlib's .py files (tests included: they are code too), sorted."""
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__")
                       and not d.startswith(".")]
        out += [(os.path.relpath(os.path.join(dirpath, f), root), os.path.join(dirpath, f))
                for f in filenames if f.endswith(".py")]
    return sorted(out)


def _dist_files(dist) -> list[tuple[str, str]]:
    return sorted((str(f), str(dist.locate_file(f))) for f in (dist.files or []) if str(f).endswith(".py"))


def pysrc_index(groups: list[tuple[str, list[tuple[str, str]]]], max_bytes: int = PYSRC_MAX_FILE_BYTES,
                near_duplicates: float | None = None):
    """The corpus's documents from `groups` [(label, [(relative path, path)])], in that order: each file
    read once, kept when it is UTF-8, non-empty, at most `max_bytes`, not an exact copy of an earlier
    file and (`near_duplicates`) not a near-copy: a file at least that fraction of whose distinct lines of
    30+ characters occur in the files kept before it (the first of a family stays). Returns (paths kept,
    info): info holds the composition per group, what was skipped and why, and `sha256`, a hash of every
    kept file's label, path and content in order."""
    from .composition import long_lines

    kept, digests, composition, lines_seen = [], set(), [], set()
    skipped = {"duplicate": 0, "too_large": 0, "not_utf8": 0, "empty_or_unreadable": 0}
    if near_duplicates is not None:
        skipped["near_duplicate"] = 0
    corpus_hash = hashlib.sha256()
    for label, files in groups:
        n, nbytes = 0, 0
        for rel, path in files:
            try:
                if os.path.getsize(path) > max_bytes:
                    skipped["too_large"] += 1
                    continue
                with open(path, "rb") as f:
                    raw = f.read()
            except OSError:
                skipped["empty_or_unreadable"] += 1
                continue
            if not raw.strip():
                skipped["empty_or_unreadable"] += 1
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                skipped["not_utf8"] += 1
                continue
            digest = hashlib.sha256(raw).digest()
            if digest in digests:
                skipped["duplicate"] += 1
                continue
            digests.add(digest)
            if near_duplicates is not None:
                lines = {hashlib.blake2b(s.encode(), digest_size=8).digest() for s in long_lines(text)}
                if lines and len(lines & lines_seen) >= near_duplicates * len(lines):
                    skipped["near_duplicate"] += 1
                    continue
                lines_seen |= lines
            corpus_hash.update(f"{label}/{rel}\0".encode() + digest)
            kept.append(path)
            n, nbytes = n + 1, nbytes + len(raw)
        composition.append({"group": label, "files": n, "bytes": nbytes})
    info = {"documents": len(kept), "bytes": sum(c["bytes"] for c in composition), "sha256": corpus_hash.hexdigest(),
            "max_file_bytes": max_bytes, **({"near_duplicates": near_duplicates} if near_duplicates else {}),
            "skipped": skipped, "composition": composition}
    return kept, info


def named_distributions(names: list) -> list:
    """The installed distributions `names`, in that order; one not installed raises DataError naming it."""
    import importlib.metadata as md

    out = []
    for name in names:
        try:
            out.append(md.distribution(name))
        except md.PackageNotFoundError:
            raise DataError(f"data.packages names {name!r}, which is not installed here: install the tested set "
                            "(pip install -e . -c constraints.txt) or drop it from data.packages") from None
    return out


def _pysrc_stream(packages: list | None = None, sha256: str | None = None,
                  near_duplicates: float | None = None) -> Stream:
    groups = [(f"stdlib (Python {sys.version.split()[0]})", _stdlib_files())]
    dists = required_distributions() if packages is None else named_distributions(packages)
    groups += [(f"{d.metadata['Name']}=={d.version}", _dist_files(d)) for d in dists]
    paths, info = pysrc_index(groups, near_duplicates=near_duplicates)
    if not paths:
        raise DataError("data.source=pysrc: no readable .py files in the stdlib or the installed packages")
    if sha256 is not None and info["sha256"] != sha256:
        # the same names at other versions (or another Python) are another corpus: results would not compare
        raise DataError(f"data.sha256={sha256}: this install's pysrc corpus hashes to {info['sha256']} "
                        f"(Python {sys.version.split()[0]}, {len(dists)} packages): install the tested versions "
                        "(pip install -e . -c constraints.txt), or set data.sha256=null for a corpus of your own")

    def batches(skip):
        for i in range(skip, len(paths), 64):
            out = []
            for p in paths[i:i + 64]:
                with open(p, encoding="utf-8") as f:
                    out.append(f.read())
            yield out

    return Stream("pysrc", None, len(paths), batches, {"python": sys.version.split()[0], **info})


def pysrc_source(cfg: "PysrcOptions") -> list[Stream]:
    return [_pysrc_stream(cfg.packages, cfg.sha256, cfg.near_duplicates)]


# ------------------------------------------------------------------------------------------- datasets
_BUILDERS = {".txt": "text", ".text": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
# Compressed text files are read through datasets' own decompression (.zst with the zstandard package):
# the Pile's shards are .jsonl.zst.
_COMPRESSIONS = (".zst", ".gz", ".bz2", ".xz")


def _extension(path: str) -> str:
    """The format's extension of a file, under a compression suffix: "x.jsonl.zst" -> ".jsonl"."""
    stem, ext = os.path.splitext(path)
    if ext.lower() in _COMPRESSIONS:
        stem, ext = os.path.splitext(stem)
    return ext.lower()


def resolve_files(key: str, patterns: list[str]) -> list[str]:
    files = []
    for pat in patterns:
        hits = sorted(glob.glob(os.path.expanduser(pat), recursive=True))
        hits = [h for h in hits if os.path.isfile(h)]
        if not hits:
            raise DataError(f"data.{key}: no file matches {pat!r}")
        files += [os.path.abspath(h) for h in hits]
    return files


def _builder_for(key: str, files: list[str]) -> str:
    exts = sorted({_extension(f) for f in files})
    for e in exts:
        if e not in _BUILDERS:
            raise DataError(f"data.{key}: unsupported file type {e!r}; valid: {', '.join(_BUILDERS)}, each "
                            f"optionally compressed ({', '.join(_COMPRESSIONS)})")
    builders = {_BUILDERS[e] for e in exts}
    if len(builders) > 1:
        raise DataError(f"data.{key}: mixes file types {exts}; use one format per dataset")
    return builders.pop()


def _unreadable_types() -> tuple:
    """What `datasets`/pyarrow raise on a file that is not what its extension says (binary, empty)."""
    import pyarrow
    from datasets.exceptions import DatasetGenerationError
    return (StopIteration, UnicodeDecodeError, pyarrow.lib.ArrowException, DatasetGenerationError)


def _unreadable(what: str, e: BaseException) -> DataError:
    if e.__cause__ is not None and type(e).__name__ == "DatasetGenerationError":
        e = e.__cause__  # the reader's own error (UnicodeDecodeError, ArrowInvalid, ...) says more
    why = "no records (an empty file?)" if isinstance(e, StopIteration) else \
        f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    return DataError(f"{what}: cannot be read ({why}); check that the files are UTF-8 text, JSON lines or parquet "
                     f"as their extension says")


def _unreachable(path: str, e: BaseException) -> HubUnreachable:
    import os

    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    advice = ("HF_HUB_OFFLINE is set and the dataset is not in the local cache: unset it to download"
              if offline else "check the network connection (or set HF_HUB_OFFLINE=1 to use a cached copy)")
    why = " ".join(str(e).split())[:200] or type(e).__name__
    return HubUnreachable(f"data.path={path!r}: cannot reach the Hugging Face hub ({why}); {advice}, or prepare "
                          f"a local copy with data=local data.files=<your .jsonl/.parquet/.txt files>")


def _load(cfg: DataConfig, path: str, split: str, what: str = "", **kw):
    """The one call both hub and local data go through (`what` names the files, for error messages)."""
    import datasets
    # The json builder logs the parse error it then raises; we report it once, in our own line.
    logging.getLogger("datasets.packaged_modules.json.json").setLevel(logging.CRITICAL)
    try:
        return datasets.load_dataset(path, split=split, streaming=cfg.streaming, cache_dir=cfg.cache_dir, **kw)
    except _unreadable_types() as e:
        raise _unreadable(what or f"data.path={path!r}", e) from None
    except ConnectionError as e:  # datasets' own (builtins) ConnectionError: hub unreachable or offline
        raise _unreachable(path, e) from None
    except FileNotFoundError as e:
        raise DataError(f"data.path={path!r}: {str(e).splitlines()[0] if str(e) else 'not found'}") from e
    except ValueError as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "split" in msg.lower() or "Unknown split" in msg:
            raise DataError(f"data.split/val_split={split!r}: {msg}") from e
        raise


def _columns(ds) -> list[str]:
    cols = ds.column_names
    if cols is None:  # streaming datasets may not know their features before reading
        first = next(iter(ds.take(1)), None)
        cols = list(first) if first is not None else []
    return list(cols)


def _ds_stream(cfg: DataConfig, ds, label: str, split: str | None, info: dict, cols: list | None = None) -> Stream:
    """`cols`: the columns when already known (a streamed dataset learns them by reading its first record;
    after the Pile filter that record could lie far into the shards)."""
    try:
        cols = _columns(ds) if cols is None else cols
    except _unreadable_types() as e:
        raise _unreadable(label, e) from None
    if cfg.text_column not in cols:
        raise DataError(f"data.text_column={cfg.text_column!r} not in {label}; valid columns: {', '.join(cols)}")
    ds = ds.select_columns([cfg.text_column])
    total = None if cfg.streaming else len(ds)
    col = cfg.text_column

    def batches(skip):
        d = ds.skip(skip) if skip else ds
        try:  # streaming reads lazily: a bad record further in fails here, not when opening
            for b in d.iter(batch_size=1024):
                texts = b[col]
                bad = next((t for t in texts if t is not None and not isinstance(t, str)), None)
                if bad is not None:  # a JSON array of numbers reads as a `text` column of numbers: not text
                    raise DataError(f"{label}: column {col!r} holds {type(bad).__name__} values ({bad!r}), not "
                                    f"text; give files whose data.text_column={col!r} holds strings")
                yield [t or "" for t in texts]
        except _unreadable_types() as e:
            raise _unreadable(label, e) from None
        except ConnectionError as e:  # a stream from the hub that loses the network part-way
            raise _unreachable(info.get("path", label), e) from None

    return Stream(label, split, total, batches, info)


def hf_source(cfg: "HubOptions") -> list[Stream]:
    import datasets
    kw = {"name": cfg.subset, "revision": cfg.revision}
    info = {"path": cfg.path, "subset": cfg.subset, "revision": cfg.revision, "datasets": datasets.__version__}
    streams = [_ds_stream(cfg, _load(cfg, cfg.path, cfg.split, **kw), f"{cfg.path}[{cfg.split}]",
                          "train" if cfg.val_split else None, dict(info, split=cfg.split))]
    if cfg.val_split:
        streams.append(_ds_stream(cfg, _load(cfg, cfg.path, cfg.val_split, **kw), f"{cfg.path}[{cfg.val_split}]",
                                  "val", dict(info, split=cfg.val_split)))
    return streams


def local_inputs(cfg: "LocalOptions") -> dict:
    """{split: [{"path", "bytes", "mtime_ns"}]} of the files data.files (and data.val_files) match now: what a
    prepared dir records, and what its reuse compares against (a file added under the glob, or changed)."""
    files = {"train": resolve_files("files", cfg.files)}
    if cfg.val_files:
        files["validation"] = resolve_files("val_files", cfg.val_files)
    return {k: [{"path": f, "bytes": os.stat(f).st_size, "mtime_ns": os.stat(f).st_mtime_ns} for f in v]
            for k, v in files.items()}


def local_source(cfg: "LocalOptions") -> list[Stream]:
    import datasets
    inputs = local_inputs(cfg)
    files = {k: [f["path"] for f in v] for k, v in inputs.items()}
    builders = {k: _builder_for("files" if k == "train" else "val_files", v) for k, v in files.items()}
    if len(set(builders.values())) > 1:
        raise DataError("data.val_files: must be the same file type as data.files")
    builder = builders["train"]
    kw = {"sample_by": cfg.txt_sample_by} if builder == "text" else {}
    streams = []
    for split, out_split in (("train", "train" if cfg.val_files else None), ("validation", "val")):
        if split not in files:
            continue
        info = {"builder": builder, "datasets": datasets.__version__, "files": inputs[split]}
        label = f"{builder} files {cfg.files if split == 'train' else cfg.val_files}"
        ds, cols = _load(cfg, builder, split, label, data_files=files, **kw), None
        if cfg.pile_set_name:
            ds, cols = _pile_subset(ds, cfg.pile_set_name, label)
            info["pile_set_name"] = cfg.pile_set_name
        streams.append(_ds_stream(cfg, ds, label, out_split, info, cols))
    return streams


def _pile_subset(ds, name: str, label: str):
    """The records of Pile-format files ({"text": ..., "meta": {"pile_set_name": ...}}) from one subset, so
    that data.files can point at a full Pile mirror's mixed shards."""
    try:
        cols = _columns(ds)
    except _unreadable_types() as e:
        raise _unreadable(label, e) from None
    if "meta" not in cols:
        raise DataError(f"data.pile_set_name={name!r}: {label} has no 'meta' column (columns: {', '.join(cols)}); "
                        "Pile-format records are {\"text\": ..., \"meta\": {\"pile_set_name\": ...}}")
    keep = ds.filter(lambda m: isinstance(m, dict) and m.get("pile_set_name") == name, input_columns=["meta"])
    return keep, cols   # a filter keeps the columns


def pydocs_source(cfg: DataConfig) -> list[Stream]:
    return [_pydocs_stream()]


def shards_source(cfg: DataConfig) -> list[Stream]:
    raise DataError("data.source=shards adopts existing shard files as they are (python -m data.prepare); "
                    "it has no documents to stream")


def open_streams(cfg: DataConfig) -> list[Stream]:
    return SOURCES[cfg.source](cfg)
