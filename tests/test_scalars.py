"""Every learned scalar group is logged at stats steps, is seen to move, and is plotted."""
import pytest

from helpers import make_cfg, records

from trainer.loop import train


def test_scalar_series_and_movement_on_synthetic_records(load_script):
    from experiments import runs as runlib
    stats = [{"tokens": 0, "step/0/a": 1.0, "step/1/a": 1.0, "scalar/blocks.0.attn_rule.norm.alpha": 1.0,
              "gate_mean/0": 0.5, "geo/angle/0": 0.1},
             {"tokens": 100, "step/0/a": 1.5, "step/1/a": 0.8, "scalar/blocks.0.attn_rule.norm.alpha": 1.1,
              "gate_mean/0": 0.4, "geo/angle/0": 0.2}]
    s = runlib.scalar_series(stats)
    assert sorted(s) == ["a", "alpha", "gate_mean"] and s["a"]["step/0/a"] == ([0, 100], [1.0, 1.5])
    m = runlib.scalar_movement(stats)
    assert m["a"] == {"keys": 2, "first": 1.0, "last": pytest.approx(1.15), "max_abs_change": pytest.approx(0.5)}
    assert m["gate_mean"]["max_abs_change"] == pytest.approx(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("norm,kinds", [("mhc", {"offdiag_mass", "res_dist_identity"}),
                                        ("hc", {"offdiag_mass", "res_dist_identity"}),
                                        ("pre_derf", {"alpha", "shift", "s"}),
                                        ("geonorm", {"a", "b"})])
def test_each_variants_scalars_are_logged_and_move(tmp_path, pydocs, load_script, norm, kinds):
    from experiments import runs as runlib
    train(make_cfg(tmp_path / norm, f"norm={norm}", "train.max_steps=6", "logging.stats_interval=3",
                   "optim.lr=1e-2", "optim.groups.scalars.lr_mult=10"))
    moved = runlib.scalar_movement(records(tmp_path / norm, "stats"))
    assert kinds <= set(moved)
    assert all(moved[k]["max_abs_change"] > 0 for k in kinds), moved


@pytest.mark.slow
def test_gate_means_are_logged_and_the_scalars_plot(tmp_path, pydocs, load_script):
    plot = load_script("plot_geometry")
    run = tmp_path / "gated"
    train(make_cfg(run, "model.attn_gate=headwise", "norm=geonorm", "train.max_steps=4", "logging.stats_interval=2"))
    stats = records(run, "stats")
    assert {"gate_mean/0", "gate_mean/1"} <= set(stats[-1]) and 0 < stats[-1]["gate_mean/0"] < 1
    assert "gate_mean/0" not in records(run, "train")[-1]     # nothing added to the training steps' records
    assert plot.main([str(run), "--scalars", "--out", str(tmp_path / "s.png")]) == 0
    assert (tmp_path / "s.png").stat().st_size > 10_000
    with pytest.raises(SystemExit, match="no learned scalars"):
        train(make_cfg(tmp_path / "plain", "train.max_steps=2", "logging.stats_interval=1"))
        plot.main([str(tmp_path / "plain"), "--scalars", "--out", str(tmp_path / "p.png")])
