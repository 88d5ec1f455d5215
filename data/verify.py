"""A prepared data dir's shards checked once before use: sha256 against meta.json, token ids against
the vocabulary. A bit flip or a shard from another tokenizer is then one error line naming the file,
not a silently wrong run or an IndexError deep in the embedding.

Reading every byte costs about what `--verify` costs, so it happens once per shard: the result is
recorded in <data dir>/verified.json, keyed by the shard's size and mtime (and the sha256 expected),
and later runs only stat the files.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from .config import DataError
from .files import atomic_write
from .loader import split_files
from .shards import HEADER_BYTES, TOKEN_DTYPE, read_header
from .files import read_json

RECORD = "verified.json"


def _scan(path: Path, chunk: int = 1 << 24) -> tuple[str, int]:
    """(sha256 of the whole file, largest token id) in one read."""
    read_header(path)  # a bad header or size is its own clear error
    h, top = hashlib.sha256(), -1
    with open(path, "rb") as f:
        h.update(f.read(HEADER_BYTES))
        while b := f.read(chunk):  # even-sized chunks after an even header: tokens never straddle two
            h.update(b)
            top = max(top, int(np.frombuffer(b, dtype=TOKEN_DTYPE).max()))
    return h.hexdigest(), top


def check_data_dir(data_dir, vocab_size: int, splits=("train", "val"), tokenizer: str = "") -> None:
    """Raise DataError naming the first shard of `splits` whose sha256 differs from meta.json or which
    holds a token id >= vocab_size. Shards already checked (same size, mtime, expected sha) are skipped."""
    d = Path(data_dir)
    meta_path = d / "meta.json"
    meta = read_json(meta_path) if meta_path.is_file() else {"splits": {}}
    expected = {str(d / sh["file"]): sh.get("sha256") for s in meta["splits"].values() for sh in s["shards"]}
    rec_path = d / RECORD
    try:
        record = read_json(rec_path)
    except (OSError, ValueError):
        record = {}
    changed = False
    for split in splits:
        for f in split_files(d, split):
            key, want = str(f), expected.get(str(f))
            try:
                st = f.stat()
            except FileNotFoundError:
                raise DataError(f"{f}: shard file not found (listed for the {split} split of {d})") from None
            r = record.get(key)
            if not r or (r["size"], r["mtime_ns"], r["sha256"]) != (st.st_size, st.st_mtime_ns, want):
                sha, top = _scan(f)
                if want and sha != want:
                    raise DataError(f"{f}: sha256 does not match {meta_path} (the shard changed on disk or is "
                                    f"corrupt); delete {d} to prepare it again")
                r = record[key] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": want, "max_id": top}
                changed = True
            if r["max_id"] >= vocab_size:
                raise DataError(f"{f}: token id {r['max_id']} is outside the vocabulary of "
                                f"{tokenizer or 'the tokenizer'} ({vocab_size} ids): the shard was made with another "
                                f"tokenizer, or is corrupt")
    if changed:
        try:
            atomic_write(rec_path, json.dumps(record, indent=1))
        except OSError:  # a read-only data dir: check again next time
            pass
