"""The validation instrument: windows spread over the whole split, world-size independence, bits per byte
on both tokenizers, the final evaluation equal to scoring every window, per-document sums and their
standard error, near-duplicate files left out of pysrc and the split's composition in meta.json."""
import json
import math

import numpy as np
import pytest
import torch

from data import ValLoader, get_tokenizer
from data.composition import split_bytes, val_overlap
from data.shards import write_shard
from data.sources import pysrc_index
from helpers import make_cfg, records
from model import GPT
from runtime import checkpoint as ck
from trainer.loop import train
from trainer.validation import LN2, score

T = 16


def _val_dir(tmp_path, docs, eot=256, name="bytes"):
    """A data dir whose val split is `docs` (lists of ids), each preceded by eot, with a meta.json."""
    ids = np.concatenate([np.r_[eot, d] for d in docs]).astype(np.uint16)
    write_shard(tmp_path / "val_000000.bin", ids)
    meta = {"tokenizer": name, "eot": eot, "splits": {"val": {"shards": [{"file": "val_000000.bin"}]}}}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    return tmp_path, ids


def _bytes_model(vocab=257, seed=0):
    from helpers import gpt_config

    torch.manual_seed(seed)
    return GPT(gpt_config("pre_ln", n_layer=1, n_head=2, n_embd=16, block_size=T, vocab_size=vocab)).eval()


def test_a_budget_samples_every_document_not_the_head(tmp_path):
    # 12 documents of 10 windows each, each of its own byte value: a budget of 12 windows must touch all 12
    # (the head would give the first document only)
    docs = [np.full(10 * T, 65 + k) for k in range(12)]
    d, _ = _val_dir(tmp_path, docs)
    val = ValLoader(d, 4, T, token_budget=12 * T, docs=True)
    seen_bytes, seen_docs = set(), set()
    for _, y, doc in val:
        seen_bytes |= set(y[y >= 0].tolist()) - {256}
        seen_docs |= set(doc[doc >= 0].tolist())
    assert seen_bytes == {65 + k for k in range(12)}
    assert seen_docs == set(range(12)) and val.num_docs == 12
    assert not val.whole and ValLoader(d, 4, T).whole


def test_document_of_each_target(tmp_path):
    d, ids = _val_dir(tmp_path, [np.full(5, 70), np.full(20, 71), np.full(9, 72)])
    val = ValLoader(d, 8, T, docs=True)
    bounds = np.flatnonzero(ids == 256)
    for x, y, doc in val:
        for row in range(x.shape[0]):
            if (y[row] < 0).all():
                continue
            for t in range(T):
                # the target's document is that of the token before it (a closing eot scores with its document)
                assert doc[row, t] == np.searchsorted(bounds, _pos(ids, x[row], t), side="right") - 1


def _pos(ids, xrow, t):
    """The position in `ids` of input token t of a window (windows are consecutive chunks of T)."""
    for start in range(0, len(ids) - T, T):
        if np.array_equal(ids[start:start + T], xrow.numpy()):
            return start + t
    raise AssertionError("window not found")


def test_world_size_independent(tmp_path):
    rng = np.random.default_rng(0)
    d, _ = _val_dir(tmp_path, [rng.integers(0, 256, int(n)) for n in rng.integers(20, 200, 9)])
    model, tb = _bytes_model(), torch.from_numpy(get_tokenizer("bytes").token_bytes())
    ac = torch.autocast("cpu", enabled=False)

    def total(world, budget):
        nats = tokens = nbytes = 0.0
        docs = None
        for r in range(world):   # the sums each rank contributes to the all-reduce
            res = score(model, ValLoader(d, 3, T, token_budget=budget, rank=r, world_size=world, docs=True),
                        lambda: ac, "cpu", tb)
            nats, tokens, nbytes = nats + res.loss * res.tokens, tokens + res.tokens, nbytes + res.bytes
            docs = res.doc_nats if docs is None else docs + res.doc_nats
        return nats, tokens, nbytes, docs

    for budget in (None, 7 * T):
        one = total(1, budget)
        for world in (2, 3):
            other = total(world, budget)
            assert other[1:3] == one[1:3]
            assert other[0] == pytest.approx(one[0], rel=1e-12)
            np.testing.assert_allclose(other[3], one[3], rtol=1e-12)


def test_bits_per_byte_bytes_tokenizer(tmp_path):
    text = ["héllo wörld " * 5, "plain ascii text here, long enough " * 2, "∑ naïve 😀 " * 4]
    docs = [np.frombuffer(s.encode(), dtype=np.uint8).astype(np.int64) for s in text]
    d, ids = _val_dir(tmp_path, docs)
    model = _bytes_model()
    res = score(model, ValLoader(d, 4, T), lambda: torch.autocast("cpu", enabled=False), "cpu",
                torch.from_numpy(get_tokenizer("bytes").token_bytes()))
    n = (len(ids) - 1) // T
    targets = np.concatenate([ids[i * T + 1:(i + 1) * T + 1] for i in range(n)])
    assert res.tokens == n * T and res.bytes == int((targets < 256).sum())   # eot targets: no bytes
    assert res.bpb == pytest.approx(res.loss * res.tokens / (res.bytes * LN2), rel=1e-12)


def test_bits_per_byte_gpt2_counts_the_decoded_bytes(tmp_path):
    tok = get_tokenizer("gpt2")
    text = ["The quick brown fox jumps over the lazy dog. " * 6, "naïve café déjà vu — “quotes” 😀 " * 5]
    docs = [np.asarray(tok.encode(s)) for s in text]
    d, ids = _val_dir(tmp_path, docs, eot=tok.eot, name="gpt2")
    tb = tok.token_bytes()
    assert tb[tok.eot] == 0 and all(tb[i] == len(tok.enc.decode_single_token_bytes(i)) for i in (0, 198, 40, 5000))
    res = score(_bytes_model(vocab=tok.vocab_size), ValLoader(d, 4, T),
                lambda: torch.autocast("cpu", enabled=False), "cpu", torch.from_numpy(tb))
    n = (len(ids) - 1) // T
    targets = np.concatenate([ids[i * T + 1:(i + 1) * T + 1] for i in range(n)])
    text_ids = targets[targets != tok.eot]
    # the exact UTF-8 length of what the scored targets encode (a token may hold part of a character)
    assert res.bytes == len(b"".join(tok.enc.decode_single_token_bytes(int(i)) for i in text_ids))
    assert res.bpb == pytest.approx(res.loss * res.tokens / (res.bytes * LN2), rel=1e-12)


def test_final_eval_scores_every_window_and_keeps_each_document(tmp_path, pydocs):
    run = tmp_path / "r"
    train(make_cfg(run, "train.max_steps=3", "train.final_eval_tokens=null"))
    fin, summary = records(run, "final_eval")[0], records(run, "summary")[0]
    saved = json.loads((run / "final_eval.json").read_text())
    model = ck.load_model(run)[0]
    model.eval()
    # every window of the split, scored with the plain loss of the model
    val = ValLoader(pydocs.out_dir, 4, 32)
    nats = tokens = 0.0
    with torch.no_grad():
        for x, y in val:
            _, loss = model(x, y)
            n = int((y >= 0).sum())
            nats, tokens = nats + float(loss) * n, tokens + n
    assert fin["whole_split"] and fin["val_tokens"] == tokens == val.w.n * 32
    assert fin["val_loss"] == pytest.approx(nats / tokens, rel=1e-6)   # fp32 batch means vs fp64 sums
    assert summary["final_val_loss"] == fin["val_loss"] and summary["final_val_bpb"] == fin["val_bpb"]
    docs = saved["docs"]
    assert sum(docs["tokens"]) == tokens and sum(docs["bytes"]) == fin["val_bytes"]
    assert sum(docs["nats"]) == pytest.approx(nats, rel=1e-6)
    assert fin["val_docs"] == sum(t > 0 for t in docs["tokens"]) > 1 and fin["se_bpb"] > 0


def test_the_final_eval_budget_is_a_spread_sample(tmp_path, pydocs):
    run = tmp_path / "r"
    train(make_cfg(run, "train.max_steps=2", "train.final_eval_tokens=2048"))
    fin = records(run, "final_eval")[0]
    assert not fin["whole_split"] and fin["val_tokens"] == 2048 and fin["val_docs"] > 8


def test_ratio_se_is_the_clustered_standard_error():
    from common.stats import ratio_se

    # equal-sized clusters: the ratio's s.e. is the s.e. of the mean of the per-cluster ratios
    rng = np.random.default_rng(1)
    r = rng.normal(2.0, 0.3, 40)
    den = np.full(40, 100.0)
    assert ratio_se(r * den, den) == pytest.approx(np.std(r, ddof=1) / math.sqrt(40), rel=1e-12)
    # paired: identical models have no difference, and the difference's s.e. is that of the per-cluster gaps
    assert ratio_se(r * den, den, num_b=r * den) == 0
    g = rng.normal(0.1, 0.05, 40)
    assert ratio_se((r + g) * den, den, num_b=r * den) == pytest.approx(np.std(g, ddof=1) / math.sqrt(40), rel=1e-9)
    assert ratio_se([1.0], [2.0]) is None


def test_near_duplicate_files_are_left_out_first_kept(tmp_path):
    table = [f"    0x{i:04x}: 'SOME GENERATED CODEC MAPPING ENTRY {i}'," for i in range(40)]
    a, b, c = tmp_path / "koi8_r.py", tmp_path / "koi8_t.py", tmp_path / "other.py"
    a.write_text("\n".join(table) + "\n")
    b.write_text("\n".join(table[:30] + [f"    0x{i:04x}: 'A DIFFERENT ENTRY NUMBER {i}'," for i in range(10)]) + "\n")
    c.write_text("\n".join(table[:5] + [f"def function_number_{i}(argument_one, argument_two):" for i in range(30)]))
    files = [(p.name, str(p)) for p in (a, b, c)]
    kept, info = pysrc_index([("g", files)], near_duplicates=0.5)
    assert kept == [str(a), str(c)] and info["skipped"]["near_duplicate"] == 1
    assert pysrc_index([("g", files)])[0] == [str(a), str(b), str(c)]   # null: every file
    assert pysrc_index([("g", files)], near_duplicates=0.8)[0] == [str(a), str(b), str(c)]


def test_split_bytes_and_overlap(tmp_path):
    tok = get_tokenizer("bytes")
    line = "x = compute_something(argument_one, argument_two)"
    train_docs = [f"{line}\nprint('a line that is long enough to count here')\n", "short\n"]
    val_docs = [f"{line}\nanother line, long enough to count, never in training\n"]
    for split, docs in (("train", train_docs), ("val", val_docs)):
        ids, _ = tok.encode_docs(docs)
        write_shard(tmp_path / f"{split}_000000.bin", ids.astype(np.uint16))
    assert split_bytes([tmp_path / "train_000000.bin"], tok.token_bytes()) == sum(len(s.encode()) for s in train_docs)
    o = val_overlap([tmp_path / "train_000000.bin"], [tmp_path / "val_000000.bin"], tok)
    assert o["val_lines"] == 2 and o["in_train"] == 0.5


def test_tables_show_bits_per_byte_and_old_runs_have_none(tmp_path):
    from experiments import runs as runlib
    from experiments.tables import build_rows, to_markdown

    def run(seed, loss, bpb):
        summary = {"final_val_loss": loss, "final_val_ppl": math.exp(loss), "steps": 10}
        if bpb is not None:
            summary["final_val_bpb"] = bpb
        return runlib.Run(tmp_path / str(seed), {}, "pre_ln", seed, evals=[{"val_loss": 5.0}], summary=summary)

    rows = build_rows({"pre_ln": [run(0, 2.0, 2.9), run(1, 2.2, 3.1)], "old": [run(0, 2.0, None)]}, None)
    assert rows[0]["bpb_mean"] == pytest.approx(3.0) and rows[1]["bpb_mean"] is None
    md = to_markdown(rows, None, None, None)
    assert "| val bits per byte |" in md and "3.0000 ± 0.1414" in md
