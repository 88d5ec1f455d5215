"""Tokenizers: gpt2 equals tiktoken's own gpt2 (offline), pinned ids, bytes round trip, errors."""
import hashlib
import shutil

import pytest

from data.config import DataError
from data.tokenizer import gpt2_bundled_files, get_tokenizer

SAMPLE = [
    "Hello world",
    "  leading spaces,\ttabs\tand\n\nnewlines \r\n trailing   ",
    "Unicode: naïve café, Ελληνικά, русский, 日本語のテキスト, 한국어, emoji 🤖🚀👍🏽, e\u0301 combining, \u00a0nbsp",
    "Digits 0 1 12 123 1234 3.14159 1e-10 -42 +7 1,000,000 2024-05-20",
    "def f(x):\n    return {'a': [x ** 2 for x in range(10)]}  # code\n\tif x != None: pass\n",
    "It's we'll they've I'd you're DON'T shouldn't",
    "literal <|endoftext|> in text is ordinary text",
    "",
    "\u200b\ufeff zero width and BOM",
    "a" * 500 + " " + "🙂" * 20,
]


def test_gpt2_pinned_ids():
    tok = get_tokenizer("gpt2")
    assert tok.name == "gpt2" and tok.vocab_size == 50257 and tok.eot == 50256
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.enc.encode("<|endoftext|>", allowed_special="all") == [50256]
    assert tok.encode("<|endoftext|>") != [50256]  # ordinary: special strings are plain text
    assert tok.decode([50256]) == "<|endoftext|>"


def test_gpt2_equals_tiktoken_own_definition(tmp_path, monkeypatch):
    """Place the bundled files where tiktoken caches its downloads (sha1 of the URL), so that
    tiktoken.get_encoding('gpt2') - its own pattern, special tokens and hash check - loads offline."""
    import tiktoken
    import tiktoken.registry
    import tiktoken.load

    vocab_bpe, encoder_json = gpt2_bundled_files()
    base = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
    for url, src in ((base + "vocab.bpe", vocab_bpe), (base + "encoder.json", encoder_json)):
        shutil.copy(src, tmp_path / hashlib.sha1(url.encode()).hexdigest())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    # tiktoken memoises encodings per process: make sure we get a fresh load from our cache dir
    monkeypatch.delitem(tiktoken.registry.ENCODINGS, "gpt2", raising=False)
    def no_download(url):  # a cache miss (URLs not tiktoken's own) must fail, not fetch
        raise AssertionError(f"tiktoken tried to download {url}")
    monkeypatch.setattr(tiktoken.load, "read_file", no_download)
    ref = tiktoken.get_encoding("gpt2")
    monkeypatch.delitem(tiktoken.registry.ENCODINGS, "gpt2", raising=False)

    tok = get_tokenizer("gpt2")
    assert tok.enc._pat_str == ref._pat_str and tok.enc._special_tokens == ref._special_tokens
    assert tok.enc.n_vocab == ref.n_vocab == 50257
    for text in SAMPLE:
        ids = tok.encode(text)
        assert ids == ref.encode_ordinary(text), text
        assert tok.decode(ids) == text
    assert tok.encode_ordinary_batch(SAMPLE, num_threads=2) == ref.encode_ordinary_batch(SAMPLE)
    joined = "\n".join(SAMPLE)
    assert tok.encode(joined) == ref.encode_ordinary(joined)


@pytest.mark.parametrize("name", ["gpt2", "bytes"])
def test_encode_docs_puts_eot_before_each_document(name):
    tok = get_tokenizer(name)
    ids, lens = tok.encode_docs(SAMPLE)
    assert lens.tolist() == [len(tok.encode(t)) + 1 for t in SAMPLE]
    pos = 0
    for text, n in zip(SAMPLE, lens):
        assert ids[pos] == tok.eot and tok.eot not in ids[pos + 1:pos + n].tolist()
        assert tok.decode(ids[pos + 1:pos + n]) == text
        pos += n
    assert pos == len(ids)


def test_bytes_tokenizer():
    tok = get_tokenizer("bytes")
    assert (tok.vocab_size, tok.eot, tok.name) == (257, 256, "bytes")
    text = "héllo 🤖 <|endoftext|>"
    assert tok.encode(text) == list(text.encode("utf-8"))
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode([104, 105, 256, 106]) == "hi<|endoftext|>j"
    assert tok.encode_ordinary_batch(["a", "é"]) == [[97], [195, 169]]


def test_unknown_tokenizer_is_one_line_error():
    with pytest.raises(DataError, match=r"unknown data.tokenizer='gpt5': valid are gpt2, bytes") as e:
        get_tokenizer("gpt5")
    assert "\n" not in str(e.value)
