"""The next micro-batch built on a background thread while the device runs this one (as modded-nanogpt does).

A batch is a pure function of (step, micro-step) (data/loader.py), so building it early changes nothing: the
loop asks for (step, micro) in order, and the batch after it is being gathered from the memory-mapped shards
(numpy index math and the gather release the GIL) and pinned while the GPU computes. A request that was not
the one prefetched (a resume, the overfit-batch mode) is built on the spot.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor


class Prefetcher:
    def __init__(self, loader, accum: int, pin: bool):
        self.loader, self.accum, self.pin = loader, accum, pin
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch")
        self.pending: dict = {}

    def _make(self, step: int, micro: int):
        x, y = self.loader.get_batch(step, micro)
        return (x.pin_memory(), y.pin_memory()) if self.pin else (x, y)

    def get(self, step: int, micro: int):
        """(x, y) of (step, micro), as loader.get_batch gives it (pinned with `pin`); starts the next one."""
        fut = self.pending.pop((step, micro), None)
        out = fut.result() if fut is not None else self._make(step, micro)
        nxt = (step, micro + 1) if micro + 1 < self.accum else (step + 1, 0)
        for f in self.pending.values():   # a stale guess (a miss): drop it
            f.cancel()
        self.pending = {nxt: self.pool.submit(self._make, *nxt)}
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.pending.clear()
