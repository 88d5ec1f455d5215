"""The `data` group, typed and validated once: each default and its doc are written here once."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from common.config import Name, NonNegInt, PosInt, Range, bad, build, check, to_plain

from common import Registry

from .errors import DataError

# name -> the function that opens a source's document streams; data/sources.py registers them (imported by
# data/__init__.py, so the registry is full before any DataConfig is validated)
SOURCES = Registry("data.source", DataError)

@dataclass
class DataConfig:
    #: the corpus's name (null: the source's); the prepared dir is <root>/<name>[-<subset>]-<tokenizer>
    name: Optional[Name] = None
    tokenizer: Name = "bytes"         # bytes (257 ids) | gpt2 (GPT-2 BPE)
    root: Optional[Name] = None       # prepared data root; null: $NANONORM_DATA, else data_cache
    source: Name = "pydocs"           # pydocs | pysrc | hf | local | shards (existing llm.c .bin files in `path`)
    #: hf: the dataset (datasets.load_dataset(path, name=subset, ...)); shards: their dir
    path: Optional[str] = None
    subset: Optional[str] = None      # hf: the dataset's config name
    revision: Optional[str] = None    # hf: pin a commit for reproducibility
    split: Name = "train"             # hf: the split read for training
    val_split: Optional[str] = None   # the dataset's own validation split; null: hold out val_fraction
    text_column: Name = "text"        # jsonl/parquet/hf column holding the text (.txt files always use "text")
    streaming: bool = False           # read lazily instead of materialising an Arrow copy first
    cache_dir: Optional[str] = None   # datasets cache (HF_DATASETS_CACHE if null)
    files: Union[str, list, None] = None      # local: glob or list of globs of .txt / .jsonl / .json / .parquet
    val_files: Union[str, list, None] = None  # local: own validation files; null: hold out val_fraction
    pile_set_name: Optional[str] = None  # local Pile-format jsonl(.zst): keep records whose meta.pile_set_name is this
    #: pysrc: the distributions whose .py files follow the stdlib's, by name; null: every one the install
    #: requires (which then changes with the project's dependencies)
    packages: Optional[list] = None
    #: pysrc: the corpus's expected sha256 (meta.json's stream0.sha256); another corpus is refused
    sha256: Optional[str] = None
    #: pysrc: leave out a file when at least this fraction of its distinct lines of 30+ characters occur in
    #: the files kept before it (generated tables, codec maps, near-copies); null: keep every file
    near_duplicates: Annotated[Optional[float], Range(0, 1, "(]")] = None
    #: .txt: one document per file, per blank-line paragraph, or per line
    txt_sample_by: Literal["document", "paragraph", "line"] = "document"
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
        return [f.name for f in fields(cls) if f.name not in ("name", "root", "streaming", "cache_dir", "num_workers",
                                                             "batch_docs", "sha256")]

    @classmethod
    def from_any(cls, cfg: Any) -> "DataConfig":
        """From the composed `data` group (or a dict); a null root is fixed here, once for the run, to
        $NANONORM_DATA, else data_cache."""
        if isinstance(cfg, DataConfig):
            return cfg
        d = to_plain(cfg)
        if d.get("root") is None:
            d["root"] = default_root()
        return build(cls, d, "data", error=DataError)

    def __post_init__(self) -> None:
        check(self, "data", DataError)
        SOURCES[self.source]  # an unknown name raises one line listing the valid ones
        if self.name is None:  # a source alone needs no YAML: its corpus is named after it
            self.name = self.source
        if self.packages is not None and not all(isinstance(p, str) for p in self.packages):
            bad("data.packages", self.packages, "must be a list of distribution names (or null)", DataError)
        for key in ("files", "val_files"):
            v = getattr(self, key)
            if isinstance(v, str):
                setattr(self, key, [v])
            elif v is not None and not (isinstance(v, (list, tuple)) and all(isinstance(s, str) for s in v)):
                bad(f"data.{key}", v, "must be a glob or a list of globs", DataError)
        if self.source == "hf" and not self.path:
            bad("data.path", self.path, "source=hf needs a dataset path, e.g. HuggingFaceFW/fineweb-edu", DataError)
        if self.source == "shards" and not (self.path and os.path.isdir(os.path.expanduser(self.path))):
            bad("data.path", self.path, "source=shards needs the directory holding existing *train_*.bin / *val_*.bin "
                "shards", DataError)
        if self.source == "local" and not self.files:
            bad("data.files", self.files, "source=local needs data.files (a glob or list of globs of "
                ".txt/.jsonl/.parquet)", DataError)

    @property
    def out_dir(self) -> Path:
        """<root>/<name>[-<subset>]-<tokenizer>: tokenizers and subsets never share a directory."""
        parts = [self.name] + ([self.subset] if self.subset else []) + [self.tokenizer]
        return Path(os.path.expanduser(self.root or default_root())) / "-".join(parts)

    def content(self) -> dict:
        return {k: getattr(self, k) for k in self.content_keys()}


def default_root() -> str:
    """Where prepared data lives when data.root is null: $NANONORM_DATA, else ./data_cache."""
    return os.environ.get("NANONORM_DATA", "data_cache")
