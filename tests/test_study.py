"""The staged study runner (experiments/study.py, scripts/study.py) on the step-scale study's file: lr
brackets, the best on the mean over seeds, edge points, picks, the chaos part's twins, shapes, and one-line
errors for bad files."""
from pathlib import Path

import pytest

S = runlib = None


@pytest.fixture(autouse=True)
def _modules(load_script):
    global S, runlib
    from experiments import runs as runlib
    S = load_script("study")


@pytest.fixture
def study():
    return S.Study.load("step_scale")


def fake(cell, lr, seed, loss):
    label = f"{cell}-lr-{lr:g}"
    return runlib.Run(path=Path(label), config={"optim": {"lr": lr}, "train": {"seed": seed}}, label=label,
                      seed=seed, evals=[{"step": 0, "val_loss": 5.5}, {"step": 400, "val_loss": loss}],
                      summary={"final_val_loss": loss}, base=label)


def grid(cell, losses_by_lr):
    return [fake(cell, lr, s, x) for lr, xs in losses_by_lr.items() for s, x in enumerate(xs)]


def overrides(study):
    return {c: spec["overrides"] for c, spec in study.cells.items()}


def test_lr_grid_is_three_ladder_points_around_the_start(study):
    assert study.around(3e-3) == [1e-3, 3e-3, 1e-2]
    assert study.around(1e-4) == [1e-4, 3e-4]      # the ladder's end: no point below it
    assert all(lr in study.ladder for spec in study.cells.values() for lr in study.around(spec["start"]))


def test_best_lr_is_chosen_on_the_mean_over_seeds_and_edges_get_one_more_point(study):
    # seed 0 alone would pick 1e-3 (2.30); the mean over three seeds picks 3e-3
    runs = grid("pre_ln", {1e-3: [2.30, 2.60, 2.60], 3e-3: [2.40, 2.40, 2.41], 1e-2: [2.70, 2.70, 2.70]})
    assert study.best(runs)["pre_ln"]["value"] == 3e-3
    assert study.edge_points(runs, overrides(study)) == {}     # inside the grid: no edge point
    runs = grid("proj_spheret-a8", {1e-3: [3.0] * 3, 3e-3: [2.9] * 3, 1e-2: [2.8] * 3})
    assert study.edge_points(runs, overrides(study)) == {"proj_spheret-a8-lr-0.03": {
        "norm": "proj_spheret", "norm.alpha_init": 8.0, "optim.lr": 3e-2}}
    runs = grid("pre_ln-rms1", {1e-3: [2.4] * 3, 3e-3: [2.5] * 3, 1e-2: [2.7] * 3})
    assert list(study.edge_points(runs, overrides(study))) == ["pre_ln-rms1-lr-0.0003"]
    # counted from the runs: two points already beyond the grid on the edge's side (edge_rounds 2), no third,
    # however many invocations it took to run them
    assert study.edge_rounds == 2 and study.around(study.cells["geonorm"]["start"]) == [3e-3, 1e-2, 3e-2]
    runs = grid("geonorm", {1e-3: [2.6] * 3, 3e-3: [2.7] * 3, 1e-2: [2.8] * 3, 3e-2: [2.9] * 3})
    assert list(study.edge_points(runs, overrides(study))) == ["geonorm-lr-0.0003"]
    runs += grid("geonorm", {3e-4: [2.5] * 3})
    assert study.edge_points(runs, overrides(study)) == {}     # 1e-4 is on the ladder, but out of rounds


def test_a_pick_takes_named_cells_and_the_best_of_each_group(study):
    best = {"pre_ln": ({"optim.lr": 3e-3}, 2.38), "proj_spheret": ({"optim.lr": 1e-3}, 2.9),
            "proj_spheret-a8": ({"optim.lr": 1e-2}, 2.7), "proj_spheret-a32": ({"optim.lr": 1e-3}, 3.4),
            "geonorm": ({"optim.lr": 1e-2}, 2.45), "geonorm-r1-a8": ({"optim.lr": 3e-3}, 2.41)}
    assert study.pick(study.part("chaos")["pick"], best) == ["pre_ln", "proj_spheret", "proj_spheret-a8",
                                                             "geonorm-r1-a8"]
    assert study.pick(study.part("trend")["pick"], best) == ["pre_ln", "geonorm-r1-a8"]


def test_chaos_part_runs_twins_with_two_threads_at_half_the_jobs(study, monkeypatch, tmp_path):
    calls = []
    args = type("A", (), {"cells": list(study.cells), "jobs": 2, "runs_root": tmp_path, "docs": tmp_path,
                          "experiment": "fidelity", "overrides": [], "shapes": None})()
    runner = S.Runner(study, args)
    monkeypatch.setattr(runner, "finished", lambda sweep: grid("pre_ln", {3e-3: [2.38] * 3}))
    monkeypatch.setattr(runner, "sweep", lambda name, pts, seeds, extra=(), jobs=None, experiment=None: calls.append(
        (name, pts, seeds, list(extra), jobs)))
    runner.run_part(study.part("chaos"))
    assert calls == [("step_scale_b", {"pre_ln-lr-0.003": {"norm": "pre_ln", "optim.lr": 3e-3}}, [0],
                      ["train.threads=2"], 1)]


def test_shapes_are_factors_of_the_base_model_labelled_by_their_values(study):
    model = {"n_embd": 128, "n_layer": 4, "n_head": 4}
    assert study.shapes(model, study.part("trend")["shapes"]) == {
        "w64": {"model.n_embd": 64, "model.n_head": 2}, "d8": {"model.n_layer": 8},
        "w256": {"model.n_embd": 256, "model.n_head": 8}, "d16": {"model.n_layer": 16}}


def test_a_later_part_starts_from_the_recorded_bests_without_the_run_dirs(study, tmp_path):
    args = type("A", (), {"cells": list(study.cells), "jobs": 2, "runs_root": tmp_path / "runs",
                          "docs": tmp_path / "docs", "experiment": "fidelity", "overrides": [], "shapes": None})()
    runner = S.Runner(study, args)
    assert runner.bests(study.part("grid")) == {}
    path = tmp_path / "docs" / "step_scale" / "a_best.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"pre_ln": {"lr": 0.003, "mean": 2.377, "edge": false}}')   # the older key name
    assert runner.bests(study.part("edge")) == {"pre_ln": ({"optim.lr": 0.003}, 2.377)}   # edge writes to grid's sweep


@pytest.mark.parametrize("change, message", [
    ({"parts": [{"name": "x", "kind": "nope"}]}, r"parts\[0\].kind: 'nope': valid are grid, edge, rerun, shapes"),
    ({"parts": [{"name": "e", "kind": "edge", "of": "grid"}]}, r"parts.e.of: 'grid' is not an earlier part"),
    ({"parts": [{"name": "g", "kind": "grid", "sweep": "s"},
                {"name": "r", "kind": "rerun", "of": "g", "pick": ["nope"]}]}, r"parts.r.pick: unknown cell 'nope'"),
    ({"colour": 1}, r"bad.yaml: unknown key\(s\) study.colour: valid keys are experiment, cells, parts, tune"),
    ({"tune": {"width": 0}}, r"bad.yaml: bad config tune.width=0: must be a positive integer"),
    ({"cells": [1]}, r"bad.yaml: bad config study.cells=\[1\]: must be a mapping"),
    ({"tune": {"widht": 2}}, r"unknown key\(s\) study.tune.widht: valid keys are key, ladder, factor, width"),
    ({"tune": {"ladder": [1e-3], "factor": 2}}, r"tune: give one of ladder .* and factor"),
    # a part kind's own keys, typed: a typo, a wrong type and a missing key are one line each
    ({"parts": [{"name": "grid", "kind": "grid", "sweep": "s", "pick": ["pre_ln"]}]},
     r"bad.yaml: unknown key\(s\) parts.grid.pick: valid keys are name, kind, sweep, seeds$"),
    ({"parts": [{"name": "h", "kind": "horizon", "sweep": "s", "cells": ["pre_ln"], "horizons": 16,
                 "test_seeds": [2]}]}, r"bad.yaml: bad config parts.h.horizons=16: must be a list$"),
    ({"parts": [{"name": "h", "kind": "horizon", "sweep": "s", "cells": ["pre_ln"], "horizons": [1],
                 "test_seeds": [2], "decay_frac": 0}]},
     r"bad config parts.h.decay_frac=0: must be a finite number > 0 or null$"),
    ({"parts": [{"name": "grid", "kind": "grid", "sweep": "s"}, {"name": "v", "kind": "vary", "of": "grid",
                                                                "key": "optim.wd"}]},
     r"missing key parts.v.values: it has no default, set it$"),
    ({"experiment": None}, r"bad.yaml: bad config study.experiment=None: must not be null"),
])
def test_a_bad_study_file_is_one_line_naming_the_key(tmp_path, change, message):
    import yaml

    d = {
        "experiment": "fidelity",
        "tune": {"ladder": [1e-3, 3e-3]},
        "cells": {"pre_ln": {"overrides": {"norm": "pre_ln"}, "start": 1e-3}},
        "parts": [{"name": "grid", "kind": "grid", "sweep": "s"}],
        **change,
    }
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(SystemExit, match=message):
        S.Study.load(str(path))


def test_a_new_part_kind_is_one_dataclass_whose_fields_are_its_typed_keys():
    """The architecture page's recipe, with no YAML: a class under @kind, its fields the part's keys."""
    from dataclasses import dataclass

    from common.config import PosInt
    from common.errors import ConfigError
    from experiments.study_parts import PART_KINDS, Part, build_part, kind
    from helpers import unregister

    @kind("probe")
    @dataclass(kw_only=True)
    class ProbePart(Part):
        """Probe the best setting of `of` `repeats` times."""
        of: str
        repeats: PosInt = 3

    try:
        p = build_part(0, {"name": "pr", "kind": "probe", "of": "grid"})
        assert isinstance(p, ProbePart) and p["repeats"] == 3 and p.get("seeds") is None and "seeds" not in p
        assert p["of"] == "grid" and "of" in p and set(p.keys()) == {"name", "kind", "of", "repeats"}
        with pytest.raises(ConfigError, match=r"^bad config parts.pr.repeats=0: must be a positive integer$"):
            build_part(0, {"name": "pr", "kind": "probe", "of": "grid", "repeats": 0})
        with pytest.raises(ConfigError, match=r"^missing key parts.pr.of: it has no default, set it$"):
            build_part(0, {"name": "pr", "kind": "probe"})
        with pytest.raises(ConfigError, match=r"^parts\[0\].kind: 'prob': valid are grid, .*, horizon, probe$"):
            build_part(0, {"name": "pr", "kind": "prob"})
    finally:
        unregister(PART_KINDS, "probe")


def test_unknown_study_part_and_cell_are_one_line():
    with pytest.raises(SystemExit, match=r"unknown study 'nope': .*studies: .*step_scale"):
        S.main(["nope"])
    with pytest.raises(SystemExit, match="unknown --cells nope"):
        S.main(["step_scale", "--cells", "nope"])
    with pytest.raises(
        SystemExit, match="unknown part 'x' of study step_scale: valid parts are grid, edge, chaos, trend"
    ):
        S.main(["step_scale", "--part", "x"])
    with pytest.raises(SystemExit, match=r"^--jobs=0: must be >= 1$"):  # not "sweep step_scale_a had failed points"
        S.main(["step_scale", "--jobs", "0", "--part", "grid"])


def fake_run_dir(sweep_dir, cell, arch, norm, optim, key, value, seed, loss, stats=()):
    import json

    import yaml

    label = f"{cell}-lr-{value:g}"
    d = sweep_dir / f"{label}-s{seed}"
    d.mkdir(parents=True)
    lr = {"optim": {"name": optim, "lr": value}} if key == "optim.lr" else \
        {"optim": {"name": optim, "lr": 1e-3, "muon": {"lr": value}}}
    (d / "config.yaml").write_text(yaml.safe_dump({"model": {"arch": arch}, "norm": {"name": norm}, **lr,
                                                   "train": {"seed": seed, "max_steps": 400, "batch_tokens": 2048}}))
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"kind": "eval", "step": 0, "tokens": 0, "val_loss": 5.5}, *({"kind": "stats", **rec} for rec in stats),
        {"kind": "eval", "step": 400, "tokens": 819_200, "val_loss": loss},
        {"kind": "summary", "step": 400, "final_val_loss": loss}]) + "\n")
    manifest = sweep_dir / "sweep.json"
    points = json.loads(manifest.read_text())["points"] if manifest.is_file() else []
    points.append({"dir": d.name, "label": label, "base": label})
    manifest.write_text(json.dumps({"points": points}))


def test_the_axes_study_report_ranks_each_block_from_the_run_dirs(tmp_path, load_script):
    from studies.axes import report as axes_report
    study = S.Study.load("axes")
    sweep = tmp_path / "runs" / "axes"
    for cell, arch, norm, optim, key, start, losses in [
            ("gpt2-pre_ln", "gpt2", "pre_ln", "adamw", "optim.lr", 3e-3, [2.40, 2.38, 2.45]),
            ("gpt2-geonorm", "gpt2", "geonorm", "adamw", "optim.lr", 1e-2, [2.50, 2.44, 2.41]),
            ("llama-pre_ln-muon", "llama", "pre_ln", "muon", "optim.muon.lr", 5e-2, [2.30, 2.32, 2.35])]:
        for value, loss in zip(study.around(start), losses):
            fake_run_dir(sweep, cell, arch, norm, optim, key, value, 0, loss)
    best = study.best([r for r in runlib.load_sweep(sweep) if r.finished])
    assert {c: b["value"] for c, b in best.items()} == {"gpt2-pre_ln": 3e-3, "gpt2-geonorm": 2e-2,
                                                        "llama-pre_ln-muon": 2.5e-2}
    axes_report.report(study, tmp_path / "runs", tmp_path / "docs", "fidelity")
    tables = (tmp_path / "docs" / "axes" / "tables.md").read_text()
    assert "| gpt2 | pre_ln | adamw | 0.003 | 2.380 (s0) |" in tables
    assert "| gpt2 | geonorm | adamw | 0.02 (edge) |" in tables           # the best is the largest lr tried
    assert "| llama | pre_ln | muon | 0.025 (edge) | 2.300 (s0) |" in tables
    assert "| pre_ln | 1 | — | — |" in tables and (tmp_path / "docs" / "axes" / "axes.png").is_file()


def test_the_step_scale_report_writes_its_tables_and_figures_from_the_run_dirs(tmp_path, load_script):
    from studies.step_scale import report
    study, root = S.Study.load("step_scale"), tmp_path / "runs"
    stats = [{"step": s, "tokens": 2048 * s, **{f"geo/angle/{j}": 0.1 * (j + 1) for j in range(4)},
              "geo/rel_update/0": 0.01, "geo/grad/0": 1.0} for s in (0, 100)]
    # (a) Pre-LN best inside its grid on the mean over seeds; 1-SpheretNorm best at the grid's edge
    for cell, losses in (("pre_ln", {1e-3: 2.50, 3e-3: 2.40, 1e-2: 2.60}),
                         ("proj_spheret", {1e-3: 2.90, 3e-3: 2.80, 1e-2: 2.70})):
        for lr, loss in losses.items():
            for seed in range(3):
                fake_run_dir(root / "step_scale_a", cell, "gpt2", cell, "adamw", "optim.lr", lr, seed,
                             loss + 0.01 * seed, stats)
    fake_run_dir(root / "step_scale_b", "pre_ln", "gpt2", "pre_ln", "adamw", "optim.lr", 3e-3, 0, 2.45)  # (b) twin
    (root / "step_scale_times.json").write_text('{"grid": 600.0, "edge": 90.0}')  # study.py's record of each part
    report.report(study, root, tmp_path / "docs", "fidelity")
    out = tmp_path / "docs" / "step_scale"
    tables = (out / "tables.md").read_text()
    assert ("| pre_ln | 0.25 | 0.001: 2.510, 0.003: 2.410, 0.01: 2.610 | 0.003 | 2.400, 2.410, 2.420 | "
            "2.410 ± 0.010 |") in tables                                  # angle at init: the mean over sublayers
    assert "| proj_spheret | 0.25 | 0.001: 2.910, 0.003: 2.810, 0.01: 2.710 | 0.01 (edge) |" in tables
    assert "| not ranked (best at the grid edge) |" in tables
    assert "| pre_ln @ 0.003 | 2.4000 | 2.4500 | 0.0500 | 0.0100 | chaotic" in tables  # 0.05 > a quarter of 0.01
    assert "## (c) Trend with size" in tables and "(not run yet)" in tables
    assert "Runs finished: (a) 18. Tokens per run: 819,200." in tables and "grid 10 min, edge 2 min." in tables
    assert (out / "a_lr.png").is_file() and (out / "a_geometry.png").is_file()


def test_the_fidelity_report_writes_each_parts_tables_and_figures_from_the_run_dirs(tmp_path, load_script):
    import json

    from studies.fidelity import report
    study, root = S.Study.load("fidelity"), tmp_path / "runs"

    def run(sweep, cell, lr, seed, loss, **kw):
        fake_run_dir(root / sweep, cell, "gpt2", cell.split("-")[0], "adamw", "optim.lr", lr, seed, loss, **kw)

    # (a) seed 0 at three lrs, seeds 1 and 2 at the best; geonorm's best is the largest lr tried
    for cell, losses in (("pre_ln", {3e-4: 2.50, 1e-3: 2.40, 3e-3: 2.45}),
                         ("geonorm", {3e-4: 2.60, 1e-3: 2.55, 3e-3: 2.50})):
        for lr, loss in losses.items():
            run("fidelity_a", cell, lr, 0, loss)
        best = min(losses, key=losses.get)
        for seed in (1, 2):
            run("fidelity_a", cell, best, seed, losses[best] + 0.01 * seed)
    run_dir = next((root / "fidelity_a").glob("pre_ln-lr-0.001-s0"))
    (run_dir / "layer_ablation.json").write_text(json.dumps({"increase": [0.5, 0.1, 0.02, 0.01], "base_loss": 2.4,
                                                             "norm": "pre_ln"}))
    for cell, loss in (("pre_ln", 2.30), ("geonorm", 2.35)):              # (c) horizon, seeds 0 and 1
        for seed in (0, 1):
            run("fidelity_c", cell, 1e-3, seed, loss + 0.02 * seed)
    for cell, loss in (("geonorm", 2.50), ("geonorm-untied", 2.60)):     # (d) a choice against its baseline
        for seed in (0, 1):
            run("fidelity_d", cell, 3e-3, seed, loss + 0.01 * seed)
    (root / "fidelity_times.json").write_text('{"grid": 600.0}')
    report.report(study, root, tmp_path / "docs")
    out = tmp_path / "docs" / "fidelity"
    tables = (out / "tables.md").read_text()
    assert "| 1 | pre_ln | 0.001 | 2.410 ± 0.010 (0,1,2) | 2.500 | 2.400 | 2.450 |" in tables
    assert "| 2 | geonorm | 0.003 (edge) | 2.510 ± 0.010 (0,1,2) | 2.600 | 2.550 | 2.500 |" in tables
    assert "- 0.82M tokens: pre_ln < geonorm" in tables                   # (c) the ranking at each token count
    assert "| geonorm-untied | 2.605 ± 0.007 | +0.100 | yes (spread 0.007) |" in tables  # (d) beyond 2x the spread
    assert "| pre_ln | 2.400 | +0.50, +0.10, +0.02, +0.01 | +0.300 / +0.015 |" in tables  # (e4) layer ablation
    assert "Parts not run yet: b, e." in tables and "| grid | 10 min |" in tables
    assert all((out / f).is_file() for f in ("a_lr_sensitivity.png", "c_horizon.png", "e_layer_ablation.png"))


def test_a_report_without_finished_runs_leaves_the_committed_tables(tmp_path, capsys, load_script):
    """`study.py <study> --report` in a fresh checkout (no run dirs) must not overwrite published tables."""
    for name in ("axes", "methods"):  # a study with its own report module, and one with the generic tables
        tables = tmp_path / "docs" / name / "tables.md"
        tables.parent.mkdir(parents=True)
        tables.write_text("committed results\n")
        S.report(S.Study.load(name), tmp_path / "runs", tmp_path / "docs", "fidelity")
        assert tables.read_text() == "committed results\n" and "left as it is" in capsys.readouterr().out


def test_another_experiment_or_overrides_keep_their_runs_apart_from_the_studys_and_docs(tmp_path, monkeypatch):
    """`study.py <study> -- train.max_steps=8` (or --experiment X) must not leave runs where the study's own
    would be skipped as finished, nor write its tables and bests over docs/."""
    seen = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(S.Runner, "run_part", lambda self, part: seen.append((self.args.runs_root, self.args.docs)))
    S.main(["step_scale", "--part", "grid", "--", "train.max_steps=8"])
    S.main(["step_scale", "--part", "grid"])
    S.main(["step_scale", "--part", "grid", "--runs-root", "r", "--docs", "d", "--", "train.max_steps=8"])
    S.main(["step_scale", "--part", "grid", "--experiment", "fidelity_depth"])
    scratch = Path("runs") / "step_scale-custom"
    assert seen == [(scratch, scratch / "docs"), (Path("runs"), Path("docs")), (Path("r"), Path("d")),
                    (scratch, scratch / "docs")]


def fake_setting(cell, lr, mult, seed, loss):
    r = fake(cell, lr, seed, loss)
    r.config["optim"]["groups"] = {"scalars": {"lr_mult": mult}}
    if mult != 1.0:
        r.label = r.base = f"{r.base}-lr_mult-{mult:g}"
    return r


def test_a_point_label_drops_to_its_cell_for_every_tuned_key():
    study = S.Study.load("fidelity")
    assert study.cell_of("geonorm-untied-lr-0.01-lr_mult-100") == "geonorm-untied"
    assert study.cell_of("pre_ln-lr-1e-05") == "pre_ln" and study.cell_of("spheret_p_inf") == "spheret_p_inf"
    # a run whose sweep recorded its cell is that cell, whatever its label looks like (a cell may end in -lr-1)
    from types import SimpleNamespace
    assert study.cell_of_run(SimpleNamespace(cell="odd-lr-1", base="odd-lr-1-lr-0.01")) == "odd-lr-1"
    assert study.cell_of_run(SimpleNamespace(cell=None, base="pre_ln-lr-1e-05")) == "pre_ln"   # older sweeps


def test_fidelity_parts_chain_the_best_lr_then_the_best_multiplier(monkeypatch, tmp_path):
    """(b) varies the scalars' multiplier at (a)'s best lr for the cells it picks; (c) and (d) run at the
    best setting of both, (d) with each ablation at its cell's setting."""
    study = S.Study.load("fidelity")
    args = type("A", (), {"cells": list(study.cells), "jobs": 2, "runs_root": tmp_path, "docs": tmp_path,
                          "experiment": "fidelity", "overrides": [], "shapes": None})()
    runner = S.Runner(study, args)
    a = [fake_setting(c, lr, 1.0, 0, x) for c, xs in [("pre_ln", {1e-3: 2.40, 3e-3: 2.38, 1e-2: 2.50}),
                                                       ("geonorm", {1e-3: 2.50, 3e-3: 2.45, 1e-2: 2.47})]
         for lr, x in xs.items()]
    b = [fake_setting("geonorm", 3e-3, m, 0, x) for m, x in [(10.0, 2.44), (30.0, 2.41), (100.0, 2.43)]]
    monkeypatch.setattr(runner, "finished", lambda sweep: {"fidelity_a": a, "fidelity_b": b}.get(sweep, []))
    calls = []
    monkeypatch.setattr(runner, "sweep", lambda name, pts, seeds, extra=(), jobs=None, experiment=None: calls.append(
        (name, pts, seeds, list(extra))))
    runner.run_part(study.part("scalars"))
    assert calls[-1][:3] == ("fidelity_b", {f"geonorm-lr-0.003-lr_mult-{m}": {
        "norm": "geonorm", "norm.sublayer_input": "raw", "optim.lr": 3e-3, "optim.groups.scalars.lr_mult": float(m)}
        for m in (10, 30, 100)}, [0])
    assert runner.bests(study.part("scalars")) == {
        "pre_ln": ({"optim.lr": 3e-3}, 2.38),
        "geonorm": ({"optim.lr": 3e-3, "optim.groups.scalars.lr_mult": 30.0}, 2.41),
    }
    runner.run_part(study.part("horizon"))
    name, pts, seeds, extra = calls[-1]
    assert (name, list(pts), seeds) == ("fidelity_c", ["pre_ln-lr-0.003", "geonorm-lr-0.003-lr_mult-30"], [0, 1])
    assert "train.max_steps=3200" in extra
    runner.run_part(study.part("choices"))
    pts = calls[-1][1]
    assert pts["geonorm-untied-lr-0.003-lr_mult-30"] == {
        "norm": "geonorm", "norm.sublayer_input": "raw", "model.tie_embeddings": False, "optim.lr": 3e-3,
        "optim.groups.scalars.lr_mult": 30.0}
    assert not any(p.startswith("proj_spheret") for p in pts)      # no best for it: not run


def test_a_contrast_compares_two_cells_at_one_value(load_script):
    from experiments import study_tables as tables
    study = S.Study.load("methods")
    runs = grid("gpt2.pre_ln", {3e-3: [2.37, 2.38, 2.38], 1e-2: [2.70, 2.72, 2.75]}) + \
        grid("gpt2.pre_ln-gated", {3e-3: [2.37, 2.38, 2.39], 1e-2: [2.47, 2.48, 2.46]})
    lines = tables.contrasts(study, runs)
    assert "| gpt2.pre_ln-gated | 0.01 | 2.470, 2.480, 2.460 | 2.470 ± 0.010 |" in "\n".join(lines)
    row = next(line for line in lines if line.startswith("| gpt2.pre_ln-gated |"))
    assert "| -0.253 [" in row and "gpt2.pre_ln-gated ahead (Holm p=" in row    # paired: 2.47-2.70 etc. per seed
    assert tables.contrasts(study, runs[:6]) == []      # the gated cell has not run: no contrast


def test_study_tables_pair_each_cell_with_its_reference_by_seed_and_correct_over_the_table(load_script):
    """A cell whose per-seed losses track the reference's is equivalent though its seeds spread more than the
    gap (a two-sample test could not say so); a cell worse on every seed is behind; Holm is over the table."""
    from experiments import study_tables as tables
    study = S.Study.load("methods")
    ref = {1e-3: [2.50, 2.45, 2.55], 3e-3: [2.40, 2.35, 2.45], 1e-2: [2.60, 2.55, 2.65]}
    runs = grid("gpt2.pre_ln", ref) + \
        grid("gpt2.mhc", {lr: [x + 0.001 * (i - 1) for i, x in enumerate(xs)] for lr, xs in ref.items()}) + \
        grid("gpt2.hybridnorm", {lr: [x + 0.06 + 0.005 * i for i, x in enumerate(xs)] for lr, xs in ref.items()})
    lines = "\n".join(tables.table(study, tables.cell_rows(study, runs)))
    mhc = next(line for line in lines.splitlines() if line.startswith("| gpt2.mhc |"))
    hyb = next(line for line in lines.splitlines() if line.startswith("| gpt2.hybridnorm |"))
    assert "| +0.000 [" in mhc and "equivalent within ±0.02 (Holm TOST p=" in mhc
    assert "| +0.065 [" in hyb and "gpt2.pre_ln ahead (Holm p=" in hyb
    pre = next(line for line in lines.splitlines() if line.startswith("| gpt2.pre_ln |"))
    assert pre.endswith("| — | — | — |")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(p.parent.name for p in (Path(__file__).resolve().parents[1] / "studies")
                                        .glob("*/study.yaml")))
def test_every_cell_and_ablation_of_a_study_file_is_a_valid_run_config(name, load_script):
    """A study file's overrides compose and validate on its experiment before the study spends hours on
    its other cells (a renamed key fails here, not when its part starts)."""
    from hydra import compose, initialize_config_dir

    from trainer.config import parse_run_config
    from trainer.config_store import CONFIG_DIR, register_code_configs

    from experiments import sweep

    study = S.Study.load(name)
    cells = {c: spec["overrides"] for c, spec in study.cells.items()}
    cells.update({a: {**study.cells[spec["of"]]["overrides"], **spec["overrides"]}
                  for p in study.parts for a, spec in (p.get("ablations") or {}).items()})
    register_code_configs()
    for cell, overrides in cells.items():
        args = [f"experiment={study.experiment}", *study.overrides,
                *(f"{k}={sweep.fmt_value(v)}" for k, v in overrides.items())]
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            rc = parse_run_config(compose("config", overrides=args))
        assert rc.model.norm.name == str(overrides.get("norm", rc.model.norm.name)), cell


def test_the_cpu_study_report_writes_both_settings_figures_and_one_table(tmp_path):
    """The CPU study (two experiments' points as they are) writes what its shell wrapper used to: the loss
    and RMS figures per setting under docs/ and one table of both."""
    from studies.cpu_study import report

    study, root = S.Study.load("cpu_study"), tmp_path / "runs"
    assert [p["kind"] for p in study.parts] == ["points", "points"] and not study.ladder   # nothing tuned
    stats = [{"step": 400, "tokens": 819_200, **{f"rms/{j}": 1.0 + j for j in range(3)}}]
    for sweep, losses in (("cpu_study", {"pre_ln": 2.40, "geonorm": 2.35}), ("cpu_study_deep", {"pre_ln": 2.9})):
        for cell, loss in losses.items():
            fake_run_dir(root / sweep, cell, "gpt2", cell, "adamw", "optim.lr", 1e-3, 0, loss, stats)
    report.report(study, root, tmp_path / "docs", "cpu_study")
    table = (tmp_path / "docs" / "cpu_study_table.md").read_text()
    assert table.startswith("# CPU study: every variant, pydocs, byte tokenizer")
    assert "(a) 6 layers x d=256" in table and "(b) 24 layers x d=128" in table
    a, b = table.split("**(b)")
    assert "| geonorm-lr-0.001 | 1 | 2.3500 |" in a and "| pre_ln-lr-0.001 | 1 | 2.4000 |" in a
    assert "| pre_ln-lr-0.001 | 1 | 2.9000 |" in b and "geonorm" not in b
    assert all((tmp_path / "docs" / f"cpu_study_{p}_{k}.png").is_file() for p in "ab" for k in ("loss", "rms"))
