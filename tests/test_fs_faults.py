"""Faults of the machine, not of the code: a full disk, a read-only or occupied location, a truncated or
malformed file. Each is one line naming the path and what to do, and nothing already written is lost or
left half-written."""
import errno
import json
import math
from pathlib import Path

import pytest
import torch

from helpers import make_cfg

from common import ConfigError, report_user_errors
from data.files import CorruptFile, atomic_open, read_json, read_yaml

SHORT_WRITE = "[enforce fail at inline_container.cc:672] . unexpected pos 179456 vs 179408"  # torch.save, disk full


def one_line_exit(capsys, fn, *args) -> str:
    with pytest.raises(SystemExit) as e:
        report_user_errors(fn, *args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    return err.strip()


def read_only_under(monkeypatch, root: Path) -> None:
    """Every directory or file created under `root` fails as on a read-only mount (root ignores chmod)."""
    import os

    real_mkdir, real_open = os.mkdir, open

    def mkdir(path, *a, **k):
        if str(path).startswith(str(root)):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_mkdir(path, *a, **k)

    def fake_open(path, mode="r", *a, **k):
        if str(path).startswith(str(root)) and any(c in mode for c in "wax+"):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, mode, *a, **k)
    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr("builtins.open", fake_open)
    monkeypatch.setattr("io.open", fake_open)  # pathlib's write_bytes / write_text


@pytest.mark.slow
def test_a_file_where_the_checkpoints_dir_belongs_is_refused_before_the_first_step(tmp_path, pydocs):
    from trainer.loop import train
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").write_text("a file")
    with pytest.raises(ConfigError, match=rf"^{run / 'checkpoints'} is a file, not a directory \(chosen by out_dir\): "
                                          "move it away or choose another location$"):
        train(make_cfg(run, "train.max_steps=2"))
    assert (run / "checkpoints").read_text() == "a file" and not (run / "metrics.jsonl").exists()


@pytest.mark.slow
def test_resuming_a_run_on_a_read_only_mount_is_one_line_and_changes_nothing(tmp_path, monkeypatch, capsys, pydocs):
    from trainer.loop import train
    run = tmp_path / "run"
    train(make_cfg(run, "train.max_steps=2"))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    read_only_under(monkeypatch, run)
    err = one_line_exit(capsys, train, make_cfg(run, "train.max_steps=4", "train.resume=auto"))
    assert err == f"error: cannot write to {run} (Read-only file system), chosen by out_dir: choose a writable location"
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_sweep_into_a_read_only_runs_root_is_one_line(tmp_path, monkeypatch, capsys, load_script):
    sweep = load_script("sweep")
    read_only_under(monkeypatch, tmp_path / "ro")
    err = one_line_exit(capsys, sweep.main, ["--name", "t", "--variants", "pre_ln", "--runs-root",
                                             str(tmp_path / "ro"), "--", "train.max_steps=2"])
    assert err == (f"error: cannot write to {tmp_path / 'ro' / 't'} (Read-only file system), chosen by --runs-root: "
                   "choose a writable location")


def test_plot_curves_to_a_read_only_out_is_one_line_and_atomic_writes_tell_the_first_error(tmp_path, monkeypatch,
                                                                                          capsys, load_script):
    plot = load_script("plot_curves")
    read_only_under(monkeypatch, tmp_path / "ro")
    err = one_line_exit(capsys, plot.main, [str(tmp_path), "--out", str(tmp_path / "ro" / "c")])
    assert "(Read-only file system), chosen by --out" in err
    # the temp file of an atomic write that could not be created is not removed a second time, loudly
    with pytest.raises(OSError) as e:
        with atomic_open(tmp_path / "ro" / "x.png", "wb") as f:
            f.write(b"x")
    assert e.value.errno == errno.EROFS and e.value.filename.endswith(".x.png." + str(__import__("os").getpid())
                                                                      + ".tmp")


def test_a_machine_fault_anywhere_is_one_line_and_a_bug_keeps_its_traceback(capsys):
    def full():
        raise OSError(errno.ENOSPC, "No space left on device", "/data/x.bin")
    assert one_line_exit(capsys, full) == ("error: cannot write /data/x.bin: the disk is full (or over quota); free "
                                           "space or choose another location")

    def missing():
        raise FileNotFoundError(errno.ENOENT, "No such file", "/nowhere")
    with pytest.raises(FileNotFoundError):   # not a machine fault: where it is not caught, it is a bug
        report_user_errors(missing)


def test_a_full_disk_while_checkpointing_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    from runtime import checkpoint as ck
    state = {"model": {"w": torch.arange(4.0)}}
    good = ck.save_checkpoint(state, tmp_path, 1, keep_last=1)
    real_save = torch.save

    def full_disk(obj, f):
        f.write(b"PK\x03\x04 partial")
        raise RuntimeError(SHORT_WRITE)
    monkeypatch.setattr(ck.torch, "save", full_disk)
    with pytest.raises(ck.CheckpointError, match=r"cannot write checkpoint .*ckpt_00000002.pt: the disk is full; the "
                                                 r"last good one, ckpt_00000001.pt, is kept; free space .* and resume "
                                                 r"with train.resume=auto$"):
        ck.save_checkpoint(state, tmp_path, 2, keep_last=1)
    with pytest.raises(ck.CheckpointError, match=r"the disk is full; no checkpoint of this run was written yet, so "
                                                 r"there is nothing to resume: free space and start it again$"):
        ck.save_checkpoint(state, tmp_path / "fresh", 1, keep_last=1)  # never "resume" where nothing is kept
    monkeypatch.setattr(ck.torch, "save", real_save)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [good.name]   # no temp file left
    assert torch.equal(torch.load(good)["model"]["w"], torch.arange(4.0))
    monkeypatch.setattr(ck.torch, "save", lambda obj, f: (_ for _ in ()).throw(RuntimeError("something else")))
    with pytest.raises(RuntimeError, match="something else"):     # not a full disk: a bug, as it was
        ck.save_checkpoint(state, tmp_path, 3, keep_last=1)


@pytest.mark.slow
def test_a_full_disk_while_preparing_keeps_the_finished_shards_and_resumes_to_the_same_data(tmp_path, monkeypatch):
    import data.prepare as prep
    from data import prepare_dataset
    from data.errors import DiskFull

    overrides = ["data.shard_size=200000"]
    clean = prepare_dataset(prep.compose_data_config([f"data.root={tmp_path / 'clean'}", *overrides]), progress=False)
    cfg = prep.compose_data_config([f"data.root={tmp_path / 'full'}", *overrides])
    real_write, calls = prep.write_shard, []

    def fills_up(path, tokens):
        calls.append(path)
        if len(calls) > 4:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_write(path, tokens)
    monkeypatch.setattr(prep, "write_shard", fills_up)
    with pytest.raises(DiskFull, match=r"is full while preparing pydocs \(data.root\): 4 finished shard\(s\) kept"):
        prepare_dataset(cfg, progress=False)
    out = cfg.out_dir if hasattr(cfg, "out_dir") else None
    out = Path(tmp_path / "full" / Path(clean).name)
    assert sorted(p.name for p in out.glob("*.bin")) == [f"train_{i:06d}.bin" for i in range(4)]
    assert not list(out.glob("*.tmp"))
    monkeypatch.setattr(prep, "write_shard", real_write)
    prepare_dataset(cfg, progress=False)
    shards = lambda d: [(s["file"], s["sha256"]) for sp in read_json(Path(d) / "meta.json")["splits"].values()  # noqa
                        for s in sp["shards"]]
    assert shards(out) == shards(clean)
    # a truncated meta.json: one line naming it, not a JSONDecodeError
    meta = out / "meta.json"
    meta.write_text(meta.read_text()[:100])
    with pytest.raises(CorruptFile, match=rf"^{meta} is corrupt or truncated \(.* at line \d+\): delete {out} to "
                                          "prepare it again$"):
        prepare_dataset(cfg, progress=False)


def test_malformed_or_mistyped_yaml_is_one_line(tmp_path, capsys, load_script):
    bad, lst, part = tmp_path / "bad.yaml", tmp_path / "list.yaml", tmp_path / "part.yaml"
    bad.write_text("a: [1\n")
    lst.write_text("- 1\n- 2\n")
    part.write_text("experiment: fidelity\ncells: {}\nparts: [x]\ntune: {ladder: [1.0]}\n")
    with pytest.raises(CorruptFile, match=r"bad.yaml is not valid YAML at line 2, column 1 \(expected ',' or ']'"):
        read_yaml(bad, "a mapping")
    sweep = load_script("sweep")
    assert "holds a YAML list, not a mapping: expected --points" in one_line_exit(
        capsys, sweep.main, ["--name", "t", "--points", str(lst), "--dry-run"])
    assert "is not valid YAML at line 2" in one_line_exit(capsys, sweep.main, ["--name", "t", "--points", str(bad),
                                                                             "--dry-run"])
    study = load_script("study")
    assert "list.yaml holds a YAML list, not a mapping: expected a study" in one_line_exit(
        capsys, study.main, [str(lst), "--list"])
    assert "bad.yaml is not valid YAML" in one_line_exit(capsys, study.main, [str(bad)])
    with pytest.raises(SystemExit, match=r"part.yaml: parts\[0\]: 'x': expected a mapping with name and kind"):
        study.main([str(part), "--list"])


def test_corrupt_json_is_one_line(tmp_path):
    p = tmp_path / "horizons.json"
    p.write_text('{"a": 1')
    with pytest.raises(CorruptFile, match=r"horizons.json is corrupt or truncated \(.*\): restore it"):
        read_json(p)
    p.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(CorruptFile, match="is not text"):
        read_json(p)


def test_tables_and_plots_show_a_run_with_a_non_finite_loss_as_diverged(tmp_path, capsys, load_script):
    """The sinks write a NaN loss as null (JSON has no NaN): make_table and plot_curves read it as diverged."""
    from experiments import runs as runlib
    make_table, plot = load_script("make_table"), load_script("plot_curves")
    for name, final in (("ok", 2.5), ("nan", None)):
        d = tmp_path / "sw" / name
        d.mkdir(parents=True)
        (d / "config.yaml").write_text(f"norm: {{name: pre_ln}}\ntrain: {{seed: {0 if final else 1}}}\n")
        lines = [{"kind": "train", "step": 1, "tokens": 8, "loss": 3.0 if final else None},
                 {"kind": "eval", "step": 0, "tokens": 0, "val_loss": 5.5},
                 {"kind": "eval", "step": 4, "tokens": 32, "val_loss": final},
                 {"kind": "summary", "step": 4, "tokens": 32, "final_val_loss": final, "diverged": False}]
        (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    run = runlib.load_run(tmp_path / "sw" / "nan")
    assert math.isnan(run.final_val_loss) and run.diverged and run.failed
    assert make_table.main([str(tmp_path / "sw")]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| pre_ln"))
    assert "| 2 |" in row and "1/2" in row
    assert plot.main([str(tmp_path / "sw"), "--out", str(tmp_path / "c")]) == 0
    assert (tmp_path / "c_loss.png").stat().st_size > 0


def test_plot_curves_on_runs_without_records_is_an_error_not_empty_figures(tmp_path, load_script):
    plot = load_script("plot_curves")
    d = tmp_path / "r"
    d.mkdir()
    (d / "config.yaml").write_text("norm: {name: pre_ln}\n")
    (d / "metrics.jsonl").write_text("garbage\n")
    with pytest.raises(SystemExit, match="no training or eval records in .*metrics.jsonl: nothing to plot"):
        plot.main([str(tmp_path), "--out", str(tmp_path / "c")])
    assert not (tmp_path / "c_loss.png").exists()


def test_an_infinite_lr_is_refused_like_nan(tmp_path):
    from trainer.config import parse_run_config
    for lr in ("inf", ".inf", "nan"):
        with pytest.raises(ConfigError, match=rf"optim.lr='?{lr}'?: must be a (finite )?number"):
            parse_run_config(make_cfg(tmp_path, f"optim.lr={lr}"))


def test_the_run_dir_lock_falls_back_to_a_pid_file_without_flock(tmp_path, monkeypatch):
    import fcntl

    from trainer.resume import RunDirLock

    def no_flock(f, op):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(fcntl, "flock", no_flock)
    first, second = RunDirLock(tmp_path), RunDirLock(tmp_path)
    assert first.acquire() and not second.acquire()          # this live process holds it
    first.release()
    assert not (tmp_path / ".lock.pid").exists() and second.acquire()
    second.release()
    (tmp_path / ".lock.pid").write_text("999999999\n")      # left by a killed run: no such process
    assert RunDirLock(tmp_path).acquire()
