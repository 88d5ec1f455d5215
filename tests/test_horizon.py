"""The horizon part kind (experiments/horizon.py) on synthetic trunks: the lr chosen on the selection seeds and
bracketed, the scalar-lr axis, fresh test seeds at each horizon's best, and the paired report."""
import json
import math
import threading
import time
from types import SimpleNamespace

import pytest

from data.files import atomic_write


def fake_loss(cell, lr, mult, seed, steps):
    """A loss with a known optimum: lr 1e-2 for pre_ln, 3e-3 for mhc (whose scalars want lr_mult 10), a
    per-seed offset shared by the cells (the paired design), falling with the horizon."""
    best = 1e-2 if cell.endswith("pre_ln") else 3e-3
    gap = 0.0 if cell.endswith("pre_ln") else (-0.05 if mult == 10 else 0.01)
    return 2.0 + 0.1 * (math.log10(lr / best)) ** 2 + gap + 0.01 * seed + 1.0 / steps


@pytest.fixture
def study_env(tmp_path, monkeypatch):
    from experiments import horizon as hz, study as S
    study = S.Study.load("horizon")
    study.cells = {"gpt2.pre_ln": {"overrides": {"norm": "pre_ln"}, "start": 3e-3},
                   "gpt2.mhc": {"overrides": {"norm": "mhc"}, "start": 3e-3, "scalar_lr_mults": [1, 10]}}
    part = {"name": "a", "kind": "horizon", "sweep": "horizon_a", "cells": ["gpt2.pre_ln", "gpt2.mhc"],
            "horizons": [1, 4], "test_seeds": [2, 3, 4], "decay_frac": 0.2}
    study.parts = [part]
    trained, devices, active, lock = [], [], set(), threading.Lock()

    def fake_run(out, horizons, decay, overrides, warmup=0, log=None, env=None):
        point = json.loads((out / "point.json").read_text())
        o = dict(a.split("=", 1) for a in overrides)
        lr, mult, seed = float(o["optim.lr"]), float(o[hz.MULT_KEY]), int(o["train.seed"])
        assert (lr, mult, seed) == (point["lr"], point["mult"], point["seed"])
        trained.append((point["cell"], lr, mult, seed, point["role"]))
        dev = env and env.get("CUDA_VISIBLE_DEVICES")
        devices.append(dev)
        if dev is not None:  # two trunks running at once never share a GPU
            with lock:
                assert dev not in active
                active.add(dev)
            time.sleep(0.02)
            with lock:
                active.discard(dev)
        rows = {h: {"steps": h, "tokens": h * 1024, "final_val_loss": fake_loss(point["cell"], lr, mult, seed, h),
                    "diverged": False, "train_s": 1.0} for h in horizons}
        atomic_write(out / "horizons.json", json.dumps({"horizons": rows}))  # as branches.run: readers run meanwhile

    monkeypatch.setattr(hz.branches, "run", fake_run)
    monkeypatch.setattr(hz, "reference_setting", lambda *a: (102_400, 1024, 50))
    monkeypatch.setattr(hz, "HOLD_S", 0.01)
    args = SimpleNamespace(runs_root=tmp_path / "runs", docs=tmp_path / "docs", experiment="horizon", overrides=[],
                           jobs=2)
    runner = SimpleNamespace(study=study, args=args, cells=study.cells)
    runner.devices = devices
    return hz, study, part, runner, trained


def test_selection_brackets_tunes_the_scalar_lr_and_tests_on_fresh_seeds(study_env):
    hz, study, part, runner, trained = study_env
    hz.run_part(runner, part)
    pre = {(lr, s) for c, lr, m, s, role in trained if c == "gpt2.pre_ln" and role == "selection"}
    # the grid 1e-3, 3e-3, 1e-2 has its best at the edge: 3e-2 is added, and then the best is inside
    assert {lr for lr, _ in pre} == {1e-3, 3e-3, 1e-2, 3e-2} and {s for _, s in pre} == {0, 1}
    mhc_mults = {(lr, m) for c, lr, m, s, role in trained if c == "gpt2.mhc" and role == "selection" and m != 1}
    # the scalar axis at mhc's best lr; its best (x 10) is the largest tried, so x 100 brackets it; and the lr
    # at x 10, tried only at 3e-3, gets its ladder neighbours there
    assert mhc_mults == {(3e-3, 10.0), (3e-3, 100.0), (1e-3, 10.0), (1e-2, 10.0)}
    tests = {(c, lr, m, s) for c, lr, m, s, role in trained if role == "test"}
    assert tests == {("gpt2.pre_ln", 1e-2, 1.0, s) for s in (2, 3, 4)} | {
        ("gpt2.mhc", 3e-3, 10.0, s) for s in (2, 3, 4)
    }
    n = len(trained)
    hz.run_part(runner, part)                                 # resumable: nothing runs twice
    assert len(trained) == n


def test_a_best_at_the_largest_scalar_lr_mult_gets_more_steps_up_until_bracketed_or_out_of_rounds(study_env,
                                                                                               monkeypatch):
    hz, study, part, runner, trained = study_env
    study.cells["gpt2.mhc"]["scalar_lr_mults"] = [1, 10, 100]
    # mhc's loss falls with the multiplier without end: the two edge rounds add x 1000 and x 10000, no more;
    # pre_ln's rises with it
    monkeypatch.setattr(hz.branches, "run", _with_loss(hz.branches.run, lambda c, lr, m, s, h: fake_loss(
        c, lr, 1.0, s, h) + (-0.01 if c.endswith("mhc") else 0.01) * math.log10(m)))
    hz.run_part(runner, part)
    mults = sorted({m for c, lr, m, s, role in trained if c == "gpt2.mhc" and role == "selection"})
    assert mults == [1.0, 10.0, 100.0, 1000.0, 10000.0]
    assert {(lr, m) for c, lr, m, s, role in trained if c == "gpt2.mhc" and role == "test"} == {(3e-3, 10000.0)}
    # a best at x 1 is not an edge of this axis: no multiplier beyond the ladder
    trained.clear()
    study.cells["gpt2.pre_ln"]["scalar_lr_mults"] = [1, 10]
    runner.args.runs_root, runner.args.docs = (runner.args.runs_root.parent / d for d in ("runs2", "docs2"))
    hz.run_part(runner, part)
    assert {m for c, lr, m, s, role in trained if c == "gpt2.pre_ln"} == {1.0, 10.0}


def test_edge_points_are_counted_per_cell_so_a_resumed_study_adds_none(study_env, monkeypatch):
    hz, study, part, runner, trained = study_env
    # pre_ln's loss falls with the lr without end: its grid (1e-3, 3e-3, 1e-2) gets edge_rounds (2) points
    # above it, 3e-2 and 1e-1, and then stops at the edge (with room on the ladder); a second invocation adds
    # nothing more
    monkeypatch.setattr(hz.branches, "run", _with_loss(hz.branches.run, lambda c, lr, m, s, h: fake_loss(
        c, lr, m, s, h) - (math.log10(lr) if c.endswith("pre_ln") else 0.0)))
    monkeypatch.setattr(study.tune, "ladder", [*study.tune.ladder, 0.3, 1.0])  # room above 1e-1
    assert study.edge_rounds == 2
    hz.run_part(runner, part)
    lrs = lambda: sorted({lr for c, lr, m, s, role in trained if c == "gpt2.pre_ln" and role == "selection"})  # noqa: E731
    assert lrs() == [1e-3, 3e-3, 1e-2, 3e-2, 1e-1]
    n = len(trained)
    hz.run_part(runner, part)
    assert len(trained) == n and lrs() == [1e-3, 3e-3, 1e-2, 3e-2, 1e-1]


def _with_loss(run, loss):
    """`run` (the fixture's fake trunk) with its final losses replaced by loss(cell, lr, mult, seed, steps)."""
    def wrapped(out, horizons, *a, **kw):
        run(out, horizons, *a, **kw)
        point, f = json.loads((out / "point.json").read_text()), out / "horizons.json"
        rows = json.loads(f.read_text())
        for h, r in rows["horizons"].items():
            r["final_val_loss"] = loss(point["cell"], point["lr"], point["mult"], point["seed"], int(h))
        atomic_write(f, json.dumps(rows))  # another cell's thread may read it meanwhile
    return wrapped


def test_the_report_compares_paired_by_seed_on_the_test_seeds(study_env, tmp_path, monkeypatch):
    hz, study, part, runner, trained = study_env
    hz.run_part(runner, part)
    from studies.horizon import report as hr

    rows = hz.collect(runner.args.runs_root, part)
    res = hr.analyse(study, part, rows)
    e = res[4.0]["gpt2.mhc"]
    assert e["setting"] == (3e-3, 10.0) and sorted(e["test"]) == [2, 3, 4]
    assert e["paired"].mean == pytest.approx(-0.05) and e["paired"].diffs == pytest.approx((-0.05,) * 3)
    assert e["verdict"].startswith("gpt2.mhc ahead")
    assert res[4.0]["gpt2.pre_ln"]["vertex"][0] == pytest.approx(1e-2, rel=1e-6)   # the parabola in log-lr
    monkeypatch.setattr(hr, "corpus_line", lambda exp: "Corpus: synthetic.")
    monkeypatch.setattr(hr, "scalar_table", lambda *a: [])
    hr.report(study, runner.args.runs_root, tmp_path / "docs", "horizon")
    text = (tmp_path / "docs" / "horizon" / "tables.md").read_text()
    assert "### a: 4 tokens per parameter" in text and "| gpt2.mhc | 0.003 | 10 |" in text
    glance = next(x for x in text.splitlines() if x.startswith("| gpt2.mhc | -0.050"))  # the at-a-glance row
    assert ": ahead (p=" in glance and glance.endswith("| none (- at every horizon) |")
    lines = (tmp_path / "docs" / "horizon" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 2 * len(trained) and all(
        {"seed", "lr", "tokens", "commit"} <= set(json.loads(x)) for x in lines
    )
    assert (tmp_path / "docs" / "horizon" / "a_gap.png").stat().st_size > 5_000


def test_no_gap_figure_before_a_cell_is_tested_against_its_reference(study_env, tmp_path, monkeypatch):
    from studies.horizon import report as hr

    hz, study, part, runner, trained = study_env
    part["cells"] = ["gpt2.pre_ln"]                       # the reference alone: nothing to plot
    hz.run_part(runner, part)
    monkeypatch.setattr(hr, "corpus_line", lambda exp: "Corpus: synthetic.")
    stale = runner.args.docs / "horizon" / "a_gap.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"an earlier report's figure")
    hr.report(study, runner.args.runs_root, runner.args.docs, "horizon")
    assert (runner.args.docs / "horizon" / "tables.md").is_file() and not stale.exists()


def test_a_fresh_checkout_resumes_from_the_published_results(study_env, monkeypatch):
    """Run dirs are not committed; docs/<study>/results.jsonl is. Without the run dirs the finished trunks
    are read from it and not trained again, and the report writes the same results back."""
    import shutil

    from studies.horizon import report as hr

    hz, study, part, runner, trained = study_env
    monkeypatch.setattr(hr, "corpus_line", lambda exp: "Corpus: synthetic.")
    hz.run_part(runner, part)
    hr.report(study, runner.args.runs_root, runner.args.docs, "horizon")
    results = runner.args.docs / "horizon" / "results.jsonl"
    before, n = sorted(results.read_text().splitlines()), len(trained)
    shutil.rmtree(runner.args.runs_root)
    hz.run_part(runner, part)
    assert len(trained) == n
    hr.report(study, runner.args.runs_root, runner.args.docs, "horizon")
    assert sorted(results.read_text().splitlines()) == before
    # a published trunk missing a horizon is trained again
    results.write_text("".join(x + "\n" for x in before if not ('"seed": 4' in x and '"tpp": 4.0' in x)))
    hz.run_part(runner, part)
    assert sorted({t[3] for t in trained[n:]}) == [4] and len(trained) == n + 2


def test_trunks_run_at_once_are_on_different_gpus(study_env):
    hz, study, part, runner, trained = study_env
    runner.args.gpus = "4,6"
    hz.run_part(runner, part)
    assert set(runner.devices) <= {"4", "6"} and None not in runner.devices and len(runner.devices) == len(trained)
    runner.args.jobs = 3
    with __import__("pytest").raises(SystemExit, match="--jobs 3: 2 visible GPU"):
        hz.run_part(runner, part)


def test_a_slot_the_first_cell_leaves_idle_goes_to_the_next_cell(study_env, monkeypatch):
    # pre_ln's three test seeds on two slots leave one idle while the third runs: mhc's trunks take it, never
    # more than --jobs at once, and pre_ln's still come out the same
    hz, study, part, runner, trained = study_env
    spans, lock, run = [], threading.Lock(), hz.branches.run

    def timed(out, *a, **kw):
        t0 = time.monotonic()
        time.sleep(0.5 if out.parts[-3:] == ("gpt2.pre_ln", "lr0.01", "s4") else 0.05)  # the one pre_ln runs alone
        run(out, *a, **kw)
        with lock:
            spans.append((trained[-1][0], trained[-1][4], t0, time.monotonic()))

    monkeypatch.setattr(hz.branches, "run", timed)
    hz.run_part(runner, part)
    events = sorted([(t0, 1) for *_, t0, _ in spans] + [(t1, -1) for *_, t1 in spans])
    assert max(sum(d for _, d in events[:i + 1]) for i in range(len(events))) <= runner.args.jobs
    last_pre = max(t1 for c, _, _, t1 in spans if c == "gpt2.pre_ln")
    assert any(t0 < last_pre for c, _, t0, _ in spans if c == "gpt2.mhc")      # pipelined, not cell after cell
    tests = {(c, lr, m, s) for c, lr, m, s, role in trained if role == "test"}
    assert ("gpt2.pre_ln", 1e-2, 1.0, 2) in tests and ("gpt2.mhc", 3e-3, 10.0, 4) in tests


def test_waiting_runs_get_a_slot_lowest_priority_first_and_none_after_a_stop(monkeypatch):
    from common import children

    slots, got = children.GpuSlots([], 1, 1), []
    held, _ = slots.acquire()
    waiters = [threading.Thread(target=lambda p=p: got.append((p, slots.acquire(p)[0]))) for p in (2, 1)]
    for w in waiters:
        w.start()
        time.sleep(0.05)                                  # priority 2 queued first, priority 1 after it
    slots.release(held)
    time.sleep(0.1)
    assert got == [(1, 0)]                                # the lower priority first, though it came later
    slots.release(0)
    waiters[0].join(timeout=2)
    assert got == [(1, 0), (2, 0)]
    # a slot that priority 0 freed is held for it, even with nothing of priority 0 running: a higher priority
    # waits out the hold, priority 0's next run (its next phase, planned meanwhile) takes it at once
    held = children.GpuSlots([], 1, 2, hold_s=0.3)
    assert held._until_a_hold_ends() <= 0.3               # a waiter wakes when the hold ends, not at its next poll
    t0 = time.monotonic()
    held.acquire(1)                                       # at the start, too, the slots wait for priority 0
    assert time.monotonic() - t0 >= 0.25
    held = children.GpuSlots([], 1, 2, hold_s=0.3)
    a, _ = held.acquire(0)
    b, _ = held.acquire(0)
    held.release(a)
    held.release(b)
    t0 = time.monotonic()
    held.acquire(1)
    assert time.monotonic() - t0 >= 0.25
    t0 = time.monotonic()
    held.acquire(0)
    assert time.monotonic() - t0 < 0.2
    held = children.GpuSlots([], 1, 2, hold_s=30)
    threading.Timer(0.1, held.finished, (0,)).start()     # priority 0 has nothing left (its cells published)
    t0 = time.monotonic()
    held.acquire(1)                                       # the start's hold ends with it, not after 30 s
    assert time.monotonic() - t0 < 5
    monkeypatch.setattr(children, "_stopped", [15])       # a stop: a waiting run raises instead of starting
    with pytest.raises(children.Stopped):
        slots.acquire()


def test_after_a_stop_signal_no_queued_trunk_starts(study_env, monkeypatch):
    # SIGTERM while trunks run: the trunks still queued neither start nor leave an empty run dir behind
    hz, study, part, runner, trained = study_env
    monkeypatch.setattr(hz.children, "_stopped", [15])
    with pytest.raises(hz.children.Stopped):
        hz.run_part(runner, part)
    assert trained == [] and not list(runner.args.runs_root.glob("**/point.json"))


def test_a_crashed_trunk_stops_its_cell_before_it_chooses_and_the_study_ends_with_one_line(study_env, monkeypatch,
                                                                                              capsys):
    # A trunk whose train.py exits with an error leaves no result: choosing the lr from the rest of the bracket
    # would be a choice the protocol never made, so that cell stops; the other cell still runs to its end.
    hz, study, part, runner, trained = study_env
    ok = hz.branches.run

    def crash_one(out, horizons, decay, overrides, warmup=0, log=None, env=None):
        if "norm=mhc" in overrides and "optim.lr=0.003" in overrides and "train.seed=1" in overrides:
            raise RuntimeError("train.py ... failed with exit 1 (log x/train.log)")
        return ok(out, horizons, decay, overrides, warmup, log, env)
    monkeypatch.setattr(hz.branches, "run", crash_one)
    with pytest.raises(hz.TrunkFailed, match=r"^study cell gpt2.mhc: 1 of 6 trunks failed, so the cell stopped "
                                             r"before its next phase \(rerun to retry them\); first: train.py"):
        hz.run_part(runner, part)
    assert {r for c, *_, r in trained if c == "gpt2.mhc"} == {"selection"}            # never tested
    assert {s for c, *_, s, r in trained if c == "gpt2.pre_ln" and r == "test"} == {2, 3, 4}  # the other cell whole
    out = capsys.readouterr().out
    assert "### cell gpt2.mhc stopped" in out and "### cell gpt2.mhc done" not in out
    monkeypatch.setattr(hz.branches, "run", ok)  # rerun: the crashed trunk is retried, the cell goes on
    hz.run_part(runner, part)
    assert ("gpt2.mhc", 3e-3, 1.0, 1, "selection") in trained[-12:]
    assert {s for c, *_, s, r in trained if c == "gpt2.mhc" and r == "test"} == {2, 3, 4}


def test_a_part_sharing_anothers_sweep_reuses_its_trunks_even_from_published_rows_only(study_env, tmp_path):
    """A second part on the same sweep (m16 beside p16) trains only what the first has not: the shared
    reference cell's trunks count, from run dirs or, in a fresh checkout, from the published rows."""
    import json

    hz, study, part, runner, trained = study_env
    second = {**part, "name": "b", "cells": ["gpt2.pre_ln"], "test_seeds": [2, 3, 4, 5]}
    study.parts = [part, second]
    hz.run_part(runner, part)
    n = len(trained)
    hz.run_part(runner, second)
    assert trained[n:] == [("gpt2.pre_ln", 1e-2, 1.0, 5, "test")]            # only the seed the first lacks
    rows = [r for r in hz.collect(runner.args.runs_root, part) if r["cell"] == "gpt2.pre_ln" and r["part"] == "a"]
    pub = hz.published(runner.args.docs, study)
    pub.parent.mkdir(parents=True, exist_ok=True)
    pub.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "trunk"}) + "\n" for r in rows))
    runner.args.runs_root = tmp_path / "fresh"                              # a fresh checkout: no run dirs
    hz.run_part(runner, second)
    assert [t[3] for t in trained[n + 1:]] == [5]                           # seeds 2-4 and the selection read back


def test_crossings_name_the_horizons_between_which_the_mean_gap_changes_sign():
    from studies.horizon.report import crossings

    assert crossings({1.0: 0.7, 4.0: -0.02, 16.0: -0.1, 32.0: 0.05}) == "1-4 (+ to -), 16-32 (- to +)"
    assert crossings({4.0: -0.1, 1.0: -0.2}) == "none (- at every horizon)"
    assert crossings({}) == "—"


def test_a_part_run_on_cells_of_another_reports_whether_each_gap_holds(study_env, monkeypatch):
    """Part b re-runs picked cells of part a one width up; the report sets each cell's gap in both side by
    side with the difference of the gaps (Welch: the parts' inits differ, so not paired across them)."""
    from studies.horizon import report as hr

    hz, study, part, runner, trained = study_env
    hz.run_part(runner, part)
    wide = {"name": "b", "kind": "horizon", "sweep": "horizon_b", "of": "a", "pick": ["gpt2.pre_ln", "gpt2.mhc"],
            "overrides": {"model.n_embd": 128}, "horizons": [4], "test_seeds": [2, 3, 4], "decay_frac": 0.2}
    study.parts = [part, wide]
    run = hz.branches.run

    def wider(out, horizons, decay, overrides, *a, **kw):  # mHC's lead doubles one width up, seed noise apart
        run(out, horizons, decay, overrides, *a, **kw)
        o = dict(a.split("=", 1) for a in overrides)
        assert o["model.n_embd"] == "128"
        rows = json.loads((out / "horizons.json").read_text())
        if o["norm"] == "mhc":
            for r in rows["horizons"].values():
                r["final_val_loss"] += -0.05 + 0.001 * int(o["train.seed"]) ** 2
        atomic_write(out / "horizons.json", json.dumps(rows))

    monkeypatch.setattr(hz.branches, "run", wider)
    hz.run_part(runner, wide)
    monkeypatch.setattr(hr, "corpus_line", lambda exp: "Corpus: synthetic.")
    monkeypatch.setattr(hr, "scalar_table", lambda *a: [])
    drawn, figure = {}, hr.figure

    def spy(study, part, res, path, of=None, of_res=None):
        drawn[part["name"]] = of and of["name"], of_res and sorted(of_res)
        figure(study, part, res, path, of, of_res)

    monkeypatch.setattr(hr, "figure", spy)
    hr.report(study, runner.args.runs_root, runner.args.docs, "horizon")
    # b's figure also draws a's gaps (at the horizons b ran: the figure filters them)
    assert drawn == {"a": (None, None), "b": ("a", [1.0, 4.0])}
    assert (runner.args.docs / "horizon" / "b_gap.png").stat().st_size > 5_000
    text = (runner.args.docs / "horizon" / "tables.md").read_text()
    assert "### b against a: does each gap hold? (b is a with model.n_embd=128;" in text
    row = next(x for x in text.splitlines() if x.startswith("| gpt2.mhc | 4 |"))
    gap_a, gap_b, diff = row.split(" | ")[2:5]
    assert gap_a.startswith("-0.050 [-0.050, -0.050]: ahead") and gap_b.startswith("-0.090 [")
    d = -0.05 + 0.001 * (4 + 9 + 16) / 3
    assert diff.startswith(f"{d:+.3f} [") and ", p=" in diff
    assert not any(x.startswith("| gpt2.pre_ln | 4 |") for x in text.splitlines())   # the reference: no gap
