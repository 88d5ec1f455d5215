"""The long-horizon corpus `pysrc`: which files it keeps (deduplicated, UTF-8, size-capped), the hash that
names its content, the listed packages and the expected hash that fix it, and a small slice prepared and
split by whole files."""
import json

import numpy as np
import pytest

from data import DataConfig, DataError, get_tokenizer, prepare_dataset
from data.prepare import compose_data_config
from data.shards import open_shard
from data.sources import _pysrc_stream, named_distributions, pysrc_index, required_distributions


def _write(tmp_path, name, data: bytes):
    p = tmp_path / name
    p.write_bytes(data)
    return (name, str(p))


def test_index_keeps_each_file_once_and_says_what_it_left_out(tmp_path):
    a = _write(tmp_path, "a.py", b"x = 1\n")
    dup = _write(tmp_path, "b.py", b"x = 1\n")            # an exact copy of a.py
    big = _write(tmp_path, "big.py", b"#" * 200)
    latin = _write(tmp_path, "latin.py", "s = 'caf\xe9'\n".encode("latin-1"))
    empty = _write(tmp_path, "empty.py", b"  \n")
    c = _write(tmp_path, "c.py", b"y = 2\n")
    paths, info = pysrc_index([("one", [a, dup, big]), ("two", [latin, empty, c, dup])], max_bytes=100)
    assert paths == [a[1], c[1]]
    assert info["skipped"] == {"duplicate": 2, "too_large": 1, "not_utf8": 1, "empty_or_unreadable": 1}
    assert info["composition"] == [{"group": "one", "files": 1, "bytes": 6}, {"group": "two", "files": 1, "bytes": 6}]
    assert info["documents"] == 2 and info["bytes"] == 12
    # the hash names content and order: one changed byte, or another order, gives another hash
    again = pysrc_index([("one", [a, dup, big]), ("two", [latin, empty, c, dup])], max_bytes=100)[1]
    assert again["sha256"] == info["sha256"]
    (tmp_path / "c.py").write_bytes(b"y = 3\n")
    assert pysrc_index([("one", [a]), ("two", [c])], max_bytes=100)[1]["sha256"] != info["sha256"]
    assert pysrc_index([("two", [c]), ("one", [a])], max_bytes=100)[1]["sha256"] != \
        pysrc_index([("one", [a]), ("two", [c])], max_bytes=100)[1]["sha256"]


def test_the_packages_are_those_the_install_requires():
    names = {d.metadata["Name"].lower() for d in required_distributions()}
    assert {"torch", "numpy", "scipy"} <= names          # direct and transitive requirements
    assert "pytest" not in names and "nanonorm" not in names   # the dev extra and the project itself are not


def test_a_slice_prepares_with_its_composition_and_splits_by_whole_files(tmp_path):
    cfg = {"name": "pysrc", "source": "pysrc", "root": str(tmp_path), "max_docs": 60, "val_fraction": 0.2,
           "val_min_tokens": 1}
    out = prepare_dataset(cfg, progress=False)
    meta = json.loads((out / "meta.json").read_text())
    info = meta["source"]["stream0"]
    assert len(info["sha256"]) == 64 and info["documents"] > 10_000 and info["bytes"] > 50_000_000
    assert info["composition"][0]["group"].startswith("stdlib") and len(info["composition"]) > 20
    assert meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"] == 60
    assert meta["splits"]["val"]["documents"] >= 3
    # every validation document is one whole source file of the slice (split by file, not by character)
    tok = get_tokenizer("bytes")
    ids = np.concatenate([np.array(open_shard(out / s["file"])) for s in meta["splits"]["val"]["shards"]])
    docs = [tok.decode(d[1:]) for d in np.split(ids, np.flatnonzero(ids == tok.eot))[1:]]  # eot opens each
    texts = []
    for batch in _pysrc_stream().batches(0):
        texts += batch
        if len(texts) >= 60:
            break
    assert len(docs) == meta["splits"]["val"]["documents"]
    assert set(docs) <= set(texts[:60])


def test_the_listed_packages_fix_the_composition_and_a_missing_one_is_named():
    info = _pysrc_stream(["numpy", "torch"]).info
    assert [c["group"].split("==")[0] for c in info["composition"]][1:] == ["numpy", "torch"]
    assert info["composition"][0]["group"].startswith("stdlib")
    with pytest.raises(DataError, match=r"data.packages names 'no-such-dist', which is not installed"):
        named_distributions(["numpy", "no-such-dist"])


def test_the_configured_package_list_is_what_a_fresh_install_has():
    # data=pysrc lists its packages by name so a new dependency does not change the corpus; each listed
    # name must still come with `pip install -e .`, or a fresh machine cannot prepare it
    listed = DataConfig.from_any(compose_data_config(["data=pysrc"])).packages
    required = {d.metadata["Name"].lower() for d in required_distributions()}
    assert listed and {n.lower() for n in listed} <= required


def test_an_expected_hash_refuses_another_corpus(tmp_path):
    with pytest.raises(DataError, match=r"data.sha256=0+: this install's pysrc corpus hashes to [0-9a-f]{64}"):
        _pysrc_stream(["numpy"], sha256="0" * 64)
    cfg = {"name": "pysrc", "source": "pysrc", "root": str(tmp_path), "max_docs": 8, "val_fraction": 0.25,
           "val_min_tokens": 1, "packages": ["numpy"]}
    out = prepare_dataset(cfg, progress=False)
    got = json.loads((out / "meta.json").read_text())["source"]["stream0"]["sha256"]
    assert prepare_dataset({**cfg, "sha256": got}, progress=False) == out   # the recorded corpus: reused
    with pytest.raises(DataError, match=rf"holds a corpus with sha256 {got}, not data.sha256=1+"):
        prepare_dataset({**cfg, "sha256": "1" * 64}, progress=False)


def test_a_key_newer_than_the_prepared_dir_counts_as_its_default(tmp_path):
    cfg = {"name": "pysrc", "source": "pysrc", "root": str(tmp_path), "max_docs": 8, "val_fraction": 0.25,
           "val_min_tokens": 1}
    out = prepare_dataset(cfg, progress=False)
    meta = json.loads((out / "meta.json").read_text())
    del meta["config"]["packages"]                       # as written before data.packages existed
    (out / "meta.json").write_text(json.dumps(meta))
    assert prepare_dataset(cfg, progress=False) == out
    with pytest.raises(DataError, match=r"prepared with data.packages=None, not \['numpy'\]"):
        prepare_dataset({**cfg, "packages": ["numpy"]}, progress=False)
