"""Experiment tooling: tables and plots from synthetic run dirs, sweep commands, experiment configs."""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"
BENCHMARKS = REPO / "benchmarks"
CONFIGS = REPO / "configs"
EXPERIMENTS = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))


def _load(name: str):
    """Import scripts/<name>.py (benchmarks/<name>.py for a bench_*) as the module `name`, as
    `python scripts/<name>.py` would see it."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, (BENCHMARKS if name.startswith("bench_") else SCRIPTS)
                                                  / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


from experiments import runs as runlib  # noqa: E402
make_table = _load("make_table")
sweep = _load("sweep")


# ---------------------------------------------------------------- synthetic run directories


def make_run(d: Path, norm: str, seed: int, final: float, *, diverged: bool = False, finished: bool = True,
             spikes: int = 0, n_layer: int = 2, meta: dict | None = None, extra_cfg: dict | None = None,
             steps: int = 40) -> Path:
    """A run dir as train.py writes it (config.yaml, metrics.jsonl), loss falling to `final`."""
    d.mkdir(parents=True)
    cfg = {"norm": {"name": norm, "decay": "harmonic", "clamp": 0.7853981633974483},
           "train": {"seed": seed}, "model": {"n_layer": n_layer}}
    if meta is not None:
        cfg["experiment_meta"] = meta
    for k, v in (extra_cfg or {}).items():
        top, key = k.split(".")
        cfg[top][key] = v
    (d / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))  # key order as OmegaConf writes it
    tpt = 1024
    lines = []
    for s in range(0, steps + 1, 5):
        frac = s / steps
        loss = final + 2.0 * (1 - frac) + 0.01 * seed
        if diverged and s > steps // 2:
            loss = float("nan")
        lines.append({"kind": "train", "step": s, "tokens": s * tpt, "loss": loss, "lr": 1e-3, "grad_norm": 1.0})
        if s % 20 == 0:
            v = float("nan") if (diverged and s > steps // 2) else loss + 0.05
            lines.append({"kind": "eval", "step": s, "tokens": s * tpt, "val_loss": v,
                          "val_ppl": math.exp(v) if math.isfinite(v) else v})
    for i in range(spikes):
        lines.append(
            {"kind": "spike", "step": 10 + i, "tokens": (10 + i) * tpt, "metric": "loss", "value": 9.0, "z": 7.0}
        )
    rms = {f"rms/{j}": 1.0 + j * (0.5 if norm == "pre_ln" else 0.0) for j in range(2 * n_layer + 1)}
    lines.append({"kind": "stats", "step": steps, "tokens": steps * tpt, **rms})
    if finished:
        fv = float("nan") if diverged else final + 0.05
        lines.append({"kind": "summary", "step": steps, "tokens": steps * tpt, "final_val_loss": fv,
                      "final_val_ppl": math.exp(fv) if math.isfinite(fv) else fv, "best_val_loss": fv,
                      "spikes_loss": spikes, "spikes_grad_norm": 1, "skipped_steps": 0, "diverged": diverged,
                      "steps": steps, "norm": norm, "seed": seed})
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))  # NaN as json writes it
    return d


@pytest.fixture
def study(tmp_path: Path) -> Path:
    meta = {"name": "geonorm_125m_books3_512", "paper_setting": "geonorm_125m_books3_512",
            "variants": ["pre_ln", "post_ln", "deepnorm", "sandwich", "geonorm"], "seeds": [0]}
    root = tmp_path / "sw"
    make_run(root / "pre_ln-s0", "pre_ln", 0, 3.0, meta=meta, spikes=2)
    make_run(root / "pre_ln-s1", "pre_ln", 1, 3.2, meta=meta, spikes=1)
    make_run(root / "post_ln-s0", "post_ln", 0, 3.5, meta=meta)
    make_run(root / "post_ln-s1", "post_ln", 1, 3.5, meta=meta, diverged=True)
    make_run(root / "geonorm-s0", "geonorm", 0, 2.9, meta=meta)
    return root


# ---------------------------------------------------------------- make_table.py


@pytest.mark.slow
def test_table_rows_mean_std_diverged_and_paper(study: Path) -> None:
    runs = [runlib.load_run(p) for p in runlib.find_runs([study])]
    paper = runlib.load_paper("geonorm_125m_books3_512")
    rows = {r["label"]: r for r in make_table.build_rows(runlib.group_runs(runs, ["pre_ln", "post_ln"]), paper)}
    pre = rows["pre_ln"]
    assert pre["n"] == 2 and pre["diverged"] == 0
    assert pre["loss_mean"] == pytest.approx(3.15)          # finals 3.05 and 3.25
    assert pre["loss_std"] == pytest.approx(math.sqrt(0.02))  # sample std of the two
    assert pre["ppl_mean"] == pytest.approx((math.exp(3.05) + math.exp(3.25)) / 2)
    assert pre["spikes_loss"] == 3 and pre["spikes_grad_norm"] == 2
    post = rows["post_ln"]
    assert post["diverged"] == 1 and post["n"] == 2
    assert post["loss_mean"] == pytest.approx(3.55) and post["loss_std"] is None  # diverged seed left out
    assert rows["geonorm"]["paper_value"] == 3.4040 and rows["pre_ln"]["paper_value"] == 3.4437
    # variants the paper has and we did not run still get a row
    assert rows["deepnorm"]["n"] == 0 and rows["deepnorm"]["paper_value"] == 3.4708


def test_table_markdown_and_latex_files(study: Path, tmp_path: Path) -> None:
    out = tmp_path / "docs" / "t.md"
    assert make_table.main([str(study), "--format", "both", "--out", str(out)]) == 0
    md = out.read_text()
    tex = out.with_suffix(".tex").read_text()
    line = next(ln for ln in md.splitlines() if ln.startswith("| pre_ln"))
    assert "3.1500 ± 0.1414" in line and "3.4437" in line and "| 2 |" in line
    post = next(ln for ln in md.splitlines() if ln.startswith("| post_ln"))
    assert "1/2" in post and "3.5500†" in post and "3.4855" in post
    assert "| deepnorm | 0 | not run" in md
    assert "paper (val loss, its tokenizer)" in md and "diverged" in md and "| val bits per byte |" in md
    assert r"\toprule" in tex and r"pre\_ln" in tex and r"3.1500 $\pm$ 0.1414" in tex and "3.4040" in tex


def test_table_with_an_unwritable_out_is_one_line_before_reading_runs(tmp_path: Path, capsys) -> None:
    (tmp_path / "afile").write_text("")
    with pytest.raises(SystemExit) as e:
        make_table.main([str(tmp_path / "no_runs_here"), "--out", str(tmp_path / "afile" / "t.md")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.strip() == (f"error: {tmp_path / 'afile'} is a file, not a directory (chosen by "
                                                 "--out): move it away or choose another location")


def test_table_ablation_labels_unfinished_and_no_paper(tmp_path: Path, capsys) -> None:
    meta = {"name": "geonorm_decay_books3", "paper_setting": "geonorm_decay_books3",
            "points": {"decay_sqrt": {"norm": "geonorm", "norm.decay": "sqrt"},
                       "decay_harmonic": {"norm": "geonorm", "norm.decay": "harmonic"}}}
    make_run(tmp_path / "a", "geonorm", 0, 3.4, meta=meta, extra_cfg={"norm.decay": "sqrt"})
    make_run(tmp_path / "b", "geonorm", 0, 3.3, meta=meta, finished=False)
    assert make_table.main([str(tmp_path)]) == 0
    md = capsys.readouterr().out
    sq = next(ln for ln in md.splitlines() if ln.startswith("| decay_sqrt"))
    ha = next(ln for ln in md.splitlines() if ln.startswith("| decay_harmonic"))
    assert "3.4500" in sq and "3.4210" in sq
    assert "3.3500*" in ha and "3.4040" in ha        # unfinished: last eval, marked
    assert "| decay_linear | 0 | not run" in md       # paper row we did not run
    assert make_table.main([str(tmp_path), "--paper-setting", "none"]) == 0
    assert "paper" not in capsys.readouterr().out.split("\n\n")[1]


def test_paper_results_data() -> None:
    text = (SCRIPTS / "paper_results.yaml").read_text()
    assert "111.70" not in text and "2081.50" not in text   # unverified, never paper values
    data = yaml.safe_load(text)
    for name, s in data["settings"].items():
        assert s["metric"] in ("val_loss", "val_ppl"), name
        assert all(isinstance(v, float) for v in s.get("values", {}).values()), name
    assert data["settings"]["spheret_fineweb_edu_24l"]["values"] == {"peri_ln": 19.09, "proj_spheret": 16.81}


# ---------------------------------------------------------------- plot_curves.py


def _png_ok(path: Path) -> None:
    import matplotlib.image as mpimg
    import numpy as np

    assert path.is_file() and path.stat().st_size > 10_000
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 300
    assert len(np.unique(img[..., :3].reshape(-1, 3), axis=0)) > 20  # curves, not a blank canvas


@pytest.mark.slow
def test_plots_from_synthetic_runs(study: Path, tmp_path: Path) -> None:
    from experiments import curves as plot_curves

    out = tmp_path / "figs" / "study"
    assert _load("plot_curves").main([str(study), "--out", str(out), "--ema", "0.5"]) == 0
    _png_ok(out.with_name("study_loss.png"))
    _png_ok(out.with_name("study_rms.png"))
    # band: mean/min/max over seeds on a common token grid
    runs = runlib.group_runs([runlib.load_run(p) for p in runlib.find_runs([study])])
    grid, mean, lo, hi = plot_curves.band([plot_curves.series(r.evals, "val_loss") for r in runs["pre_ln"]])
    assert list(grid) == [0, 20480, 40960]
    assert mean[-1] == pytest.approx(3.155) and lo[-1] == pytest.approx(3.05) and hi[-1] == pytest.approx(3.26)
    prof = plot_curves.rms_profile(runs["pre_ln"][0])
    assert list(prof) == [1.0, 1.5, 2.0, 2.5, 3.0]


def test_plot_colours_and_order_follow_the_variant_registry(tmp_path: Path) -> None:
    """Every registered variant has its own colour, the same in every figure; legends follow the
    registry's order; groups that are not one variant each (an ablation's points) get other colours."""
    from model import VARIANTS

    from experiments import curves as plot_curves

    def groups(*specs: tuple[str, str]) -> dict:
        runs = [runlib.load_run(make_run(tmp_path / f"{label}-{len(list(tmp_path.iterdir()))}", norm, 0, 3.0))
                for label, norm in specs]
        for r, (label, _) in zip(runs, specs):
            r.label = label
        return runlib.group_runs(runs)

    every = groups(*[(v, v) for v in reversed(list(VARIANTS))])
    assert list(every) == list(VARIANTS)  # registry order, whatever order the runs came in
    colours = plot_curves.group_colors(every)
    assert len({str(c) for c in colours.values()}) == len(VARIANTS)  # mix_ln no longer repeats pre_ln's
    few = plot_curves.group_colors(groups(("mix_ln", "mix_ln"), ("geonorm", "geonorm"), ("p_inf", "spheret")))
    assert few["mix_ln"] == colours["mix_ln"] and few["geonorm"] == colours["geonorm"]
    assert few["p_inf"] == colours["spheret"]  # a point label that is one variant: that variant's colour
    ablation = plot_curves.group_colors(groups(("sqrt", "geonorm"), ("linear", "geonorm")))
    assert ablation["sqrt"] != ablation["linear"]
    assert not {str(c) for c in ablation.values()} & {str(c) for c in colours.values()}


# ---------------------------------------------------------------- sweep.py


def _dry(capsys, *argv: str) -> tuple[list[list[str]], str]:
    assert sweep.main(["--dry-run", "--python", "python", *argv]) == 0
    out = capsys.readouterr().out
    import shlex
    cmds = [shlex.split(ln) for ln in out.splitlines() if ln and not ln.startswith("#")]
    return cmds, out


def experiment_meta(name: str) -> dict:
    return yaml.safe_load((CONFIGS / "experiment" / f"{name}.yaml").read_text())["experiment_meta"]


def test_sweep_dry_run_experiment(capsys, tmp_path: Path) -> None:
    cmds, out = _dry(capsys, "--experiment", "cpu_study", "--runs-root", str(tmp_path))
    meta = experiment_meta("cpu_study")
    # one command per point and seed: every point at the common seeds, then the extra seeds
    firsts = [f"{label}-s{s}" for s in meta["seeds"] for label in meta["points"]]
    extras = [f"{label}-s{s}" for label, seeds in meta["extra_seeds"].items() for s in seeds]
    assert extras  # the experiment has a seed-noise yardstick
    outs = [c[-3].split("/")[-1] for c in cmds]
    assert outs == firsts + extras  # first seeds first
    first = cmds[0]
    assert first[:2] == ["python", "train.py"]
    assert first[2:] == ["experiment=cpu_study", "norm=pre_ln", "train.seed=0", "run_name=cpu_study-pre_ln-s0",
                         f"out_dir={tmp_path}/cpu_study/pre_ln-s0", "logging.wandb.group=cpu_study",
                         "train.resume=auto"]
    sph = next(c for c in cmds if "out_dir=" + str(tmp_path) + "/cpu_study/spheret_p_inf-s0" in c)
    assert "norm=spheret" in sph and "norm.p=inf" in sph
    assert not (tmp_path / "cpu_study").exists()  # dry run writes nothing


def test_sweep_grid_torchrun_and_fixed_overrides(capsys, tmp_path: Path) -> None:
    cmds, _ = _dry(capsys, "--name", "lr scan", "--grid", "norm=pre_ln,geonorm", "optim.lr=1e-3,3e-3",
                   "train.seed=0,1", "--nproc", "4", "--runs-root", str(tmp_path), "--", "model=tiny",
                   "optim.betas=[0.9,0.99]")
    assert len(cmds) == 8
    assert all(c[:4] == ["torchrun", "--standalone", "--nproc_per_node=4", "train.py"] for c in cmds)
    c = cmds[0]
    assert c[4:] == ["norm=pre_ln", "optim.lr=1e-3", "train.seed=0", "model=tiny", "optim.betas=[0.9,0.99]",
                     "run_name=lr-scan-pre_ln-lr-1e-3-s0", f"out_dir={tmp_path}/lr-scan/pre_ln-lr-1e-3-s0",
                     "logging.wandb.group=lr-scan", "train.resume=auto"]
    dirs = {x.split("/")[-1] for cmd in cmds for x in cmd if x.startswith("out_dir=")}
    assert len(dirs) == 8 and "geonorm-lr-3e-3-s1" in dirs


def test_sweep_skips_finished_resumes_interrupted(capsys, tmp_path: Path) -> None:
    root = tmp_path / "cpu_study"
    make_run(root / "pre_ln-s0", "pre_ln", 0, 3.0)                      # finished: skipped
    make_run(root / "post_ln-s0", "post_ln", 0, 3.0, finished=False)    # interrupted after a checkpoint
    (root / "post_ln-s0" / "checkpoints").mkdir()
    (root / "post_ln-s0" / "checkpoints" / "ckpt_00000020.pt").write_bytes(b"x")
    make_run(root / "deepnorm-s0", "deepnorm", 0, 3.0, finished=False)  # died before any checkpoint
    all_cmds, _ = _dry(capsys, "--experiment", "cpu_study", "--runs-root", str(tmp_path / "empty"))
    cmds, out = _dry(capsys, "--experiment", "cpu_study", "--runs-root", str(tmp_path))
    assert "# skip (finished): pre_ln-s0" in out and "# resume: post_ln-s0" in out
    assert "# restart: deepnorm-s0" in out and f"1 finished, 1 to resume, 1 to restart, {len(all_cmds) - 3} new" in out
    assert len(cmds) == len(all_cmds) - 1
    assert not any(f"out_dir={root}/pre_ln-s0" in c for c in cmds)
    post = next(c for c in cmds if f"out_dir={root}/post_ln-s0" in c)
    deep = next(c for c in cmds if f"out_dir={root}/deepnorm-s0" in c)
    assert "train.resume=auto" in post and "train.resume=auto" in deep  # auto restarts a run without checkpoints


def test_sweep_slurm_script_and_requirements(capsys, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="data.files"):  # Pile data must be user-supplied
        sweep.main(["--experiment", "geonorm_125m_books3_512", "--dry-run"])
    assert sweep.main(["--experiment", "geonorm_125m_books3_512", "--slurm", "--nproc", "8", "--dry-run",
                       "--runs-root", str(tmp_path), "--partition", "gpu", "--", "data.files=/d/*.jsonl"]) == 0
    out = capsys.readouterr().out
    n = len(experiment_meta("geonorm_125m_books3_512")["points"])  # one array task per point
    assert (
        f"#SBATCH --array=0-{n - 1}" in out and "#SBATCH --gpus-per-node=8" in out and "#SBATCH --partition=gpu" in out
    )
    assert out.count("torchrun --standalone --nproc_per_node=8 train.py experiment=geonorm_125m_books3_512") == n
    assert "'data.files=/d/*.jsonl'" in out and "norm=sandwich" in out
    # both readings of GeoNorm's sublayer input, pinned; a subset by label keeps a point's overrides
    assert "norm=geonorm norm.sublayer_input=norm" in out and "norm=geonorm norm.sublayer_input=raw" in out
    assert sweep.main(["--experiment", "geonorm_125m_books3_512", "--dry-run", "--variants", "geonorm_raw",
                       "--runs-root", str(tmp_path), "--", "data.files=/d/*.jsonl"]) == 0
    out = capsys.readouterr().out
    assert "norm.sublayer_input=raw" in out and "norm=pre_ln" not in out
    # the cost comes before anything runs: 50k steps x 16,384 tokens of a 162M model, ~667 PFLOP, ~0.47 H100-hours
    import re

    cost = re.search(r"# cost of the 1 point\(s\) to run: ([\d,.]+) PFLOP, ([\d.]+) GPU-hours at 40% MFU", out)
    assert cost and float(cost[1].replace(",", "")) == pytest.approx(667, rel=0.01), out[-500:]
    assert float(cost[2]) == pytest.approx(0.47, abs=0.02)
    with pytest.raises(SystemExit, match="valid: pre_ln, post_ln, deepnorm, sandwich, geonorm, geonorm_raw"):
        sweep.main(["--experiment", "geonorm_125m_books3_512", "--dry-run", "--variants", "geonorm_normin",
                    "--", "data.files=/d/*.jsonl"])
    with pytest.raises(SystemExit, match="unknown experiment"):
        sweep.main(["--experiment", "nope", "--dry-run"])


# ---------------------------------------------------------------- experiment configs compose


@pytest.mark.slow
def test_every_experiment_config_composes() -> None:
    """Compose each experiment with Hydra as train.py will, and check its values against the typed
    configs of model/, trainer/ and data/ (needs every config group of configs/config.yaml)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from data.config import DataConfig, DataError
    from model.config import GPTConfig
    from trainer.config import parse_run_config
    from omegaconf import open_dict

    from trainer.config_store import component_nodes, register_code_configs

    register_code_configs()
    paper = yaml.safe_load((SCRIPTS / "paper_results.yaml").read_text())["settings"]
    # every paper setting we hold numbers for has the experiment that reproduces it
    assert set(paper) <= set(EXPERIMENTS)
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        for name in EXPERIMENTS:
            cfg = compose("config", overrides=[f"experiment={name}"])
            if cfg.data.name.startswith("pile_"):  # the user's copy of the Pile: without a path, one clear line
                with pytest.raises(DataError, match="data.files"):
                    parse_run_config(cfg)
                cfg = compose("config", overrides=[f"experiment={name}", "data.files=[/somewhere/*.jsonl]"])
            meta = cfg.experiment_meta
            assert meta.name == name
            assert meta.paper_setting is None or meta.paper_setting in paper, name
            rc = parse_run_config(cfg)  # every group's keys exist and are valid
            assert "tokens_per_run" not in meta, name  # max_steps x batch_tokens: derived, not restated
            # one rank, no accumulation remainder
            assert rc.train.batch_tokens % (rc.train.micro_batch_size * cfg.model.block_size) == 0, name
            points = dict(meta.points) if "points" in meta else {v: {"norm": v} for v in meta.variants}
            for ovr in points.values():  # each point as sweep.py passes it: `norm=<name>`, then its keys
                pc = OmegaConf.merge(cfg, {})
                with open_dict(pc):
                    pc.norm = OmegaConf.create(component_nodes()["norm"][ovr["norm"]])  # the variant's option
                for k, v in ovr.items():
                    if k != "norm":
                        OmegaConf.update(pc, k, v, force_add=False)  # a key the variant lacks: an error
                GPTConfig.from_hydra(pc.model, pc.norm, vocab_size=257)  # raises on a bad point
                parse_run_config(pc)
            assert rc.data == DataConfig.from_any(OmegaConf.to_container(cfg.data, resolve=True))
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        a = compose("config", overrides=["experiment=geonorm_125m_books3_4096"])
        assert (a.model.n_layer, a.model.n_embd, a.model.block_size) == (12, 768, 4096)
        assert a.train.batch_tokens == 32 * 4096 and a.optim.lr == 6e-4 and a.train.precision == "fp16"
        assert a.data.name == "pile_books3"
        b = compose("config", overrides=["experiment=spheret_fineweb_edu_24l"])
        assert (b.model.n_layer, b.train.max_steps, b.train.batch_tokens) == (24, 50000, 131072)
        assert b.data.name == "fineweb_edu"
        c = compose("config", overrides=["experiment=cpu_study_deep"])
        assert (c.model.n_layer, c.model.n_embd, c.data.tokenizer, c.optim.lr) == (24, 128, "bytes", 1e-2)
        d = compose("config", overrides=["experiment=geonorm_clamp_books3"])
        assert d.norm.name == "geonorm"


def test_sweep_runs_points_in_turn_and_reruns_only_the_failed(tmp_path: Path, capsys) -> None:
    """Local execution with a stand-in for python/train.py: each point's command runs, a failing point
    makes the sweep exit 1 without stopping the others, sweep.json records labels, reruns skip done points."""
    calls = tmp_path / "calls.txt"
    stub = tmp_path / "fakepython"
    stub.write_text(f"""#!{sys.executable}
import json, sys
from pathlib import Path
kv = dict(a.split("=", 1) for a in sys.argv[2:])
with open({str(calls)!r}, "a") as f:
    f.write(kv["out_dir"].split("/")[-1] + "\\n")
if kv["norm"] == "post_ln" and not Path({str(tmp_path / "fixed")!r}).exists():
    sys.exit(3)
d = Path(kv["out_dir"]); d.mkdir(parents=True, exist_ok=True)
summary = {{"kind": "summary", "step": 1, "tokens": 1, "final_val_loss": 2.0}}
(d / "metrics.jsonl").write_text(json.dumps(summary) + "\\n")
""")
    stub.chmod(0o755)
    argv = ["--name", "t", "--grid", "norm=pre_ln,post_ln,geonorm", "--runs-root", str(tmp_path), "--python", str(stub)]
    assert sweep.main(argv) == 1
    assert calls.read_text().split() == ["pre_ln-s0", "post_ln-s0", "geonorm-s0"]
    assert "1 point(s) failed: post_ln-s0" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "t" / "sweep.json").read_text())
    assert [(p["label"], p["seed"]) for p in manifest["points"]] == [
        ("pre_ln", "0"),
        ("post_ln", "0"),
        ("geonorm", "0"),
    ]
    (tmp_path / "fixed").touch()
    assert sweep.main(argv) == 0
    assert calls.read_text().split()[3:] == ["post_ln-s0"]  # only the unfinished point ran again
    # runs made with other fixed overrides (a quick check's) are refused, not counted as this sweep's points
    with pytest.raises(SystemExit, match=r"t holds runs made with experiment=None and the fixed overrides \[\], not "
                                         r"experiment=None and \[train.max_steps=8\]: pass those to continue them"):
        sweep.main([*argv, "--", "train.max_steps=8"])
    assert len(calls.read_text().split()) == 4


def test_usage_examples_name_existing_experiments():
    import re
    texts = {p.name: p.read_text() for p in [*SCRIPTS.glob("*.py"), *SCRIPTS.glob("*.sh"), REPO / "README.md",
                                             *(REPO / "docs").glob("*.md")]}
    used = {(name, m) for name, t in texts.items() for m in re.findall(r"--experiment[ =]([A-Za-z0-9_]+)", t)}
    assert {m for _, m in used} >= {"cpu_study"}
    assert [u for u in used if u[1] not in EXPERIMENTS] == []


@pytest.mark.slow
def test_bench_data_baseline_on_a_corpus_smaller_than_its_batch_count(tmp_path):
    bench = _load("bench_data")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(30)))
    (tmp_path / "w").mkdir()
    res = bench.run_baseline(str(corpus), str(tmp_path / "w"), workers=1)
    assert res["tokens"] > 30 * 20


@pytest.mark.slow
def test_bench_train_leaves_no_temp_dirs(tmp_path):
    import os
    import subprocess
    from helpers import TINY

    env = {**os.environ, "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    r = subprocess.run([sys.executable, str(BENCHMARKS / "bench_train.py"), "--steps", "2", "--repeats", "1",
                        "--warmup", "1", *TINY], cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "median: bare" in r.stdout
    assert not list(tmp_path.glob("bench_train_*"))


def test_sweep_jobs_run_points_concurrently_with_points_file(tmp_path: Path) -> None:
    """--jobs 2 overlaps two points (each stand-in waits until both have started); --points gives
    labelled overrides; each point's output goes to its run dir's sweep.log."""
    stub = tmp_path / "fakepython"
    stub.write_text(f"""#!{sys.executable}
import json, sys, time
from pathlib import Path
kv = dict(a.split("=", 1) for a in sys.argv[2:])
d = Path(kv["out_dir"]); d.mkdir(parents=True, exist_ok=True)
(d / "started").touch()
others = [p for p in d.parent.glob("*/started") if p.parent != d]
t0 = time.time()
while not others and time.time() - t0 < 20:
    time.sleep(0.05)
    others = [p for p in d.parent.glob("*/started") if p.parent != d]
print("lr", kv["optim.lr"], "overlapped", bool(others))
summary = {{"kind": "summary", "step": 1, "tokens": 1, "final_val_loss": 2.0}}
(d / "metrics.jsonl").write_text(json.dumps(summary) + "\\n")
""")
    stub.chmod(0o755)
    pts = tmp_path / "points.yaml"
    pts.write_text("fast: {norm: pre_ln, optim.lr: 0.003}\nslow: {norm: geonorm, optim.lr: 0.0003}\n")
    argv = ["--name", "j", "--points", str(pts), "--jobs", "2", "--runs-root", str(tmp_path), "--python", str(stub)]
    assert sweep.main(argv) == 0
    for d, lr in (("fast-s0", "0.003"), ("slow-s0", "0.0003")):
        assert (tmp_path / "j" / d / "sweep.log").read_text().strip() == f"lr {lr} overlapped True"
    with pytest.raises(SystemExit, match="--jobs=0"):
        sweep.main(argv[:-4] + ["--jobs", "0"])


def test_sweep_grid_axes_recorded_for_best_over(capsys, tmp_path: Path) -> None:
    sweep.main(["--name", "g", "--grid", "norm=pre_ln,geonorm", "optim.lr=1e-3,3e-3", "--runs-root", str(tmp_path),
                "--python", "true"])
    pts = json.loads((tmp_path / "g" / "sweep.json").read_text())["points"]
    assert {(p["base"], p["axes"]["optim.lr"], p["label"]) for p in pts} == {
        ("pre_ln", "1e-3", "pre_ln-lr-1e-3"), ("pre_ln", "3e-3", "pre_ln-lr-3e-3"),
        ("geonorm", "1e-3", "geonorm-lr-1e-3"), ("geonorm", "3e-3", "geonorm-lr-3e-3")}


def _lr_study(root: Path) -> Path:
    """A synthetic `--grid optim.lr=1e-3,3e-3` sweep: pre_ln best at 1e-3 on seed 0 (with seeds 1, 2
    added there), geonorm best at 3e-3; geonorm at 1e-3 seed 1 (not common to both lrs) is very good,
    which must not sway the choice; one run ends above its initial loss."""
    points = []
    def add(label, lr, seed, final, **kw):
        d = f"{label}-lr-{lr}-s{seed}"
        make_run(root / d, label, seed, final, **kw)
        cfg = yaml.safe_load((root / d / "config.yaml").read_text())
        cfg["optim"] = {"lr": float(lr)}
        (root / d / "config.yaml").write_text(yaml.safe_dump(cfg))
        points.append({"label": f"{label}-lr-{lr}", "seed": str(seed), "base": label, "axes": {"optim.lr": lr},
                       "overrides": [f"norm={label}", f"optim.lr={lr}"], "dir": d})
    add("pre_ln", "1e-3", 0, 3.0)
    add("pre_ln", "1e-3", 1, 3.2)
    add("pre_ln", "1e-3", 2, 3.1)
    add("pre_ln", "3e-3", 0, 3.3)
    add("geonorm", "1e-3", 0, 3.4)
    add("geonorm", "1e-3", 1, 1.0)
    add("geonorm", "3e-3", 0, 2.9)
    (root / "sweep.json").write_text(json.dumps({"name": "lr", "points": points}))
    return root


def test_best_over_picks_each_variants_best_value(tmp_path: Path, capsys) -> None:
    root = _lr_study(tmp_path / "lr")
    runs = [runlib.load_run(p) for p in runlib.find_runs([root])]
    rows = {r["label"]: r for r in make_table.best_rows(runs, "optim.lr", [], None)}
    assert rows["pre_ln"]["best_value"] == 1e-3 and rows["pre_ln"]["n"] == 3
    assert rows["pre_ln"]["loss_mean"] == pytest.approx(3.15) and rows["pre_ln"]["loss_std"] == pytest.approx(0.1)
    # geonorm: chosen on the common seed 0 (2.95 at 3e-3 beats 3.45 at 1e-3), not on seed 1's 1.05
    assert rows["geonorm"]["best_value"] == 3e-3 and rows["geonorm"]["seeds"] == [0]
    assert rows["geonorm"]["by_value"] == {1e-3: pytest.approx(3.45), 3e-3: pytest.approx(2.95)}
    assert make_table.main([str(root), "--best-over", "optim.lr"]) == 0
    md = capsys.readouterr().out
    line = next(ln for ln in md.splitlines() if ln.startswith("| pre_ln"))
    assert "0.001: 3.0500, 0.003: 3.3500" in line and "3.1500 ± 0.1000" in line
    # 1e-3 is the smallest lr tried and was chosen on seed 0 alone: both are said, and the row is not ranked
    assert "| 0.001 (edge) (chosen on 1 of 3 seeds) |" in line and "not ranked: best at the grid edge" in line
    assert "| 3.0500, 3.2500, 3.1500 |" in line   # per-seed values
    half = 4.302652729911275 * 0.1 / math.sqrt(3)  # t(0.975, 2) * std / sqrt(3)
    assert f"[{3.15 - half:.4f}, {3.15 + half:.4f}]" in line
    assert "(edge): the best value is at the edge" in md and "code commit of the runs: unrecorded." in md


def test_table_says_ahead_only_where_welch_separates(tmp_path: Path, capsys) -> None:
    for seed, (a, b, c) in enumerate([(3.00, 3.50, 3.10), (3.01, 3.52, 2.80), (2.99, 3.49, 3.30)]):
        make_run(tmp_path / f"pre_ln-s{seed}", "pre_ln", seed, a)
        make_run(tmp_path / f"post_ln-s{seed}", "post_ln", seed, b)
        make_run(tmp_path / f"geonorm-s{seed}", "geonorm", seed, c)
    assert make_table.main([str(tmp_path), "--paper-setting", "none"]) == 0
    md = capsys.readouterr().out
    row = {ln.split("|")[1].strip(): ln for ln in md.splitlines() if ln.startswith("| ")}
    assert row["pre_ln"].rstrip().endswith("| best |")
    assert "pre_ln ahead (p=" in row["post_ln"]          # 0.5 apart, tiny spread
    assert "not separated (p=" in row["geonorm"]          # as far as its seed spread

def test_run_above_its_initial_loss_is_marked_failed(tmp_path: Path, capsys) -> None:
    good = make_run(tmp_path / "r" / "pre_ln-s0", "pre_ln", 0, 3.0)
    bad = make_run(tmp_path / "r" / "pre_ln-s1", "pre_ln", 1, 3.0)
    lines = [json.loads(s) for s in (bad / "metrics.jsonl").read_text().splitlines()]
    for rec in lines:  # training went backwards: the last evaluation is above the first
        if rec["kind"] == "eval" and rec["step"] > 0:
            rec["val_loss"] = 7.5
        if rec["kind"] == "summary":
            rec["final_val_loss"] = 7.5
    (bad / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    runs = {r.seed: r for r in (runlib.load_run(good), runlib.load_run(bad))}
    assert not runs[0].failed and runs[1].failed and not runs[1].diverged
    rows = make_table.build_rows(runlib.group_runs(list(runs.values())), None)
    assert rows[0]["failed"] == 1 and rows[0]["diverged"] == 0 and rows[0]["loss_mean"] == pytest.approx(3.05)
    assert make_table.main([str(tmp_path / "r")]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| pre_ln"))
    assert "3.0500†" in line and "| 0/2 | 1/2 |" in line


def test_sweep_tune_lr_uses_the_experiments_grid(capsys, tmp_path: Path) -> None:
    assert sweep.main(["--experiment", "geonorm_125m_arxiv_512", "--tune-lr", "--dry-run", "--runs-root", str(tmp_path),
                       "--python", "python", "data.files=/data/arxiv/*.jsonl"]) == 0
    out = capsys.readouterr().out
    meta = yaml.safe_load((CONFIGS / "experiment" / "geonorm_125m_arxiv_512.yaml").read_text())["experiment_meta"]
    for v in meta["points"]:
        for lr in meta["lr_grid"]:
            assert f"{v}-lr-{lr!r}-s0" in out and f"optim.lr={lr!r}" in out
    with pytest.raises(SystemExit, match="no experiment_meta.lr_grid"):
        sweep.main(["--experiment", "cpu_study", "--tune-lr", "--dry-run"])


def test_every_paper_experiment_recommends_an_lr_grid() -> None:
    for name in EXPERIMENTS:
        meta = yaml.safe_load((CONFIGS / "experiment" / f"{name}.yaml").read_text())["experiment_meta"]
        if meta.get("paper_setting"):
            grid = meta.get("lr_grid")
            assert grid and len(grid) >= 3 and grid == sorted(grid), name


def test_slurm_submit_without_sbatch_keeps_the_script_and_says_where(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(SystemExit, match=r"no sbatch on PATH .*sweep\.sbatch"):
        sweep.main(
            ["--experiment", "cpu_study", "--slurm", "--submit", "--runs-root", str(tmp_path), "--python", "python"]
        )
    assert (tmp_path / "cpu_study" / "sweep.sbatch").is_file()


@pytest.mark.parametrize("grid, bad, msg", [
    ("norm=pre_ln,nonorm", "nonorm-s0", "unknown norm=nonorm: valid are "),
    ("optim.lr=abc,1e-3", "base-lr-abc-s0", "bad config optim.lr='abc': must be a number"),
])
def test_sweep_validates_every_point_while_planning(tmp_path, capsys, grid, bad, msg):
    for extra in (["--dry-run"], []):
        with pytest.raises(SystemExit) as e:
            sweep.main(["--name", "t", "--grid", grid, "--runs-root", str(tmp_path), *extra])
        out, err = capsys.readouterr()
        assert e.value.code == 2 and f"# bad point {bad}: {msg}" in out
        assert (
            err.strip().splitlines() == [err.strip()] and f"1 of 2 point(s) cannot run, nothing started: {bad}: " in err
        )
        assert "rerun" not in out + err and not (tmp_path / "t").exists()  # nothing started, nothing written


@pytest.mark.parametrize("name, argv, message", [
    ("bench_variants", ["--variants", "geonorm", "nope"], "error: unknown norm.name='nope': valid are pre_ln, "),
    ("bench_sample", ["--norm", "nope"], "error: unknown norm.name='nope': valid are pre_ln, "),
    ("bench_train", ["--steps", "1", "model.foo=1"], "error: unknown key(s) model.foo: valid keys are "),
])
def test_benchmarks_report_a_bad_variant_or_key_as_one_line(name, argv, message, monkeypatch, capsys):
    from common import report_user_errors

    bench = _load(name)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *argv])
    with pytest.raises(SystemExit) as e:
        report_user_errors(bench.main)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(message) and err.count("\n") == 1, err
