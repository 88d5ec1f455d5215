"""Shard preparation: round trips, independent header reader, meta.json, local formats, the hub code
path on local parquet, resume after an interruption, idempotence, and every one-line error."""
import json
import os
import struct
import subprocess
import sys
from array import array
from pathlib import Path

import numpy as np
import pytest

from helpers import REPO, unregister

from common import UserError
from data import DataError, TrainLoader, ValLoader, get_tokenizer, prepare_dataset
from data.config import DataConfig
from data.prepare import compose_data_config
from data.shards import ShardError, open_shard, read_header, write_shard
from data.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]

# Documents with unicode, code, blank lines, and the literal eot string (must stay ordinary text).
BASE = ["The quick brown fox jumps over the lazy dog.",
        "Unicode: naïve café, 日本語, emoji 🤖 and e\u0301.\n\nSecond paragraph.",
        "def f(x):\n    return x ** 2  # code\n",
        "literal <|endoftext|> stays text",
        "Digits 1234567890 and 3.14159."]
DOCS = [f"Doc {i}. " + BASE[i % len(BASE)] * (1 + i % 4) for i in range(120)]


def read_shard_independently(path):
    """Parse a shard with struct/array only (no project code): header then uint16 tokens."""
    raw = Path(path).read_bytes()
    header = struct.unpack("<256i", raw[:1024])
    tokens = array("H")
    tokens.frombytes(raw[1024:])
    assert sys.byteorder == "little"
    assert header[0] == 20240520 and header[1] == 1 and header[2] == len(tokens)
    assert not any(header[3:])
    return list(tokens)


def split_docs(tokens, eot):
    """Documents from a token stream with eot BEFORE each document."""
    assert tokens[0] == eot
    docs, cur = [], None
    for t in tokens:
        if t == eot:
            if cur is not None:
                docs.append(cur)
            cur = []
        else:
            cur.append(t)
    docs.append(cur)
    return docs


def split_texts(data_dir, split):
    meta = json.loads((data_dir / "meta.json").read_text())
    tok = get_tokenizer(meta["tokenizer"])
    stream = [t for sh in meta["splits"][split]["shards"] for t in read_shard_independently(data_dir / sh["file"])]
    return [tok.decode(d) for d in split_docs(stream, tok.eot)] if stream else []


def is_subsequence(sub, seq):
    it = iter(seq)
    return all(any(x == y for y in it) for x in sub)


def write_jsonl(path, texts, key="text"):
    path.write_text("".join(json.dumps({key: t, "id": i}) + "\n" for i, t in enumerate(texts)))
    return path


def cfg(tmp_path, **kw):
    # val_min_tokens=0: these corpora are tiny and their held-out fraction is what is under test
    d = dict(name="t", tokenizer="bytes", root=str(tmp_path / "cache"), source="local",
             cache_dir=str(tmp_path / "hf"), num_workers=1, batch_docs=16, val_fraction=0.2, val_min_tokens=0)
    d.update(kw)
    return d


@pytest.mark.slow
@pytest.mark.parametrize("tokenizer,shard_size,workers", [("bytes", 3000, 2), ("gpt2", 800, 1)])
def test_round_trip_multi_shard_and_meta(tmp_path, tokenizer, shard_size, workers):
    f = write_jsonl(tmp_path / "c.jsonl", DOCS)
    out = prepare_dataset(cfg(tmp_path, files=[str(f)], tokenizer=tokenizer, shard_size=shard_size,
                              num_workers=workers), progress=False)
    assert out == tmp_path / "cache" / f"t-{tokenizer}"
    meta = json.loads((out / "meta.json").read_text())
    train, val = split_texts(out, "train"), split_texts(out, "val")
    # every document lands, whole, in exactly one split, in source order
    assert sorted(train + val) == sorted(DOCS) and 0 < len(val) < len(train)
    assert is_subsequence(train, DOCS) and is_subsequence(val, DOCS)
    assert meta["tokenizer"] == tokenizer and meta["shard_size"] == shard_size
    assert meta["eot"] == get_tokenizer(tokenizer).eot
    tok = get_tokenizer(tokenizer)
    for split, texts in (("train", train), ("val", val)):
        s = meta["splits"][split]
        assert s["documents"] == len(texts)
        assert s["tokens"] == sum(len(tok.encode(t)) + 1 for t in texts)
        assert sum(sh["tokens"] for sh in s["shards"]) == s["tokens"]
        assert all(sh["tokens"] == shard_size for sh in s["shards"][:-1])  # only the last is partial
        for sh in s["shards"]:
            import hashlib
            assert hashlib.sha256((out / sh["file"]).read_bytes()).hexdigest() == sh["sha256"]
    assert len(meta["splits"]["train"]["shards"]) >= 3
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*.tail")) and not (out / "progress.json").exists()
    assert meta["source"]["stream0"]["files"][0]["path"] == str(f)


def test_txt_and_parquet_and_streaming_match_jsonl(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    texts = DOCS[:40]
    write_jsonl(tmp_path / "a.jsonl", texts)
    pq.write_table(pa.table({"body": texts, "n": list(range(40))}), tmp_path / "a.parquet")
    (tmp_path / "txt").mkdir()
    for i, t in enumerate(texts):  # one document per file, sorted names keep the order
        (tmp_path / "txt" / f"{i:03d}.txt").write_text(t)
    outs = [prepare_dataset(cfg(tmp_path, name="j", files=[str(tmp_path / "a.jsonl")]), progress=False),
            prepare_dataset(cfg(tmp_path, name="js", files=[str(tmp_path / "a.jsonl")], streaming=True),
                            progress=False),
            prepare_dataset(cfg(tmp_path, name="p", files=str(tmp_path / "*.parquet"), text_column="body"),
                            progress=False),
            prepare_dataset(cfg(tmp_path, name="x", files=[str(tmp_path / "txt" / "*.txt")]), progress=False)]
    shas = [[sh["sha256"] for s in json.loads((o / "meta.json").read_text())["splits"].values()
             for sh in s["shards"]] for o in outs]
    assert shas[0] == shas[1] == shas[2] == shas[3]
    assert sorted(split_texts(outs[3], "train") + split_texts(outs[3], "val")) == sorted(texts)


def test_hub_code_path_with_own_validation_split(tmp_path):
    """source=hf runs datasets.load_dataset(path, ...) as for the hub; a local parquet directory with
    train/validation files exercises it, including the dataset's own validation split."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    d = tmp_path / "hubds" / "data"
    d.mkdir(parents=True)
    pq.write_table(pa.table({"text": DOCS[:30]}), d / "train-00000-of-00001.parquet")
    pq.write_table(pa.table({"text": DOCS[30:36]}), d / "validation-00000-of-00001.parquet")
    out = prepare_dataset(cfg(tmp_path, source="hf", path=str(tmp_path / "hubds"), val_split="validation"),
                          progress=False)
    assert split_texts(out, "train") == DOCS[:30] and split_texts(out, "val") == DOCS[30:36]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["val_split"] == "dataset split 'validation'"
    with pytest.raises(DataError, match="data.text_column='content' not in .*valid columns: text"):
        prepare_dataset(cfg(tmp_path, name="h2", source="hf", path=str(tmp_path / "hubds"), text_column="content"),
                        progress=False)


def shard_shas(out):
    meta = json.loads((out / "meta.json").read_text())
    return {sh["file"]: sh["sha256"] for s in meta["splits"].values() for sh in s["shards"]}


def test_an_unwritable_data_root_is_one_line_and_leaves_nothing(tmp_path):
    (tmp_path / "afile").write_text("")  # a file in the way: unwritable even as root
    f = write_jsonl(tmp_path / "c.jsonl", DOCS)
    with pytest.raises(UserError, match=r"afile is a file, not a directory, in the way of .*afile/x/.* "
                                        r"\(chosen by data.root \(else \$NANONORM_DATA"):
        prepare_dataset(cfg(tmp_path / "afile" / "x", files=[str(f)]), progress=False)


@pytest.mark.slow
@pytest.mark.parametrize("entry", [["-m", "data.prepare", "data=openwebtext"],
                                   ["train.py", "data=fineweb_edu", "train.max_steps=1"]])
def test_an_unreachable_hub_is_one_line_and_leaves_no_directory(tmp_path, entry):
    # HF_HUB_OFFLINE=1 fails at once, without the network, exactly as an unreachable hub does
    env = {**os.environ, "NANONORM_DATA": str(tmp_path / "root"), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled",
           "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    p = subprocess.run([sys.executable, *entry, f"out_dir={tmp_path / 'run'}"] if entry[0] == "train.py"
                       else [sys.executable, *entry], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert err[-1].startswith("error: data.path=") and "cannot reach the Hugging Face hub" in err[-1]
    assert "HF_HUB_OFFLINE is set" in err[-1] and "data=local data.files=" in err[-1]
    assert not any((tmp_path / "root").glob("*/*")) and not any((tmp_path / "root").glob("*"))  # no dir, no .lock


def test_a_hub_lost_part_way_keeps_what_was_prepared(tmp_path, monkeypatch):
    """The network, not the input: one line that says what to do, and the finished shards stay to resume."""
    import datasets
    from data.errors import HubUnreachable

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    c = cfg(tmp_path, source="hf", path="org/corpus")
    with monkeypatch.context() as m, pytest.raises(
            HubUnreachable, match=r"^data.path='org/corpus': cannot reach the Hugging Face hub \(no route\); "
                                  r"check the network connection"):
        m.setattr(datasets, "load_dataset", lambda *a, **k: (_ for _ in ()).throw(ConnectionError("no route")))
        prepare_dataset(c, progress=False)
    assert not DataConfig.from_any(c).out_dir.exists()  # nothing prepared yet: no empty dir with a .lock

    import data.prepare as P
    real = P._save_progress

    def save_then_lose_the_network(out, *args):  # a stream that drops after its first shards
        real(out, *args)
        if len(list(Path(out).glob("*_*.bin"))) >= 2:
            raise HubUnreachable("data.path='org/corpus': cannot reach the Hugging Face hub (lost)")
    monkeypatch.setattr(P, "_save_progress", save_then_lose_the_network)
    f = write_jsonl(tmp_path / "c.jsonl", DOCS * 3)
    c2 = cfg(tmp_path / "b", files=[str(f)], shard_size=2500, batch_docs=8)
    with pytest.raises(HubUnreachable):
        prepare_dataset(c2, progress=False)
    out = DataConfig.from_any(c2).out_dir
    assert len(list(out.glob("*_*.bin"))) >= 2 and (out / "progress.json").exists()  # kept, to resume
    assert not (out / ".lock").exists()


def test_preparation_says_what_it_is_doing_without_a_terminal(tmp_path, capsys, monkeypatch):
    import data.prepare as P

    monkeypatch.setattr(P, "PROGRESS_LINE_S", 0.0)  # a progress line at every batch
    f = write_jsonl(tmp_path / "c.jsonl", DOCS * 3)
    prepare_dataset(cfg(tmp_path, files=[str(f)], batch_docs=8), progress=False)
    err = [e for e in capsys.readouterr().err.splitlines() if e.startswith("[data] ")]  # (not datasets' own bars)
    assert (
        err[0].startswith("[data] preparing t (local source, tokenizer bytes) into ") and "opening the corpus" in err[0]
    )
    assert err[1] == f"[data] {len(DOCS) * 3} documents to tokenize with 1 worker process(es)"
    lines = [e for e in err if e.startswith("[data] ") and f"/{len(DOCS) * 3} documents, " in e]
    assert lines and lines[-1].startswith(f"[data] {len(DOCS) * 3}/{len(DOCS) * 3} documents, ")
    assert err[-1].startswith("[data] prepared ")


def fail_after_shards(monkeypatch, n: int) -> None:
    """Make preparation die right after the progress checkpoint that follows its n-th finished shard."""
    import data.prepare as P
    real = P._save_progress

    def save(out, *args):
        real(out, *args)
        if len(list(Path(out).glob("*_*.bin"))) >= n:
            raise RuntimeError(f"injected failure after {n} shards")
    monkeypatch.setattr(P, "_save_progress", save)


@pytest.mark.slow
def test_interrupted_preparation_resumes(tmp_path, capsys, monkeypatch):
    f = write_jsonl(tmp_path / "c.jsonl", DOCS * 3)
    kw = dict(files=[str(f)], shard_size=2500, batch_docs=8, num_workers=2)
    clean = prepare_dataset(cfg(tmp_path / "clean", **kw), progress=False)
    expected = shard_shas(clean)
    assert len(expected) >= 8

    c = cfg(tmp_path, **kw)
    with monkeypatch.context() as m, pytest.raises(RuntimeError, match="injected failure"):
        fail_after_shards(m, 3)
        prepare_dataset(c, progress=False)
    out = DataConfig.from_any(c).out_dir
    done = sorted(p.name for p in out.glob("*.bin"))
    assert len(done) >= 3 and not (out / "meta.json").exists() and (out / "progress.json").exists()
    mtimes = {p: os.stat(out / p).st_mtime_ns for p in done}
    # what a crash after the checkpoint leaves behind: bytes appended to a tail, a half-written shard
    with open(out / ".train.tail", "ab") as t:
        t.write(b"\x07" * 100)
    (out / ".train_000099.bin.4242.tmp").write_bytes(b"partial")  # atomic_open's temp name
    capsys.readouterr()
    prepare_dataset(c, progress=False)
    assert "resuming" in capsys.readouterr().err
    assert shard_shas(out) == expected
    assert all(os.stat(out / p).st_mtime_ns == m for p, m in mtimes.items())  # finished shards kept
    assert not list(out.glob(".*.tmp"))                         # the killed writer's half shard is gone

    # a finished shard that no longer matches its sha256 is not trusted: start over, same result
    c2 = cfg(tmp_path / "b", **kw)
    with monkeypatch.context() as m, pytest.raises(RuntimeError):
        fail_after_shards(m, 2)
        prepare_dataset(c2, progress=False)
    out2 = DataConfig.from_any(c2).out_dir
    first = sorted(out2.glob("train_*.bin"))[0]
    first.write_bytes(first.read_bytes()[:-2] + b"\0\0")
    capsys.readouterr()
    prepare_dataset(c2, progress=False)
    assert "starting over" in capsys.readouterr().err
    assert shard_shas(out2) == expected


def test_prepared_is_a_noop_and_config_change_is_an_error(tmp_path):
    f = write_jsonl(tmp_path / "c.jsonl", DOCS[:20])
    c = cfg(tmp_path, files=[str(f)])
    out = prepare_dataset(c, progress=False)
    m = os.stat(out / "meta.json").st_mtime_ns
    assert prepare_dataset(c, progress=False, verify=True) == out
    assert os.stat(out / "meta.json").st_mtime_ns == m
    with pytest.raises(DataError, match=r"prepared with data.val_fraction=0.2, not 0.3: delete it"):
        prepare_dataset(dict(c, val_fraction=0.3), progress=False)
    (out / "val_000000.bin").write_bytes(b"x")
    with pytest.raises(DataError, match="val_000000.bin: missing or wrong size"):
        prepare_dataset(c, progress=False)


def test_errors_are_one_line(tmp_path, monkeypatch):
    def err(c, match):
        with pytest.raises(DataError, match=match) as e:
            prepare_dataset(c, progress=False)
        assert "\n" not in str(e.value)

    err(cfg(tmp_path, files=[str(tmp_path / "missing" / "*.jsonl")]), r"data.files: no file matches '.*missing")
    empty = write_jsonl(tmp_path / "empty.jsonl", ["", ""])
    err(cfg(tmp_path, name="e", files=[str(empty)]), "empty corpus")
    wrong = write_jsonl(tmp_path / "w.jsonl", DOCS[:3], key="content")
    err(cfg(tmp_path, name="w", files=[str(wrong)]), r"data.text_column='text' not in .*valid columns: content, id")
    (tmp_path / "a.csv").write_text("x")
    err(cfg(tmp_path, name="c", files=[str(tmp_path / "a.csv")]), r"data.files: unsupported file type '.csv'")
    err(cfg(tmp_path, bogus=1), r"^unknown key\(s\) data.bogus: valid keys are name, tokenizer, root, ")
    err(cfg(tmp_path, source="web"), r"unknown data.source='web': valid are pydocs, pysrc, hf, local, shards")
    err(cfg(tmp_path, files=None), r"data.files=None: source=local needs data.files")
    err(cfg(tmp_path, tokenizer="gpt5", files=[str(wrong)]), r"unknown data.tokenizer='gpt5'")

    class Huge(Tokenizer):
        name, eot, vocab_size = "huge", 69999, 70000

    import data.tokenizer as T
    T.register_tokenizer("huge", Huge)
    try:
        err(cfg(tmp_path, tokenizer="huge", files=[str(wrong)]), r"has 70000 ids, more than the uint16 shards hold")
    finally:
        unregister(T.TOKENIZERS, "huge")
        T.get_tokenizer.cache_clear()


def test_shard_reader_rejects_bad_files(tmp_path):
    write_shard(tmp_path / "ok.bin", np.arange(10, dtype=np.uint16))
    assert read_header(tmp_path / "ok.bin") == 10 and open_shard(tmp_path / "ok.bin").tolist() == list(range(10))
    raw = bytearray((tmp_path / "ok.bin").read_bytes())
    (tmp_path / "trunc.bin").write_bytes(raw[:-2])
    raw[0] = 0
    (tmp_path / "magic.bin").write_bytes(raw)
    with pytest.raises(ShardError, match="trunc.bin: header says 10 tokens"):
        open_shard(tmp_path / "trunc.bin")
    with pytest.raises(ShardError, match="magic.bin: bad magic"):
        open_shard(tmp_path / "magic.bin")


@pytest.mark.slow
def test_pydocs_default_corpus(tmp_path, pydocs):
    """The offline default: deterministic, big enough, built without importing stdlib modules."""
    c = pydocs.config  # the session prepared it once with the default data config
    d = DataConfig.from_any(c)  # the YAML names the corpus; the byte tokenizer and source are DataConfig's defaults
    assert d.name == "pydocs" and d.tokenizer == "bytes" and d.source == "pydocs"
    out = pydocs.out_dir
    assert out == pydocs.root / "pydocs-bytes"
    assert not pydocs.imported & {"antigravity", "this", "turtle", "tkinter", "idlelib", "asyncio.__main__"}
    meta = json.loads((out / "meta.json").read_text())
    tokens = meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"]
    assert tokens > 2_000_000 and meta["splits"]["val"]["documents"] >= 10
    again = prepare_dataset(dict(c, root=str(tmp_path / "again"), max_docs=40), progress=False)
    again2 = prepare_dataset(dict(c, root=str(tmp_path / "again2"), max_docs=40, num_workers=2), progress=False)
    assert shard_shas(again) == shard_shas(again2)
    # the trainer's view: batches of real text
    x, y = TrainLoader(out, 4, 64, seed=1).get_batch(0)
    assert x.shape == (4, 64) and int(x.max()) < 257
    assert len(list(ValLoader(out, 8, 64, token_budget=64 * 20))) == 3


@pytest.mark.parametrize("name", ["pydocs", "pysrc", "local", "openwebtext", "fineweb_edu"])
def test_hydra_configs_validate(name, monkeypatch):
    monkeypatch.setenv("NANONORM_DATA", "/some/root")
    c = DataConfig.from_any(compose_data_config([f"data={name}", "data.tokenizer=gpt2"]
                                                + (["data.files=x.txt"] if name == "local" else [])))
    assert c.name == name and c.tokenizer == "gpt2" and c.root == "/some/root"
    if name == "openwebtext":
        assert (c.path, c.revision) == ("Skylion007/openwebtext", "refs/convert/parquet")
    if name == "fineweb_edu":
        assert c.path == "HuggingFaceFW/fineweb-edu" and c.subset == "sample-10BT"
        assert c.out_dir == Path("/some/root/fineweb_edu-sample-10BT-gpt2")


@pytest.mark.slow
def test_cli_prints_one_line_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "data.prepare", "data=local", f"data.root={tmp_path}",
                        f"data.files={tmp_path}/nothing/*.txt"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("error: data.files: no file matches")
    assert "Traceback" not in r.stderr


def test_existing_llmc_shards_are_adopted(tmp_path):
    src = tmp_path / "fineweb10B"
    src.mkdir()
    write_shard(src / "fineweb_val_000000.bin", np.arange(100, 300, dtype=np.uint16))
    for i in (1, 2):
        write_shard(src / f"fineweb_train_{i:06d}.bin", np.arange(i * 1000, i * 1000 + 500, dtype=np.uint16))
    out = prepare_dataset(dict(name="fw", tokenizer="gpt2", root=str(tmp_path / "cache"), source="shards",
                               path=str(src)), progress=False)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["tokenizer"] == "gpt2" and meta["splits"]["train"]["tokens"] == 1000
    assert [Path(s["file"]).name for s in meta["splits"]["train"]["shards"]] == \
        ["fineweb_train_000001.bin", "fineweb_train_000002.bin"]
    x, y = TrainLoader(out, 3, 16).get_batch(2)
    assert torch_equal_shift(x, y) and int(x.min()) >= 1000
    assert next(iter(ValLoader(out, 2, 16)))[0][0, 0] == 100
    with pytest.raises(DataError, match="source=shards needs the directory"):
        prepare_dataset(dict(name="fw", root=str(tmp_path), source="shards", path=str(tmp_path / "nope")))


def torch_equal_shift(x, y):
    return bool((y[:, :-1] == x[:, 1:]).all())


def run_prepare(*args, script=False):
    cmd = [sys.executable, "data/prepare.py"] if script else [sys.executable, "-m", "data.prepare"]
    return subprocess.run(cmd + [str(a) for a in args], cwd=ROOT, capture_output=True, text=True, timeout=180)


@pytest.mark.slow
def test_readme_adopt_shards_command_works_and_reruns(tmp_path):
    """docs/data.md: `python -m data.prepare data=shards data.name=fw10B data.path=DIR`."""
    src = tmp_path / "fineweb10B"
    src.mkdir()
    write_shard(src / "fineweb_val_000000.bin", np.arange(100, 300, dtype=np.uint16))
    write_shard(src / "fineweb_train_000001.bin", np.arange(1000, 1500, dtype=np.uint16))
    for _ in range(2):  # the second run finds it prepared and prints the same summary
        r = run_prepare("data=shards", "data.name=fw10B", f"data.path={src}",
                        f"data.root={tmp_path / 'cache'}")
        assert r.returncode == 0, r.stderr[-2000:]
        assert "train: ? documents (adopted shards), 500 tokens, 1 shards" in r.stdout, r.stdout


@pytest.mark.slow
def test_prepare_runs_as_a_script_too(tmp_path):
    f = write_jsonl(tmp_path / "c.jsonl", DOCS * 2)
    r = run_prepare("data=local", "data.name=s", "data.tokenizer=bytes", f"data.files={f}", f"data.root={tmp_path}",
                    "data.num_workers=1", "data.val_fraction=0.2", script=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "s-bytes/train:" in r.stdout and (tmp_path / "s-bytes" / "meta.json").exists()
    assert run_prepare("--help", script=True).returncode == 0


def test_held_out_val_split_is_topped_up_to_a_usable_size(tmp_path):
    # The README's local example: 600 short documents, the default val_fraction holds out about one.
    docs = [f"Document {i}: " + BASE[i % len(BASE)] * 3 for i in range(600)]
    f = write_jsonl(tmp_path / "c.jsonl", docs)
    out = prepare_dataset(cfg(tmp_path, files=[str(f)], val_fraction=0.0005, val_min_tokens=8192), progress=False)
    meta = json.loads((out / "meta.json").read_text())
    val = split_texts(out, "val")
    assert meta["splits"]["val"]["tokens"] >= 8192 and "topped up" in meta["val_split"]
    assert sorted(split_texts(out, "train") + val) == sorted(docs)  # whole documents, each in one split
    assert meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"] == sum(len(d.encode()) + 1 for d in docs)
    assert len(list(ValLoader(out, 8, 256, token_budget=65536))) >= 1  # training's validation can run (tiny: block 256)

    # .txt split into paragraphs: the held-out rule alone would give no validation document at all
    (tmp_path / "p.txt").write_text("\n\n".join(docs))
    out = prepare_dataset(cfg(tmp_path, name="p", files=[str(tmp_path / "p.txt")], txt_sample_by="paragraph",
                              val_fraction=0.0005, val_min_tokens=4096), progress=False)
    assert json.loads((out / "meta.json").read_text())["splits"]["val"]["tokens"] >= 4096

    # one huge document: its tail becomes the validation split
    big = "".join(docs)
    f = write_jsonl(tmp_path / "one.jsonl", [big])
    out = prepare_dataset(cfg(tmp_path, name="one", files=[str(f)], val_fraction=0.0005, val_min_tokens=5000,
                              shard_size=7000), progress=False)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["splits"]["val"]["tokens"] == 5001 and meta["splits"]["val"]["documents"] == 1  # eot + tail
    (head,), (tail,) = split_texts(out, "train"), split_texts(out, "val")
    assert head + tail == big and len(tail.encode()) == 5000

    # too small a corpus for that: one line at preparation time, saying what to set; no directory left
    f = write_jsonl(tmp_path / "small.jsonl", docs[:20])
    with pytest.raises(DataError, match=r"the corpus has [\d,]+ tokens, too few for a validation split of "
                                        r"data.val_min_tokens=8,192 .*lower data.val_min_tokens"):
        prepare_dataset(cfg(tmp_path, name="small", files=[str(f)], val_fraction=0.0005, val_min_tokens=8192),
                        progress=False)
    assert not (tmp_path / "cache" / "small-bytes").exists()


@pytest.mark.parametrize("name, content, needle", [
    ("empty.jsonl", b"", "no records (an empty file?)"),
    ("bin.jsonl", bytes(range(256)) * 8, "ArrowInvalid"),
    ("bin.txt", bytes(range(128, 256)) * 8, "UnicodeDecodeError"),
], ids=["empty.jsonl", "bin.jsonl", "bin.txt"])
def test_unreadable_files_are_one_line_and_leave_no_directory(tmp_path, capsys, name, content, needle):
    """The command's own error path, in this process (test_cli_prints_one_line_error runs the command)."""
    from data.prepare import main

    (tmp_path / name).write_bytes(content)
    with pytest.raises(SystemExit) as e:
        main(["data=local", "data.name=bad", "data.tokenizer=bytes", f"data.files={tmp_path / name}",
              f"data.root={tmp_path / 'cache'}", "data.num_workers=1"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and name in last and needle in last and "cannot be read" in last
    assert not (tmp_path / "cache" / "bad-bytes").exists()


@pytest.mark.parametrize("name, content, kind", [("nums.json", "[1, 2, 3, 4]", "int"),
                                                 ("nums.jsonl", '{"text": "a"}\n{"text": 6.5}\n', "float")])
def test_numbers_where_text_belongs_are_refused_not_trained_on(tmp_path, capsys, name, content, kind):
    from data.prepare import main

    (tmp_path / name).write_text(content)
    with pytest.raises(SystemExit) as e:
        main(["data=local", "data.name=nums", "data.tokenizer=bytes", f"data.files={tmp_path / name}",
              f"data.root={tmp_path / 'cache'}", "data.num_workers=1"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and name in last and f"column 'text' holds {kind} values" in last, last
    assert not (tmp_path / "cache" / "nums-bytes").exists()


def test_verify_ends_with_a_line_that_every_sha256_matched(tmp_path, capsys):
    from data.prepare import main

    f = write_jsonl(tmp_path / "c.jsonl", DOCS * 2)
    args = ["data=local", "data.name=v", "data.tokenizer=bytes", f"data.files={f}", f"data.root={tmp_path}",
            "data.num_workers=1", "data.val_fraction=0.2", "data.shard_size=3000"]
    assert main(args) == 0
    capsys.readouterr()
    assert main([*args, "--verify"]) == 0
    n = sum(len(s["shards"]) for s in json.loads((tmp_path / "v-bytes" / "meta.json").read_text())["splits"].values())
    assert capsys.readouterr().out.strip().splitlines()[-1] == \
        f"verified: the sha256 of all {n} shards matches {tmp_path / 'v-bytes' / 'meta.json'}"


def test_prepare_cli_reports_a_bad_group_option_or_override_as_one_line(capsys):
    from data.prepare import main

    for argv, message in ((["data=nope"], "error: unknown data=nope: valid are fineweb_edu, local, "),
                          (["data.max_docs=="], "error: bad override 'data.max_docs==': extraneous input '='"),
                          (["data.max_docs=abc"], "error: bad config data.max_docs='abc': must be an integer")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith(message) and err.count("\n") == 1, err


def test_pile_jsonl_zst_shards_are_read_and_filtered_by_pile_set_name(tmp_path):
    """A full Pile mirror's mixed .jsonl.zst shards: data=pile_arxiv keeps the ArXiv records only."""
    import zstandard

    recs = [{"text": f"arxiv paper {i} " * 20, "meta": {"pile_set_name": "ArXiv"}} for i in range(30)]
    recs += [{"text": f"github file {i} " * 20, "meta": {"pile_set_name": "Github"}} for i in range(30)]
    recs = [recs[i // 2] if i % 2 == 0 else recs[30 + i // 2] for i in range(60)]  # interleaved
    raw = "".join(json.dumps(r) + "\n" for r in recs).encode()
    shard = tmp_path / "00.jsonl.zst"
    shard.write_bytes(zstandard.ZstdCompressor().compress(raw))
    out = prepare_dataset(cfg(tmp_path, name="pile_arxiv", files=[str(shard)], pile_set_name="ArXiv"), progress=False)
    texts = split_texts(out, "train") + split_texts(out, "val")
    assert len(texts) == 30 and all(t.startswith("arxiv paper") for t in texts)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["config"]["pile_set_name"] == "ArXiv"
    # streamed, the columns are learnt by reading a first record once, before the filter (after it, the
    # first matching record of a rare subset could lie gigabytes in)
    from data import sources

    seen = []
    real = sources._columns
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sources, "_columns", lambda ds: seen.append(ds) or real(ds))
        streamed = prepare_dataset(cfg(tmp_path, name="pile_arxiv_s", files=[str(shard)], pile_set_name="ArXiv",
                                       streaming=True), progress=False)
    assert len(seen) == 1 and len(split_texts(streamed, "train") + split_texts(streamed, "val")) == 30
    # the data config itself: what a user points at a mirror
    import yaml

    assert yaml.safe_load((REPO / "configs" / "data" / "pile_arxiv.yaml").read_text())["pile_set_name"] == "ArXiv"
    assert yaml.safe_load((REPO / "configs" / "data" / "pile_books3.yaml").read_text())["pile_set_name"] == "Books3"
    # files without the Pile's meta column: one line saying so
    plain = write_jsonl(tmp_path / "plain.jsonl", DOCS[:10])
    with pytest.raises(DataError, match=r"data.pile_set_name='ArXiv': json files .* has no 'meta' column "
                                        r"\(columns: text, id\)"):
        prepare_dataset(cfg(tmp_path, name="plain", files=[str(plain)], pile_set_name="ArXiv"), progress=False)


def test_pg19_stand_in_reads_its_hub_layout_through_the_hub_path(tmp_path):
    """data=pg19 as the hub serves it (parquet under data/, train and validation splits, PG-19's columns),
    from a local directory in that layout through the same datasets.load_dataset(path, ...) call."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from data.config import DataConfig

    repo = tmp_path / "pg19"
    (repo / "data").mkdir(parents=True)
    for split, n in (("train", 12), ("validation", 3)):
        t = pa.table({"short_book_title": [f"Book {i}" for i in range(n)], "publication_date": [1900] * n,
                      "url": ["u"] * n, "text": [f"{split} book {i}. " * 200 for i in range(n)]})
        pq.write_table(t, repo / "data" / f"{split}-00000-of-00001.parquet")
    import yaml

    pg = yaml.safe_load((REPO / "configs" / "data" / "pg19.yaml").read_text())
    assert (pg["source"], pg["path"], pg["val_split"]) == ("hf", "emozilla/pg19", "validation") and pg["revision"]
    d = {**pg, "path": str(repo), "revision": None, "tokenizer": "bytes", "root": str(tmp_path / "cache"),
         "cache_dir": str(tmp_path / "hf"), "num_workers": 1}
    out = prepare_dataset(DataConfig.from_any(d), progress=False)
    train, val = split_texts(out, "train"), split_texts(out, "val")
    assert len(train) == 12 and len(val) == 3 and all(t.startswith("validation book") for t in val)


def test_a_changed_local_corpus_is_not_reused(tmp_path):
    """A file added under the same data.files glob used to be ignored: the old shards were reused silently."""
    import os

    from data import prepare_dataset
    from data.config import DataConfig
    from data.errors import DataError

    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"d{i}.txt").write_text(f"document number {i} " * 200)
    cfg = DataConfig.from_any({"name": "mine", "source": "local", "files": [str(src / "*.txt")],
                               "root": str(tmp_path / "data"), "val_fraction": 0.34, "val_min_tokens": 16})
    out = prepare_dataset(cfg, progress=False)
    assert prepare_dataset(cfg, progress=False) == out                   # unchanged: reused
    (src / "d3.txt").write_text("a new document " * 100)
    with pytest.raises(DataError, match=r"prepared from other files than data.files matches now \(1 added"):
        prepare_dataset(cfg, progress=False)
    (src / "d3.txt").unlink()
    os.utime(src / "d1.txt", ns=(1, 1))                                   # edited (its time moved)
    with pytest.raises(DataError, match=r"\(1 changed"):
        prepare_dataset(cfg, progress=False)
    assert prepare_dataset(cfg, force=True, progress=False) == out        # --force prepares it again
    assert prepare_dataset(cfg, progress=False) == out
