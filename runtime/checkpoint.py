"""Checkpoint files (format: docs/training.md, "Resume and pre-emption"): atomic save, keep last K, find, load and
validate, the model of a checkpoint, and the RNG streams they carry. Shared by training, eval.py and
sample.py; what training does with a run dir (its lock, the resume decision) is trainer/resume.py."""
from __future__ import annotations

import logging
import pickle
import random
import re
import zipfile
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch

from common import UserError
from common.errors import disk_full

from data.files import atomic_open

log = logging.getLogger("nanonorm.train")

FORMAT, VERSION = "nanonorm-ckpt", 1
_NAME = re.compile(r"^ckpt_(\d{8})\.pt$")
_REQUIRED = ("step", "model", "model_config", "tokenizer", "optimizer", "scheduler", "rng", "loader", "config")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be used; the message names the file and the problem."""


def ckpt_dir(run_dir: Union[str, Path]) -> Path:
    return Path(run_dir) / "checkpoints"


def ckpt_path(run_dir: Union[str, Path], step: int) -> Path:
    return ckpt_dir(run_dir) / f"ckpt_{step:08d}.pt"


def list_checkpoints(run_dir: Union[str, Path]) -> list[Path]:
    """Finished checkpoints (temp files excluded), oldest first."""
    d = ckpt_dir(run_dir)
    if not d.is_dir():
        return []
    return sorted((p for p in d.iterdir() if _NAME.match(p.name)), key=lambda p: int(_NAME.match(p.name)[1]))


def find_latest(run_dir: Union[str, Path]) -> Optional[Path]:
    """Newest finished checkpoint of a run dir (or of a checkpoints/ dir itself), None if there is none."""
    run_dir = Path(run_dir)
    if run_dir.name == "checkpoints" and not ckpt_dir(run_dir).is_dir():
        run_dir = run_dir.parent
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def save_checkpoint(state: dict, run_dir: Union[str, Path], step: int, keep_last: int, keep_steps=()) -> Path:
    """Write atomically (temp name, fsync, rename); then delete all but the newest keep_last, and those
    of `keep_steps` (branch points, kept whatever keep_last says)."""
    path = ckpt_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"format": FORMAT, "version": VERSION, **state, "step": step}
    try:
        with atomic_open(path, "wb") as f:   # on any error the temp file is removed; older checkpoints stay
            torch.save(state, f)
    except (OSError, RuntimeError) as e:
        if not disk_full(e):
            raise
        kept = list_checkpoints(run_dir)
        then = (f"the last good one, {kept[-1].name}, is kept; free space (or lower train.keep_last) and resume "
                "with train.resume=auto" if kept else
                "no checkpoint of this run was written yet, so there is nothing to resume: free space and start "
                "it again")
        raise CheckpointError(f"cannot write checkpoint {path}: the disk is full; {then}") from None
    keep = {ckpt_path(run_dir, k).name for k in keep_steps}
    for old in list_checkpoints(run_dir)[:-keep_last]:
        if old.name not in keep:
            old.unlink(missing_ok=True)
    return path


def _torch_load(path: Path) -> dict:
    """torch.load memory-mapped and weights-only.

    mmap: tensors stay in the file (the page cache, shared by every process on the machine) until
    used, so a rank holds only what it copies out: the model weights, and the optimizer state where
    training resumes. Without it each of 8 ranks resuming the 1.3B model would first read the whole
    file (~16 GB with Adam state) into its own memory. weights_only: our files hold only tensors and
    plain Python values, so nothing in a checkpoint can run code; checkpoints written before the RNG
    state was stored that way hold numpy arrays, allowed by name."""
    try:
        return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except pickle.UnpicklingError:
        with torch.serialization.safe_globals(_NUMPY_RNG_GLOBALS):
            return torch.load(path, map_location="cpu", mmap=True, weights_only=True)


_reconstruct = (np._core if hasattr(np, "_core") else np.core).multiarray._reconstruct
# numpy 2 moved numpy.core to numpy._core: allow the function under the name either wrote
_NUMPY_RNG_GLOBALS = [_reconstruct, *((_reconstruct, f"numpy.{m}.multiarray._reconstruct") for m in ("core", "_core")),
                      np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def failed_record(path: Path) -> Optional[str]:
    """The first record of the checkpoint's zip archive whose data does not match its CRC-32, as a phrase;
    None if all match (or the file is no zip: load_checkpoint reports that). torch.save writes a CRC-32 per
    tensor record but torch.load never checks it, so a flipped bit in the weights would load silently.
    Reading the file once costs ~1 s per 2 GB, small beside the training that wrote it."""
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError):
        return None
    except Exception as e:  # zlib/struct errors inside a damaged record
        return f"unreadable record: {type(e).__name__}"
    return f"record {bad}: CRC-32 mismatch" if bad else None


def damaged_error(path: Path, damaged: str) -> CheckpointError:
    return CheckpointError(f"checkpoint {path} fails its checksum ({damaged}): the file is damaged; "
                           + ("delete it to resume from the previous one" if _NAME.match(path.name) else
                              "copy it again from where it came from"))


def load_checkpoint(path: Union[str, Path], verify: bool = True) -> dict:
    """Load and check a checkpoint; CheckpointError naming the file if it is corrupt or not ours. `verify`:
    check every record's CRC-32 first (a DDP resume verifies on rank 0 once and tells the others)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if not zipfile.is_zipfile(path) and not _NAME.match(path.name):
        # every file torch.save writes is a zip archive (torch's own error would talk of mmap); a run's own
        # ckpt_*.pt that is not one was cut short, and gets the corrupt-file advice below
        raise CheckpointError(f"{path} is not a nanonorm checkpoint (not a torch.save zip archive); "
                              f"give a run dir or a ckpt_*.pt file written by train.py")
    damaged = failed_record(path) if verify else None
    if damaged:
        raise damaged_error(path, damaged)
    try:
        ckpt = _torch_load(path)
    except Exception as e:  # truncated zip, pickle garbage, a foreign object, a data file given by mistake, ...
        foreign = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        msg = f"it pickles {foreign[1]}, not a tensor or plain value" if foreign else " ".join(str(e).split())[:200]
        # Deleting is the way out only for a run's own checkpoint (an older one then takes over).
        advice = ("delete it to resume from the previous one" if _NAME.match(path.name) else
                  "give a run dir or a ckpt_*.pt file written by train.py")
        raise CheckpointError(f"checkpoint {path} is corrupt or unreadable ({type(e).__name__}: {msg}); "
                              f"{advice}") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a nanonorm checkpoint (no format='{FORMAT}' field)")
    if ckpt.get("version") != VERSION:
        raise CheckpointError(
            f"checkpoint {path} has version {ckpt.get('version')!r}; this code reads version {VERSION}"
        )
    missing = [k for k in _REQUIRED if k not in ckpt]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks field(s) {missing}")
    return ckpt


# Keys renamed since checkpoints were first written: old prefix -> new (nGPT's logit scale moved into its head)
RENAMED = {"logit_step.": "lm_head."}


def strip_prefixes(state_dict: dict) -> dict:
    """Remove torch.compile / DDP wrappers' key prefixes (in case a foreign state dict has them), and give
    keys of older checkpoints their current names (RENAMED)."""
    out = {}
    for k, v in state_dict.items():
        for pre in ("_orig_mod.", "module."):
            while k.startswith(pre):
                k = k[len(pre):]
        for old, new in RENAMED.items():
            if k.startswith(old):
                k = new + k[len(old):]
        out[k] = v
    return out


def resolve_checkpoint(path_or_run_dir: Union[str, Path], key: Optional[str] = None) -> Path:
    """A checkpoint file as given, or a run dir's newest one; one-line CheckpointError otherwise.
    The one resolver of train.py's `train.resume=<path>` (`key` names that setting in the error),
    eval.py's and sample.py's path argument."""
    p = Path(path_or_run_dir)
    bad = f"bad config {key}={str(path_or_run_dir)!r}: " if key else ""
    if p.is_dir():
        latest = find_latest(p)
        if latest is None:
            raise CheckpointError(f"{bad}no checkpoints (checkpoints/ckpt_*.pt) in {p}")
        return latest
    if not p.is_file():
        raise CheckpointError(f"{bad}checkpoint {p} does not exist (give a run dir or a ckpt_*.pt file)")
    return p


def load_weights(model, state_dict: dict, path: Path, against: str) -> None:
    """model.load_state_dict, with a mismatch named by its first keys (torch's first line names none)."""
    sd = strip_prefixes(state_dict)
    own = model.state_dict()
    missing, unexpected = [k for k in own if k not in sd], [k for k in sd if k not in own]
    shapes = [f"{k} {tuple(sd[k].shape)} vs {tuple(v.shape)}" for k, v in own.items()
              if k in sd and tuple(sd[k].shape) != tuple(v.shape)]

    def some(keys):
        return ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")

    why = "; ".join(f"{what}: {some(keys)}" for what, keys in
                    (("missing", missing), ("unexpected", unexpected), ("shape (checkpoint vs model)", shapes)) if keys)
    if why:
        raise CheckpointError(f"checkpoint {path}: weights do not match {against} ({why})")
    model.load_state_dict(sd)


def load_model(path_or_run_dir: Union[str, Path], device="cpu"):
    """(model in eval mode on `device`, checkpoint dict without the optimizer state) from a ckpt file or
    a run dir's newest one. Only the weights are read from the file (see _torch_load)."""
    from model import GPT, GPTConfig

    p = resolve_checkpoint(path_or_run_dir)
    ckpt = load_checkpoint(p)
    model = GPT(GPTConfig.from_dict(ckpt["model_config"]))
    load_weights(model, ckpt["model"], p, "its model_config")
    ckpt.pop("optimizer", None)  # mapped, never read: inference needs the weights only
    return model.to(device).eval(), ckpt


# --- RNG -----------------------------------------------------------------------------------------

def rank_seed(seed: int, rank: int) -> int:
    """Per-rank seed (dropout etc.); rank 0 keeps `seed`, so 1 process == rank 0 of many."""
    return (seed + 1_000_003 * rank) % (2**31)


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def rng_state() -> dict:
    """This process's RNG streams. On CUDA only the current device's generator: a process draws
    from its own GPU only, and a list of every visible GPU's state could not be restored where a
    process sees a different number of GPUs (8 ranks resumed as 2 nodes x 4 instead of 1 x 8).

    Plain Python values and tensors only (numpy's state as a tensor), so the file loads with
    torch.load(weights_only=True)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    s = {"python": random.getstate(), "torch": torch.get_rng_state(),
         "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached))}
    if torch.cuda.is_available():
        s["cuda"] = torch.cuda.get_rng_state()
    return s


def set_rng_state(s: dict) -> None:
    random.setstate(s["python"])
    kind, keys, *rest = s["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.int64).astype(np.uint32), *rest))
    torch.set_rng_state(s["torch"])
    cuda = s.get("cuda")
    if cuda is None or not torch.cuda.is_available():
        return
    if isinstance(cuda, (list, tuple)):  # older checkpoints: every visible GPU's state, by device index
        i = torch.cuda.current_device()
        if i >= len(cuda):
            log.warning(f"checkpoint holds CUDA RNG states of {len(cuda)} GPU(s), none for cuda:{i}; "
                        f"its CUDA RNG stream is not restored")
            return
        cuda = cuda[i]
    torch.cuda.set_rng_state(cuda)
