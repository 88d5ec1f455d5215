"""The step-scale study's planning: lr brackets, edge points and the chaos control's twins."""
from pathlib import Path

import pytest

study = runlib = None


@pytest.fixture(autouse=True)
def _modules(load_script):
    global study, runlib
    runlib = load_script("runlib")
    study = load_script("step_scale_study")


def fake(cell, lr, seed, loss):
    label = f"{cell}-lr-{lr:g}"
    return runlib.Run(path=Path(label), config={"optim": {"lr": lr}, "train": {"seed": seed}}, label=label,
                      seed=seed, evals=[{"step": 0, "val_loss": 5.5}, {"step": 400, "val_loss": loss}],
                      summary={"final_val_loss": loss}, base=label)


def grid(cell, losses_by_lr):
    return [fake(cell, lr, s, x) for lr, xs in losses_by_lr.items() for s, x in enumerate(xs)]


def test_lr_grid_is_three_ladder_points_around_the_centre():
    assert study.around(3e-3) == [1e-3, 3e-3, 1e-2]
    assert study.around(1e-4) == [1e-4, 3e-4]      # the ladder's end: no point below it
    assert all(lr in study.LADDER for c, (_, centre) in study.CELLS.items() for lr in study.around(centre))


def test_best_lr_is_chosen_on_the_mean_over_seeds_and_edges_get_one_more_point():
    # seed 0 alone would pick 1e-3 (2.30); the mean over three seeds picks 3e-3
    runs = grid("pre_ln", {1e-3: [2.30, 2.60, 2.60], 3e-3: [2.40, 2.40, 2.41], 1e-2: [2.70, 2.70, 2.70]})
    best = study.best_lrs(runs)["pre_ln"]
    assert best["value"] == 3e-3
    assert study.edge_points(runs, study.CELLS) == {}     # inside the grid: no edge point
    runs = grid("proj_spheret-a8", {1e-3: [3.0] * 3, 3e-3: [2.9] * 3, 1e-2: [2.8] * 3})
    assert study.edge_points(runs, study.CELLS) == {"proj_spheret-a8-lr-0.03": {
        "norm": "proj_spheret", "norm.alpha_init": 8.0, "optim.lr": 3e-2}}
    runs = grid("pre_ln-rms1", {1e-3: [2.4] * 3, 3e-3: [2.5] * 3, 1e-2: [2.7] * 3})
    assert list(study.edge_points(runs, study.CELLS)) == ["pre_ln-rms1-lr-0.0003"]


def test_chaos_reruns_pre_ln_the_published_cell_and_each_familys_best():
    runs = (grid("pre_ln", {3e-3: [2.38] * 3}) + grid("proj_spheret", {1e-3: [2.9] * 3})
            + grid("proj_spheret-a8", {1e-2: [2.7] * 3}) + grid("proj_spheret-a32", {1e-3: [3.4] * 3})
            + grid("geonorm", {1e-2: [2.45] * 3}) + grid("geonorm-r1-a8", {3e-3: [2.41] * 3}))
    best = study.best_lrs(runs)
    assert study.chaos_cells(best) == ["pre_ln", "proj_spheret", "proj_spheret-a8", "geonorm-r1-a8"]


def test_chaos_part_runs_twins_with_two_threads(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(study, "finished", lambda args, name: grid("pre_ln", {3e-3: [2.38] * 3}))
    monkeypatch.setattr(study, "sweep", lambda args, name, pts, seeds, *extra, jobs=None: calls.append(
        (name, pts, seeds, extra, jobs)))
    args = type("A", (), {"cells": ["pre_ln"], "jobs": 2, "runs_root": tmp_path})()
    study.run_part(args, "chaos")
    assert calls == [("step_scale_b", {"pre_ln-lr-0.003": {"norm": "pre_ln", "optim.lr": 3e-3}}, "0",
                      ("train.threads=2",), 1)]


def test_unknown_part_and_cell_are_one_line(capsys):
    with pytest.raises(SystemExit, match="unknown --cells nope"):
        study.main(["run", "grid", "--cells", "nope"])
    with pytest.raises(SystemExit, match="run needs a part"):
        study.main(["run", "x"])
