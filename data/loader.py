"""Training and validation loaders over memory-mapped llm.c shards.

Each split is cut into windows of block_size+1 tokens with stride block_size (x = w[:-1], y = w[1:]);
a window never crosses a shard boundary (at most block_size tokens lost per shard).

Train order: position p in an endless stream maps to window perm_e(p mod n), epoch e = p // n, where
perm_e is a keyed pseudo-random bijection (Feistel network, key (seed, e)): O(batch) work and O(1)
memory for any corpus size, and a pure function of (seed, p), so resume is exact with no saved state.
Step s owns positions [s*G, (s+1)*G), G = micro_batch_size * grad_accum * world_size; slot
(micro_step * world_size + rank) of that range goes to (rank, micro_step). Hence ranks are disjoint and
cover the global batch, and world size 1 with accum 2 sees the same step as world size 2 with accum 1.
"""
from __future__ import annotations

import glob
import math
import os
import warnings
from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np

from .config import DataError
from .shards import open_shard
from .files import read_json

if TYPE_CHECKING:  # annotations only: torch is imported lazily below
    import torch

GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # splitmix64's increment: 2^64 / golden ratio


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer (vectorized, wrapping uint64 arithmetic): the one integer hash of the
    data pipeline (the loader's permutation keys, prepare's validation split)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class FeistelPermutation:
    """A pseudo-random bijection of [0, n) keyed by `key`: a 6-round balanced Feistel network on the
    smallest even bit width covering n, restricted to [0, n) by cycle walking (expected < 4 walks)."""

    def __init__(self, n: int, key: tuple[int, ...], rounds: int = 6):
        if n < 1:
            raise ValueError("permutation of an empty range")
        self.n = n
        bits = max(2, math.ceil(math.log2(n)) if n > 1 else 2)
        bits += bits % 2
        self.half = np.uint64(bits // 2)
        self.mask = np.uint64((1 << (bits // 2)) - 1)
        k = np.uint64(0x243F6A8885A308D3)
        for part in key:
            k = splitmix64(np.array([k ^ np.uint64(part & 0xFFFFFFFFFFFFFFFF)], dtype=np.uint64))[0]
        self.keys = splitmix64(k + np.arange(1, rounds + 1, dtype=np.uint64) * GOLDEN_GAMMA)

    def _round_trip(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self.half, x & self.mask
        for k in self.keys:
            left, right = right, left ^ (splitmix64(right ^ k) & self.mask)
        return (left << self.half) | right

    def __call__(self, i: np.ndarray) -> np.ndarray:
        out = self._round_trip(np.asarray(i, dtype=np.uint64))
        bad = out >= self.n
        while bad.any():
            out[bad] = self._round_trip(out[bad])
            bad = out >= self.n
        return out.astype(np.int64)


def split_files(data_dir: str | os.PathLike, split: str) -> list[Path]:
    """The shards of a split: from meta.json when present, else `*{split}_*.bin` sorted (llm.c dirs)."""
    d = Path(data_dir)
    meta = d / "meta.json"
    if meta.exists():
        return [d / s["file"] for s in read_json(meta)["splits"].get(split, {}).get("shards", [])]
    return [Path(p) for p in sorted(glob.glob(str(d / f"*{split}_*.bin")))]


class _Windows:
    """The windows of one split across its shards."""

    def __init__(self, data_dir, split: str, block_size: int):
        if not isinstance(block_size, int) or block_size < 1:
            raise DataError(f"block_size={block_size!r}: must be an integer >= 1")
        files = split_files(data_dir, split)
        if not files and (Path(data_dir) / "meta.json").exists():
            raise DataError(f"{data_dir}: the {split} split is empty (meta.json lists no {split} shards); prepare "
                            f"it again with data.val_min_tokens > 0 or data.val_files")
        if not files:
            raise DataError(f"{data_dir}: no {split} shards (expected meta.json or {split}_*.bin files)")
        self.T = block_size
        self.shards = [open_shard(f) for f in files]
        counts = np.array([max(len(s) - 1, 0) // block_size for s in self.shards], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)])
        self.n = int(self.starts[-1])
        self.tokens = int(sum(len(s) for s in self.shards))
        if self.n == 0:
            raise DataError(f"{data_dir}: the {split} split has {self.tokens} tokens, too few for one "
                            f"sequence of block_size+1={block_size + 1}"
                            + ("; prepare it again with a larger data.val_min_tokens (or give data.val_files)"
                               if split == "val" else ""))
        self._offsets = np.arange(block_size + 1, dtype=np.int64)

    def read(self, windows: np.ndarray) -> np.ndarray:
        """uint16 [len(windows), T+1]; one fancy-index gather per shard touched, no loop over tokens."""
        buf = np.empty((len(windows), self.T + 1), dtype=np.uint16)
        shard = np.searchsorted(self.starts, windows, side="right") - 1
        for s in np.unique(shard):
            rows = np.nonzero(shard == s)[0]
            begin = (windows[rows] - self.starts[s]) * self.T
            buf[rows] = self.shards[s][begin[:, None] + self._offsets]
        return buf


def _xy(buf: np.ndarray) -> tuple["torch.Tensor", "torch.Tensor"]:
    import torch  # lazily: `import data` (and the prepare workers) stay light

    t = torch.from_numpy(buf.astype(np.int64))
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


class TrainLoader:
    def __init__(self, data_dir, micro_batch_size: int, block_size: int, grad_accum: int = 1, rank: int = 0,
                 world_size: int = 1, seed: int = 0, split: str = "train"):
        for k, v in (("micro_batch_size", micro_batch_size), ("grad_accum", grad_accum), ("world_size", world_size)):
            if not isinstance(v, int) or v < 1:
                raise DataError(f"{k}={v!r}: must be an integer >= 1")
        if not 0 <= rank < world_size:
            raise DataError(f"rank={rank} is not in [0, world_size={world_size})")
        self.data_dir = Path(data_dir)
        self.w = _Windows(data_dir, split, block_size)
        self.B, self.T, self.accum, self.rank, self.world = micro_batch_size, block_size, grad_accum, rank, world_size
        self.global_batch = micro_batch_size * grad_accum * world_size
        self.seed = int(seed)
        self._perms: dict[int, FeistelPermutation] = {}

    @property
    def num_sequences(self) -> int:
        """Windows per epoch."""
        return self.w.n

    def _perm(self, epoch: int) -> FeistelPermutation:
        if epoch not in self._perms:
            if len(self._perms) > 4:
                self._perms.clear()
            self._perms[epoch] = FeistelPermutation(self.w.n, (self.seed, epoch))
        return self._perms[epoch]

    def windows(self, step: int, micro_step: int = 0) -> np.ndarray:
        """Window ids this (rank, micro_step) reads at `step`."""
        if not 0 <= micro_step < self.accum:
            raise DataError(f"micro_step={micro_step} is not in [0, grad_accum={self.accum})")
        first = step * self.global_batch + (micro_step * self.world + self.rank) * self.B
        pos = first + np.arange(self.B, dtype=np.int64)
        epoch, within = np.divmod(pos, self.w.n)
        out = np.empty_like(pos)
        for e in np.unique(epoch):
            m = epoch == e
            out[m] = self._perm(int(e))(within[m])
        return out

    def get_batch(self, step: int, micro_step: int = 0):
        """(x, y) int64 [micro_batch_size, block_size] on CPU; a pure function of (seed, step, micro_step,
        rank) for fixed data, global batch and block_size."""
        return _xy(self.w.read(self.windows(step, micro_step)))

    def state_dict(self) -> dict:
        return {"version": 1, "seed": self.seed, "block_size": self.T, "global_batch": self.global_batch,
                "num_sequences": self.w.n, "tokens": self.w.tokens}

    def load_state_dict(self, d: dict) -> None:
        """Adopt the checkpoint's seed (the order is otherwise stateless); warn when the data differ."""
        self.seed = int(d["seed"])
        self._perms.clear()
        for k, mine in (("block_size", self.T), ("global_batch", self.global_batch),
                        ("num_sequences", self.w.n), ("tokens", self.w.tokens)):
            if k in d and d[k] != mine:
                warnings.warn(f"TrainLoader resume: checkpoint has {k}={d[k]}, now {mine}; "
                              f"the batch order will differ from the original run", stacklevel=2)


def spread(n: int, k: int) -> np.ndarray:
    """k window ids evenly spread over [0, n): the centre of each of k equal parts (all n when k >= n).
    A fixed stride, so a budget samples every region of the split, never only its head."""
    if k >= n:
        return np.arange(n, dtype=np.int64)
    return ((2 * np.arange(k, dtype=np.int64) + 1) * n) // (2 * k)


class ValLoader:
    """A fixed, world-size-independent list of sequences: min(all, token_budget // block_size) windows spread
    evenly over the whole val split (`spread`; None: every window). Sequence i goes to rank i % world_size;
    every rank yields the same number of full [batch_size, block_size] batches, padding with y = -1
    (ignore_index). With `docs=True` each batch also carries the document of every target (`doc_ids`), so a
    final evaluation can keep each document's loss and bytes."""

    def __init__(self, data_dir, batch_size: int, block_size: int, token_budget: int | None = None,
                 rank: int = 0, world_size: int = 1, split: str = "val", docs: bool = False):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise DataError(f"batch_size={batch_size!r}: must be an integer >= 1")
        if not 0 <= rank < world_size:
            raise DataError(f"rank={rank} is not in [0, world_size={world_size})")
        self.w = _Windows(data_dir, split, block_size)
        n = self.w.n if token_budget is None else min(self.w.n, max(1, int(token_budget) // block_size))
        self.windows = spread(self.w.n, n)
        self.whole = n == self.w.n
        self.num_sequences = n
        self.num_tokens = n * block_size  # tokens scored across all ranks
        self.B, self.rank, self.world = batch_size, rank, world_size
        self.num_batches = math.ceil(math.ceil(n / world_size) / batch_size)
        self.docs = _DocIndex(self.w, _eot(data_dir)) if docs else None

    @property
    def num_docs(self) -> int:
        return self.docs.n if self.docs is not None else 0

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self):
        """(x, y), or (x, y, doc) with `docs`: int64 [batch_size, block_size] each, doc -1 on padding."""
        for b in range(self.num_batches):
            seq = self.rank + self.world * (b * self.B + np.arange(self.B, dtype=np.int64))
            valid = seq < self.num_sequences
            win = self.windows[np.where(valid, seq, 0)]
            x, y = _xy(self.w.read(win))
            y[np.nonzero(~valid)[0].tolist()] = -1   # padding rows: ignore_index
            if self.docs is None:
                yield x, y
            else:
                import torch

                doc = torch.from_numpy(self.docs.of_targets(win))
                doc[np.nonzero(~valid)[0].tolist()] = -1
                yield x, y, doc


def _eot(data_dir) -> int | None:
    meta = Path(data_dir) / "meta.json"
    return int(read_json(meta)["eot"]) if meta.exists() and "eot" in read_json(meta) else None


class _DocIndex:
    """Which document each target of a window belongs to. Documents start at an end-of-text token (the
    shard layout), so a target belongs to the document of the token before it: a document's closing eot is
    scored with that document. A shard's text before its first eot counts as one more document."""

    def __init__(self, w: _Windows, eot: int | None):
        self.T = w.T
        self.eots, self.base = [], []
        n = 0
        for shard in w.shards:
            if eot is None:  # an llm.c dir without meta.json: its shards start with the eot
                eot = int(shard[0])
            pos = np.flatnonzero(np.asarray(shard) == eot).astype(np.int64)
            lead = 0 if len(pos) and pos[0] == 0 else 1   # text before the first eot: a document of its own
            self.eots.append(pos)
            self.base.append(n + lead - 1)
            n += len(pos) + lead
        self.n = n
        self.starts = w.starts
        self._t = np.arange(1, w.T + 1, dtype=np.int64)

    def of_targets(self, windows: np.ndarray) -> np.ndarray:
        out = np.empty((len(windows), self.T), dtype=np.int64)
        shard = np.searchsorted(self.starts, windows, side="right") - 1
        for s in np.unique(shard):
            rows = np.nonzero(shard == s)[0]
            ctx = (windows[rows] - self.starts[s])[:, None] * self.T + self._t - 1  # the token before each target
            out[rows] = self.base[s] + np.searchsorted(self.eots[s], ctx, side="right")
        return out
