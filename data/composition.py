"""What a prepared split holds, measured from its shards for meta.json: the UTF-8 bytes its tokens encode
(so bits per byte and tokens per byte are known per corpus), and for a corpus small enough to read twice,
the fraction of validation lines that also occur in training (a validation set that repeats its training
set measures memory, not modelling)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .shards import open_shard

MIN_LINE_CHARS = 30            # a shorter line ("return None", "else:") repeats by nature
OVERLAP_MAX_TOKENS = 400_000_000   # larger training splits are not read a second time to measure overlap


def split_bytes(files: list[Path], token_bytes: np.ndarray) -> int:
    """The UTF-8 bytes the tokens of `files` encode (end-of-text: none)."""
    total = 0
    for f in files:
        counts = np.bincount(np.asarray(open_shard(f)), minlength=len(token_bytes))
        total += int(counts[:len(token_bytes)] @ token_bytes)
    return total


def _documents(files: list[Path], tok):
    """The decoded documents of `files`, in order (documents start at an end-of-text token)."""
    for f in files:
        t = np.asarray(open_shard(f))
        cuts = np.flatnonzero(t == tok.eot)
        for a, b in zip(np.r_[0, cuts + 1], np.r_[cuts, len(t)]):
            if b > a:
                yield bytes(t[a:b].astype(np.uint8)).decode("utf-8", "replace") if tok.name == "bytes" \
                    else tok.decode(t[a:b])


def long_lines(text: str, min_chars: int = MIN_LINE_CHARS) -> list[str]:
    """The lines of `text` with at least `min_chars` characters once stripped, stripped."""
    return [s for s in (line.strip() for line in text.splitlines()) if len(s) >= min_chars]


def val_overlap(train: list[Path], val: list[Path], tok, min_chars: int = MIN_LINE_CHARS) -> dict:
    """The fraction of the validation split's lines of `min_chars`+ characters that occur, stripped, as a
    line of the training split."""
    seen = set()
    for doc in _documents(train, tok):
        seen.update(hash(s) for s in long_lines(doc, min_chars))
    n = hit = 0
    for doc in _documents(val, tok):
        lines = long_lines(doc, min_chars)
        n += len(lines)
        hit += sum(hash(s) in seen for s in lines)
    return {"min_line_chars": min_chars, "val_lines": n, "in_train": hit / n if n else None}
