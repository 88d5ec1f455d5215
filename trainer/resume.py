"""The run dir and resuming (training only): the run dir's lock and the temp files an interrupted write
left, the resume decision, what a resume may change (the model: nothing; the data order: only when
forced), and the pre-emption signals. The loop calls these; rank 0 decides, the others are told."""
from __future__ import annotations

import errno
import fcntl
import logging
import math
import os
import shutil
import signal
from pathlib import Path
from typing import Optional, Union

from common import ConfigError, UserError
from data.config import as_read, content_keys
from data.files import NotWritable, writable_dir
from runtime.checkpoint import CheckpointError, ckpt_dir, find_latest, resolve_checkpoint

from .optim import flat_schedule
from .sinks import truncate_jsonl

log = logging.getLogger("nanonorm.train")


def flatten(d: dict, prefix: str = "") -> dict:
    """{"a.b": v} of a nested mapping."""
    out = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def claim_run_dir(run_dir: Path) -> tuple["RunDirLock", Optional[str]]:
    """Rank 0 takes the run dir's lock before looking at what is in it, and keeps it for the run: two
    runs started into one dir cannot both pass the checks of `decide`. (lock, error or None)."""
    try:  # before the first step: a checkpoint that cannot be written would otherwise fail at the first save
        writable_dir(run_dir, "out_dir")
    except NotWritable as e:
        return None, str(e)
    if (run_dir / "sweep.json").is_file():  # a run inside it would hide the sweep's points from its tables
        return None, (f"out_dir {run_dir} is a sweep directory (it holds sweep.json), not a run dir: give one of "
                      "its points' dirs, or another out_dir")
    ck = ckpt_dir(run_dir)
    if ck.exists() and not ck.is_dir():  # not created here: a refused run must leave the dir as it found it
        return None, f"{ck} is a file, not a directory (chosen by out_dir): move it away or choose another location"
    lock = RunDirLock(run_dir)
    if not lock.acquire():
        return lock, (f"run dir {run_dir} is in use by another train.py (pid {lock.holder()} holds {lock.path}); "
                      "wait for it to end, or pass another run_name=...")
    for p in remove_stale_temps(run_dir):
        log.warning(f"removed {p}, left by an interrupted write")
    return lock, None


def decide(train_cfg, run_dir: Path) -> tuple[str, Optional[str]]:
    """Fresh, resume from which checkpoint, or refuse: ("ok", checkpoint path or None) | ("error", why).
    `train.resume`: auto (the newest checkpoint, if any), none (fresh; an occupied dir needs
    train.overwrite), or a checkpoint file or run dir."""
    latest, metrics = find_latest(run_dir), run_dir / "metrics.jsonl"
    if train_cfg.resume == "auto":
        if latest is None:
            done = last_recorded_step(metrics)
            if done and not train_cfg.overwrite:  # its checkpoints were lost (or never written): say so
                return "error", (
                    f"run dir {run_dir} records training up to step {done} but has no checkpoint in "
                    f"{ckpt_dir(run_dir)}: restore the checkpoints to resume, or pass train.overwrite=true "
                    "to start over (its records are then removed)"
                )
            truncate_jsonl(metrics, -1)  # nothing to continue: the records are stale
        return "ok", str(latest) if latest else None
    if train_cfg.resume != "none":
        try:
            return "ok", str(resolve_checkpoint(train_cfg.resume, key="train.resume"))
        except CheckpointError as e:  # raised on every rank, once rank 0 has told them
            return "error", str(e)
    if latest is not None or (metrics.exists() and metrics.stat().st_size > 0):
        if not train_cfg.overwrite:
            return "error", (f"run dir {run_dir} already holds a run ({latest or metrics}); pass train.resume=auto "
                             "to continue it, train.overwrite=true to start over, or another run_name=...")
        shutil.rmtree(ckpt_dir(run_dir), ignore_errors=True)
        metrics.unlink(missing_ok=True)
    return "ok", None


def last_recorded_step(metrics: Path) -> int:
    """The last step of a training record in metrics.jsonl (0: none, or no file). A torn line is skipped."""
    import json

    last = 0
    try:
        with open(metrics) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if isinstance(r, dict) and r.get("kind") == "train":
                    last = max(last, int(r.get("step") or 0))
    except (FileNotFoundError, NotADirectoryError):
        return 0
    return last


# Keys that decide which tokens each step sees: changing one on resume makes the continuation differ
# from an uninterrupted run, so it takes train.resume_force=true. (The model: check_compatible.)
EXACTNESS_KEYS = ("train.seed", "train.batch_tokens", "train.overfit_batch", "data.name",
                  *(f"data.{k}" for k in content_keys()))
# How and where to resume, not what is trained.
RESUME_KEYS = ("train.resume", "train.resume_force", "train.overwrite", "train.stop_at", "out_dir", "run_name")
# Compared as the model's config by check_compatible, which reads older checkpoints' forms too (the
# `norm` group's composed keys changed when the variants took their own options).
MODEL_PREFIXES = ("norm.",)


def check_config_changes(path: Path, now: dict, saved: dict, resume_force: bool) -> bool:
    """Warn about keys of the composed config that differ from the checkpoint's; refuse a change of an
    exactness key unless `resume_force`. True when any key differs."""
    now, before = flatten(_spelled(now)), flatten(_spelled(saved))
    # a key added since the checkpoint was written, now at its default, is how the older run trained
    default = _defaults(now)
    changed = [k for k in sorted(set(now) | set(before))
               if now.get(k) != before.get(k, default.get(k)) and k not in RESUME_KEYS
               and not k.startswith(MODEL_PREFIXES)]
    if not changed:
        return False

    def show(keys):
        return ", ".join(f"{k} {before.get(k)!r} -> {now.get(k)!r}" for k in keys)

    breaking = [k for k in changed if k in EXACTNESS_KEYS]
    if breaking and not resume_force:
        raise ConfigError(f"resuming {path} with {show(breaking)} would not continue the same data order: "
                          "pass train.resume_force=true to resume anyway, or start another run_name=...")
    log.warning(f"resuming {path} with a changed config: {show(changed)}"
                + (" (the data order differs from an uninterrupted run)" if breaking else ""))
    return True


def _defaults(now: dict) -> dict:
    """{"train.seed": 1337, ...}: every group's keys at their defaults, the optimizer's of `now`'s
    `optim.name`, spelled as `now` is (flattened, its schedule flat)."""
    from .config_store import group_defaults
    from .optim_options import optim_nodes

    node = optim_nodes().get(now.get("optim.name"), {})
    return flatten({**group_defaults(), "optim": flat_schedule(node)})


def _spelled(cfg: dict) -> dict:
    """The `optim` group as the command line spells it, so that a nested schedule (`schedule: {name: wsd,
    decay_frac: 0.4}`) compares equal to the flat form that runs saved before optim=muon nested it; the `data`
    group as its source reads it (data.config.as_read), so that a run saved with every source's keys does too."""
    if isinstance(cfg.get("optim"), dict):
        cfg = {**cfg, "optim": flat_schedule(cfg["optim"])}
    if isinstance(cfg.get("data"), dict):
        cfg = {**cfg, "data": as_read(cfg["data"])}
    return cfg


def check_compatible(path: Path, ckpt: dict, model_config: dict, tokenizer: str) -> None:
    """A resume must continue the same model: name the first mismatching field (`norm.clamp`)."""
    from model import GPTConfig

    try:
        saved = flatten(GPTConfig.from_dict(ckpt["model_config"]).to_dict())  # older flat configs in today's form
    except UserError as e:
        raise CheckpointError(f"checkpoint {path} has a bad model_config: {e}") from None
    if ckpt["tokenizer"] != tokenizer:  # first: it also changes the vocabulary size
        raise CheckpointError(f"checkpoint {path} is incompatible with this run: tokenizer "
                              f"{ckpt['tokenizer']!r} in the checkpoint but {tokenizer!r} now")
    model_config = flatten(model_config)
    # a changed variant is named as such (norm.name), not by the first of its options that differs
    diff = sorted((k for k in set(saved) | set(model_config) if saved.get(k) != model_config.get(k)),
                  key=lambda k: (not k.endswith("name"), k))
    if diff:
        k = diff[0]
        raise CheckpointError(f"checkpoint {path} is incompatible with this run: model_config.{k} is "
                              f"{saved.get(k)!r} in the checkpoint but {model_config.get(k)!r} now"
                              + (f" (and {len(diff) - 1} more field(s))" if len(diff) > 1 else ""))


class RunDirLock:
    """An exclusive flock on <run_dir>/.lock, held by rank 0 for the whole run: a second train.py
    started into the same run dir is refused at once, however close together the two start. The
    kernel drops the lock when the process dies, so a killed run never leaves a stale claim."""

    NAME = ".lock"

    def __init__(self, run_dir: Union[str, Path]):
        self.path = Path(run_dir) / self.NAME
        self._f = None
        self._pid_file: Optional[Path] = None

    def acquire(self) -> bool:
        """True when claimed; False when another live process holds the run dir."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return False
        except OSError as e:
            f.close()
            if e.errno not in NO_FLOCK:
                raise
            return self._acquire_pid_file()
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")  # for the person who finds the lock: which process holds it
        f.flush()
        self._f = f
        return True

    def _acquire_pid_file(self) -> bool:
        """Where the file system has no flock (Lustre mounted without `-o flock`, some NFS): a pid file
        created exclusively. Weaker: a killed run leaves it, so a pid that is not alive on this host is
        taken over; two hosts sharing a run dir are not told apart."""
        log.warning(f"{self.path.parent}: the file system does not support flock; using a pid file instead "
                    "(mount with `-o flock` for the kernel's lock)")
        path = self.path.with_name(self.NAME + ".pid")
        for _ in range(2):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                holder = path.read_text().strip()
                if holder.isdigit() and _alive(int(holder)):
                    self.path.write_text(f"{holder}\n")
                    return False
                path.unlink(missing_ok=True)  # left by a killed run
                continue
            with os.fdopen(fd, "w") as f:
                f.write(f"{os.getpid()}\n")
            self.path.write_text(f"{os.getpid()}\n")
            self._pid_file = path
            return True
        return False

    def holder(self) -> str:
        try:
            return self.path.read_text().strip() or "?"
        except OSError:
            return "?"

    def release(self) -> None:
        if self._f is not None:
            self._f.close()  # closing the descriptor drops the flock
            self._f = None
        if self._pid_file is not None:
            self._pid_file.unlink(missing_ok=True)
            self._pid_file = None


# flock's errors on a file system that does not implement it
NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temps(run_dir: Union[str, Path]) -> list[Path]:
    """Temp files of writes that a kill interrupted (`.<name>.<pid>.tmp`, and older versions'
    `.ckpt_*.pt.tmp<pid>`) in the run dir and its checkpoints/. Only safe while holding the run dir's
    lock: no live writer can own them then."""
    run_dir = Path(run_dir)
    found = sorted({p for d in (run_dir, ckpt_dir(run_dir)) for pat in (".*.tmp", ".ckpt_*.pt.tmp*")
                    for p in d.glob(pat) if p.is_file()})
    for p in found:
        p.unlink(missing_ok=True)
    return found


# --- pre-emption ---------------------------------------------------------------------------------

class StopSignal:
    """SIGTERM/SIGUSR1/SIGINT set a flag; the loop checkpoints at the next step boundary and exits cleanly.
    (A handler must not checkpoint itself: it could run mid-step, between backward and optimizer step.)

    Under DDP every rank must stop at the same step: `requested` launches, each step, an asynchronous
    max-all-reduce of every rank's flag (a CPU tensor on a gloo group: no device sync) and reads the
    previous step's result, which has long arrived. A signal is acted on one step after the step it came
    in, with no blocking per step."""

    # SIGINT: Ctrl-C saves too, instead of losing the steps since the last save
    SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")
    _BASE = 2.0 ** 52  # the flag is _BASE - step: its max over ranks names the earliest signalled step

    def __init__(self):
        self.received: Optional[str] = None
        self.step: Optional[int] = None  # the step during which a signal came (this rank's or, agreed, the earliest)
        self._previous, self._work, self._flag = {}, None, None

    def install(self) -> "StopSignal":
        for name in self.SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None:
                try:
                    self._previous[sig] = signal.signal(sig, self._handler)
                except ValueError:  # not the main thread (e.g. some test runners): leave defaults
                    pass
        return self

    def _handler(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name

    def note(self, step: int) -> None:
        """Called after each step: remember the step during which this rank got its signal."""
        if self.received is not None and self.step is None:
            self.step = step

    def requested(self, group=None) -> bool:
        """Whether any rank has had a signal: this process's flag, or (`group`: the ranks' gloo group)
        the agreement of all ranks, one step late."""
        if group is None:
            return self.received is not None
        import torch

        from runtime import distributed

        seen = False
        if self._work is not None:
            self._work.wait()
            v = self._flag.item()
            if v > 0:
                seen, self.step = True, int(self._BASE - v)
        if seen:
            self._work = None
        else:
            self._flag = torch.tensor(self._BASE - self.step if self.step is not None else 0.0, dtype=torch.float64)
            self._work = distributed.all_reduce_async(self._flag, "max", group)
        return seen

    def log_flag(self) -> float:
        """This rank's signal for the logging step's max all-reduce (float32, beside the loss maxima):
        minus the signalled step, so the max names the earliest one; -inf for none."""
        return -float(self.step) if self.step is not None else float("-inf")

    def adopt_log_flag(self, v: float) -> bool:
        """Whether the reduced `log_flag` says some rank was signalled; if so, agree on its step (a rank
        that saw no signal still reports the step at which another rank got one)."""
        if not math.isfinite(v):
            return False
        self.step = int(-v)
        return True

    def uninstall(self) -> None:
        if self._work is not None:
            self._work.wait()  # every rank launched the same flag all-reduces: finish the last one
            self._work = None
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)
        self._previous.clear()


# --- stopping as diverged, and a checkpoint checked before its data is prepared ---------------------

def diverged_message(s: int, consecutive: int, limit: int, log_interval: int) -> str:
    """Why a run stops as diverged. The count is read at logging steps (no per-step host sync), so it can
    pass the limit before the stop; a skipped step changes nothing, so the model is as after s - consecutive."""
    return (f"stopping at step {s}: {consecutive} consecutive non-finite steps were skipped (train.max_skipped={limit} "
            f"was reached at step {s - consecutive + limit}; it is checked at logging steps, every "
            f"logging.log_interval={log_interval}); the run has diverged, and its weights are "
            f"those after step {s - consecutive}")


def load_compatible(path: Path, model_config, tokenizer: str) -> dict:
    """The checkpoint at `path`, loaded (memory-mapped) and checked to be of this model and tokenizer. Its
    checksums are read once, on rank 0, not once per rank (a 17 GB file on 8 ranks would be read 8 times)."""
    import torch.distributed as dist

    from runtime import checkpoint
    from runtime.distributed import broadcast_object

    first = not dist.is_initialized() or dist.get_rank() == 0
    damaged = broadcast_object(checkpoint.failed_record(Path(path)) if first and Path(path).is_file() else None)
    if damaged:
        raise checkpoint.damaged_error(Path(path), damaged)
    ckpt = checkpoint.load_checkpoint(path, verify=False)
    check_compatible(path, ckpt, model_config.to_dict(), tokenizer)
    return ckpt
