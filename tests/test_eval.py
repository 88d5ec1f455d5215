"""eval.py and evaluation/: lm-eval adapter scoring, rolling windows, a local task end to end,
strided perplexity, the CLI's outputs and its errors. Tiny models (2 layers, d=32, byte tokenizer)."""
import json
import math

import numpy as np
import pytest
import torch
from lm_eval import utils as lm_utils
from lm_eval.api.instance import Instance

from data import get_tokenizer
from data.shards import shard_name, write_shard
from evaluation.harness import NanoLM, run_tasks
from evaluation.perplexity import evaluate_perplexity
from evaluation.scoring import plan_windows
from model import GPT, GPTConfig

BLOCK = 16


def tiny_model(norm="pre_ln", seed=0, block_size=BLOCK):
    torch.manual_seed(seed)
    m = GPT(GPTConfig(norm=norm, vocab_size=320, block_size=block_size, n_layer=2, n_head=2, n_embd=32))
    with torch.no_grad():  # larger weights than GPT-2's init: peaked, input-dependent predictions
        for p in m.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
    return m.eval()


def save_ckpt(path, model, data_dir="", step=5, wandb_run_id=None):
    """A checkpoint in runtime/checkpoint.py's format, built directly (no trainer needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"format": "nanonorm-ckpt", "version": 1, "step": step, "model": model.state_dict(),
                "model_config": model.config.to_dict(), "tokenizer": "bytes", "data_dir": str(data_dir),
                "optimizer": {}, "scheduler": {}, "rng": {}, "loader": {}, "config": {},
                "wandb_run_id": wandb_run_id}, path)
    return path


def logprobs(model, tokens):
    """log p(tokens[i] | tokens[:i]) for i >= 1, from one full forward (tokens fit in the context)."""
    x = torch.tensor([tokens[:-1]])
    logits, _ = model(x)
    lp = torch.log_softmax(logits[0].double(), dim=-1)
    return [lp[i, t].item() for i, t in enumerate(tokens[1:])], logits[0].argmax(-1).tolist()


def req(kind, *args):
    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


@pytest.fixture(scope="module")
def lm():
    return NanoLM(tiny_model(), get_tokenizer("bytes"), batch_size=3)


def test_loglikelihood_equals_hand_computed_sum(lm):
    tok, model = lm.tokenizer, lm.model
    pairs = [("Hello", " world"), ("ab", "c"), ("", "xyz"), ("The answer is ", "42"),
             ("a much longer context than the window " * 2, " tail")]  # left-truncated context
    out = lm.loglikelihood([req("loglikelihood", c, x) for c, x in pairs])
    assert len(out) == len(pairs)
    for (ctx, cont), (got, greedy) in zip(pairs, out):
        if ctx.endswith(" "):  # the harness moves trailing context spaces into the continuation
            ctx, cont = ctx.rstrip(" "), " " * (len(ctx) - len(ctx.rstrip(" "))) + cont
        c, x = (tok.encode(ctx) or [tok.eot]), tok.encode(cont)
        full = (c + x)[-(BLOCK + 1):]  # what fits in the model's context
        lps, argmax = logprobs(model, full)
        want = sum(lps[-len(x):])
        assert got == pytest.approx(want, abs=1e-4), (ctx, cont)
        assert greedy == (argmax[-len(x):] == x)


def test_greedy_flag_true_for_the_argmax_continuation(lm):
    ids = lm.tokenizer.encode("seed")
    for _ in range(3):  # build the model's own greedy continuation
        _, argmax = logprobs(lm.model, ids + [0])
        ids.append(argmax[len(ids) - 1])
    (lp, greedy), = lm._loglikelihood_tokens([(None, ids[:4], ids[4:])])
    (lp2, greedy2), = lm._loglikelihood_tokens([(None, ids[:4], ids[4:6] + [(ids[6] + 1) % 256])])
    assert not greedy2 and lp2 < lp
    assert greedy


def test_loglikelihood_rolling_handles_text_longer_than_block_size(lm):
    tok, model = lm.tokenizer, lm.model
    short, long_ = "short text", "a rolling text much longer than the sixteen-token context! " * 2
    assert len(tok.encode(long_)) > 4 * BLOCK
    got = lm.loglikelihood_rolling([req("loglikelihood_rolling", short), req("loglikelihood_rolling", long_)])
    # short: one window, conditioned on end-of-text
    lps, _ = logprobs(model, [tok.eot] + tok.encode(short))
    assert got[0] == pytest.approx(sum(lps), abs=1e-4)
    # long: the harness's own rolling windows (disjoint, each with full context), scored one by one
    want = 0.0
    for ctx, pred in map(lm_utils.make_disjoint_window,
                         lm_utils.get_rolling_token_windows(tok.encode(long_), tok.eot, BLOCK, 1)):
        lps, _ = logprobs(model, ctx + pred)
        want += sum(lps[-len(pred):])
    assert got[1] == pytest.approx(want, abs=1e-3)
    # and every token scored once: the sum differs from scoring only the last window
    assert got[1] < sum(lps[-len(pred):]) - 1.0


def test_windows_score_every_target_once_with_bounded_context():
    for n, first, stride in [(50, 1, BLOCK), (50, 1, 5), (50, 30, BLOCK), (17, 1, BLOCK), (3, 1, 2)]:
        ws = list(plan_windows(n, first, BLOCK, stride))
        assert [t for w in ws for t in range(w.first, w.end)] == list(range(first, n))
        assert all(w.end - 1 - w.start <= BLOCK for w in ws)
        # every target but the earliest sees at least block_size - stride tokens (or all before it)
        for w in ws:
            assert w.first - w.start >= min(w.first, BLOCK - stride + 1)


def write_task(dir_, name="toy_mc", data_file=None):
    docs = [{"q": "The cat sat on the", "choices": ["mat", "sky", "moon"], "label": 0},
            {"q": "Water is", "choices": ["wet", "dry"], "label": 0},
            {"q": "One plus one is", "choices": ["two", "three", "five"], "label": 0},
            {"q": "Fire is", "choices": ["cold", "hot"], "label": 1}]
    if data_file is None:
        data_file = dir_ / f"{name}.jsonl"
        data_file.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (dir_ / f"{name}.yaml").write_text(f"""task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data_file}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{q}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
""")
    return docs


@pytest.mark.slow
def test_local_multiple_choice_task_end_to_end_through_task_manager(lm, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    docs = write_task(tmp_path)
    write_task(tmp_path, "toy_missing", data_file=tmp_path / "nowhere.jsonl")  # data cannot be loaded
    lines = []
    results, failures = run_tasks(lm, ["toy_missing", "toy_mc"], include_path=str(tmp_path),
                                  bootstrap_iters=0, echo=lines.append)
    # the broken task fails alone, with one line naming it; the other still runs
    assert list(failures) == ["toy_missing"] and len(lines) == 1 and lines[0].startswith("task toy_missing failed")
    assert "\n" not in failures["toy_missing"]
    # accuracy equals the argmax of our own loglikelihoods over the choices (the harness puts its
    # target_delimiter, a space, between question and choice)
    correct = 0
    for d in docs:
        scores = lm.loglikelihood([req("loglikelihood", d["q"], " " + c) for c in d["choices"]])
        correct += int(np.argmax([s for s, _ in scores]) == d["label"])
    assert results["toy_mc"]["acc"] == pytest.approx(correct / len(docs))
    assert results["toy_mc"]["samples"] == len(docs)


def write_split(dir_, lengths, seed=0):
    rng = np.random.default_rng(seed)
    dir_.mkdir(parents=True, exist_ok=True)
    toks = []
    for i, n in enumerate(lengths):
        t = np.concatenate([[256], rng.integers(0, 256, n - 1)]).astype(np.uint16)  # eot starts a shard
        write_shard(dir_ / shard_name("val", i), t)
        toks.append(t.astype(np.int64))
    return toks


def direct_nll(model, toks, context):
    """Token by token: target i predicted from the previous `context(i)` tokens."""
    nll, n = 0.0, 0
    for t in toks:
        for i in range(1, len(t)):
            x = torch.tensor(t[max(0, i - context(i)):i])[None]
            logits, _ = model(x, last_only=True)
            nll -= torch.log_softmax(logits[0, -1].double(), -1)[t[i]].item()
            n += 1
    return nll / n, n


def test_perplexity_matches_direct_computation(tmp_path):
    model = tiny_model(seed=1)
    toks = write_split(tmp_path / "data", [3 * BLOCK + 1, 2 * BLOCK + 1])  # whole chunks: the val-loss layout
    # stride = block_size: non-overlapping chunks; target i sees the tokens since its chunk began
    r = evaluate_perplexity(model, tmp_path / "data", "val", batch_size=2)
    want, n = direct_nll(model, toks, lambda i: (i - 1) % BLOCK + 1)
    assert r["tokens"] == n == 5 * BLOCK
    assert r["loss"] == pytest.approx(want, rel=1e-5) and r["ppl"] == pytest.approx(math.exp(want), rel=1e-5)
    # the same as the mean of the model's own loss over the chunks
    losses = [model(torch.tensor(t[s:s + BLOCK])[None], torch.tensor(t[s + 1:s + BLOCK + 1])[None])[1].item()
              for t in toks for s in range(0, len(t) - 1, BLOCK)]
    assert r["loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-5)
    # stride 1: every target gets the full block_size of context
    r1 = evaluate_perplexity(model, tmp_path / "data", "val", stride=1, batch_size=7)
    want1, _ = direct_nll(model, toks, lambda i: BLOCK)
    assert r1["loss"] == pytest.approx(want1, rel=1e-5) and r1["loss"] != pytest.approx(r["loss"], rel=1e-4)
    # a token budget scores whole windows spread over the split (both shards here), never only its head
    rb = evaluate_perplexity(model, tmp_path / "data", "val", token_budget=2 * BLOCK, batch_size=3)
    chunks = [(t, s) for t in toks for s in range(0, len(t) - 1, BLOCK)]   # the 5 chunks: the 2nd and the
    picked = [chunks[1], chunks[3]]                                        # 4th are the centres of two halves
    lossb = [model(torch.tensor(t[s:s + BLOCK])[None], torch.tensor(t[s + 1:s + BLOCK + 1])[None])[1].item()
             for t, s in picked]
    assert rb["tokens"] == 2 * BLOCK and rb["loss"] == pytest.approx(sum(lossb) / 2, rel=1e-5)


def run_eval(capsys, *argv):
    import eval as eval_cli

    try:
        rc = eval_cli.main([str(a) for a in argv])
    except SystemExit as e:  # a user error: one line on stderr, exit 2
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.slow
def test_eval_cli_json_markdown_and_wandb(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    model = tiny_model(seed=2)
    write_split(tmp_path / "data", [2 * BLOCK + 1, 40])
    run = tmp_path / "runs" / "r1"
    save_ckpt(run / "checkpoints" / "ckpt_00000003.pt", tiny_model(seed=9), tmp_path / "data", step=3)
    save_ckpt(run / "checkpoints" / "ckpt_00000005.pt", model, tmp_path / "data", step=5, wandb_run_id="evaltest1")
    write_task(tmp_path)
    rc, out, err = run_eval(capsys, run, "--tasks", "toy_mc", "--include-path", tmp_path, "--stride", "8",
                            "--bootstrap-iters", "0")
    assert rc == 0, err
    res = json.loads((run / "eval" / "eval_00000005.json").read_text())  # the newest checkpoint
    assert res["step"] == 5 and res["norm"] == "pre_ln" and res["tokenizer"] == "bytes"
    direct = evaluate_perplexity(model, tmp_path / "data", "val", stride=8)
    assert res["perplexity"]["loss"] == pytest.approx(direct["loss"], rel=1e-9)
    assert res["perplexity"]["tokens"] == 2 * BLOCK + 39
    assert set(res["tasks"]["toy_mc"]) >= {"acc", "samples"} and res["failed_tasks"] == {}
    assert "| toy_mc | acc |" in out and f"{res['perplexity']['ppl']:.4f}" in out
    # logged to the run's own wandb run id (offline run dir carries the id)
    assert [p.name.split("-")[-1] for p in (run / "wandb").glob("offline-run-*")] == ["evaltest1"]


@pytest.mark.parametrize(
    "setup, needle",
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: (p / "empty_run").mkdir() or p / "empty_run", "no checkpoints"),
        (
            lambda p: (p / "junk.pt").write_bytes(b"not a checkpoint") and p / "junk.pt",
            "not a nanonorm checkpoint (not a torch.save zip",
        ),
        (lambda p: torch.save({"model": {}}, p / "other.pt") or p / "other.pt", "not a nanonorm checkpoint"),
    ],
)
def test_bad_checkpoint_paths_give_one_clear_line(tmp_path, capsys, setup, needle):
    path = setup(tmp_path)
    rc, out, err = run_eval(capsys, path, "--tasks", "none", "--split", "null")
    assert rc == 2 and needle in err and str(path) in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_an_unwritable_out_is_refused_before_evaluating(tmp_path, capsys, monkeypatch):
    import evaluation.perplexity as P

    ckpt = save_ckpt(tmp_path / "c.pt", tiny_model())
    write_split(tmp_path / "data", [40])
    (tmp_path / "afile").write_text("")  # a file where --out needs a directory: unwritable even as root
    monkeypatch.setattr(P, "evaluate_perplexity", lambda *a, **k: pytest.fail("evaluated before checking --out"))
    rc, _, err = run_eval(capsys, ckpt, "--tasks", "none", "--data-dir", tmp_path / "data",
                          "--out", tmp_path / "afile" / "r.json")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert f"{tmp_path / 'afile'} is a file, not a directory" in err and "chosen by --out" in err


def test_bad_eval_options_give_one_clear_line(tmp_path, capsys):
    ckpt = save_ckpt(tmp_path / "c.pt", tiny_model())
    rc, _, err = run_eval(capsys, ckpt, "--stride", "0")
    assert rc == 2 and "stride=0" in err and len(err.strip().splitlines()) == 1
    write_split(tmp_path / "data", [40])
    rc, _, err = run_eval(capsys, ckpt, "--tasks", "none", "--data-dir", tmp_path / "data", "--split", "test")
    assert rc == 2 and "no 'test' shards" in err and "val" in err


def test_eval_config_file_then_flags(tmp_path):
    """--config FILE sets keys first, flags override them; a bad file or key is one line."""
    import argparse

    from evaluation.config import EvalConfigError, add_flags, from_args

    parser = argparse.ArgumentParser()
    add_flags(parser)
    f = tmp_path / "eval.yaml"
    f.write_text("tasks: [piqa, arc_easy]\ntoken_budget: 1000\nsplit: val\n")
    cfg = from_args(parser.parse_args(["--config", str(f), "--token-budget", "64", "--split", "null"]))
    assert (cfg.tasks, cfg.token_budget, cfg.split) == (["piqa", "arc_easy"], 64, None)
    f.write_text("token_budjet: 1000\n")
    with pytest.raises(EvalConfigError, match=r"^unknown key\(s\) eval.token_budjet: valid keys are split, "):
        from_args(parser.parse_args(["--config", str(f)]))
    f.write_text("- a list\n")
    with pytest.raises(EvalConfigError, match=r"^eval config .*eval.yaml must be a mapping of keys to values$"):
        from_args(parser.parse_args(["--config", str(f)]))
    with pytest.raises(EvalConfigError, match=r"^cannot read eval config .*missing.yaml"):
        from_args(parser.parse_args(["--config", str(tmp_path / "missing.yaml")]))
    with pytest.raises(EvalConfigError, match=r"^bad config eval.limit='\[1': must be a number$"):
        from_args(parser.parse_args(["--limit", "[1"]))
    assert from_args(parser.parse_args(["--split", "[x", "--out", "a: b"])).split == "[x"  # a string key keeps its text
    for text, tasks in (("piqa, arc_easy", ["piqa", "arc_easy"]), ("null", []), ("none", []), ("[]", [])):
        assert from_args(parser.parse_args(["--tasks", text])).tasks == tasks


def test_generate_until_is_greedy_and_stops_at_the_until_string(lm):
    from model.generate import generate

    tok = lm.tokenizer
    ctx = "Once"  # 4 + 12 tokens fit block_size: no left truncation of the context
    ids = generate(lm.model, torch.tensor([tok.encode(ctx)]), 12, temperature=0, vocab_size=tok.vocab_size)
    full = tok.decode(ids[0, len(ctx):].tolist())
    stop = full[5:7]  # a string the greedy path produces: generation must stop there and cut it off
    out = lm.generate_until([req("generate_until", ctx, {"until": [stop], "max_gen_toks": 12}),
                             req("generate_until", ctx, {"until": ["\x00never"], "max_gen_toks": 12})])
    assert out[0] == full.split(stop)[0] and len(out[0]) <= 5
    assert out[1] == full.split(tok.decode([tok.eot]))[0]


@pytest.mark.slow
def test_torchrun_splits_evaluation_across_ranks(tmp_path):
    """2 gloo ranks on CPU give the single-process perplexity and task metrics."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    model = tiny_model(seed=6)
    write_split(tmp_path / "data", [3 * BLOCK + 1, 37])
    ckpt = save_ckpt(tmp_path / "ckpt.pt", model, tmp_path / "data")
    write_task(tmp_path)
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(repo / "eval.py"),
           str(ckpt), "--tasks", "toy_mc", "--include-path", str(tmp_path), "--bootstrap-iters", "0",
           "--stride", "8", "--batch-size", "2", "--out", str(tmp_path / "ddp.json")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "ddp.json").read_text())
    assert res["world_size"] == 2
    single = evaluate_perplexity(model, tmp_path / "data", "val", stride=8)
    assert res["perplexity"]["tokens"] == single["tokens"] == 3 * BLOCK + 36
    assert res["perplexity"]["loss"] == pytest.approx(single["loss"], rel=1e-6)
    lm1 = NanoLM(model, get_tokenizer("bytes"))
    results, _ = run_tasks(lm1, ["toy_mc"], include_path=str(tmp_path), bootstrap_iters=0, echo=lambda m: None)
    assert res["tasks"]["toy_mc"]["acc"] == results["toy_mc"]["acc"] and res["tasks"]["toy_mc"]["samples"] == 4


@pytest.mark.slow
def test_a_task_failing_on_one_rank_is_skipped_on_every_rank(tmp_path):
    """Rank 1 fails one task before any collective (its data) and one after the first (scoring):
    both ranks skip both tasks, name rank 1's error, run the next task and exit (before: a hang)."""
    import os

    from helpers import torchrun

    for name in ("toy_load", "toy_score", "toy_mc"):
        write_task(tmp_path, name)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    code, text = torchrun(["-m", "tests.torchrun_scripts", "one_rank_fails", tmp_path], env, timeout=120)
    assert code == 0, text[-3000:]
    out = {r: json.loads((tmp_path / f"result_{r}.json").read_text()) for r in (0, 1)}
    for rank in (0, 1):
        f = out[rank]["failures"]
        assert sorted(f) == ["toy_load", "toy_score"], f
        assert f["toy_load"].startswith("rank 1: ConnectionError: simulated download failure")
        assert f["toy_score"].startswith("rank 1: RuntimeError: simulated out of memory")
    assert out[0]["results"]["toy_mc"]["samples"] == 4 and out[1]["results"] == {}


@pytest.mark.slow
def test_successive_evaluations_keep_every_result_and_failures_exit_nonzero(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    write_split(tmp_path / "data", [2 * BLOCK + 1, 40])
    run = tmp_path / "runs" / "r"
    save_ckpt(run / "checkpoints" / "ckpt_00000005.pt", tiny_model(seed=3), tmp_path / "data", step=5)
    out = run / "eval" / "eval_00000005.json"
    write_task(tmp_path)
    write_task(tmp_path, "toy_missing", data_file=tmp_path / "nowhere.jsonl")  # its data cannot be loaded
    common = ["--include-path", tmp_path, "--bootstrap-iters", "0", "--wandb", "false"]

    rc, _, err = run_eval(capsys, run, "--tasks", "none", *common)
    assert rc == 0, err
    good = json.loads(out.read_text())
    assert good["perplexity"]["stride"] == BLOCK
    # a failed evaluation (the task's data is unavailable) writes nothing over a good result, and says so
    rc, _, err = run_eval(capsys, run, "--split", "null", "--tasks", "toy_missing", *common)
    assert rc == 1 and "nothing written" in err and "toy_missing" in err
    assert json.loads(out.read_text()) == good
    # another evaluation of the same checkpoint adds its results; the perplexity stays
    rc, _, err = run_eval(capsys, run, "--split", "null", "--tasks", "toy_mc", *common)
    assert rc == 0, err
    res = json.loads(out.read_text())
    assert res["perplexity"] == good["perplexity"] and set(res["tasks"]) == {"toy_mc"}
    # a second perplexity setting is kept beside the first; a partly failed run exits 1 but keeps what worked
    rc, _, err = run_eval(capsys, run, "--stride", "8", "--tasks", "toy_mc,toy_missing", *common)
    assert rc == 1 and "1 of 2 requested task(s) failed or are unknown: toy_missing" in err
    res = json.loads(out.read_text())
    assert [r["perplexity"]["stride"] for r in res["runs"] if r["perplexity"]] == [BLOCK, 8]
    assert res["perplexity"]["stride"] == 8 and set(res["tasks"]) == {"toy_mc"}
    assert res["failed_tasks"] == {"toy_missing": res["runs"][-1]["failed_tasks"]["toy_missing"]}
    assert len(res["runs"]) == 3  # the failed invocation wrote nothing


@pytest.mark.parametrize("argv, needle", [
    (["--device", "cuda"], "bad config device='cuda': torch sees no CUDA device here"),
    (["--dtype", "fp8"], "bad config eval.dtype='fp8': valid: auto, bf16, fp16, fp32"),
    (["--stride", "17"], f"bad config eval.stride=17: must be at most the model's block_size={BLOCK}"),
    (["--threads", "0"], "bad config eval.threads=0: must be a positive integer"),
])
def test_impossible_eval_settings_give_one_clear_line(tmp_path, capsys, monkeypatch, argv, needle):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ckpt = save_ckpt(tmp_path / "c.pt", tiny_model())
    write_split(tmp_path / "data", [40])
    rc, _, err = run_eval(capsys, ckpt, "--tasks", "none", "--data-dir", tmp_path / "data", *argv)
    assert rc == 2 and needle in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_shard_with_ids_outside_the_vocabulary_is_named(tmp_path, capsys):
    ckpt = save_ckpt(tmp_path / "c.pt", tiny_model())
    (tmp_path / "data").mkdir()
    write_shard(tmp_path / "data" / shard_name("val", 0), np.where(np.arange(50) == 30, 300, 5).astype(np.uint16))
    rc, _, err = run_eval(capsys, ckpt, "--tasks", "none", "--data-dir", tmp_path / "data")
    last = err.strip().splitlines()[-1]
    assert rc == 2 and "Traceback" not in err, err
    assert (
        last.startswith("error: ")
        and "val_000000.bin: token id 300 is outside the vocabulary of bytes (257 ids)" in last
    )


def test_a_data_file_given_as_checkpoint_gets_fitting_advice(tmp_path, capsys):
    f = tmp_path / "corpus.jsonl"
    f.write_text('{"text": "hello"}\n')
    rc, _, err = run_eval(capsys, f, "--tasks", "none")
    assert rc == 2 and "corpus.jsonl is not a nanonorm checkpoint" in err and "delete it" not in err
    assert "mmap" not in err
    assert "give a run dir or a ckpt_*.pt file written by train.py" in err and len(err.strip().splitlines()) == 1


def test_eval_threads_option_and_cpu_default(tmp_path, capsys, monkeypatch):
    from runtime import distributed as runtime

    ckpt = save_ckpt(tmp_path / "c.pt", tiny_model())
    write_split(tmp_path / "data", [40])
    rc, _, err = run_eval(capsys, ckpt, "--tasks", "none", "--data-dir", tmp_path / "data", "--threads", "2")
    assert rc == 0 and "2 CPU threads" in err, err
    assert torch.get_num_threads() == 1  # restored for the caller
    # default: OMP_NUM_THREADS when set, else the cores not busy (a loaded machine: 1 thread)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert runtime.cpu_threads() == 3 and runtime.cpu_threads(5) == 5
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (2.4, 2.0, 2.0))
    assert runtime.cpu_threads() == 1
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (0.1, 0.0, 0.0))
    assert runtime.cpu_threads() == 2


def test_an_unknown_task_is_one_line_in_seconds_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import runtime.checkpoint as C

    ckpt = save_ckpt(tmp_path / "c.pt", tiny_model())
    monkeypatch.setattr(C, "load_model", lambda *a, **k: pytest.fail("loaded the model before checking --tasks"))
    rc, _, err = run_eval(capsys, ckpt, "--tasks", "helaswag,arc_easy", "--split", "null")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert ("unknown task(s) helaswag (in no lm-eval task file); helaswag: did you mean hellaswag" in err
            and "lm-eval ls tasks" in err)
    write_task(tmp_path)  # a task of one's own under --include-path counts as known
    from evaluation.harness import unknown_tasks
    assert unknown_tasks(["toy_mc", "arc_easy"], include_path=tmp_path) == {}


def test_eval_at_the_runs_eval_tokens_is_the_training_validation_loss(tmp_path, capsys):
    """The README's claim: the default stride at --token-budget = train.eval_tokens measures what training's
    validation pass measured; the default budget (the whole split) scores more and differs."""
    from helpers import make_cfg, records
    from trainer.loop import train

    run = tmp_path / "run"
    train(make_cfg(run, "train.max_steps=3"))
    val = records(run, "eval")[-1]["val_loss"]
    rc, _, err = run_eval(capsys, run, "--tasks", "none", "--token-budget", "512")
    assert rc == 0, err
    res = json.loads((run / "eval" / "eval_00000003.json").read_text())["perplexity"]
    assert res["tokens"] == 512 and res["loss"] == pytest.approx(val, rel=1e-6, abs=1e-6)
    rc, _, err = run_eval(capsys, run, "--tasks", "none")
    whole = json.loads((run / "eval" / "eval_00000003.json").read_text())["perplexity"]
    assert rc == 0 and whole["tokens"] > 512 and whole["loss"] != pytest.approx(val, rel=1e-6)


def test_an_unreachable_hub_is_one_line_in_seconds_before_any_task(tmp_path, capsys, monkeypatch):
    """eval.py with its default tasks and no network used to try the hub for each of 11 tasks, with retries
    (307 s), and then report all 11 failed."""
    import time

    from helpers import make_cfg
    from trainer.loop import train

    run = tmp_path / "run"
    train(make_cfg(run, "train.max_steps=1"))
    for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")        # nothing listens there
    t0 = time.time()
    rc, _, err = run_eval(capsys, run)
    assert rc == 2 and time.time() - t0 < 60
    assert err.strip().splitlines()[-1].startswith("error: the Hugging Face hub (127.0.0.1:9) cannot be reached")
    assert "--tasks none" in err and "HF_DATASETS_OFFLINE=1" in err and not (run / "eval").exists()
    # with the data said to be in a local cache, the hub is not probed
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    from evaluation.harness import hub_unreachable
    assert hub_unreachable() is None


def test_out_never_replaces_another_checkpoints_results_or_a_foreign_file(tmp_path, capsys):
    """--out onto another checkpoint's eval file used to replace its results (and say 'merged'); onto a JSON
    that is no eval result, a KeyError traceback."""
    from helpers import make_cfg
    from trainer.loop import train

    a, b = tmp_path / "a", tmp_path / "b"
    train(make_cfg(a, "train.max_steps=2"))
    train(make_cfg(b, "train.max_steps=3"))
    rc, _, err = run_eval(capsys, a, "--tasks", "none", "--token-budget", "512")
    assert rc == 0 and "merged" not in err                                        # a first write merges nothing
    rc, _, err = run_eval(capsys, a, "--tasks", "none", "--token-budget", "1024")
    assert rc == 0 and "(merged with its earlier results for this checkpoint)" in err
    target = a / "eval" / "eval_00000002.json"
    before = target.read_text()
    rc, _, err = run_eval(capsys, b, "--tasks", "none", "--token-budget", "512", "--out", target)
    assert rc == 2 and err.strip().splitlines()[-1].startswith(f"error: --out {target} holds the results of another "
                                                               "checkpoint")
    assert target.read_text() == before                                             # kept, untouched
    rc, _, err = run_eval(capsys, b, "--tasks", "none", "--out", tmp_path)        # a directory: not a temp file's name
    assert rc == 2 and err.strip().endswith(f"--out {tmp_path} is a directory: give a file name (e.g. "
                                            f"{tmp_path / 'eval.json'})")
    foreign = tmp_path / "notes.json"
    foreign.write_text('{"a": 1}\n')
    rc, _, err = run_eval(capsys, b, "--tasks", "none", "--out", foreign)
    assert rc == 2 and "is not an eval.py result file" in err and foreign.read_text() == '{"a": 1}\n'
