"""llm.c / modded-nanogpt shard format.

A shard is a 256 x int32 little-endian header (magic 20240520, version 1, token count, zeros) followed by
the tokens as uint16. Documents are separated by the end-of-text token, placed BEFORE each document (as
llm.c's fineweb.py does), so every document in a shard starts right after an eot.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from .config import DataError
from .files import atomic_open

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TOKEN_DTYPE = np.dtype("<u2")
MAX_VOCAB = 2 ** 16  # ids must fit uint16


class ShardError(DataError):
    """A shard file that is not a valid llm.c shard (message names the file). A DataError, so every
    entry point that reports bad data in one line reports a corrupt shard the same way."""


def write_shard(path: str | os.PathLike, tokens: np.ndarray) -> str:
    """Write tokens to `path` atomically (data/files.py); returns the sha256 of the whole file."""
    path = Path(path)
    if tokens.size and int(tokens.max()) >= MAX_VOCAB:
        raise ShardError(f"{path}: token id {int(tokens.max())} does not fit uint16")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = MAGIC, VERSION, tokens.size
    body = tokens.astype(TOKEN_DTYPE, copy=False).tobytes()
    h = hashlib.sha256()
    h.update(header.tobytes())
    h.update(body)
    with atomic_open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(body)
    return h.hexdigest()


def read_header(path: str | os.PathLike) -> int:
    """Validate the header and the file size; return the token count."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(HEADER_BYTES)
    except FileNotFoundError:
        raise ShardError(f"{path}: shard file not found") from None
    if len(raw) < HEADER_BYTES:
        raise ShardError(f"{path}: too short for a shard header ({len(raw)} bytes)")
    header = np.frombuffer(raw, dtype="<i4")
    if header[0] != MAGIC:
        raise ShardError(f"{path}: bad magic {header[0]} (expected {MAGIC}); not an llm.c shard")
    if header[1] != VERSION:
        raise ShardError(f"{path}: unsupported shard version {header[1]} (expected {VERSION})")
    ntok = int(header[2])
    expect = HEADER_BYTES + ntok * TOKEN_DTYPE.itemsize
    size = path.stat().st_size
    if size != expect:
        raise ShardError(f"{path}: header says {ntok} tokens ({expect} bytes) but the file has {size} bytes")
    return ntok


def open_shard(path: str | os.PathLike) -> np.memmap:
    """Memory-map a shard's tokens (read-only, uint16)."""
    ntok = read_header(path)
    if ntok == 0:
        return np.zeros(0, dtype=TOKEN_DTYPE)
    return np.memmap(path, dtype=TOKEN_DTYPE, mode="r", offset=HEADER_BYTES, shape=(ntok,))


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(chunk):
            h.update(b)
    return h.hexdigest()


def shard_name(split: str, index: int) -> str:
    return f"{split}_{index:06d}.bin"
