"""Tokenize a corpus into llm.c shards: `python -m data.prepare data=openwebtext data.tokenizer=gpt2`.

Pipeline: the main process reads documents in a fixed order and assigns each to train/val; worker
processes tokenize batches (eot before each document); results come back IN ORDER and stream into a
shard buffer of `shard_size` tokens per split. Memory is bounded by one shard per split plus a few batches
in flight, whatever the corpus size. Shards are written to a temp name then renamed. Every finished shard
(and every 30 s) a checkpoint (`progress.json` + append-only per-split tail files holding the tokens not
yet in a shard) is written, so an interrupted run resumes where it stopped; on resume the finished shards
are checked against the sha256 recorded for them. `meta.json` is written last: its presence means done.
"""
from __future__ import annotations

if __name__ == "__main__" and not __package__:
    # `python data/prepare.py ...` (the way nanoGPT's prepare scripts run): a file run as a script
    # cannot use relative imports, so run the installed package's module, as `python -m data.prepare`.
    import runpy
    runpy.run_module("data.prepare", run_name="__main__", alter_sys=True)
    raise SystemExit(0)

import collections
import fcntl
import hashlib
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

from common import ConfigError, report_user_errors
from common.config import defaults
from common.errors import disk_full, say_line

from .config import DataConfig, DataError
from .errors import DiskFull
from .files import atomic_write, writable_dir
from .loader import GOLDEN_GAMMA, splitmix64
from .shards import (HEADER_BYTES, MAGIC, MAX_VOCAB, TOKEN_DTYPE, VERSION, open_shard, sha256_file, shard_name,
                     write_shard)
from .sources import open_streams
from .tokenizer import get_tokenizer
from .verify import RECORD
from .files import read_json

META_FORMAT = "nanonorm-data"
PROGRESS = "progress.json"
CHECKPOINT_EVERY_S = 30.0
# each data.* key's default, for a meta.json written before the key existed


# ------------------------------------------------------------------------------------------ val split
def held_out(doc_index: np.ndarray, seed: int, fraction: float) -> np.ndarray:
    """Whether each document (by its index in the source order) is validation: a splitmix64 hash of
    (seed, index), so the assignment is independent of batching, workers and resume."""
    with np.errstate(over="ignore"):
        x = splitmix64(doc_index.astype(np.uint64) + np.uint64(seed + 1) * GOLDEN_GAMMA)
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / 2 ** 53) < fraction


def top_up_val(out: Path, writers: dict, min_tokens: int, eot: int) -> str:
    """Give the held-out val split at least `min_tokens` tokens, taken from the end of the train split:
    whole documents when they come close to the need (at most twice it), else the tail of the last
    document (a corpus of one huge document). Returns what was done, for meta.json ("" if nothing)."""
    train, val = writers["train"], writers["val"]
    need = min_tokens - val.tokens
    if need <= 0 or train.docs == 0:  # (no training documents: the empty-corpus error says it better)
        return ""
    if train.tokens - need < min_tokens:
        raise DataError(f"the corpus has {train.tokens + val.tokens:,} tokens, too few for a validation split of "
                        f"data.val_min_tokens={min_tokens:,} tokens and at least as many for training: add documents, "
                        f"give data.val_files, or lower data.val_min_tokens")
    # The train tokens not yet in a shard, plus finished shards taken back until they cover the need.
    tail = train.buf[:train.n].copy()
    while tail.size < 2 * need and train.shards:
        sh = train.shards.pop()
        tail = np.concatenate([np.array(open_shard(out / sh["file"])), tail])
        (out / sh["file"]).unlink()
    starts = np.flatnonzero(tail[:tail.size - need + 1] == eot)  # document starts leaving >= need tokens
    if starts.size and tail.size - starts[-1] <= 2 * need:
        cut = int(starts[-1])
        moved, ndocs = tail[cut:], int(np.count_nonzero(tail[cut:] == eot))
        train.docs -= ndocs
        how = f"{ndocs} whole documents"
    else:  # one document longer than twice the need: its tail becomes a val document of its own
        cut = tail.size - need
        moved, ndocs = np.concatenate([np.array([eot], dtype=tail.dtype), tail[cut:]]), 1
        how = f"the last {need:,} tokens of the last document"
    train.tokens -= tail.size
    train.n = 0
    train.append(tail[:cut], 0)
    val.append(moved, ndocs)
    return f"; topped up to data.val_min_tokens={min_tokens:,} with {how} from the end of the corpus"


# -------------------------------------------------------------------------------------------- workers
_TOK = None


def _init_worker(tokenizer_name: str) -> None:
    global _TOK
    _TOK = get_tokenizer(tokenizer_name)


def _encode_task(task: list[tuple[str, list[str]]]) -> list[tuple[str, np.ndarray, int]]:
    out = []
    for split, texts in task:
        ids, _ = _TOK.encode_docs(texts)
        out.append((split, ids.astype(TOKEN_DTYPE), len(texts)))  # ids < vocab_size <= 2**16, checked
    return out


# --------------------------------------------------------------------------------------- split writer
class SplitWriter:
    """Streams one split's tokens into fixed-size shards. The tokens not yet in a shard live in a
    preallocated buffer and are mirrored to an append-only tail file for resume."""

    def __init__(self, out: Path, split: str, shard_size: int, state: dict | None = None):
        self.out, self.split, self.shard_size = out, split, shard_size
        self.buf = np.empty(shard_size, dtype=TOKEN_DTYPE)  # untouched pages cost no memory
        self.n = 0
        self.tail_path = out / f".{split}.tail"
        self.shards = list(state["shards"]) if state else []
        self.docs = state["docs"] if state else 0
        self.tokens = state["tokens"] if state else 0
        self.tail_hash = hashlib.sha256()
        if state and state["tail_tokens"]:
            tail = np.fromfile(self.tail_path, dtype=TOKEN_DTYPE, count=state["tail_tokens"])
            self.buf[:tail.size] = tail
            self.n = tail.size
            self.tail_hash.update(tail.tobytes())
        with open(self.tail_path, "wb") as f:  # rewrite: drops bytes appended after the checkpoint
            f.write(self.buf[:self.n].tobytes())
        self.tail = open(self.tail_path, "ab")

    def append(self, ids: np.ndarray, ndocs: int) -> int:
        """Add a batch's tokens; returns the number of shards written."""
        self.docs += ndocs
        self.tokens += ids.size
        written, pos = 0, 0
        while ids.size - pos >= self.shard_size - self.n:
            take = self.shard_size - self.n
            self.buf[self.n:] = ids[pos:pos + take]
            pos += take
            self.n = self.shard_size
            self._emit()
            written += 1
        rest = ids[pos:]
        self.buf[self.n:self.n + rest.size] = rest
        self.n += rest.size
        if written:
            self._reset_tail()
        else:
            self.tail.write(rest.tobytes())
            self.tail_hash.update(rest.tobytes())
        return written

    def _emit(self) -> None:
        name = shard_name(self.split, len(self.shards))
        sha = write_shard(self.out / name, self.buf[:self.n])
        self.shards.append({"file": name, "tokens": int(self.n), "sha256": sha})
        self.n = 0

    def _reset_tail(self) -> None:
        self.tail.close()
        data = self.buf[:self.n].tobytes()
        atomic_write(self.tail_path, data)
        self.tail_hash = hashlib.sha256(data)
        self.tail = open(self.tail_path, "ab")

    def state(self) -> dict:
        self.tail.flush()
        os.fsync(self.tail.fileno())
        return {"shards": self.shards, "docs": self.docs, "tokens": self.tokens,
                "tail_tokens": int(self.n), "tail_sha256": self.tail_hash.copy().hexdigest()}

    def finish(self) -> dict:
        if self.n or not self.shards and self.docs:
            self._emit()
        self.tail.close()
        self.tail_path.unlink(missing_ok=True)
        return {"documents": self.docs, "tokens": self.tokens, "shards": self.shards}


# ------------------------------------------------------------------------------------------- resume
def _load_progress(out: Path, content: dict) -> tuple[dict | None, str]:
    """The checkpoint to resume from, or (None, why not)."""
    p = out / PROGRESS
    if not p.exists():
        return None, "no checkpoint"
    try:
        st = read_json(p)
    except (OSError, ValueError):
        return None, f"{p} unreadable"
    if {k: st.get("config", {}).get(k) for k in content} != content:  # an older form may record more keys
        return None, "the data config changed since the interrupted run"
    for split, s in st["splits"].items():
        for sh in s["shards"]:
            f = out / sh["file"]
            if not f.exists() or sha256_file(f) != sh["sha256"]:
                return None, f"shard {f} is missing or does not match its recorded sha256"
        tail = out / f".{split}.tail"
        nbytes = s["tail_tokens"] * TOKEN_DTYPE.itemsize
        if not tail.exists() or tail.stat().st_size < nbytes:
            return None, f"{tail} is shorter than recorded"
        with open(tail, "rb") as f:
            if hashlib.sha256(f.read(nbytes)).hexdigest() != s["tail_sha256"]:
                return None, f"{tail} does not match its recorded sha256"
    return st, ""


def _save_progress(out: Path, content: dict, stream: int, docs_read: int, writers: dict) -> None:
    st = {"config": content, "stream": stream, "docs_read": docs_read,
          "splits": {k: w.state() for k, w in writers.items()}}
    atomic_write(out / PROGRESS, json.dumps(st))


def _clear(out: Path) -> None:
    for f in out.iterdir():
        if f.name != ".lock" and (f.suffix in (".bin", ".tmp", ".tail") or f.name in (PROGRESS, "meta.json", RECORD)):
            f.unlink()


# -------------------------------------------------------------------------------------------- driver
PROGRESS_LINE_S = 5.0  # seconds between progress lines when stderr is not a terminal (no bar)


def _log(msg: str) -> None:
    say_line(f"[data] {msg}")  # one write: other ranks share this stderr


def _check_prepared(cfg: DataConfig, out: Path, verify: bool) -> bool:
    """True when `out` holds a finished preparation of this exact config (fast: stats, no hashing)."""
    meta_path = out / "meta.json"
    if not meta_path.exists():
        return False
    meta = read_json(meta_path, f"delete {out} to prepare it again")
    old = meta.get("config", {})
    for k, v in cfg.content().items():
        if k == "val_min_tokens" and k not in old and meta["splits"]["val"]["tokens"] >= v:
            continue  # prepared before the key existed, and its val split is already that large
        if k not in old and v == defaults(type(cfg)).get(k):
            continue  # prepared before the key existed, which now holds its default: the same tokens
        if old.get(k) != v:
            raise DataError(f"{out} was prepared with data.{k}={old.get(k)!r}, not {v!r}: delete it, or set "
                            f"data.name (or data.root) to prepare elsewhere")
    if cfg.source == "local":
        _check_local_inputs(cfg, out, meta)
    got = [st.get("sha256") for k, st in sorted(meta.get("source", {}).items()) if k.startswith("stream")]
    if getattr(cfg, "sha256", None) is not None and got != [cfg.sha256]:  # pysrc's expected corpus
        raise DataError(f"{out} holds a corpus with sha256 {', '.join(map(str, got)) or 'unrecorded'}, not "
                        f"data.sha256={cfg.sha256}: delete it to prepare this install's, or set data.sha256=null")
    for split in meta["splits"].values():
        for sh in split["shards"]:
            f = out / sh["file"]
            if not f.exists() or f.stat().st_size != HEADER_BYTES + sh["tokens"] * TOKEN_DTYPE.itemsize:
                raise DataError(f"{f}: missing or wrong size for {sh['tokens']} tokens (recorded in {meta_path}); "
                                f"delete {out} to prepare again")
            if verify and sh["sha256"] and sha256_file(f) != sh["sha256"]:
                raise DataError(f"{f}: sha256 does not match {meta_path}; delete {out} to prepare again")
    return True


def _check_local_inputs(cfg: DataConfig, out: Path, meta: dict) -> None:
    """A prepared dir of local files is reused only while its globs match the same files, unchanged (size and,
    where recorded, modification time): a file added or edited under the glob is another corpus."""
    from .sources import local_inputs

    was = {f["path"]: f for st in meta.get("source", {}).values() if isinstance(st, dict)
           for f in st.get("files", [])}
    now = {f["path"]: f for fs in local_inputs(cfg).values() for f in fs}
    added, gone = sorted(set(now) - set(was), key=str), sorted(set(was) - set(now), key=str)
    changed = sorted((p for p in set(now) & set(was) if now[p]["bytes"] != was[p]["bytes"]
                      or was[p].get("mtime_ns", now[p]["mtime_ns"]) != now[p]["mtime_ns"]), key=str)
    if added or gone or changed:
        what = "; ".join(f"{n} {label} (e.g. {xs[0]})" for n, label, xs in
                         ((len(added), "added", added), (len(gone), "gone", gone), (len(changed), "changed", changed))
                         if xs)
        raise DataError(f"{out} was prepared from other files than data.files matches now ({what}): prepare it "
                        "again with `python -m data.prepare ... --force` (or delete it), or set data.name to keep both")


def prepare_dataset(cfg, *, force: bool = False, verify: bool = False, progress: bool | None = None) -> Path:
    """Prepare the shards for data config `cfg` if needed; return the directory holding meta.json and the
    shards. A no-op (a few stats) when already prepared. Call it on one rank first (others wait)."""
    cfg = DataConfig.from_any(cfg)
    out = cfg.out_dir
    if not force and _check_prepared(cfg, out, verify):
        return out
    tok = get_tokenizer(cfg.tokenizer)
    if cfg.source == "shards":
        return _adopt_shards(cfg, tok, out)
    if tok.vocab_size > MAX_VOCAB:
        raise DataError(f"data.tokenizer={cfg.tokenizer!r} has {tok.vocab_size} ids, more than the uint16 shards "
                        f"hold ({MAX_VOCAB}); use a tokenizer with at most {MAX_VOCAB} ids")
    writable_dir(out, "data.root (else $NANONORM_DATA, else data_cache)")  # before any download or work
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process preparing the same dir waits, then reuses it
        if not force and _check_prepared(cfg, out, verify):
            return out
        out.mkdir(parents=True, exist_ok=True)  # the process we waited for may have failed and removed it
        if force:
            _clear(out)
        try:
            _run(cfg, tok, out, progress)
        except DataError as e:
            # Bad input fails the same way every time: nothing worth resuming, so leave no half-made dir.
            # An unreachable hub or a full disk is the machine, not the input: what was prepared stays, to resume.
            if not getattr(e, "resumable", False):
                _clear(out)
            (out / ".lock").unlink(missing_ok=True)
            if not any(out.iterdir()):
                out.rmdir()
            raise
    return out


def _adopt_shards(cfg: DataConfig, tok, out: Path) -> Path:
    """Existing llm.c shards (e.g. modded-nanogpt's fineweb10B): validate the headers and write a
    meta.json that points at them by absolute path; nothing is copied or re-tokenized."""
    from .loader import split_files
    from .shards import read_header
    src = Path(cfg.path).expanduser().resolve()
    splits = {}
    for split in ("train", "val"):
        files = split_files(src, split)
        if split == "train" and not files:
            raise DataError(f"data.path={cfg.path!r}: no *train_*.bin shards there")
        shards = [{"file": str(f), "tokens": read_header(f), "sha256": None} for f in files]
        splits[split] = {"documents": None, "tokens": sum(s["tokens"] for s in shards), "shards": shards}
    meta = {"format": META_FORMAT, "version": 1, "name": cfg.name, "tokenizer": tok.name,
            "vocab_size": tok.vocab_size, "eot": tok.eot, "shard_size": None,
            "source": {"source": "shards", "path": str(src)}, "val_split": "existing *val_*.bin shards",
            "splits": splits, "config": cfg.content()}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "meta.json", json.dumps(meta, indent=1))
    return out


def _run(cfg: DataConfig, tok, out: Path, progress) -> None:
    content = cfg.content()
    state = _resume_or_start_over(out, content)
    _log(f"preparing {cfg.name} ({cfg.source} source, tokenizer {tok.name}) into {out}: opening the corpus")
    streams = open_streams(cfg)  # errors about files/columns/splits surface here, before any work

    writers = {s: SplitWriter(out, s, cfg.shard_size, state["splits"].get(s) if state else None)
               for s in ("train", "val")}
    t0 = time.time()
    encoder = _Encoder(cfg)
    bar = _progress_bar(cfg, streams, out, progress)
    _log(f"{f'{bar.total:,} documents' if bar.total else 'documents of a stream of unknown length'} to "
         f"tokenize with {encoder.n_workers} worker process(es)")
    try:
        feeder = _Feeder(out, content, writers, encoder, bar, t0)
        for si, stream in enumerate(streams):
            if state and si < state["stream"]:
                continue
            feeder.feed(cfg, si, stream, start=state["docs_read"] if state and si == state["stream"] else 0)
            state = None  # later streams start from 0
            _save_progress(out, content, si + 1, 0, writers)
        bar.close()
        val_held_out = all(s.split is None for s in streams)
        topped = top_up_val(out, writers, cfg.val_min_tokens, tok.eot) if val_held_out else ""
        splits = {s: w.finish() for s, w in writers.items()}
    except OSError as e:
        if not disk_full(e):
            raise
        done = sum(len(w.shards) for w in writers.values())
        raise DiskFull(f"the disk holding {out} is full while preparing {cfg.name} (data.root): {done} finished "
                        "shard(s) kept, the one being written removed; free space and rerun the same command to "
                        "resume from the last progress checkpoint") from None
    finally:
        bar.close()
        encoder.close()
        for w in writers.values():
            try:
                w.tail.close()
            except OSError:  # a full disk refuses the buffered rest: the progress checkpoint never counted it
                pass
    _check_splits(cfg, splits, val_held_out)
    _measure(tok, out, splits)
    _write_meta(cfg, tok, out, streams, splits, content, topped, t0)


def _measure(tok, out: Path, splits: dict) -> None:
    """Each split's bytes and bytes per token, and (small corpora) the validation lines also in training,
    into `splits` for meta.json (data/composition.py)."""
    from .composition import OVERLAP_MAX_TOKENS, split_bytes, val_overlap

    tb = tok.token_bytes()
    files = {s: [out / sh["file"] for sh in v["shards"]] for s, v in splits.items()}
    for s, v in splits.items():
        v["bytes"] = split_bytes(files[s], tb)
        v["bytes_per_token"] = round(v["bytes"] / v["tokens"], 6) if v["tokens"] else None
    if splits["train"]["tokens"] <= OVERLAP_MAX_TOKENS:
        splits["val"]["overlap"] = val_overlap(files["train"], files["val"], tok)
        o = splits["val"]["overlap"]
        if o["in_train"] is not None:
            _log(f"{o['in_train']:.1%} of the {o['val_lines']:,} validation lines of {o['min_line_chars']}+ "
                 "characters also occur in training")


def _resume_or_start_over(out: Path, content: dict) -> Optional[dict]:
    """The progress of an interrupted preparation of the same content, or None (the dir cleared)."""
    state, why = _load_progress(out, content)
    if state is None:
        if (out / PROGRESS).exists():
            _log(f"cannot resume ({why}); starting over")
        _clear(out)
    else:
        done = sum(len(s["shards"]) for s in state["splits"].values())
        _log(f"resuming {out}: {done} finished shards verified, {state['docs_read']} documents already read")
        for f in out.glob(".*.tmp"):  # a shard a killed writer left half-written (we hold the dir's lock)
            f.unlink(missing_ok=True)
    return state


def allocated_cpus() -> int:
    """The cores this job may use, not the node's: Slurm's SLURM_CPUS_PER_TASK, else the process's CPU
    affinity (a cgroup or taskset), else every core."""
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        return int(slurm)
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def start_method() -> str:
    """fork is fast, but not after CUDA or a process group is up in this process (train.py preparing its
    data): a forked worker would inherit their threads and locks. Then spawn."""
    torch = sys.modules.get("torch")
    busy = torch is not None and ((torch.cuda.is_available() and torch.cuda.is_initialized())
                                  or (torch.distributed.is_available() and torch.distributed.is_initialized()))
    return "fork" if sys.platform.startswith("linux") and not busy else "spawn"


class _Encoder:
    """Tokenizes batches of documents: in a process pool (data.num_workers > 1), else in-process."""

    def __init__(self, cfg: DataConfig):
        self.n_workers = cfg.num_workers or allocated_cpus()
        self.pool = None
        if self.n_workers > 1:
            ctx = mp.get_context(start_method())
            self.pool = ctx.Pool(self.n_workers, initializer=_init_worker, initargs=(cfg.tokenizer,))
        else:
            _init_worker(cfg.tokenizer)

    def submit(self, task):
        """A handle for result(): the pool's async result, or the result itself."""
        return self.pool.apply_async(_encode_task, (task,)) if self.pool else _encode_task(task)

    def result(self, handle):
        return handle.get() if self.pool else handle

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


def _progress_bar(cfg: DataConfig, streams, out: Path, progress):
    from tqdm.auto import tqdm

    total = sum(s.total for s in streams) if all(s.total is not None for s in streams) else None
    if cfg.max_docs and total is not None:
        total = min(total, cfg.max_docs * len(streams))
    return tqdm(total=total, unit="doc", desc=f"prepare {out.name}", smoothing=0.05, dynamic_ncols=True,
                disable=(not progress) if progress is not None else None)


class _Feeder:
    """Streams documents through the encoder into the split writers, in order, with a bounded number
    of batches in flight, saving progress after every finished shard (and every CHECKPOINT_EVERY_S)."""

    def __init__(self, out: Path, content: dict, writers: dict, encoder: _Encoder, bar, t0: float):
        self.out, self.content, self.writers, self.encoder, self.bar = out, content, writers, encoder, bar
        self.t0, self.last_ckpt = t0, time.time()
        self.last_line, self.docs = t0, 0  # without a progress bar (not a terminal), a line every PROGRESS_LINE_S
        self.pending: collections.deque = collections.deque()

    def feed(self, cfg: DataConfig, si: int, stream, start: int) -> None:
        """Stream number `si` from document `start` on, to its end."""
        self.bar.update(start)
        self.docs += start
        for idx0, texts in _batched(stream, start, cfg):
            res = self.encoder.submit(_split_task(cfg, stream, idx0, texts))
            # (docs read after this batch, docs in this batch): a checkpoint resumes after the batch
            self.pending.append(((idx0 + len(texts), len(texts)), res))
            self._drain(si, 2 * self.encoder.n_workers + 2)  # bounded: at most this many batches in flight
        self._drain(si, 0)

    def _drain(self, si: int, limit: int) -> None:
        while len(self.pending) > limit:
            end, res = self.pending.popleft()
            new = sum(self.writers[split].append(ids, n) for split, ids, n in self.encoder.result(res))
            now = time.time()
            self.bar.update(end[1])
            self.docs += end[1]
            ntok = sum(w.tokens for w in self.writers.values())
            self.bar.set_postfix_str(f"{ntok / 1e6:.1f}M tok, {ntok / max(now - self.t0, 1e-9) / 1e6:.2f}M tok/s",
                                     refresh=False)
            if new or now - self.last_ckpt > CHECKPOINT_EVERY_S:
                _save_progress(self.out, self.content, si, end[0], self.writers)
                self.last_ckpt = now
            if self.bar.disable and now - self.last_line > PROGRESS_LINE_S:
                self.last_line = now
                of = f"/{self.bar.total:,}" if self.bar.total else ""
                _log(f"{self.docs:,}{of} documents, {ntok / 1e6:.1f}M tokens, {now - self.t0:.0f}s")


def _split_task(cfg: DataConfig, stream, idx0: int, texts: list) -> list:
    """[(split, texts)] of one batch: the stream's own split, or the held-out draw per document."""
    idx = np.arange(idx0, idx0 + len(texts))
    keep = np.fromiter((bool(t) for t in texts), dtype=bool, count=len(texts))
    if stream.split is None:
        val = held_out(idx, cfg.split_seed, cfg.val_fraction)
        task = [("train", [t for t, k, v in zip(texts, keep, val) if k and not v]),
                ("val", [t for t, k, v in zip(texts, keep, val) if k and v])]
    else:
        task = [(stream.split, [t for t, k in zip(texts, keep) if k])]
    return [(s, ts) for s, ts in task if ts]


def _check_splits(cfg: DataConfig, splits: dict, val_held_out: bool) -> None:
    if splits["train"]["documents"] == 0:
        raise DataError(f"empty corpus: data.source={cfg.source} produced no non-empty training documents"
                        + (f" from data.files={cfg.files}" if cfg.source == "local" else ""))
    if splits["val"]["tokens"] == 0:
        raise DataError(
            f"the validation split ({'data.val_files' if cfg.val_files else f'data.val_split={cfg.val_split!r}'}) "
            f"has no documents; give one with documents, or leave it unset to hold out part of data.files"
        )
    if not val_held_out and splits["val"]["tokens"] < cfg.val_min_tokens:
        _log(f"warning: the validation split has {splits['val']['tokens']:,} tokens, fewer than "
             f"data.val_min_tokens={cfg.val_min_tokens:,}: validation loss will be noisy")


def _write_meta(cfg: DataConfig, tok, out: Path, streams, splits: dict, content: dict, topped: str, t0: float) -> None:
    """meta.json (the sign of a finished preparation); the progress file goes."""
    meta = {
        "format": META_FORMAT, "version": 1, "name": cfg.name,
        "tokenizer": tok.name, "vocab_size": tok.vocab_size, "eot": tok.eot,
        "shard_format": {"magic": MAGIC, "version": VERSION, "header_int32": 256, "dtype": "uint16",
                         "eot": "before each document"},
        "shard_size": cfg.shard_size,
        "source": dict({"source": cfg.source, "revision": getattr(cfg, "revision", None)},
                       **{f"stream{i}": s.info for i, s in enumerate(streams)}),
        "val_split": (f"dataset split {cfg.val_split!r}" if getattr(cfg, "val_split", None) else
                      "val_files" if getattr(cfg, "val_files", None) else
                      f"held-out fraction {cfg.val_fraction} of documents, seed {cfg.split_seed}" + topped),
        "splits": splits,
        "config": content,
        "seconds": round(time.time() - t0, 2),
    }
    atomic_write(out / "meta.json", json.dumps(meta, indent=1))
    (out / PROGRESS).unlink(missing_ok=True)
    ntok = sum(s["tokens"] for s in splits.values())
    _log(f"prepared {out}: {splits['train']['documents']} + {splits['val']['documents']} documents, "
         f"{ntok:,} tokens in {time.time() - t0:.1f}s")


def _batched(stream, start: int, cfg: DataConfig):
    """(index of first doc, texts) batches of cfg.batch_docs documents from `start`, up to max_docs."""
    limit = cfg.max_docs
    buf, idx0 = [], start
    for texts in stream.batches(start):
        buf.extend(texts)
        while len(buf) >= cfg.batch_docs:
            b, buf = buf[:cfg.batch_docs], buf[cfg.batch_docs:]
            if limit is not None and idx0 + len(b) > limit:
                b = b[:max(limit - idx0, 0)]
            if b:
                yield idx0, b
            idx0 += len(b)
            if limit is not None and idx0 >= limit:
                return
    if limit is not None:
        buf = buf[:max(limit - idx0, 0)]
    if buf:
        yield idx0, buf


# ----------------------------------------------------------------------------------------------- CLI
def compose_data_config(overrides: list[str]):
    """Compose only the `data` group from configs/ with Hydra, `data=<name> data.key=value ...`, over the
    schema of every data.* key (each source's own null: its default), as train.py's base_config holds it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    from common.config import composition_error_line

    from .config import data_group_defaults

    schema = {"data": data_group_defaults()}
    ConfigStore.instance().store(name="data_only", node={"defaults": ["_self_", {"data": "pydocs"}], **schema})
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(Path(__file__).resolve().parent.parent / "configs"),
                                   version_base=None):
            return compose(config_name="data_only", overrides=overrides).data
    except HydraException as e:
        raise ConfigError(composition_error_line(e, schema)) from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print("usage: python -m data.prepare [data=pydocs|pysrc|local|openwebtext|fineweb_edu] [data.KEY=VALUE ...] "
              "[--force] [--verify]\n  --force: rebuild from scratch; --verify: check every shard's sha256")
        return 0
    flags = {a for a in argv if a.startswith("--")}
    bad = flags - {"--force", "--verify"}
    if bad:
        print(f"error: unknown flag {sorted(bad)[0]}; valid: --force, --verify", file=sys.stderr)
        return 2
    from common.errors import set_interrupt_note

    set_interrupt_note("the shards finished so far are kept; rerun the same command to resume from the last "
                       "progress checkpoint")
    cfg = report_user_errors(compose_data_config, [a for a in argv if not a.startswith("--")])
    out = report_user_errors(prepare_dataset, cfg, force="--force" in flags, verify="--verify" in flags)
    meta = read_json(out / "meta.json")
    for s, v in meta["splits"].items():
        docs = "? documents (adopted shards)" if v["documents"] is None else f"{v['documents']:,} documents"
        print(f"{out}/{s}: {docs}, {v['tokens']:,} tokens, {len(v['shards'])} shards")
    if "--verify" in flags:
        shards = [sh for v in meta["splits"].values() for sh in v["shards"]]
        unhashed = sum(sh["sha256"] is None for sh in shards)
        print(f"verified: the sha256 of all {len(shards) - unhashed} shards matches {out / 'meta.json'}"
              + (f"; {unhashed} adopted shards have no recorded sha256 (not checked)" if unhashed else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
