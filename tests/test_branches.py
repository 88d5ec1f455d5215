"""WSD cooldown branches (scripts/branches.py): a branch resumed from the trunk's checkpoint at its decay
start is the direct `wsd` run of its horizon, bitwise; the trunk keeps its branch points."""
import json
from pathlib import Path

import pytest
import torch

from helpers import make_cfg, records

from runtime import checkpoint as ck
from trainer.loop import train

# evals and stats (an extra forward and backward) before the branch point: neither may change the run
COMMON = ["optim.warmup_steps=2", "train.eval_interval=5", "logging.stats_interval=5", "train.keep_last=1"]


def without_out_dir(args):
    return [a for a in args if not a.startswith("out_dir=")]  # make_cfg names the run dir


@pytest.mark.slow
def test_a_branch_equals_the_direct_wsd_run_of_its_horizon_bitwise(tmp_path, pydocs):
    from experiments import branches as br
    p = br.plan([12, 24], 0.25, warmup=2)
    assert p == {"trunk": 24, "branches": {12: 9}} and br.cost(p) == pytest.approx(1.125)
    out = tmp_path / "hz"
    train(make_cfg(tmp_path / "direct", *COMMON, "optim.schedule=wsd", "optim.decay_frac=0.25", "train.max_steps=12"))
    train(make_cfg(out / "trunk", *COMMON, *without_out_dir(br.trunk_args(p, 0.25, out))))
    # the trunk kept its branch point although keep_last=1
    assert [c.name for c in ck.list_checkpoints(out / "trunk")] == ["ckpt_00000009.pt", "ckpt_00000024.pt"]
    branch = without_out_dir(br.branch_args(12, 9, 0.25, out))
    assert f"train.resume={ck.ckpt_path(out / 'trunk', 9)}" in branch
    train(make_cfg(out / "h12", *COMMON, *branch))
    direct = {r["step"]: (r["loss"], r["grad_norm"], r["lr"]) for r in records(tmp_path / "direct", "train")}
    got = {r["step"]: (r["loss"], r["grad_norm"], r["lr"]) for r in records(out / "h12", "train")}
    assert sorted(got) == list(range(10, 13)) and all(got[s] == direct[s] for s in got)
    trunk = {r["step"]: r["lr"] for r in records(out / "trunk", "train")}
    assert trunk[12] > direct[12][2]  # the trunk is still at its peak where the branch has decayed
    a, b = ck.load_checkpoint(ck.find_latest(tmp_path / "direct")), ck.load_checkpoint(ck.find_latest(out / "h12"))
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    for k, v in a["optimizer"]["state"].items():
        assert all(
            torch.equal(t, b["optimizer"]["state"][k][n]) for n, t in v.items() if isinstance(t, torch.Tensor)
        ), k
    assert records(out / "h12", "summary")[0]["final_val_loss"] == records(tmp_path / "direct", "summary")[0][
        "final_val_loss"]
    assert b["wandb_run_id"] is None and b["train_s"] < a["train_s"] + 60  # a run of its own, not the trunk's
    res = br.summarize(out, p, 0.25)
    assert set(res["horizons"]) == {12, 24} and res["horizons"][12]["branch_from"] == 9
    assert json.loads((out / "horizons.json").read_text())["trunk_steps"] == 24


def test_the_plan_refuses_what_cannot_branch():
    from experiments import branches as br
    with pytest.raises(SystemExit, match="horizon 10 starts its decay at step 8, inside optim.warmup_steps=8"):
        br.plan([10, 40], 0.2, warmup=8)
    with pytest.raises(SystemExit, match="--decay-frac 1.0: must be in"):
        br.plan([10, 40], 1.0)
    assert br.plan([40], 0.2) == {"trunk": 40, "branches": {}}
    assert br.decay_start(226, 0.2) == 181 and br.cost(br.plan([226, 906, 3625, 7250], 0.2)) == pytest.approx(
        1 + (45 + 181 + 725) / 7250)


def test_bad_checkpoint_steps_are_one_line(tmp_path):
    from common import ConfigError
    from trainer.config import parse_run_config

    with pytest.raises(ConfigError, match=r"train.ckpt_steps.*must be a list of positive step numbers"):
        parse_run_config(make_cfg(tmp_path, "train.ckpt_steps=[0,5]"))


@pytest.mark.slow
def test_resume_auto_refuses_a_run_whose_checkpoints_are_gone(tmp_path, pydocs):
    """A finished run without its checkpoints/ used to start over silently and cut its records."""
    import shutil

    from common import ConfigError

    run = tmp_path / "run"
    train(make_cfg(run, "train.max_steps=4"))
    before = (run / "metrics.jsonl").read_text()
    shutil.rmtree(run / "checkpoints")
    with pytest.raises(ConfigError, match=r"records training up to step 4 but has no checkpoint in .*checkpoints: "
                                          r"restore the checkpoints to resume, or pass train.overwrite=true"):
        train(make_cfg(run, "train.max_steps=4", "train.resume=auto"))
    assert (run / "metrics.jsonl").read_text() == before          # nothing lost
    (run / "checkpoints").write_text("not a dir")                  # checkpoints/ a file: refused, named
    with pytest.raises(ConfigError, match=r"checkpoints is a file, not a directory"):
        train(make_cfg(run, "train.max_steps=4", "train.resume=auto"))
    (run / "checkpoints").unlink()
    train(make_cfg(run, "train.max_steps=4", "train.resume=auto", "train.overwrite=true"))
    assert records(run, "summary")                                  # started over, as asked


def test_a_relative_out_dir_is_where_the_caller_stands_not_the_checkout(tmp_path, monkeypatch):
    """train.py runs with the checkout's root as its cwd: the trunk and branches of a relative `out` must
    still be written under the caller's directory, where the caller reads them back."""
    from experiments import branches as br

    seen = []

    def fake_train(args, log, env=None):
        seen.append(next(a for a in args if a.startswith("out_dir=")))
        raise RuntimeError("stop here")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(br, "train", fake_train)
    with pytest.raises(RuntimeError, match="stop here"):
        br.run(Path("rel/hz"), [12, 24], 0.25, [], warmup=2)
    assert seen == [f"out_dir={tmp_path.resolve() / 'rel' / 'hz' / 'trunk'}"]


def _study_cells():
    """Every cell of the studies that branch (horizon, horizon16): its overrides, once per distinct set."""
    from experiments.study import Study

    out = {}
    for name in ("horizon", "horizon16"):
        for cell, spec in Study.load(name).cells.items():
            over = tuple(f"{k}={v}" for k, v in spec["overrides"].items())
            out.setdefault(over, cell)
    return [pytest.param(list(over), id=cell) for over, cell in out.items()]


@pytest.mark.slow
@pytest.mark.parametrize("overrides", _study_cells())
def test_every_study_cell_branches_bitwise(tmp_path, pydocs, overrides):
    """The cooldown branch equals the direct wsd run for every variant a study branches (its learned scalars,
    streams and mixing matrices resume exactly): the losses of its steps and its final weights, bitwise."""
    from experiments import branches as br

    common = [*overrides, "optim.warmup_steps=1", "train.eval_interval=3", "logging.stats_interval=3",
              "train.keep_last=1", "model.n_layer=2"]
    p = br.plan([6, 10], 0.5, warmup=1)
    out = tmp_path / "hz"
    train(make_cfg(tmp_path / "direct", *common, "optim.schedule=wsd", "optim.decay_frac=0.5", "train.max_steps=6"))
    train(make_cfg(out / "trunk", *common, *without_out_dir(br.trunk_args(p, 0.5, out))))
    train(make_cfg(out / "h6", *common, *without_out_dir(br.branch_args(6, p["branches"][6], 0.5, out))))
    direct = {r["step"]: (r["loss"], r["grad_norm"]) for r in records(tmp_path / "direct", "train")}
    got = {r["step"]: (r["loss"], r["grad_norm"]) for r in records(out / "h6", "train")}
    assert sorted(got) == [4, 5, 6] and all(got[s] == direct[s] for s in got)
    a, b = ck.load_checkpoint(ck.find_latest(tmp_path / "direct")), ck.load_checkpoint(ck.find_latest(out / "h6"))
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
