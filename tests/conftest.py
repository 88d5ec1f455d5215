"""Test-wide settings: never talk to wandb's servers, one CPU thread.

The packages are imported as installed (`pip install -e .[dev]`, see the README).
"""
import os
import sys

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
# Tiny models gain nothing from a second thread, and subprocess tests (torchrun, CLI) run several
# processes on 2 cores: OpenMP threads spinning against each other make them ~10-50x slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402  (imported after OMP_NUM_THREADS is set)

torch.set_num_threads(1)


class PreparedCorpus:
    """The offline default corpus as the session prepared it."""

    def __init__(self, root, config, out_dir, imported):
        self.root, self.config, self.out_dir, self.imported = root, config, out_dir, imported


@pytest.fixture(scope="session")
def pydocs(tmp_path_factory):
    """The default data (pydocs, byte tokenizer), prepared once per test session in a fresh
    directory that $NANONORM_DATA points at, so that every test run and every subprocess (train.py,
    torchrun) reads it there. The xdist workers share it: the first prepares it, the others wait for
    it and reuse it. `imported`: the modules first imported while preparing it."""
    import fcntl
    import json

    from data import prepare_dataset
    from data.prepare import compose_data_config

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "pydocs-data"
    root.mkdir(exist_ok=True)
    mp = pytest.MonkeyPatch()
    mp.setenv("NANONORM_DATA", str(root))
    config = compose_data_config([])
    with open(root / ".fixture.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = root / "imported.json"
        before = set(sys.modules)
        out_dir = prepare_dataset(config, progress=False)
        if not record.exists():   # this worker prepared it
            record.write_text(json.dumps(sorted(set(sys.modules) - before)))
    yield PreparedCorpus(root, config, out_dir, set(json.loads(record.read_text())))
    mp.undo()


def _load_script(name: str):
    """Import scripts/<name>.py as the module `name`, as `python scripts/<name>.py` sees it (to call its
    main in process); each module once per session."""
    import importlib.util
    from pathlib import Path

    if name in sys.modules:
        return sys.modules[name]
    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def load_script():
    """`load_script("make_table")`: a script of scripts/ as a module."""
    return _load_script
