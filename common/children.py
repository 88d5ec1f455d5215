"""Child processes of the launchers (sweep.py, study.py, branches.py): a train.py they start must never
outlive them, and must not lose its steps when they are stopped.

- A SIGINT or SIGTERM to the launcher is forwarded to every running child (train.py checkpoints at the next
  step and exits), the launcher waits for them, starts nothing more, and exits 128 + the signal number.
- Children run in their own session, so a Ctrl-C at the terminal reaches them once, through the launcher,
  not twice (a second signal would not wait for the save).
- On Linux a child gets SIGTERM when its launcher dies, even by kill -9 (prctl PR_SET_PDEATHSIG), so no
  orphaned run goes on training unseen.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import heapq
import itertools
import math
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

FORWARDED = (signal.SIGINT, signal.SIGTERM)
_PR_SET_PDEATHSIG = 1
_children: set = set()
_lock = threading.Lock()
_stopped: list[int] = []  # the signal that stopped the launcher, once one arrived

_prctl = None
if sys.platform.startswith("linux"):  # resolved here, not in the forked child (where imports could deadlock)
    try:
        _prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        _prctl = None


def _die_with_parent(parent: int):
    def hook():
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the launcher died between fork and prctl
            os._exit(1)
    return hook


def popen(cmd: list, **kw) -> subprocess.Popen:
    """subprocess.Popen that dies with this process and receives its forwarded SIGINT/SIGTERM."""
    with _lock:
        if _stopped:
            raise Stopped(_stopped[0])
        p = subprocess.Popen(cmd, start_new_session=True, preexec_fn=_die_with_parent(os.getpid()), **kw)
        _children.add(p)
    return p


def wait(p: subprocess.Popen) -> int:
    try:
        return p.wait()
    finally:
        with _lock:
            _children.discard(p)


def run(cmd: list, **kw) -> int:
    """popen + wait: the exit status. Raises Stopped when the launcher was told to stop meanwhile."""
    code = wait(popen(cmd, **kw))
    if _stopped:
        raise Stopped(_stopped[0])
    return code


def stopped() -> int | None:
    """The signal that stopped the launcher, or None."""
    return _stopped[0] if _stopped else None


class Stopped(Exception):
    """The launcher received SIGINT/SIGTERM: its children were told and waited for; start nothing more."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _forward(signum, _frame):
    with _lock:
        first = not _stopped
        _stopped.append(signum)
        procs = list(_children)
    if first:
        print(f"\n# {signal.Signals(signum).name}: told {len(procs)} running train.py to checkpoint and stop; "
              "waiting for them (rerun the same command to resume)", file=sys.stderr, flush=True)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signum)


@contextmanager
def forwarding():
    """Install the forwarding handlers for the body (main thread only); a Stopped raised in it becomes an exit
    with 128 + the signal number, after every child has exited."""
    old = {s: signal.signal(s, _forward) for s in FORWARDED}
    try:
        yield
    except Stopped as e:
        for p in list(_children):
            wait(p)
        raise SystemExit(128 + e.signum) from None
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# --- GPUs for concurrent runs ----------------------------------------------------------------------

def visible_gpus(spec: str | None = None) -> list[str]:
    """The GPU ids runs may use: `spec` ("0,1,2,3", a launcher's --gpus), else CUDA_VISIBLE_DEVICES, else
    every device torch sees; [] on a machine without CUDA."""
    if spec is None:
        spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is not None:
        return [g.strip() for g in spec.split(",") if g.strip() and g.strip() != "-1"]
    try:
        import torch
        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # no torch or no driver: no GPUs
        return []


class GpuSlots:
    """Packs concurrent runs onto GPUs: `jobs` slots, each `per_run` GPUs of `gpus`, never one GPU in two
    slots unless `oversubscribe`. Every child gets its slot's CUDA_VISIBLE_DEVICES (else all land on cuda:0).
    Without GPUs, every slot is CPU-only and the environment is left as it is.
    `acquire` waits for a free slot; of the callers waiting, the lowest `priority` goes first (then the
    earliest), so a launcher may queue more runs than slots and still finish its first cell first. With
    `hold_s`, a slot that a run of priority p frees is kept for p (or lower) that long: a launcher between
    two phases of p's work queues the next within seconds, and a higher priority would take the slot for a
    whole run."""

    def __init__(self, gpus: list[str], per_run: int, jobs: int, oversubscribe: bool = False, hold_s: float = 0.0):
        self.groups = [gpus[i:i + per_run] for i in range(0, len(gpus) - per_run + 1, per_run)]
        if gpus and not self.groups:
            raise SystemExit(f"--nproc {per_run}: a run needs {per_run} GPUs, {len(gpus)} visible "
                             f"({','.join(gpus)}): lower --nproc or pass --gpus")
        if self.groups and jobs > len(self.groups) and not oversubscribe:
            raise SystemExit(f"--jobs {jobs}: {len(gpus)} visible GPU(s) ({','.join(gpus)}) hold {len(self.groups)} "
                             f"run(s) of {per_run} GPU(s) at once: lower --jobs to {len(self.groups)}, name the GPUs "
                             "with --gpus, or pass --oversubscribe to share them")
        self.free = list(range(jobs))
        self.hold_s = hold_s
        # the priority of the run that last freed a slot, and when; at the start the slots are held for priority
        # 0 (the first cell), which may still be planning while later ones already queue
        self._freed_at = {s: time.monotonic() if hold_s else -math.inf for s in self.free}
        self._freed_by = {s: 0 if hold_s else math.inf for s in self.free}
        self._held: dict = {}  # slot -> the priority running on it
        self._cond = threading.Condition()
        self._waiting: list = []  # heap of (priority, ticket)
        self._tickets = itertools.count()

    def _takeable(self, priority: int) -> list:
        """The free slots a run of `priority` may take now, freed longest ago first."""
        now = time.monotonic()
        return sorted((s for s in self.free if self._freed_by[s] >= priority or now - self._freed_at[s] >= self.hold_s),
                      key=self._freed_at.get)

    def _until_a_hold_ends(self) -> float:
        """Seconds to wait before the takeable slots may change with no release: the end of the next hold
        (nothing notifies then), at most 0.5 s."""
        now = time.monotonic()
        ends = [self._freed_at[s] + self.hold_s - now for s in self.free if now - self._freed_at[s] < self.hold_s]
        return max(0.001, min([0.5] + ends))

    def acquire(self, priority: int = 0) -> tuple[int, dict | None]:
        """(slot, environment for the child, or None to inherit). Waits for a slot; raises Stopped when the
        launcher is stopped meanwhile (a queued run never starts after a stop)."""
        with self._cond:
            me = (priority, next(self._tickets))
            heapq.heappush(self._waiting, me)
            try:
                while not (self._waiting[0] == me and self._takeable(priority)):
                    if _stopped:
                        raise Stopped(_stopped[0])
                    self._cond.wait(timeout=self._until_a_hold_ends())  # a stop is seen within 0.5 s
            finally:
                self._waiting.remove(me)
                heapq.heapify(self._waiting)
                self._cond.notify_all()  # the next in line may now be first
            slot = self._takeable(priority)[0]
            self.free.remove(slot)
            self._held[slot] = priority
        if not self.groups:
            return slot, None
        return slot, {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(self.groups[slot % len(self.groups)])}

    def finished(self, priority: int) -> None:
        """Priority `priority` will queue nothing more: the slots held for it are free for any (a resumed
        study whose first cells are published would otherwise idle through the start's hold)."""
        with self._cond:
            for s in self.free:
                if self._freed_by[s] == priority:
                    self._freed_at[s] = -math.inf
            self._cond.notify_all()

    def release(self, slot: int) -> None:
        with self._cond:
            self._freed_by[slot] = self._held.pop(slot, math.inf)
            self._freed_at[slot] = time.monotonic()
            self.free.append(slot)
            self.free.sort()
            self._cond.notify_all()
