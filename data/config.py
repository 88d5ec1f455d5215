"""The `data` group, typed and validated once: each default and its doc are written here once."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from common.config import Name, NonNegInt, PosInt, Range, bad, check, defaults, own_options, to_plain, union_keys

from common import Registry

from .errors import DataError

# source name -> the function in data/sources.py that opens its document streams (`cfg -> [Stream]`),
# imported when a corpus is prepared, with its Options (below): the keys only that source reads
SOURCES = Registry("data.source", DataError)


@dataclass
class DataConfig:
    """The `data.*` keys every source reads. A source's own keys are its Options, a subclass below recorded
    beside its name in SOURCES: `data.files` exists only under `data.source=local`, and another source's key
    is one line naming the chosen source's keys. `from_any` builds the chosen source's class."""
    #: the corpus's name (null: the source's); the prepared dir is <root>/<name>[-<subset>]-<tokenizer>
    name: Optional[Name] = None
    tokenizer: Name = "bytes"         # bytes (257 ids) | gpt2 (GPT-2 BPE)
    root: Optional[Name] = None       # prepared data root; null: $NANONORM_DATA, else data_cache
    source: Name = "pydocs"           # pydocs | pysrc | hf | local | shards
    #: held-out fraction of DOCUMENTS (when there is no val split)
    val_fraction: Annotated[float, Range(0, 1, "[)")] = 0.0005
    val_min_tokens: NonNegInt = 8192  # held-out val is topped up to this many tokens from the corpus's end
    split_seed: NonNegInt = 1337      # seed of the document split
    shard_size: PosInt = 100_000_000  # tokens per shard (llm.c uses 100M)
    max_docs: Optional[PosInt] = None  # cap on documents read (quick runs); null = all
    num_workers: Optional[PosInt] = None  # tokenizer processes; null = all cores
    batch_docs: PosInt = 256          # documents per worker task

    @classmethod
    def content_keys(cls) -> list[str]:
        """The keys that change the prepared tokens (recorded in meta.json, compared on reuse): all but
        the name, where the data lives, how fast it is read and the expected hash, which checks the tokens
        instead of choosing them (a new key counts, to be safe)."""
        return [f.name for f in fields(cls) if f.name not in _NOT_CONTENT]

    @classmethod
    def from_any(cls, cfg: Any) -> "DataConfig":
        """The chosen source's Options from the composed `data` group (or a dict): a key of another source
        set there is one line; null is a source key's default. A null root is fixed here, once for the run,
        to $NANONORM_DATA, else data_cache."""
        if isinstance(cfg, DataConfig):
            return cfg
        d = to_plain(cfg)
        if d.get("root") is None:
            d["root"] = default_root()
        source = d.get("source") or DataConfig.source
        options = SOURCES.options(source) or DataConfig  # an unknown name: one line listing the valid ones
        own = {f.name for f in fields(options)}
        # Another source's key is dropped when null (the schema's value) or at its default: a config written
        # before the sources took their own keys holds every key of every source at its default.
        shared = {f.name for f in fields(DataConfig)}
        unread = {k: defaults(c)[k] for k, c in data_keys().items() if k not in own}
        given = {k: v for k, v in d.items()
                 if k in shared or (v is not None and (k not in unread or v != unread[k]))}
        return own_options(options, given, "data", f"data.source={source}", data_keys(), error=DataError)

    def __post_init__(self) -> None:
        check(self, "data", DataError)
        SOURCES.options(self.source)  # an unknown name raises one line listing the valid ones
        if self.name is None:  # a source alone needs no YAML: its corpus is named after it
            self.name = self.source

    @property
    def out_dir(self) -> Path:
        """<root>/<name>[-<subset>]-<tokenizer>: tokenizers and subsets never share a directory."""
        parts = [self.name] + ([self.subset] if getattr(self, "subset", None) else []) + [self.tokenizer]
        return Path(os.path.expanduser(self.root or default_root())) / "-".join(parts)

    def content(self) -> dict:
        return {k: getattr(self, k) for k in self.content_keys()}


_NOT_CONTENT = ("name", "root", "streaming", "cache_dir", "num_workers", "batch_docs", "sha256")


# ---- each source's own keys (its Options); the order of SOURCES below is the order of every listing ----
@dataclass
class PysrcOptions(DataConfig):
    """pysrc: the Python source files of the stdlib and of named installed distributions."""
    #: the distributions whose .py files follow the stdlib's, by name; null: every one the install
    #: requires (which then changes with the project's dependencies)
    packages: Optional[list] = None
    #: the corpus's expected sha256 (meta.json's stream0.sha256); another corpus is refused
    sha256: Optional[str] = None
    #: leave out a file when at least this fraction of its distinct lines of 30+ characters occur in
    #: the files kept before it (generated tables, codec maps, near-copies); null: keep every file
    near_duplicates: Annotated[Optional[float], Range(0, 1, "(]")] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.packages is not None and not all(isinstance(p, str) for p in self.packages):
            bad("data.packages", self.packages, "must be a list of distribution names (or null)", DataError)


@dataclass
class DatasetsOptions(DataConfig):
    """The keys of the sources read through `datasets.load_dataset` (hf, local)."""
    text_column: Name = "text"        # jsonl/parquet/hf column holding the text (.txt files always use "text")
    streaming: bool = False           # read lazily instead of materialising an Arrow copy first
    cache_dir: Optional[str] = None   # datasets cache (HF_DATASETS_CACHE if null)


@dataclass
class HubOptions(DatasetsOptions):
    """hf: a Hugging Face hub dataset."""
    path: Optional[str] = None        # the dataset (datasets.load_dataset(path, name=subset, ...))
    subset: Optional[str] = None      # the dataset's config name
    revision: Optional[str] = None    # pin a commit for reproducibility
    split: Name = "train"             # the split read for training
    val_split: Optional[str] = None   # the dataset's own validation split; null: hold out val_fraction

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.path:
            bad("data.path", self.path, "source=hf needs a dataset path, e.g. HuggingFaceFW/fineweb-edu", DataError)


@dataclass
class LocalOptions(DatasetsOptions):
    """local: the user's own files."""
    files: Union[str, list, None] = None      # glob or list of globs of .txt / .jsonl / .json / .parquet
    val_files: Union[str, list, None] = None  # own validation files; null: hold out val_fraction
    pile_set_name: Optional[str] = None  # Pile-format jsonl(.zst): keep records whose meta.pile_set_name is this
    #: .txt: one document per file, per blank-line paragraph, or per line
    txt_sample_by: Literal["document", "paragraph", "line"] = "document"

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("files", "val_files"):
            v = getattr(self, key)
            if isinstance(v, str):
                setattr(self, key, [v])
            elif v is not None and not (isinstance(v, (list, tuple)) and all(isinstance(s, str) for s in v)):
                bad(f"data.{key}", v, "must be a glob or a list of globs", DataError)
        if not self.files:
            bad("data.files", self.files, "source=local needs data.files (a glob or list of globs of "
                ".txt/.jsonl/.parquet)", DataError)


@dataclass
class ShardsOptions(DataConfig):
    """shards: existing llm.c shard files, adopted as they are."""
    path: Optional[str] = None        # the directory holding existing *train_*.bin / *val_*.bin shards

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.path and os.path.isdir(os.path.expanduser(self.path))):
            bad("data.path", self.path, "source=shards needs the directory holding existing *train_*.bin / *val_*.bin "
                "shards", DataError)


SOURCES.add("pydocs", f"{__package__}.sources:pydocs_source", options=DataConfig)
SOURCES.add("pysrc", f"{__package__}.sources:pysrc_source", options=PysrcOptions)
SOURCES.add("hf", f"{__package__}.sources:hf_source", options=HubOptions)
SOURCES.add("local", f"{__package__}.sources:local_source", options=LocalOptions)
SOURCES.add("shards", f"{__package__}.sources:shards_source", options=ShardsOptions)


def data_keys() -> dict:
    """{key: the class declaring it first} over every source: the `data` schema."""
    return union_keys([DataConfig, *SOURCES.all_options().values()])


def data_group_defaults() -> dict:
    """The `data` group's keys for composition: the shared ones at their defaults, each source's own null
    (its default, read only when that source is chosen)."""
    shared = defaults(DataConfig)
    return {**shared, **{k: None for k in data_keys() if k not in shared}}


def as_read(node: dict) -> dict:
    """The `data` group as its source reads it: another source's keys left out, this source's null keys at
    their defaults. A run dir saved when every source's keys sat in one group compares equal to today's."""
    source = node.get("source") or DataConfig.source
    options = SOURCES.options(source) if source in SOURCES else None
    if options is None:
        return dict(node)
    own, shared, every = defaults(options), {f.name for f in fields(DataConfig)}, data_keys()
    return {k: own[k] if v is None and k in own and k not in shared else v for k, v in node.items()
            if k in own or k not in every}


def content_keys() -> list[str]:
    """The keys of any source that change the prepared tokens (a run's data identity)."""
    return [k for k in data_keys() if k not in _NOT_CONTENT]


def default_root() -> str:
    """Where prepared data lives when data.root is null: $NANONORM_DATA, else ./data_cache."""
    return os.environ.get("NANONORM_DATA", "data_cache")
