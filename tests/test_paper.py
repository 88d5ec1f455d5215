"""scripts/paper.py: a paper table's cost before it runs, its commands, and the table in the paper's layout
(paper and ours per row, each number beside its difference from Pre-LN), on synthetic run dirs."""
from __future__ import annotations

import json
import re

import pytest
import yaml

from test_experiments import _load, make_run

from experiments import cost as paper_cost  # noqa: E402
from experiments import paper_tables  # noqa: E402, F401

paper = _load("paper")


def test_every_table_names_existing_experiments_and_paper_settings():
    data = paper.load_tables()
    for name, tables in data["tables"].items():
        for t, spec in tables.items():
            for row in spec["rows"] + list(spec.get("reference_rows", {}).values()):
                assert (paper.REPO / "configs" / "experiment" / f"{row}.yaml").is_file(), (name, t, row)
                assert row in data["settings"], (name, t, row)
    assert len(data["tables"]["geonorm"]["main"]["rows"]) == 8


@pytest.mark.slow
def test_dry_run_prints_the_cost_from_the_models_own_count_and_the_commands(capsys):
    import torch

    from model import GPT
    from trainer.config import parse_run_config
    from trainer.monitor import PEAK_FLOPS

    assert paper.main(["geonorm", "clamp", "--dry-run", "--gpu", "A100", "--mfu", "0.5",
                       "--files", "pile_books3=/data/b3/*.jsonl", "--sweep", "--jobs 8"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| geonorm_clamp_books3 |")]
    assert [r[2].strip() for r in rows] == ["clamp_pi_2", "clamp_pi_4", "clamp_pi_8"]
    # the FLOPs and GPU-hours of a row: the model's own count over its tokens, at 50% of the A100's peak
    rc = parse_run_config(paper_cost.compose(["experiment=geonorm_clamp_books3", "norm=geonorm",
                                              "data.files=/x/*.jsonl"]))
    with torch.device("meta"):
        fpt = float(GPT(rc.model).flops_per_token())
    t = rc.train
    flops = fpt * t.max_steps * t.batch_tokens + (t.max_steps // t.eval_interval + 1) * t.eval_tokens * fpt / 3
    assert float(rows[0][5].replace(",", "")) == pytest.approx(flops / 1e15, abs=0.5)
    hours = flops / (0.5 * PEAK_FLOPS["NVIDIA A100-SXM4-80GB"]["fp16"]) / 3600
    assert float(rows[0][6]) == pytest.approx(hours, abs=0.05)
    assert rows[0][8].strip() == "32 x 512 of 32"  # the whole batch on one GPU (its header says why)
    total = re.search(r"total: 3 runs, ([\d.]+) GPU-hours", out)
    assert total and float(total[1]) == pytest.approx(3 * hours, abs=0.1)
    assert "prepared data pile_books3 >= 1.6 GB" in out
    cmd = [line for line in out.splitlines() if line.startswith("$ ")]
    assert cmd == ["$ python scripts/sweep.py --experiment geonorm_clamp_books3 --name geonorm_clamp_books3 "
                   "--runs-root runs --jobs 8 -- 'data.files=/data/b3/*.jsonl'"]


def test_bad_table_or_gpu_is_one_line(capsys):
    from common import ConfigError

    with pytest.raises(ConfigError, match=r"unknown table 'mian' of geonorm; valid: main, decay, clamp"):
        paper.main(["geonorm", "mian", "--dry-run"])
    with pytest.raises(ConfigError, match=r"unknown paper 'geo'; valid: geonorm, spheret"):
        paper.main(["geo", "main"])
    with pytest.raises(ConfigError, match=r"--gpu='V100': no dense peak known"):
        paper_cost.gpu_name("V100")
    with pytest.raises(ConfigError, match=r"bad --stand-in 'pg19'"):
        paper.main(["geonorm", "main", "--table", "--stand-in", "pg19"])


def test_files_are_checked_once_before_the_cost_and_any_sweep(tmp_path, capsys):
    """A --files name no row reads used to be ignored, and a glob matching nothing to launch every row's points
    (a --dry-run, which may plan for another machine, checks the names only)."""
    from common import ConfigError

    with pytest.raises(ConfigError, match=r"bad --files nope=/x/\*.jsonl: no row of this table reads data config "
                                          r"'nope' \(its rows read: pile_arxiv, pile_books3\)"):
        paper.main(["geonorm", "main", "--dry-run", "--files", "nope=/x/*.jsonl"])
    with pytest.raises(ConfigError, match=r"bad --files pile_books3=.*: data.files: no file matches"):
        paper.main(["geonorm", "main", "--files", f"pile_books3={tmp_path}/none/*.jsonl"])   # a launch: nothing ran
    assert "cost of" not in capsys.readouterr().out                      # refused before anything else


def _sweep(root, row, values: dict, meta_points: dict | None = None, seeds=(0,)):
    for label, v in values.items():
        for s in seeds:
            extra = {}
            if meta_points:
                extra = {k: val for k, val in meta_points[label].items() if k != "norm"}
            norm = (meta_points or {}).get(label, {}).get("norm", label)
            make_run(root / row / f"{label}-s{s}", norm, s, v - 0.05 + 0.001 * s,
                     meta={"points": meta_points} if meta_points else None, extra_cfg=extra)


def test_grid_table_in_the_papers_layout_with_differences_from_pre_ln(tmp_path, capsys):
    _sweep(tmp_path, "geonorm_125m_books3_512", {"pre_ln": 3.60, "post_ln": 3.65, "geonorm": 3.55})
    _sweep(tmp_path, "geonorm_125m_arxiv_512", {"pre_ln": 2.00, "sandwich": 1.99})
    assert paper.main(["geonorm", "main", "--table", "--runs-root", str(tmp_path),
                       "--out", str(tmp_path / "t.md")]) == 0
    text = (tmp_path / "t.md").read_text()
    assert text == capsys.readouterr().out
    lines = text.splitlines()
    assert "| setting | | pre_ln | post_ln | deepnorm | sandwich | geonorm |" in lines
    i = lines.index("| 125m_books3_512 (val_loss) | paper | 3.4437 (+0.0000) | 3.4855 (+0.0418) | 3.4708 (+0.0271) | "
                    "3.4604 (+0.0167) | 3.4040 (-0.0397) |")
    assert lines[i + 1] == "| | ours | 3.6000 (+0.0000) | 3.6500 (+0.0500) | — | — | 3.5500 (-0.0500) |"
    assert "| | ours | 2.0000 (+0.0000) | — | — | 1.9900 (-0.0100) | — |" in lines
    assert "geonorm_1_3b_books3_512: no finished runs under" in text


def test_ablation_differences_come_from_the_main_rows_pre_ln_and_a_stand_in_is_marked(tmp_path):
    pts = {"decay_sqrt": {"norm": "geonorm", "norm.decay": "sqrt"},
           "decay_harmonic": {"norm": "geonorm", "norm.decay": "harmonic"}}
    _sweep(tmp_path, "geonorm_decay_books3-pg19", {"decay_sqrt": 3.52, "decay_harmonic": 3.50}, pts)
    _sweep(tmp_path, "geonorm_125m_books3_512-pg19", {"pre_ln": 3.60})
    _sweep(tmp_path, "geonorm_decay_arxiv", {"decay_sqrt": 1.95}, pts)
    _sweep(tmp_path, "geonorm_125m_arxiv_512", {"pre_ln": 2.00})
    text = paper_tables_text(tmp_path, "decay", ["--stand-in", "pile_books3=pg19"])
    lines = text.splitlines()
    assert "| decay_books3 (val_loss) | paper | 3.4210 (-0.0227) | 3.4168 (-0.0269) | 3.4040 (-0.0397) |" in lines
    assert "| | ours † | 3.5200 (-0.0800) | — | 3.5000 (-0.1000) |" in lines
    assert "| | ours | 1.9500 (-0.0500) | — | — |" in lines
    assert ("† geonorm_decay_books3: stand-in for Books3 (PG-19, public-domain books before 1919); absolute losses "
            "not comparable") in lines


def paper_tables_text(root, table, extra=()):
    import io
    from contextlib import redirect_stdout

    buf = io.StringIO()
    with redirect_stdout(buf):
        assert paper.main(["geonorm", table, "--table", "--runs-root", str(root), *extra]) == 0
    return buf.getvalue()


def test_zero_shot_aggregates_every_runs_newest_eval_beside_the_papers_numbers(tmp_path, capsys):
    spec = paper.load_tables()["tables"]["spheret"]["zero_shot"]
    for row in spec["rows"]:
        for label, shift in (("pre_ln", 0.0), ("proj_spheret", 0.02), ("cay_spheret", 0.01)):
            run = make_run(tmp_path / row / f"{label}-s0", label, 0, 3.0)
            (run / "eval").mkdir()
            (run / "eval" / "eval_00000001.json").write_text(json.dumps({"tasks": {"piqa": {"acc": 0.1}}}))
            tasks = {m.rstrip("+-").split("/")[0]: {} for m in spec["metrics"]}
            for m in spec["metrics"]:
                task, metric = m.rstrip("+-").split("/")
                tasks[task][metric] = (50.0 - 100 * shift) if m.endswith("-") else 0.5 + shift
            (run / "eval" / "eval_00000040.json").write_text(json.dumps({"step": 40, "tasks": tasks}))
    assert paper.main(["spheret", "zero_shot", "--table", "--runs-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert ("| lambada_openai/perplexity (lower is better) | 50 | 48 | 49 | proj_spheret | best baseline 59.55, "
            "proj_spheret 46.74 |") in out
    assert "| piqa/acc (higher is better) | 0.5 | 0.52 | 0.51 | proj_spheret | — |" in out  # the newest eval
    assert "cay_spheret / proj_spheret best on 12/12 metrics (paper: 11/12)" in out
    assert "best on 12/12 metrics (paper: 10/12)" in out


def test_eval_runs_eval_py_on_every_run_of_the_rows(tmp_path, capsys):
    for row in ("spheret_fineweb_edu_36l", "spheret_openwebtext_36l"):
        (tmp_path / row / "pre_ln-s0" / "checkpoints").mkdir(parents=True)
    assert paper.main(["spheret", "zero_shot", "--eval", "--dry-run", "--runs-root", str(tmp_path),
                       "--eval-args", "--limit 100"]) == 0
    cmds = [line for line in capsys.readouterr().out.splitlines() if line.startswith("$ ")]
    assert len(cmds) == 2 and all(
        "eval.py" in c and "--tasks lambada_openai,wikitext," in c and c.endswith("--limit 100") for c in cmds
    )


def test_a_zero_shot_table_or_eval_without_runs_says_so(tmp_path, capsys):
    """--eval with no runs printed nothing and exited 0; --table said "best on 0/12" under a header of 4 cells
    over a separator of 3."""
    from common import ConfigError

    with pytest.raises(ConfigError, match=r"--eval: no run with a checkpoint under .* train the table's rows first"):
        paper.main(["spheret", "zero_shot", "--eval", "--runs-root", str(tmp_path)])
    assert paper.main(["spheret", "zero_shot", "--table", "--runs-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("no runs under ") == 2 and "best on 0/" not in out and "| metric |" not in out


def test_results_file_is_data_the_tables_read():
    data = yaml.safe_load(paper.RESULTS.read_text())
    zs = data["tables"]["spheret"]["zero_shot"]["paper"]
    assert zs["values"]["lambada_openai/perplexity"] == {"best baseline": 59.55, "proj_spheret": 46.74}
    assert data["stand_ins"]["pg19"]["for"] == "pile_books3"
