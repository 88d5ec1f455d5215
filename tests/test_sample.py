"""model/generate.py and sample.py: the KV cache changes nothing but speed, for every variant, within
block_size and across the crop; seeded sampling is reproducible; bad input gives one clear line."""
import pytest
import torch

from model import GPT, VARIANTS, GPTConfig
from model.generate import generate, sample_next

BLOCK = 16


def tiny_model(norm="pre_ln", seed=0):
    torch.manual_seed(seed)
    m = GPT(GPTConfig(norm=norm, vocab_size=320, block_size=BLOCK, n_layer=2, n_head=2, n_embd=32))
    with torch.no_grad():  # larger weights than GPT-2's init: greedy paths that depend on the context
        for p in m.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
    return m.eval()


@pytest.mark.parametrize("norm", list(VARIANTS))
def test_greedy_with_cache_equals_without_for_every_variant(norm):
    model = tiny_model(norm)
    prompt = torch.randint(0, 257, (2, 5), generator=torch.Generator().manual_seed(1))
    for new, keep in [(BLOCK - 5, None), (3 * BLOCK, None), (3 * BLOCK, 6)]:  # within, across the crop
        a = generate(model, prompt, new, temperature=0, use_cache=True, crop_keep=keep)
        b = generate(model, prompt, new, temperature=0, use_cache=False, crop_keep=keep)
        assert a.shape == (2, 5 + new)
        assert torch.equal(a, b), (norm, new, keep)
        assert len(set(a[:, 5:].flatten().tolist())) > 2  # real paths, not one repeated token


def test_crop_is_nanogpt_sliding_window():
    """Past block_size each token is predicted from exactly the last block_size tokens."""
    model = tiny_model(seed=3)
    prompt = torch.randint(0, 257, (1, BLOCK), generator=torch.Generator().manual_seed(2))
    out = generate(model, prompt, 10, temperature=0)
    for t in range(BLOCK, out.size(1)):
        logits, _ = model(out[:, t - BLOCK:t], last_only=True)
        assert logits[0, -1].argmax().item() == out[0, t].item()


def test_same_seed_same_samples_and_filters():
    model = tiny_model(seed=4)
    prompt = torch.randint(0, 257, (3, 4), generator=torch.Generator().manual_seed(0))

    def draw(seed, **kw):
        return generate(model, prompt, 2 * BLOCK, generator=torch.Generator().manual_seed(seed), **kw)

    assert torch.equal(draw(7, top_k=50, top_p=0.95), draw(7, top_k=50, top_p=0.95))
    assert not torch.equal(draw(7), draw(8))
    greedy = generate(model, prompt, 2 * BLOCK, temperature=0)
    assert torch.equal(draw(5, top_k=1), greedy) and torch.equal(draw(6, top_p=1e-6), greedy)
    # padded vocabulary ids above the tokenizer's are never sampled
    assert draw(9, temperature=5.0, vocab_size=257).max().item() < 257


def test_top_k_and_top_p_keep_the_right_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = torch.Generator().manual_seed(0)
    ks = {sample_next(logits, top_k=2, generator=g).item() for _ in range(200)}
    ps = {sample_next(logits, top_p=0.7, generator=g).item() for _ in range(200)}
    assert ks == {0, 1} and ps == {0, 1}  # 0.5 < 0.7 needs the second token, not the third


def test_bad_generation_arguments():
    model = tiny_model()
    with pytest.raises(ValueError, match=r"prompt is 17 tokens, longer than the model's context \(block_size=16\)"):
        generate(model, torch.zeros(1, BLOCK + 1, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="top_p"):
        generate(model, torch.zeros(1, 2, dtype=torch.long), 4, top_p=1.5)


def save_ckpt(path, model):
    torch.save({"format": "nanonorm-ckpt", "version": 1, "step": 1, "model": model.state_dict(),
                "model_config": model.config.to_dict(), "tokenizer": "bytes", "data_dir": "",
                "optimizer": {}, "scheduler": {}, "rng": {}, "loader": {}, "config": {},
                "wandb_run_id": None}, path)
    return path


def run_sample(capsys, *argv):
    import sample as sample_cli

    try:
        rc = sample_cli.main([str(a) for a in argv])
    except SystemExit as e:  # a user error: one line on stderr, exit 2
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_sample_cli(tmp_path, capsys):
    ckpt = save_ckpt(tmp_path / "ckpt.pt", tiny_model(seed=5))
    args = [ckpt, "--prompt", "Hi", "--num-samples", "2", "--max-new-tokens", "40", "--top-k", "20", "--seed", "3"]
    rc, out1, err = run_sample(capsys, *args)
    assert rc == 0, err
    assert out1.count("Hi") >= 2 and "-" * 40 in out1 and "tokens/s" in err
    assert run_sample(capsys, *args)[1] == out1  # same seed, same samples
    assert run_sample(capsys, *args[:-1], "4")[1] != out1
    (tmp_path / "p.txt").write_text("From a file")
    rc, out, _ = run_sample(capsys, ckpt, "--prompt-file", tmp_path / "p.txt", "--max-new-tokens", "5")
    assert rc == 0 and out.startswith("From a file")


def test_many_samples_come_in_batches_with_progress_and_equal_one_batch_when_few(tmp_path, capsys):
    ckpt = save_ckpt(tmp_path / "ckpt.pt", tiny_model(seed=5))
    args = [ckpt, "--prompt", "Hi", "--num-samples", "5", "--max-new-tokens", "6", "--seed", "3"]
    rc, out_one, err = run_sample(capsys, *args)  # 5 <= the default batch of 16: one batch, no progress
    assert rc == 0 and "samples (" not in err and out_one.count("-" * 40) == 4
    rc, out, err = run_sample(capsys, *args, "--batch-size", "2")
    assert rc == 0 and out.count("-" * 40) == 4
    assert [line.split()[1] for line in err.splitlines() if " samples (" in line] == ["2/5", "4/5"]
    assert "s left)" in err
    rc, _, err = run_sample(capsys, ckpt, "--batch-size", "0")
    assert rc == 2 and "--batch-size=0: must be >= 1" in err


def test_sample_cli_errors(tmp_path, capsys):
    ckpt = save_ckpt(tmp_path / "ckpt.pt", tiny_model())
    for argv, needle in [
        ((ckpt, "--prompt", "x" * (BLOCK + 3)), "prompt is 19 tokens, longer than the model's context (block_size=16)"),
        ((tmp_path / "nope.pt",), "does not exist"),
        ((tmp_path,), "no checkpoints"),
        ((ckpt, "--temperature", "-1"), "temperature=-1"),
    ]:
        rc, out, err = run_sample(capsys, *argv)
        assert rc == 2 and needle in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_sample_threads_option(tmp_path, capsys):
    ckpt = save_ckpt(tmp_path / "ckpt.pt", tiny_model())
    rc, _, err = run_sample(capsys, ckpt, "--max-new-tokens", "4", "--threads", "2")
    assert rc == 0 and "cpu, 2 threads" in err, err
    assert torch.get_num_threads() == 1  # restored for the caller
    rc, _, err = run_sample(capsys, ckpt, "--threads", "0")
    assert rc == 2 and "--threads=0: must be >= 1" in err


def test_unreadable_prompt_file_is_one_line(tmp_path, capsys):
    import sample
    with pytest.raises(SystemExit) as e:
        sample.main([str(tmp_path), "--prompt-file", str(tmp_path / "nonexistent.txt")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--prompt-file" in err and "nonexistent.txt" in err and "No such file" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_generation_past_the_context_says_what_happens_and_shows_progress(tmp_path, capsys):
    ckpt = save_ckpt(tmp_path / "ckpt.pt", tiny_model())
    rc, _, err = run_sample(capsys, ckpt, "--prompt", "Hi", "--max-new-tokens", "40")
    assert rc == 0, err
    assert ("sample: 2 prompt + 40 new tokens exceed the context of 16: for the last 26, the window is cropped to "
            "its last 16 tokens and re-encoded every token") in err
    progress = [line for line in err.splitlines() if "/40 new tokens" in line]
    assert [p.split()[1] for p in progress] == [f"{n}/40" for n in range(4, 40, 4)]  # every tenth
    rc, _, err = run_sample(capsys, ckpt, "--prompt", "Hi", "--max-new-tokens", "40", "--crop-keep", "8")
    assert "re-encoded once every 9 tokens" in err
    rc, _, err = run_sample(capsys, ckpt, "--prompt", "Hi", "--max-new-tokens", "10")
    assert rc == 0 and "exceed the context" not in err and "new tokens (" not in err  # short: no notes


def test_a_non_utf8_prompt_an_infinite_temperature_and_a_huge_seed_are_one_line(tmp_path, capsys):
    ckpt = save_ckpt(tmp_path / "ckpt.pt", tiny_model())
    bad_prompt = b"\xff\xfe".decode("utf-8", "surrogateescape")     # how argv delivers bytes that are not UTF-8
    for argv, expect in (([ckpt, "--prompt", bad_prompt], "is not valid UTF-8 text"),
                         ([ckpt, "--temperature", "inf"], "must be a finite number >= 0"),
                         ([ckpt, "--seed", "99999999999999999999"], "the range torch.manual_seed takes")):
        rc, _, err = run_sample(capsys, *argv, "--max-new-tokens", "2")
        assert rc == 2 and expect in err and "Traceback" not in err, err


def test_a_huge_generation_reports_progress_by_time_too(capsys, monkeypatch):
    """--max-new-tokens 100000000 reported only every tenth (10^7 tokens): minutes, or hours, of silence."""
    import sample

    clock = [0.0]
    monkeypatch.setattr(sample.time, "perf_counter", lambda: clock[0])
    tick = sample._progress(100_000_000, 0.0, every_s=30.0)
    for _ in range(640):            # 10 s a token: a line at the first 64-token check past 30 s
        clock[0] += 10.0
        tick(None)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("sample: ")]
    assert len(lines) == 10 and lines[0].startswith("sample: 64/100000000 new tokens")
