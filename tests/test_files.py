"""data/files.py: the one atomic write every module uses (temp name, fsync, rename)."""
import os

import pytest

from data.files import atomic_open, atomic_write


def test_atomic_write_text_and_bytes(tmp_path):
    p = atomic_write(tmp_path / "a.json", "{\"x\": \"é\"}\n")
    assert p.read_text(encoding="utf-8") == "{\"x\": \"é\"}\n"
    atomic_write(p, b"\x00\x01")  # replaces the old content as a whole
    assert p.read_bytes() == b"\x00\x01"
    assert os.listdir(tmp_path) == ["a.json"]  # no temporary file left


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    p = tmp_path / "ckpt.pt"
    p.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="killed"):
        with atomic_open(p, "wb") as f:
            f.write(b"half of the new")
            assert p.read_bytes() == b"old"  # readers see the old file while writing
            assert f.name.endswith(".tmp") and os.path.dirname(f.name) == str(tmp_path)
            raise RuntimeError("killed")
    assert p.read_bytes() == b"old" and os.listdir(tmp_path) == ["ckpt.pt"]


def test_temporary_name_is_hidden_unique_per_process_and_ends_in_tmp(tmp_path):
    with atomic_open(tmp_path / "meta.json") as f:
        name = os.path.basename(f.name)
    assert name == f".meta.json.{os.getpid()}.tmp"
