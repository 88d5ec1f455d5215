"""Loaders: x/y alignment, rank-disjoint covering global batches, world-size invariance, exact resume,
epoch coverage, and a world-size-independent padded validation set."""
import numpy as np
import pytest
import torch

from data import DataError, TrainLoader, ValLoader
from data.loader import FeistelPermutation
from data.shards import write_shard

T = 8


@pytest.fixture
def shards(tmp_path):
    """Three train shards of unequal length (tokens = position in the stream, mod 65536) and one val."""
    pos = 0
    for i, n in enumerate([300, 177, 250]):
        write_shard(tmp_path / f"train_{i:06d}.bin", (np.arange(pos, pos + n) % 65536).astype(np.uint16))
        pos += n
    write_shard(tmp_path / "val_000000.bin", (np.arange(1000, 1000 + 205)).astype(np.uint16))
    return tmp_path


def global_batch(d, step, micro, accum, world, seed=0):
    rows = []
    for r in range(world):
        ld = TrainLoader(d, micro, T, grad_accum=accum, rank=r, world_size=world, seed=seed)
        rows += [ld.get_batch(step, m)[0] for m in range(accum)]
    return torch.cat(rows)


def as_set(x):
    return sorted(map(tuple, x.tolist()))


def test_batches_are_contiguous_windows(shards):
    ld = TrainLoader(shards, 5, T, seed=3)
    x, y = ld.get_batch(4)
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (5, T)
    assert x.is_contiguous() and y.is_contiguous()
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert torch.equal(y - x, torch.ones_like(x))        # stream tokens are consecutive integers
    first = x[:, 0].numpy()
    shard_start = np.where(first < 300, 0, np.where(first < 477, 300, 477))
    assert np.all((first - shard_start) % T == 0)           # windows start on the block grid of their shard


def test_ranks_disjoint_and_covering_and_world_size_invariant(shards):
    for step in (0, 1, 7):
        ref = global_batch(shards, step, micro=6, accum=1, world=1)
        assert len(set(as_set(ref))) == 6                      # no window twice within a step
        for micro, accum, world in ((3, 2, 1), (3, 1, 2), (1, 2, 3), (2, 3, 1), (1, 1, 6)):
            parts = [TrainLoader(shards, micro, T, grad_accum=accum, rank=r, world_size=world).get_batch(step, m)[0]
                     for r in range(world) for m in range(accum)]
            flat = [tuple(row) for p in parts for row in p.tolist()]
            assert len(set(flat)) == len(flat)                  # ranks/micro-steps disjoint
            assert sorted(flat) == as_set(ref)                  # and covering the same global batch


def test_epoch_visits_every_window_once_then_reshuffles(shards):
    ld = TrainLoader(shards, 1, T, seed=5)
    n = ld.num_sequences
    assert n == 299 // T + 176 // T + 249 // T                # windows never cross a shard boundary
    seen = np.array([ld.windows(s)[0] for s in range(2 * n)])
    assert sorted(seen[:n].tolist()) == sorted(seen[n:].tolist()) == list(range(n))
    assert not np.array_equal(seen[:n], seen[n:])


def test_resume_is_exact_and_seed_matters(shards):
    a = TrainLoader(shards, 4, T, grad_accum=2, seed=11)
    expected = [a.get_batch(s, m)[0] for s in range(5, 8) for m in range(2)]
    b = TrainLoader(shards, 4, T, grad_accum=2, seed=0)         # fresh process, wrong seed
    b.load_state_dict(a.state_dict())
    assert all(torch.equal(e, b.get_batch(s, m)[0]) for e, (s, m) in
               zip(expected, [(s, m) for s in range(5, 8) for m in range(2)]))
    c = TrainLoader(shards, 4, T, grad_accum=2, seed=12)
    assert not torch.equal(c.get_batch(5)[0], expected[0])
    with pytest.warns(UserWarning) as rec:
        TrainLoader(shards, 4, T + 1, grad_accum=2).load_state_dict(a.state_dict())
    assert any("block_size=8, now 9" in str(w.message) for w in rec)


def test_feistel_is_a_bijection():
    for n in (1, 2, 5, 64, 1000, 4097):
        p = FeistelPermutation(n, (7, 0))(np.arange(n))
        assert sorted(p.tolist()) == list(range(n))
    assert not np.array_equal(FeistelPermutation(1000, (7, 0))(np.arange(1000)), np.arange(1000))


def test_val_is_fixed_padded_and_world_size_independent(shards):
    def collect(world, budget, bs=3):
        seqs, counts = {}, []
        for r in range(world):
            batches = list(ValLoader(shards, bs, T, token_budget=budget, rank=r, world_size=world))
            counts.append(len(batches))
            for b, (x, y) in enumerate(batches):
                assert x.shape == y.shape == (bs, T)
                for i in range(bs):
                    if (y[i] == -1).all():
                        continue
                    assert not (y[i] == -1).any()
                    seqs[r + world * (b * bs + i)] = tuple(x[i].tolist())
        assert len(set(counts)) == 1                               # every rank: same number of batches
        return seqs

    full = collect(1, None)
    assert len(full) == 204 // T and full[0][0] == 1000            # in order, from the split's start
    for world in (2, 3, 5):
        assert collect(world, None) == full
    budget = collect(2, 10 * T)
    n = len(full)
    # a budget is spread over the whole split at a fixed stride (the centre of each tenth), never its head
    assert budget == {i: full[(2 * i + 1) * n // 20] for i in range(10)}
    assert collect(3, 10 * T) == budget                             # the same windows at any world size
    assert ValLoader(shards, 4, T, token_budget=10 * T).num_tokens == 10 * T


def test_loader_errors(shards, tmp_path):
    with pytest.raises(DataError, match="rank=2 is not in"):
        TrainLoader(shards, 2, T, rank=2, world_size=2)
    with pytest.raises(DataError, match="no val shards"):
        ValLoader(tmp_path / "nowhere", 2, T)
    with pytest.raises(DataError, match="too few for one sequence"):
        TrainLoader(shards, 2, 5000)


def test_the_prefetcher_gives_the_loaders_batches_and_builds_the_next_one(shards):
    from trainer.prefetch import Prefetcher

    ld = TrainLoader(shards, 3, T, grad_accum=2, seed=5)
    pf = Prefetcher(ld, accum=2, pin=False)
    try:
        for step, micro in [(0, 0), (0, 1), (1, 0), (1, 1), (7, 0), (7, 1), (2, 0)]:   # in order, then misses
            x, y = pf.get(step, micro)
            want = ld.get_batch(step, micro)
            assert torch.equal(x, want[0]) and torch.equal(y, want[1])
            nxt = (step, micro + 1) if micro == 0 else (step + 1, 0)
            assert list(pf.pending) == [nxt]                     # the next one is being built
    finally:
        pf.close()
